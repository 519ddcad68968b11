"""Transports: how server-side steps reach client-side steps, and the communication log.

Server-side code never calls a client directly: it builds :class:`Message` objects and calls
``transport.send_and_receive(messages)``, which returns the replies (the shape of Flower's
``grid.send_and_receive``). :class:`InProcessTransport` runs the clients in this process,
encoding and decoding every message and logging its size; the Flower runtime provides another
transport with the same method, so the algorithm code is the same in both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hybridfl.runtime.messages import Message, decode, encode


class ClientEndpoint(Protocol):
    """Client-side steps: answer one message with one message."""

    def handle(self, msg: Message) -> Message: ...


class Transport(Protocol):
    """Delivers server messages to clients and returns the replies that arrive, in the same
    order (a client that fails returns nothing: server-side steps must not assume every reply)."""

    def send_and_receive(self, messages: list[Message]) -> list[Message]: ...


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
        self.entries.append(LogEntry(msg.round, msg.kind, msg.sender, msg.receiver, nbytes))

    @property
    def bytes_total(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def messages_total(self) -> int:
        return len(self.entries)

    def bytes_in_round(self, rnd: int) -> int:
        return sum(e.nbytes for e in self.entries if e.round == rnd)

    def per_client(self, server: str = "server") -> dict[str, dict[str, int]]:
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
    """

    def __init__(
        self,
        clients: dict[str, ClientEndpoint],
        recorder: Callable[[bytes], None] | None = None,
        failure_rate: float = 0.0,
        failure_seed: int = 0,
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

    def get_state(self) -> dict:
        """JSON-able state for checkpoints: the log and the failure draws so far."""
        return {
            "log": [[e.round, e.kind, e.sender, e.receiver, e.nbytes] for e in self.log.entries],
            "failed": [[r, c, v] for (r, c), v in self._failed.items()],
            "failures": [list(f) for f in self.failures],
            "failure_rng": self._failure_rng.bit_generator.state,
        }

    def set_state(self, state: dict) -> None:
        """Restore what :meth:`get_state` returned."""
        self.log = CommLog([LogEntry(*e) for e in state["log"]])
        self._failed = {(int(r), str(c)): bool(v) for r, c, v in state["failed"]}
        self.failures = [(int(r), str(c)) for r, c in state["failures"]]
        self._failure_rng.bit_generator.state = state["failure_rng"]

    def fails(self, rnd: int, client_id: str) -> bool:
        """Whether ``client_id`` fails in round ``rnd`` (drawn once, then remembered)."""
        if self.failure_rate == 0.0 or rnd < 1:
            return False
        key = (rnd, client_id)
        if key not in self._failed:
            self._failed[key] = bool(self._failure_rng.random() < self.failure_rate)
            if self._failed[key]:
                self.failures.append(key)
        return self._failed[key]

    @property
    def client_ids(self) -> list[str]:
        return list(self.clients)

    def _cross(self, msg: Message) -> Message:
        raw = encode(msg)
        self.log.add(msg, len(raw))
        if self.recorder is not None:
            self.recorder(raw)
        return decode(raw)

    def send_and_receive(self, messages: Iterable[Message]) -> list[Message]:
        replies = []
        for msg in messages:
            if msg.receiver not in self.clients:
                raise KeyError(f"no client named {msg.receiver!r}")
            reply = self.clients[msg.receiver].handle(self._cross(msg))
            if self.fails(msg.round, msg.receiver):
                continue  # the client crashed before its reply left: nothing arrives
            replies.append(self._cross(reply))
        return replies
