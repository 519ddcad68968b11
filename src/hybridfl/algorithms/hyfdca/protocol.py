"""The HyFDCA client's own view of the protocol (against a malicious server): which message may come next, its own
round and step counters, and the fail-closed stop. The server is the adversary here: nothing it
says about the protocol's state is taken on trust.

:class:`ClientProtocol` is consulted by :meth:`HyFDCAClient.handle
<hybridfl.algorithms.hyfdca.client.HyFDCAClient.handle>` before any other check
(:meth:`ClientProtocol.admit`), updated after a message is answered (:meth:`ClientProtocol.commit`),
and stopped by any refusal (:meth:`ClientProtocol.stop`). Its fields are part of the client's state
(:meth:`ClientProtocol.get_state`), so they survive Flower's rebuild of the client for every
message and a checkpoint.

**Order.** Setup: ``hyfdca.hello``, then (``alignment: psi``) ``psi_serve``, ``psi_result``,
``psi_tags``, then ``init`` and ``norms``, each at most once and in that order, all in round 0. A
round message (round ``>= 1``) comes only after ``norms``; its round number may not go back. A
higher number opens a new round, which starts with ``hyfdca.ip`` (block mode), ``hyfdca.ip`` or a
returning client's ``hyfdca.primal`` carrying ``alpha`` (consensus mode, HyFDCA Alg. 1 line 6) or
``hyfdca.segstart`` (segment mode). Within a round (:data:`NEXT`):

- block and consensus: [``primal`` (returning) [``unmask``]] ``ip``, ``dual``, ``primal``
  [``unmask``];
- segment: per pass ``segstart``, ``sweep`` ..., then either the closing sweep (a
  ``hyfdca.sweep`` with ``close``, carrying the PrimalAggregation share, a one-shot masked
  exchange that is never unmasked), or
  ``primal`` [``unmask``] (the server's fallback when a holder's reply is missing; also after a
  closing sweep whose pass the server could not add); a pass over segments the client alone
  holds is one ``hyfdca.segstart`` with ``solo`` (start and closing sweep at once), possibly
  followed by that fallback (the sequential schedule runs several passes in a round).

A round may end early at any point (the server stops asking a client whose reply it lost), and
over Flower a message the server gave up on may never reach the node, so a phase may be skipped
(:data:`START`, :data:`NEXT`), but never repeated or taken back: a request is answered once. A
second ``primal`` without the steps between, or a second ``unmask``, is out of place (an
``unmask`` comes right after the ``primal`` it unmasks and must name that exchange's tag:
:meth:`~hybridfl.privacy.secagg.SecAggClient.correction`).

**Counters.** ``round`` is the server's round number of the last message it answered, checked
(never lower; a new round only at a round's start); it is never used for a bound. Its own
counters are ``rounds`` (the rounds in which it answered a message: the encoding error of a
decrypted ``alpha``, :meth:`HyFDCAClient.encoding_error
<hybridfl.algorithms.hyfdca.client.HyFDCAClient.encoding_error>`) and ``steps`` (its local dual
steps, ``hyfdca.dual``, and segment passes, ``hyfdca.segstart``, since its last accepted
``alpha``, a decrypted one or, segment mode, the one it computed at its last closing sweep): the
change bound of an ``alpha`` is ``nu * max(1, steps)``. In segment mode this is the protocol's
exact bound (a segment steps only when all its holders, so this client too, take part; a
fallback ``hyfdca.primal`` right after a closing sweep takes back at most that pass's change,
``nu`` per sample); in block and consensus modes a sample's other holders may also step while this client is
away (partial participation): with ``nu = 1`` (the default) the dual box already bounds the change
by 1, so nothing changes; with another ``nu`` a returning client may refuse an honest ``alpha``
that moved more than ``nu`` while it was away (it then leaves the run: fail closed).

**Fail closed.** Any refused message (a :class:`~hybridfl.errors.HybridFLError` or any other
exception while answering) stops the client for the run: :meth:`ClientProtocol.admit` refuses
every later message with one sentence naming the message it refused first. A refusal therefore
tells the server at most one bit per run (whether the client stopped), whatever it asks after.
"""

from __future__ import annotations

import numpy as np

from hybridfl.algorithms.hyfdca import kinds
from hybridfl.runtime.failclosed import FailClosed
from hybridfl.runtime.messages import Message

SETUP = (kinds.HELLO, kinds.PSI_SERVE, kinds.PSI_RESULT, kinds.PSI_TAGS, kinds.INIT, kinds.NORMS)
"""The setup messages, in the only order a client accepts them (the PSI ones only with ``alignment: psi``)."""

START = {
    "block": ("ip", "dual", "primal"),
    "consensus": ("primal_ret", "ip", "dual"),
    "segment": ("segstart", "solo", "primal"),
}
"""The phases a round may start with, per ``dual_mode``."""

NEXT = {
    "block": {"ip": ("dual", "primal"), "dual": ("primal",), "primal": ("unmask",), "unmask": ()},
    "consensus": {
        "primal_ret": ("unmask_ret", "ip", "dual"),
        "unmask_ret": ("ip", "dual"),
        "ip": ("dual", "primal"),
        "dual": ("primal",),
        "primal": ("unmask",),
        "unmask": (),
    },
    "segment": {
        "segstart": ("sweep", "close", "primal"),
        "sweep": ("sweep", "close", "primal"),
        "close": ("primal", "segstart", "solo"),  # a one-shot exchange: never unmasked
        "solo": ("primal", "segstart", "solo"),  # start and closing sweep at once
        "primal": ("unmask", "segstart", "solo"),
        "unmask": ("segstart", "solo"),
    },
}
"""Per ``dual_mode``: the phases that may follow each phase within a round (a phase is the
message kind without ``hyfdca.``; ``primal_ret``/``unmask_ret``: a returning client's
PrimalAggregation before SecureInnerProduct, consensus mode; ``close``: segment mode's closing
``hyfdca.sweep``, which carries the PrimalAggregation share)."""


class ClientProtocol(FailClosed):
    """One HyFDCA client's protocol state (module docstring; the stop:
    :class:`~hybridfl.runtime.failclosed.FailClosed`).

    Args:
        client_id: the client's name (in the refusal sentences).

    Attributes:
        stopped: ``""`` while it takes part; else the sentence saying which message it refused.
        setup: index in :data:`SETUP` of the last setup message answered (-1: none).
        round: the server's round number of the last round message answered (0: setup).
        phase: the phase of that message within its round (:data:`NEXT`; ``""`` before round 1).
        rounds: own counter: the rounds in which it answered a message.
        steps: own counter: dual steps and segment passes since its last accepted ``alpha``.
    """

    FIELDS = ("stopped", "setup", "round", "phase", "rounds", "steps")

    def __init__(self, client_id: str):
        super().__init__(f"HyFDCA client {client_id!r}")
        self.client_id = client_id
        self.setup = -1
        self.round = 0
        self.phase = ""
        self.rounds = 0
        self.steps = 0

    def phase_of(self, msg: Message, mode: str) -> str:
        """The phase ``msg`` would take in the current round (``primal_ret``/``unmask_ret`` in
        consensus mode before the round's ``ip``; ``close``: a ``hyfdca.sweep`` whose ``close`` is
        true; ``solo``: a ``hyfdca.segstart`` whose ``solo`` is true)."""
        kind = msg.kind.removeprefix("hyfdca.")
        close = msg.payload.get("close", False)
        if kind == "sweep" and isinstance(close, (bool, np.bool_)) and bool(close):
            return "close"  # the closing sweep (a ``close`` that is not a bool is refused by its check)
        solo = msg.payload.get("solo", False)
        if kind == "segstart" and isinstance(solo, (bool, np.bool_)) and bool(solo):
            return "solo"  # a pass over segments it alone holds, in one exchange
        new_round = int(msg.round) > self.round
        if mode == "consensus" and kind in ("primal", "unmask"):
            early = new_round or self.phase in ("primal_ret", "unmask_ret")
            return kind + "_ret" if early else kind
        return kind

    def admit(self, msg: Message, mode: str | None) -> None:
        """Check that ``msg`` may come now (module docstring), before anything else is read.

        Args:
            msg: the server's message.
            mode: the run's ``dual_mode`` (``None`` before ``hyfdca.init``).

        Raises:
            ProtocolError: the client has stopped (one sentence naming the message it refused),
                or ``msg`` is out of place (a setup message again or out of order, a round number
                that goes back, a kind the protocol does not put here).
        """
        self.check_running()
        rnd = int(msg.round)
        if msg.kind in SETUP:
            i = SETUP.index(msg.kind)
            if rnd != 0:
                raise self.refusal(msg, "a setup message outside round 0")
            if i <= self.setup:
                raise self.refusal(msg, f"setup is past it (last {SETUP[self.setup]!r}): each setup step comes once")
            if (i == 0) != (self.setup < 0) or (msg.kind == kinds.NORMS and self.setup != SETUP.index(kinds.INIT)):
                raise self.refusal(msg, "the setup steps come in the order hello, PSI, init, norms")
            return
        if self.setup != len(SETUP) - 1 or mode is None:
            raise self.refusal(msg, "a round message before its setup ended (hyfdca.norms)")
        if rnd < max(1, self.round):
            raise self.refusal(msg, f"the round number goes back (it answered round {self.round} already)")
        phase = self.phase_of(msg, mode)
        table = NEXT.get(mode, {})
        if phase not in table:
            raise self.refusal(msg, f"not a message of dual_mode {mode!r}")
        allowed = START[mode] if rnd > self.round else table.get(self.phase, ())
        if phase not in allowed:
            where = "at the start of a round" if rnd > self.round else f"after {self.phase!r} in the same round"
            raise self.refusal(msg, f"the protocol does not put it {where} (each request is answered once)")

    def commit(self, msg: Message, mode: str | None) -> None:
        """Record that ``msg`` (admitted by :meth:`admit`) was answered."""
        if msg.kind in SETUP:
            self.setup = SETUP.index(msg.kind)
            return
        rnd = int(msg.round)
        phase = self.phase_of(msg, str(mode))
        if rnd > self.round:
            self.rounds += 1
        self.round, self.phase = rnd, phase
        if phase in ("dual", "segstart"):
            self.steps += 1

    def rounds_now(self, msg: Message) -> int:
        """Its own count of rounds with ``msg``'s round (admitted, not yet committed) included."""
        return self.rounds + (1 if int(msg.round) > self.round else 0)

    def rounds_for_alpha(self) -> int:
        """``R`` of the change bound ``|alpha_i - last_i| <= nu R`` of an ``alpha`` arriving now:
        its own dual steps and passes since its last accepted ``alpha``, at least 1."""
        return max(1, self.steps)

    def alpha_accepted(self) -> None:
        """An ``alpha`` was accepted: the step counter starts again."""
        self.steps = 0
