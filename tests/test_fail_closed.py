"""The shared fail-closed rule (``hybridfl.runtime.failclosed``) on the clients without an
order of their own: hybrid FedAvg's (``fedavg.hello`` once in round 0, one ``fedavg.fit`` a
round) and HyFEM's (the stop only: its messages' order is its secure aggregation's). Adversary: a
server that sends any message it likes; after one refusal the client answers nothing more in the
run, with one sentence, and the stop survives a rebuild from its state (Flower rebuilds a client
for every message). The HyFEM refusals themselves are in ``tests/test_malicious_server.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.errors import ProtocolError
from hybridfl.runtime.failclosed import FailClosed, OrderedProtocol
from hybridfl.runtime.messages import SERVER, Message
from tests.test_payloads import _fedavg

STOPPED = "has stopped taking part in this run after refusing"


def _fit(fed, cid: str, rnd: int) -> Message:
    d = int(fed.server.feat[cid].size)
    good = {"w": np.zeros(d), "lr": 0.1, "lam": 0.01, "loss": "logistic", "local_steps": 2, "batch_size": 8}
    return Message("fedavg.fit", SERVER, cid, rnd, good)


@pytest.mark.parametrize("attack", ["repeat", "round_back", "hello_again"])
def test_hybrid_fedavg_client_fails_closed(attack):
    """A second ``fedavg.fit`` in round 2, a round-1 fit after round 2, or a ``fedavg.hello`` in
    a round: refused; then an honest round-3 fit is refused with the sentence naming it, and so is
    the same fit to a client rebuilt from the stopped one's state."""
    fed = _fedavg()
    fed.setup()
    cid = list(fed.clients)[0]
    client = fed.clients[cid]
    client.handle(_fit(fed, cid, 2))
    bad = {
        "repeat": _fit(fed, cid, 2),
        "round_back": _fit(fed, cid, 1),
        "hello_again": Message("fedavg.hello", SERVER, cid, 2, {}),
    }[attack]
    why = {"repeat": "answered once", "round_back": "round number goes back", "hello_again": "outside round 0"}
    with pytest.raises(ProtocolError, match=why[attack]):
        client.handle(bad)
    with pytest.raises(ProtocolError, match=STOPPED) as e1:
        client.handle(_fit(fed, cid, 3))
    assert f"{bad.kind!r} of round {bad.round}" in str(e1.value)
    fresh = _fedavg()
    fresh.setup()
    rebuilt = fresh.clients[cid]
    rebuilt.set_state(client.get_state())
    with pytest.raises(ProtocolError, match=STOPPED) as e2:
        rebuilt.handle(_fit(fed, cid, 3))
    assert str(e2.value) == str(e1.value) and client.failed_state() == client.get_state()


def test_the_shared_rule_keeps_its_state_as_json_or_as_an_array():
    """``FailClosed`` alone (HyFEM's): a refusal inside ``answer`` stops it, the stop round-trips
    through both state forms; ``OrderedProtocol``: a round may not start with a kind it does not
    list, and its counters survive the round trip."""
    msg = Message("hyfem.fit", SERVER, "a", 1, {})
    stop = FailClosed("HyFEM client 'a'")

    def refuse():
        raise ValueError("bad")

    with pytest.raises(ValueError):
        stop.answer(msg, refuse)
    as_json, as_array = FailClosed("HyFEM client 'a'"), FailClosed("HyFEM client 'a'")
    as_json.set_state(stop.get_state())
    as_array.set_array_state(stop.array_state())
    for back in (stop, as_json, as_array):
        with pytest.raises(ProtocolError, match=r"refusing 'hyfem.fit' of round 1 \(ValueError\)"):
            back.answer(msg, lambda: None)
    order = OrderedProtocol("c", ("s.hello",), ("s.fit",), {"s.fit": ("s.unmask",)})
    with pytest.raises(ProtocolError, match="at the start of a round"):
        order.admit(Message("s.unmask", SERVER, "c", 1, {}))
    order.answer(Message("s.fit", SERVER, "c", 1, {}), lambda: None)
    again = OrderedProtocol("c", ("s.hello",), ("s.fit",), {"s.fit": ("s.unmask",)})
    again.set_state(order.get_state())
    assert (again.round, again.last, again.counts) == (1, "s.fit", {"s.fit": 1})
    with pytest.raises(ProtocolError, match="each request is answered once"):
        again.admit(Message("s.fit", SERVER, "c", 1, {}))
