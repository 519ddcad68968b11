"""A client's own view of the protocol against a malicious server, shared by the algorithms: the
fail-closed stop (:class:`FailClosed`) and, for protocols that are a fixed order of setup steps
and per-round requests, that order (:class:`OrderedProtocol`).

Adversary: the server (HyFDCA, HyFEM, hybrid FedAvg) or coordinator (FedBCD) sends any message
it likes, in any order, with any round number, as often as it likes. A client answers each
request once and only where the protocol puts it, checks the round number against its own record
(never lower; it is never used for a bound), and **fails closed**: after any refused message it
answers nothing more in the run, every later message refused with one sentence naming the message
it refused first. A refusal then tells the server at most one bit per run (whether the client
stopped), whatever it asks after; the stop is part of the client's state, so it survives Flower's
rebuild of the client for every message (:func:`hybridfl.runtime.flower.node.client_step` keeps it
when the message fails) and a checkpoint.

HyFDCA's own order (consensus mode's returning clients, segment passes) is
:class:`hybridfl.algorithms.hyfdca.protocol.ClientProtocol`, built on :class:`FailClosed`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import Message

T = TypeVar("T")


class FailClosed:
    """The fail-closed stop of one client (module docstring).

    Args:
        who: the client as the refusal sentences name it (e.g. ``"FedBCD party 'a'"``).

    Attributes:
        stopped: ``""`` while it takes part; else which message it refused first.
        FIELDS: the attributes :meth:`to_json` keeps (subclasses add theirs).
    """

    FIELDS: tuple[str, ...] = ("stopped",)

    def __init__(self, who: str):
        self.who = who
        self.stopped = ""

    def check_running(self) -> None:
        """Raises:
        ProtocolError: the client has stopped (one sentence naming the message it refused first)."""
        if self.stopped:
            raise ProtocolError(
                f"{self.who} has stopped taking part in this run after refusing {self.stopped}; "
                "it answers no further message."
            )

    def refusal(self, msg: Message, why: str) -> ProtocolError:
        """The one-sentence refusal of ``msg`` out of place (``why`` without a final period)."""
        return ProtocolError(f"{self.who} refuses {msg.kind!r} of round {msg.round}: {why}.")

    def stop(self, msg: Message, err: BaseException) -> None:
        """Fail closed after refusing ``msg`` (``err``); the first refusal is the one named."""
        if not self.stopped:
            self.stopped = f"{msg.kind!r} of round {int(msg.round)} ({type(err).__name__})"

    def admit(self, msg: Message) -> None:
        """Check that ``msg`` may come now (nothing here; :class:`OrderedProtocol` checks the order)."""

    def commit(self, msg: Message) -> None:
        """Record that ``msg`` (admitted) was answered (nothing here)."""

    def answer(self, msg: Message, step: Callable[[], T]) -> T:
        """Answer ``msg`` with ``step`` under the fail-closed rule: refused if stopped; any
        exception of ``step`` (which should call :meth:`admit` before it changes anything) stops
        the client and propagates; on success the message is committed.

        Raises:
            ProtocolError: the client has stopped; or whatever ``step`` raises.
        """
        self.check_running()
        try:
            out = step()
        except Exception as e:
            self.stop(msg, e)
            raise
        self.commit(msg)
        return out

    def to_json(self) -> str:
        """The :data:`FIELDS` as JSON (the state entry)."""
        return json.dumps({k: getattr(self, k) for k in self.FIELDS})

    def from_json(self, text: str) -> None:
        """Restore :meth:`to_json` (each field with its constructor value's type).

        Raises:
            ValueError: not such JSON (a state file edited by hand).
        """
        d = json.loads(text)
        for k in self.FIELDS:
            cur = getattr(self, k)
            setattr(self, k, {str(a): int(b) for a, b in d[k].items()} if isinstance(cur, dict) else type(cur)(d[k]))

    def get_state(self) -> dict[str, Any]:
        """Codec values: ``protocol`` (:meth:`to_json`)."""
        return {"protocol": self.to_json()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state` (nothing if ``protocol`` is missing)."""
        if "protocol" in state:
            self.from_json(str(state["protocol"]))

    def array_state(self) -> dict[str, np.ndarray]:
        """:meth:`get_state` for a client whose state holds arrays only: ``protocol`` as the
        UTF-8 bytes of its JSON, uint8 ``(n,)``."""
        return {"protocol": np.frombuffer(self.to_json().encode(), dtype=np.uint8).copy()}

    def set_array_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`array_state` (nothing if ``protocol`` is missing).

        Raises:
            ValueError: not the JSON :meth:`array_state` writes.
        """
        if "protocol" in state:
            self.from_json(np.asarray(state["protocol"], dtype=np.uint8).tobytes().decode())


class OrderedProtocol(FailClosed):
    """A protocol of setup steps (round 0, in order, each at most once; one may be skipped, none
    repeated or taken back) and rounds (round ``>= 1``, numbers never going back; a higher number
    opens a round with one of ``start``, each later message of the round must be one ``after``
    allows after the last, and each kind is answered at most ``limit`` times a round, default 1).

    Args:
        who: as :class:`FailClosed`.
        setup: the setup kinds, in order.
        start: the kinds that may open a round.
        after: kind -> the kinds that may follow it in the same round.
        limit: kind -> the most messages of it a round (default 1: each request answered once).
        at_setup: kinds that may also come once in round 0, after the setup steps (no setup step
            after them).

    Attributes:
        setup_step: index in ``setup`` of the last setup message answered (-1: none).
        round: the round number of the last round message answered (0: setup).
        last: the kind of that message (``""`` before round 1).
        counts: kind -> messages of it answered in that round.
    """

    FIELDS = ("stopped", "setup_step", "round", "last", "counts")

    def __init__(
        self,
        who: str,
        setup: Sequence[str],
        start: Sequence[str],
        after: Mapping[str, Sequence[str]],
        limit: Mapping[str, int] | None = None,
        at_setup: Sequence[str] = (),
    ):
        super().__init__(who)
        self.setup, self.start, self.after = tuple(setup), tuple(start), {k: tuple(v) for k, v in after.items()}
        self.limit, self.at_setup = dict(limit or {}), tuple(at_setup)
        self.setup_step, self.round, self.last = -1, 0, ""
        self.counts: dict[str, int] = {}

    def admit(self, msg: Message) -> None:
        """Check that ``msg`` may come now (class docstring), before the client reads anything else.

        Raises:
            ProtocolError: the client has stopped, or ``msg`` is out of place (one sentence).
        """
        self.check_running()
        rnd = int(msg.round)
        if msg.kind in self.setup:
            if rnd != 0:
                raise self.refusal(msg, "a setup message outside round 0")
            if self.setup.index(msg.kind) <= self.setup_step or self.last:
                raise self.refusal(msg, "setup is past it: each setup step comes once, in order")
            return
        if rnd == 0 and self.round == 0 and msg.kind in self.at_setup:  # e.g. the untrained model's evaluation
            if self.counts.get(msg.kind, 0) >= 1:
                raise self.refusal(msg, "each request is answered once")
            return
        if rnd < max(1, self.round):
            raise self.refusal(msg, f"the round number goes back (it answered round {self.round} already)")
        if rnd > self.round:
            if msg.kind not in self.start:
                raise self.refusal(msg, "the protocol does not put it at the start of a round")
            return
        if self.counts.get(msg.kind, 0) >= self.limit.get(msg.kind, 1):
            raise self.refusal(msg, "each request is answered once")
        if msg.kind not in self.after.get(self.last, ()):
            raise self.refusal(msg, f"the protocol does not put it after {self.last!r} in the same round")

    def commit(self, msg: Message) -> None:
        """Record that ``msg`` (admitted by :meth:`admit`) was answered."""
        if msg.kind in self.setup:
            self.setup_step = self.setup.index(msg.kind)
            return
        rnd = int(msg.round)
        if rnd > self.round:
            self.round, self.counts = rnd, {}
        self.last = msg.kind
        self.counts[msg.kind] = self.counts.get(msg.kind, 0) + 1
