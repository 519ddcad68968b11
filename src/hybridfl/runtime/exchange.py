"""One reply policy for every server-side exchange.

A server step sends messages with ``transport.send_and_receive`` and gets back what arrived. An
arrival is an *answer* only if it comes from a client that was asked, is of the kind of the message
that client was sent, and is that client's first reply in the exchange. :func:`answers` keeps
exactly those; every other arrival (unasked, of another kind, or a repeat) is logged with its
sender and the reason and left out, so the algorithm's missing-reply policy treats its sender as a
client whose reply did not arrive. One client's stray reply therefore never stops a run (McMahan et
al. 2017, Alg. 1 aggregates the replies that arrive; HyFEM Alg. 1, HyFDCA Alg. 1 and FedBCD
Alg. 1 likewise proceed with the clients that answered).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from hybridfl.runtime.messages import Message

log = logging.getLogger("hybridfl.exchange")


def answers(sent: Sequence[Message], arrived: Iterable[Message], who: str) -> list[Message]:
    """The answers among ``arrived`` to the messages ``sent``, in arrival order.

    Args:
        sent: the messages of the exchange (at most one per receiver).
        arrived: what the transport returned for them.
        who: the name of the server step for the log (e.g. ``"HyFEM round 3"``).

    Returns:
        Each reply whose sender was sent a message of the same kind, the first one per sender. Every
        other reply is logged (warning: its sender, its kind, why) and dropped; nothing raises.
    """
    kinds = {m.receiver: m.kind for m in sent}
    seen: set[str] = set()
    out: list[Message] = []
    for r in arrived:
        if r.sender not in kinds:
            why = "its sender was not asked"
        elif r.sender in seen:
            why = "its sender already answered"
        elif r.kind != kinds[r.sender]:
            why = f"it does not answer the {kinds[r.sender]!r} message its sender was sent"
        else:
            seen.add(r.sender)
            out.append(r)
            continue
        log.warning("%s: the %r reply from %r is ignored: %s.", who, r.kind, r.sender, why)
    return out
