"""The Flower side of our messages: how one of our encoded messages rides in a Flower ``Message``
(:func:`pack`, :func:`unpack_meta`), the message kinds of a run's start (hello, setup), and the
per-message log of our counted bytes against Flower's serialized bytes (:class:`WireLog`).

Every message of an algorithm is carried as one ``bytes`` value of a Flower ``ConfigRecord`` in a
Flower ``Message`` of type ``query.hybridfl``; an algorithm message also carries the client's
sequence number and the highest number whose reply the server received (outside our counted bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict

MESSAGE_TYPE = "query.hybridfl"
RECORD = "hybridfl"
KEY = "msg"
SEQ = "seq"
ACKED = "acked"
HELLO = "deploy.hello"
SETUP = "deploy.setup"
NODE_UNAVAILABLE = 5  # flwr.common.constant.ErrorCode.NODE_UNAVAILABLE
MESSAGE_UNAVAILABLE = 3  # flwr.common.constant.ErrorCode.MESSAGE_UNAVAILABLE: a reply listed, its objects never came


def pack(raw: bytes, seq: int | None = None, acked: int | None = None) -> RecordDict:
    """Our encoded message bytes -> the content of a Flower Message. An algorithm message also
    carries, outside our counted bytes, the client's sequence number ``seq`` and ``acked``: the
    highest number whose reply the server received (messages between were given up)."""
    rec = ConfigRecord({KEY: raw})
    if seq is not None:
        rec[SEQ] = int(seq)
    if acked is not None:
        rec[ACKED] = int(acked)
    return RecordDict({RECORD: rec})


def unpack_seq(content: RecordDict) -> tuple[bytes, int | None]:
    """Inverse of :func:`pack`: ``(our bytes, sequence number or None)``."""
    raw, seq, _ = unpack_meta(content)
    return raw, seq


def unpack_meta(content: RecordDict) -> tuple[bytes, int | None, int | None]:
    """Inverse of :func:`pack`: ``(our bytes, sequence number or None, acked or None)``.

    Raises:
        ValueError: no hybridfl message, or a ``seq``/``acked`` that is not a non-negative integer
            (one sentence; an untrusted sender's record is never cast blindly).
    """
    raw = unpack(content)
    return raw, _count(content[RECORD].get(SEQ), SEQ), _count(content[RECORD].get(ACKED), ACKED)


def _count(v: object, name: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"the hybridfl record's {name!r} is {type(v).__name__} {v!r:.40}, not a non-negative integer.")
    return int(v)


def unpack(content: RecordDict) -> bytes:
    """Inverse of :func:`pack`.

    Raises:
        ValueError: the Flower message does not carry a hybridfl message.
    """
    if RECORD not in content or KEY not in content[RECORD]:
        raise ValueError(
            f"the Flower message carries no {RECORD!r} record; it was not sent by a hybridfl ServerApp/ClientApp."
        )
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
    retry: bool = False


@dataclass
class WireLog:
    """Per message: our counted bytes and Flower's serialized bytes; per exchange: seconds."""

    entries: list[WireEntry] = field(default_factory=list)
    exchanges: list[dict] = field(default_factory=list)

    @property
    def wire_total(self) -> int:
        """Bytes of Flower's serialized objects over all messages (without RPC framing and TLS)."""
        return sum(e.wire for e in self.entries)
