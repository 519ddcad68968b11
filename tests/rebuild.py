"""HyFDCA clients rebuilt from their state before every message, as Flower's ClientApp rebuilds a
client per message (tests of the state contract)."""

from __future__ import annotations

from hybridfl.algorithms.hyfdca.spec import build_client
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation, client_data


class Rebuilt:
    """One client's endpoint: builds the client from its data and ``state`` (through the codec) for
    every message, answers, and keeps the new state."""

    def __init__(self, cd, cfg):
        self.cd, self.cfg, self.state = cd, cfg, {}

    def handle(self, msg):
        c = build_client(self.cd, self.cfg, 0)
        c.set_state(decode(encode(Message("s", SERVER, self.cd.client_id, 0, self.state))).payload)
        reply = c.handle(msg)
        self.state = c.get_state()
        return reply


def rebuild_every_message(fed, split, part, cfg, secrets) -> dict[str, Rebuilt]:
    """Replace every client of the federation ``fed`` (built with seed 0) by a :class:`Rebuilt`
    one; returns them by client ID."""
    cds = {cd.client_id: cd for cd in client_data(split, part, secrets)}
    out = {}
    for cid in list(fed.transport.clients):
        out[cid] = fed.clients[cid] = fed.transport.clients[cid] = Rebuilt(cds[cid], cfg)
    return out


def reference_and_rebuilt(split, part, cfg, ref=None):
    """A HyFDCA run of ``cfg`` (seed 0, all rounds, no monitor), and the same run with every client
    rebuilt before every message (:func:`rebuild_every_message`, the reference's keys): ``(ref,
    rebuilt)`` federations. ``ref``: a finished reference to reuse."""
    if ref is None:
        ref = build_federation("hyfdca", split, part, cfg, seed=0)
        ref.setup()
        ref.loop(monitor=False).run()
    fed = build_federation("hyfdca", split, part, cfg, seed=0, secrets=ref.secrets)
    rebuild_every_message(fed, split, part, cfg, ref.secrets)
    fed.setup()
    fed.loop(monitor=False).run()
    return ref, fed
