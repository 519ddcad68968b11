"""Transports: how server-side steps reach client-side steps, and the communication log.

Server-side code never calls a client directly: it builds :class:`Message` objects and calls
``transport.send_and_receive(messages)`` (the shape of Flower's ``grid.send_and_receive``). Two
transports implement the :class:`Transport` contract:

- :class:`InProcessTransport` runs the clients in this process, encoding and decoding every
  message and logging its size (the simulation);
- :class:`hybridfl.runtime.flower.bridge.FlowerTransport` carries the same bytes through a Flower
  SuperLink to one SuperNode per client (deployment).

Both return **the replies that arrived by the deadline** and never raise for a missing one, so an
algorithm's missing-reply policy (HyFEM: the client is absent this round; HyFDCA: its dual changes
are not committed; FedBCD: skip and undo the round, or stop) runs the same way on both.

A reply that arrives but cannot be a client's answer (under another client's name, bytes that do
not decode, over Flower an error reply) is a *bad reply*: both transports leave it out (a missing
reply), log it with the client and the reason, and count it in :class:`Strikes`; a client with
:data:`MAX_STRIKES` bad replies is dropped for the run (no further message is sent to it, its
replies count as missing). One client's bad reply therefore never stops a run.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from hybridfl.errors import HybridFLError
from hybridfl.runtime.messages import SERVER, Message, decode, decode_parts, encode_parts

MAX_STRIKES = 3
"""Bad replies after which a client is dropped for the run (:class:`Strikes`)."""

log = logging.getLogger("hybridfl.transport")


class Strikes:
    """The bad replies of each client in a run; a client with ``limit`` of them is dropped.

    Args:
        limit: bad replies that drop a client (None: :data:`MAX_STRIKES`).

    Attributes:
        events: one dict per bad reply (``round``, ``kind``, ``client``, ``why``), JSON-able.
        dropped: client -> the reason of its last bad reply, for the clients dropped for the run.
    """

    def __init__(self, limit: int | None = None):
        self.limit = int(MAX_STRIKES if limit is None else limit)
        self.events: list[dict] = []
        self.dropped: dict[str, str] = {}

    def add(self, client: str, rnd: int, kind: str, why: str) -> None:
        """Record a bad reply of ``client`` to its ``kind`` message of round ``rnd`` (logged as a
        warning); at the ``limit``-th, drop the client (logged once)."""
        self.events.append({"round": int(rnd), "kind": str(kind), "client": str(client), "why": str(why)[:500]})
        log.warning(
            "hybridfl: client %s: its reply to %r (round %d) counts as missing: %s", client, kind, rnd, str(why)[:500]
        )
        n = sum(1 for e in self.events if e["client"] == client)
        if n >= self.limit and client not in self.dropped:
            self.dropped[client] = str(why)[:500]
            log.warning("hybridfl: client %s is dropped for the rest of the run after %d bad replies", client, n)

    def get_state(self) -> dict:
        """JSON-able state (for checkpoints)."""
        return {"events": list(self.events), "dropped": dict(self.dropped)}

    def set_state(self, state: dict) -> None:
        """Restore :meth:`get_state`."""
        self.events = [dict(e) for e in state.get("events", [])]
        self.dropped = {str(c): str(w) for c, w in state.get("dropped", {}).items()}


class ClientEndpoint(Protocol):
    """Client-side steps: answer one message with one message."""

    def handle(self, msg: Message) -> Message:
        """Answer ``msg`` (addressed to this client) with one reply to its sender, same round."""
        ...


@runtime_checkable
class Transport(Protocol):
    """What server-side steps may use to reach the clients.

    Attributes:
        client_ids: the clients of the federation, in partition order.
        log: a :class:`CommLog` of every message that crossed (counted bytes of our codec).
    """

    log: CommLog

    @property
    def client_ids(self) -> list[str]:
        """The clients of the federation, in partition order."""
        ...

    def send_and_receive(self, messages: Sequence[Message]) -> list[Message]:
        """Deliver ``messages`` (at most one per client) and return the replies that arrived by the
        transport's deadline, in the order of ``messages``. A client whose reply did not arrive
        (it failed, its node died, it timed out) is simply missing from the list: no exception.

        Raises:
            KeyError: a message names a client that is not in the federation.
        """
        ...


@dataclass
class LogEntry:
    round: int
    kind: str
    sender: str
    receiver: str
    nbytes: int


@dataclass
class CommLog:
    """Every message that crossed: round, kind, sender, receiver and size in bytes."""

    entries: list[LogEntry] = field(default_factory=list)

    def add(self, msg: Message, nbytes: int) -> None:
        """Record ``msg`` (its round, kind, sender, receiver) with its encoded size ``nbytes``."""
        self.entries.append(LogEntry(msg.round, msg.kind, msg.sender, msg.receiver, nbytes))

    @property
    def bytes_total(self) -> int:
        """Bytes of every message logged."""
        return sum(e.nbytes for e in self.entries)

    @property
    def messages_total(self) -> int:
        """Number of messages logged."""
        return len(self.entries)

    def per_client(self, server: str = SERVER) -> dict[str, dict[str, int]]:
        """Client -> {messages, bytes_up (client to server), bytes_down (server to client)}."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"messages": 0, "bytes_up": 0, "bytes_down": 0})
        for e in self.entries:
            if e.sender == server:
                d = out[e.receiver]
                d["bytes_down"] += e.nbytes
            else:
                d = out[e.sender]
                d["bytes_up"] += e.nbytes
            d["messages"] += 1
        return dict(out)


class InProcessTransport:
    """Runs client endpoints in this process; every message is encoded, logged and decoded.

    Args:
        clients: client ID -> endpoint.
        recorder: optional callback receiving the raw bytes of every message (for audits).
        failure_rate: probability that a client fails in a round (rounds >= 1): it receives
            the round's messages and does its work, but its replies never arrive, as when a
            node crashes mid-round. The decision is drawn once per (round, client) with
            ``failure_seed``, so a multi-exchange round loses the client for the whole round.
            ``send_and_receive`` then returns only the replies that arrived (in order).
        failure_seed: seed of those draws.
        fail_at: explicit ``(round, client)`` failures on top of the random ones (tests that replay
            one failure on several transports).
    """

    def __init__(
        self,
        clients: dict[str, ClientEndpoint],
        recorder: Callable[[bytes], None] | None = None,
        failure_rate: float = 0.0,
        failure_seed: int = 0,
        fail_at: Iterable[tuple[int, str]] = (),
    ):
        if not 0.0 <= failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), got {failure_rate}")
        self.clients = clients
        self.log = CommLog()
        self.recorder = recorder
        self.failure_rate = float(failure_rate)
        self._failure_rng = np.random.default_rng(failure_seed)
        self._failed: dict[tuple[int, str], bool] = {}
        self.failures: list[tuple[int, str]] = []
        self.fail_at = {(int(r), str(c)) for r, c in fail_at}
        self.strikes = Strikes()

    def get_state(self) -> dict:
        """JSON-able state for checkpoints: the log and the failure draws so far."""
        return {
            "log": [[e.round, e.kind, e.sender, e.receiver, e.nbytes] for e in self.log.entries],
            "failed": [[r, c, v] for (r, c), v in self._failed.items()],
            "failures": [list(f) for f in self.failures],
            "failure_rng": self._failure_rng.bit_generator.state,
            "strikes": self.strikes.get_state(),
        }

    def set_state(self, state: dict) -> None:
        """Restore what :meth:`get_state` returned."""
        self.log = CommLog([LogEntry(*e) for e in state["log"]])
        self._failed = {(int(r), str(c)): bool(v) for r, c, v in state["failed"]}
        self.failures = [(int(r), str(c)) for r, c in state["failures"]]
        self._failure_rng.bit_generator.state = state["failure_rng"]
        self.strikes.set_state(state.get("strikes", {}))

    def fails(self, rnd: int, client_id: str) -> bool:
        """Whether ``client_id`` fails in round ``rnd`` (drawn once, then remembered)."""
        if rnd < 1:
            return False
        if (rnd, client_id) in self.fail_at:
            if (rnd, client_id) not in self._failed:
                self._failed[(rnd, client_id)] = True
                self.failures.append((rnd, client_id))
            return True
        if self.failure_rate == 0.0:
            return False
        key = (rnd, client_id)
        if key not in self._failed:
            self._failed[key] = bool(self._failure_rng.random() < self.failure_rate)
            if self._failed[key]:
                self.failures.append(key)
        return self._failed[key]

    @property
    def client_ids(self) -> list[str]:
        """The client IDs of ``clients``, in their order."""
        return list(self.clients)

    def _cross(self, msg: Message) -> Message:
        """``msg`` as the other side reads it: encoded and counted, then decoded (from the encoded
        pieces, :func:`~hybridfl.runtime.messages.decode_parts`, unless a recorder wants the bytes)."""
        head, bodies = encode_parts(msg)
        if self.recorder is not None:
            raw = b"".join([head, *bodies])
            self.log.add(msg, len(raw))
            self.recorder(raw)
            return decode(raw)
        self.log.add(msg, len(head) + sum(memoryview(b).nbytes for b in bodies))
        return decode_parts(head, bodies)

    def send_and_receive(self, messages: Iterable[Message]) -> list[Message]:
        """Deliver each message to its client's :meth:`~ClientEndpoint.handle` (both directions
        encoded, logged and decoded) and return the replies, in order, without those of the clients
        that fail this round (:meth:`fails`), of the clients dropped for the run, and the bad ones
        (a reply under another client's name or one that does not encode: :class:`Strikes`). An
        exception a client raises propagates (the clients here are this process's own objects).

        Raises:
            KeyError: a message names a client that is not in ``clients``.
        """
        replies = []
        for msg in messages:
            if msg.receiver not in self.clients:
                raise KeyError(f"no client named {msg.receiver!r}")
            if msg.receiver in self.strikes.dropped:
                continue  # dropped for the run: not asked again, its reply is missing
            reply = self.clients[msg.receiver].handle(self._cross(msg))
            if self.fails(msg.round, msg.receiver):
                continue  # the client crashed before its reply left: nothing arrives
            why = _misaddressed(reply, msg)
            if not why:
                try:
                    reply = self._cross(reply)
                except (HybridFLError, TypeError) as e:  # MessageError, or a value the codec cannot carry
                    why = f"its reply does not encode ({e})"
            if why:
                self.strikes.add(msg.receiver, msg.round, msg.kind, why)
                continue
            replies.append(reply)
        return replies


def _misaddressed(reply: object, msg: Message) -> str:
    """Why ``reply`` cannot be ``msg.receiver``'s answer to ``msg`` ("" if it can): not a message,
    or sent under another name or to someone other than the sender of ``msg``."""
    if not isinstance(reply, Message):
        return f"its reply is a {type(reply).__name__}, not a message"
    if reply.sender != msg.receiver:
        return f"its reply is signed {str(reply.sender)[:64]!r}, not {msg.receiver!r}"
    if reply.receiver != msg.sender:
        return f"its reply is addressed to {str(reply.receiver)[:64]!r}, not {msg.sender!r}"
    return ""
