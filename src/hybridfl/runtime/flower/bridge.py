"""The bridge between our :class:`~hybridfl.runtime.messages.Message` and Flower's Message API.

Every message of an algorithm is encoded with our own codec (:func:`hybridfl.runtime.messages.encode`,
the bytes the in-process simulation counts) and carried as one ``bytes`` value of a Flower
``ConfigRecord`` in a Flower ``Message`` of type ``query.hybridfl``. Flower moves it from the
ServerApp through the SuperLink to the SuperNode of the receiving client and back.

:class:`FlowerTransport` implements our ``Transport`` protocol (``send_and_receive``) on a Flower
``Grid``, so the server classes of the algorithms run unchanged over Flower. It logs two sizes per
message: our counted bytes (``log``, a :class:`CommLog` exactly like the simulation's) and Flower's
serialized object bytes (``wire``: the sum of the deflated Message/RecordDict/ConfigRecord objects
Flower pushes and pulls, without gRPC/HTTP framing and TLS).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict

from hybridfl.runtime.messages import Message as HMessage
from hybridfl.runtime.messages import decode, encode
from hybridfl.runtime.transport import CommLog

MESSAGE_TYPE = "query.hybridfl"
RECORD = "hybridfl"
KEY = "msg"


def pack(raw: bytes) -> RecordDict:
    """Our encoded message bytes -> the content of a Flower Message."""
    return RecordDict({RECORD: ConfigRecord({KEY: raw})})


def unpack(content: RecordDict) -> bytes:
    """Inverse of :func:`pack`.

    Raises:
        ValueError: the Flower message does not carry a hybridfl message.
    """
    if RECORD not in content or KEY not in content[RECORD]:
        raise ValueError(f"the Flower message carries no {RECORD!r} record; it was not sent by a hybridfl ServerApp/ClientApp.")
    raw = content[RECORD][KEY]
    if not isinstance(raw, bytes):
        raise ValueError("the hybridfl record of the Flower message does not hold bytes.")
    return raw


def flower_nbytes(msg: Message) -> int:
    """Bytes of Flower's serialized form of ``msg``: the deflated objects of its object tree
    (Message, RecordDict, ConfigRecord), i.e. what Flower pushes/pulls, without RPC framing."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(o.deflate()) for o in get_all_nested_objects(msg).values())


@dataclass
class WireEntry:
    round: int
    kind: str
    sender: str
    receiver: str
    counted: int
    wire: int


@dataclass
class WireLog:
    """Per message: our counted bytes and Flower's serialized bytes; per exchange: seconds."""

    entries: list[WireEntry] = field(default_factory=list)
    exchanges: list[dict] = field(default_factory=list)

    @property
    def counted_total(self) -> int:
        return sum(e.counted for e in self.entries)

    @property
    def wire_total(self) -> int:
        return sum(e.wire for e in self.entries)


class FlowerTransport:
    """Our ``Transport`` on a Flower ``Grid``: push one Flower message per our message, pull replies.

    Args:
        grid: the ServerApp's ``Grid``.
        nodes: client ID -> Flower node ID (from the hello exchange).
        poll_interval: seconds between pulls for replies (Flower's own ``grid.send_and_receive``
            sleeps 3 s between pulls; the default here is 0.02 s).
        timeout: seconds to wait for all replies of one exchange before giving up.

    Raises (from :meth:`send_and_receive`):
        KeyError: a message for a client that is not connected.
        TimeoutError: some client did not answer within ``timeout`` (names them).
        RuntimeError: a ClientApp failed (carries Flower's error reason).
    """

    def __init__(self, grid, nodes: Mapping[str, int], poll_interval: float = 0.02, timeout: float = 600.0):
        self.grid = grid
        self.nodes = dict(nodes)
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.log = CommLog()
        self.wire = WireLog()

    @property
    def client_ids(self) -> list[str]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[HMessage], check_sender: bool = True) -> list[HMessage]:
        """Deliver ``messages`` (one Flower message each) and return the replies in the same order."""
        msgs = list(messages)
        t0 = time.perf_counter()
        out = []
        for m in msgs:
            if m.receiver not in self.nodes:
                raise KeyError(f"no connected client named {m.receiver!r} (connected: {', '.join(self.nodes)})")
            raw = encode(m)
            fm = Message(pack(raw), dst_node_id=self.nodes[m.receiver], message_type=MESSAGE_TYPE, group_id=str(m.round))
            self.log.add(m, len(raw))
            self.wire.entries.append(WireEntry(m.round, m.kind, m.sender, m.receiver, len(raw), flower_nbytes(fm)))
            out.append(fm)
        ids = list(self.grid.push_messages(out))
        if len(ids) != len(msgs) or any(not i for i in ids):
            raise RuntimeError("the SuperLink did not accept every message (a destination node may have disconnected).")
        index = {mid: k for k, mid in enumerate(ids)}
        replies: list[Message | None] = [None] * len(msgs)
        pending = set(ids)
        deadline = time.monotonic() + self.timeout
        while pending:
            for r in self.grid.pull_messages(list(pending)):
                k = index.get(r.metadata.reply_to_message_id)
                if k is None:
                    continue
                replies[k] = r
                pending.discard(r.metadata.reply_to_message_id)
            if not pending:
                break
            if time.monotonic() > deadline:
                late = [msgs[index[i]].receiver for i in pending]
                raise TimeoutError(f"no reply within {self.timeout:g} s from client(s) {', '.join(late)}.")
            time.sleep(self.poll_interval)
        result = []
        for m, r in zip(msgs, replies):
            assert r is not None
            if r.has_error():
                raise RuntimeError(f"the ClientApp of client {m.receiver!r} failed on {m.kind!r}: {r.error.reason}")
            raw = unpack(r.content)
            h = decode(raw)
            if check_sender and h.sender != m.receiver:
                raise RuntimeError(f"node {self.nodes[m.receiver]} answered as {h.sender!r}, expected {m.receiver!r}.")
            self.log.add(h, len(raw))
            self.wire.entries.append(WireEntry(h.round, h.kind, h.sender, h.receiver, len(raw), flower_nbytes(r)))
            result.append(h)
        self.wire.exchanges.append({"round": msgs[0].round if msgs else 0, "kind": msgs[0].kind if msgs else "",
                                    "messages": len(msgs), "seconds": time.perf_counter() - t0})
        return result
