"""Messages between the server and the clients, and their byte codec.

Every value that crosses between a client and the server is a :class:`Message` with a sender, a
receiver, a round and a payload, so that a run can report rounds, messages and bytes per client and
a test can check on the message log that no raw feature value or label is ever sent. The simulation
encodes every message to bytes with :func:`encode` and decodes it on the other side, so the
counted size is the size of real bytes and no object either side could change is shared between
them (in process the bytes stay in their pieces, :func:`encode_parts` and :func:`decode_parts`:
an immutable ``bytes`` value is handed over as it is, everything else is copied).

Payload values may be NumPy arrays, ``bytes`` (e.g. ciphertexts), ``int``, ``float``, ``bool``,
``str``, or lists of ``str``/numbers (sent in the JSON header).

Wire format: ``[4-byte big-endian header length][UTF-8 JSON header][raw array/bytes bodies]``.

The header is bounded before it is parsed: at most :data:`MAX_HEADER_BYTES` bytes and at most
:data:`MAX_HEADER_ITEMS` JSON values (counted by its commas), so a hostile header cannot make the
receiver build millions of Python objects (6-9x its size in memory) before any check; arrays and
byte strings travel in the body, whose decoded size equals its byte size.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import Any

import numpy as np

from hybridfl.errors import MessageError

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_ITEMS",
    "MAX_MESSAGE_BYTES",
    "SERVER",
    "Message",
    "MessageError",
    "decode",
    "decode_parts",
    "encode",
    "encode_parts",
    "pack_arrays",
    "unpack_arrays",
]

SERVER = "server"
"""The name of the server (the coordinator, in FedBCD) as a message sender or receiver."""

MAX_MESSAGE_BYTES = 2 * 1024**3
"""The largest message :func:`encode` writes and :func:`decode` reads (2 GiB), in bytes."""

MAX_HEADER_BYTES = 8 * 1024**2
"""The largest JSON header :func:`encode` writes and :func:`decode` parses (8 MiB), in bytes."""

MAX_HEADER_ITEMS = 300_000
"""The most commas a header may hold (so at most about as many JSON values: list items, payload
values and body entries together); checked on the raw bytes before parsing. Long vectors belong in
the body as arrays or bytes (HyFDCA's plain alignment sends its sample IDs as one byte string,
:func:`hybridfl.algorithms.hyfdca.idlists.pack_ids`)."""

_HEADER_KEYS = frozenset({"kind", "from", "to", "round", "v", "e"})
_ENTRY_KEYS = {
    "a": frozenset({"k", "t", "d", "s", "o", "n"}),  # array: dtype, shape
    "b": frozenset({"k", "t", "o", "n"}),  # bytes
    "l": frozenset({"k", "t", "i", "o", "n"}),  # item i of a list of bytes
}
_ENTRY_INTS = {t: tuple(sorted(keys & {"o", "n", "i"})) for t, keys in _ENTRY_KEYS.items()}
"""Per entry type, its integer fields (exactly ``int``: JSON's integers; a bool is not one)."""
_DTYPE_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex numbers
_MAX_DIMS = 32


@dataclass
class Message:
    """One exchange: ``kind`` (e.g. ``"hyfem.fit"``), sender, receiver, round, payload."""

    kind: str
    sender: str
    receiver: str
    round: int
    payload: dict[str, Any] = field(default_factory=dict)

    def reply(self, kind: str | None = None, **payload: Any) -> Message:
        """A message back to the sender of this one, in the same round."""
        return Message(kind or self.kind, self.receiver, self.sender, self.round, dict(payload))


def encode(msg: Message) -> bytes:
    """Serialise a message to bytes (see module docstring for the format): the join of
    :func:`encode_parts`.

    Raises:
        TypeError, MessageError: as :func:`encode_parts`.
    """
    head, bodies = encode_parts(msg)
    return b"".join([head, *bodies])


def encode_parts(msg: Message) -> tuple[bytes, list[Any]]:
    """:func:`encode`'s bytes in pieces, not joined: the 4-byte header length and the header,
    then the bodies (each array's bytes as a view of a contiguous copy or of the array itself,
    each ``bytes`` value as it is), in the order of the header's entries.

    Raises:
        TypeError: for a payload value of an unsupported type or an array of a dtype other than
            numeric or bool (names the key).
        MessageError: the message would be larger than :data:`MAX_MESSAGE_BYTES`, or its header over
            :data:`MAX_HEADER_BYTES` or :data:`MAX_HEADER_ITEMS` (send long vectors as arrays).
    """
    entries: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    bodies: list[Any] = []  # bytes-like views of the bodies (encode copies them once, by its join)
    offset = 0
    for key, v in msg.payload.items():
        t = type(v)
        if t in _SCALAR_TYPES or v is None:  # the common values first, by their exact type
            values[key] = v
            continue
        if isinstance(v, list) and v and isinstance(v[0], _BYTES) and all_instances(v, _BYTES):  # ciphertexts
            for j, x in enumerate(v):
                bodies.append(x)
                entries.append({"k": key, "t": "l", "i": j, "o": offset, "n": len(x)})
                offset += len(x)
            continue
        if isinstance(v, np.ndarray):
            arr = np.ascontiguousarray(v)
            if arr.dtype == object:
                raise TypeError(f"payload entry {key!r} of message {msg.kind!r} is an object array.")
            if arr.dtype.kind not in _DTYPE_KINDS or arr.dtype.fields is not None:
                raise TypeError(
                    f"payload entry {key!r} of message {msg.kind!r} has dtype {arr.dtype}, not a numeric or bool type."
                )
            raw = memoryview(arr.reshape(-1).view(np.uint8))  # the bytes of tobytes(), not copied
            entries.append({"k": key, "t": "a", "d": arr.dtype.str, "s": list(arr.shape), "o": offset, "n": len(raw)})
        elif isinstance(v, (bytes, bytearray)):
            raw = v
            entries.append({"k": key, "t": "b", "o": offset, "n": len(raw)})
        elif isinstance(v, (bool, int, float, str, np.integer, np.floating)):
            values[key] = v.item() if isinstance(v, (np.integer, np.floating)) else v
            continue
        elif isinstance(v, (list, tuple)) and all_instances(v, _SCALARS):
            values[key] = list(v)
            continue
        else:
            raise TypeError(f"payload entry {key!r} of message {msg.kind!r} has unsupported type {type(v).__name__}.")
        bodies.append(raw)
        offset += len(raw)
    header = "".join(
        _HEADER_ENCODE(
            {"kind": msg.kind, "from": msg.sender, "to": msg.receiver, "round": msg.round, "v": values, "e": entries},
            0,
        )
    ).encode()
    _check_header_size(len(header), header.count(b","), msg.kind)
    size = 4 + len(header) + offset
    if size > MAX_MESSAGE_BYTES:
        raise MessageError(f"message {msg.kind!r} would be {size} bytes, over the limit of {MAX_MESSAGE_BYTES} bytes.")
    return struct.pack(">I", len(header)) + header, bodies


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Inverse of :func:`encode` (arrays are returned as writable copies).

    The bytes are checked before anything is built from them: the size limit
    (:data:`MAX_MESSAGE_BYTES`), the header's size and item count (:data:`MAX_HEADER_BYTES`,
    :data:`MAX_HEADER_ITEMS`, before the JSON is parsed), a JSON object header with exactly the keys and types
    :func:`encode` writes, entries that tile the body exactly in order (no negative offset, no
    overlap, nothing past the end, no trailing bytes), numeric or bool array dtypes whose byte size
    is ``prod(shape) * itemsize``. The decoded values therefore never take more memory than the
    input.

    Raises:
        MessageError: the bytes are not a well-formed message (one sentence, without the data).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageError(f"a message must be bytes, got {type(data).__name__}.")
    try:
        mv = memoryview(data).cast("B")
    except (TypeError, ValueError):
        raise MessageError("a message must be a contiguous byte buffer.") from None
    h, base = _checked_header(mv, mv.nbytes)
    return _payload(h, mv.nbytes - base, lambda j, o, n: mv[base + o : base + o + n])


def decode_parts(head: bytes, bodies: list[Any]) -> Message:
    """:func:`decode` of the join of :func:`encode_parts`'s pieces, without joining them: the same
    checks (the header's size, items and keys; entries that tile the bodies, now also one body
    per entry of exactly its length) and the same message, but a ``bytes`` body is returned as
    the same object (it cannot change) instead of a copy; arrays are still writable copies, and a
    mutable body (``bytearray``, a view) is copied. The in-process transport's path
    (:class:`~hybridfl.runtime.transport.InProcessTransport`): a 42 MB vector of the HyFDCA setup is
    then copied once, by its encoding, not three times.

    Raises:
        MessageError: the pieces are not a well-formed message (one sentence, without the data).
    """
    try:
        sizes = [memoryview(b).nbytes for b in bodies]
        mv = memoryview(head).cast("B")
    except (TypeError, ValueError):
        raise MessageError("a message piece must be a contiguous byte buffer.") from None
    h, base = _checked_header(mv, mv.nbytes + sum(sizes))
    if base != mv.nbytes:
        raise MessageError("the message's header piece is not its 4-byte length and header.")
    if len(h["e"]) != len(bodies):
        raise MessageError(f"the message has {len(bodies)} bodies for {len(h['e'])} entries.")

    def body(j: int, o: int, n: int) -> Any:
        if sizes[j] != n:
            raise MessageError(f"entry {j} of the message has a body of another length.")
        b = bodies[j]
        return b if type(b) is bytes else memoryview(b).cast("B")

    return _payload(h, sum(sizes), body)


def _checked_header(mv: memoryview, size: int) -> tuple[dict[str, Any], int]:
    """The parsed, checked header at the start of ``mv`` of a message of ``size`` bytes in all,
    and where its bodies start.

    Raises:
        MessageError: the size limit, a truncated message, or a header :func:`_header` refuses.
    """
    if size > MAX_MESSAGE_BYTES:
        raise MessageError(f"the message is {size} bytes, over the limit of {MAX_MESSAGE_BYTES} bytes.")
    if size < 4 or mv.nbytes < 4:
        raise MessageError(f"the message is truncated: {size} bytes, shorter than its 4-byte header length.")
    (hlen,) = struct.unpack(">I", mv[:4])
    if hlen > min(size, mv.nbytes) - 4:
        raise MessageError(f"the message is truncated: its header says {hlen} bytes but only {size - 4} follow.")
    _check_header_size(hlen, None, None)
    raw_header = mv[4 : 4 + hlen]
    _check_header_size(hlen, bytes(raw_header).count(b","), None)
    return _header(raw_header), 4 + hlen


def _payload(h: dict[str, Any], body_len: int, body: Any) -> Message:
    """The message of the checked header ``h`` whose entries' bodies (``body(j, offset,
    length)``, ``body_len`` bytes in all) tile the body exactly in order.

    Raises:
        MessageError: a negative, overlapping, gapped, repeated or out-of-order entry, one past the
            end, trailing bytes, or an array :func:`_array` refuses.
    """
    payload: dict[str, Any] = dict(h["v"])
    lists: dict[str, int] = {}
    cursor = 0
    for j, e in enumerate(h["e"]):
        o, n = e["o"], e["n"]
        if o < 0 or n < 0:
            raise MessageError(f"entry {j} of the message has a negative offset or length.")
        if o + n > body_len:
            raise MessageError(f"entry {j} of the message runs past the end of its {body_len}-byte body (truncated?).")
        if o < cursor:
            raise MessageError(f"entry {j} of the message overlaps the entry before it.")
        if o > cursor:
            raise MessageError(f"entry {j} of the message leaves a gap after the entry before it.")
        cursor = o + n
        k, t = e["k"], e["t"]
        if t == "l":
            if k in payload and k not in lists:
                raise MessageError(f"entry {j} of the message repeats a payload key.")
            if e["i"] != lists.get(k, 0):
                raise MessageError(f"entry {j} of the message is out of order in its list.")
            lists[k] = e["i"] + 1
        elif k in payload:
            raise MessageError(f"entry {j} of the message repeats a payload key.")
        raw = body(j, o, n)
        if t == "a":
            payload[k] = _array(j, e, raw)
        elif t == "b":
            payload[k] = raw if type(raw) is bytes else bytes(raw)
        else:
            payload.setdefault(k, []).append(raw if type(raw) is bytes else bytes(raw))
    if cursor != body_len:
        raise MessageError(f"the message has {body_len - cursor} trailing bytes after its last entry.")
    return Message(h["kind"], h["from"], h["to"], h["round"], payload)


def _check_header_size(nbytes: int, commas: int | None, kind: str | None) -> None:
    """Refuse a header over :data:`MAX_HEADER_BYTES` bytes or with more than
    :data:`MAX_HEADER_ITEMS` commas (``commas`` None: the size only)."""
    what = f"message {kind!r}'s header" if kind is not None else "the message header"
    if nbytes > MAX_HEADER_BYTES:
        raise MessageError(f"{what} is {nbytes} bytes, over the limit of {MAX_HEADER_BYTES} bytes.")
    if commas is not None and commas > MAX_HEADER_ITEMS:
        raise MessageError(
            f"{what} holds about {commas + 1} values, over the limit of {MAX_HEADER_ITEMS} (long lists go in the "
            "body as arrays)."
        )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise MessageError("the message header repeats a key in a JSON object.")
    return d


_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""The header's encoder (``json.dumps`` with compact separators), built once: ``dumps`` with
arguments builds one per call."""


def _make_header_encode():
    """The C encoder that ``_HEADER_ENCODER.encode`` builds anew on every call (its settings:
    compact separators, ASCII, ``NaN`` allowed, keys in insertion order), built once and without
    the check for circular references (a header is a fresh tree of dicts, lists and scalars);
    ``_HEADER_ENCODER``'s own pure-Python iterator where the C module is missing. Called as
    ``encode(obj, 0)``, it returns the JSON text's chunks."""
    enc = _HEADER_ENCODER
    if c_make_encoder is None:  # pragma: no cover - CPython has the C encoder
        return lambda obj, _level: enc.iterencode(obj, _one_shot=False)
    return c_make_encoder(
        None, enc.default, encode_basestring_ascii, None, enc.key_separator, enc.item_separator, False, False, True
    )


_HEADER_ENCODE = _make_header_encode()

_HEADER_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)
"""The header's decoder (``json.loads`` refusing repeated keys), built once."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_SCALARS = (str, int, float, bool)
_SCALAR_TYPES = frozenset(_SCALARS)
"""Exactly these types go in the header as they are (subclasses, NumPy's scalars among them, take
the checked path)."""
_BYTES = (bytes, bytearray)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, _SCALARS)


def all_instances(items: Any, types: tuple[type, ...]) -> bool:
    """``all(isinstance(x, types) for x in items)``, decided at C speed (one set of the items'
    types) when every item's type is one of ``types`` exactly, as for a decoded JSON list or a
    list of sample IDs, and item by item otherwise (subclasses: ``bool`` of ``int``, NumPy's
    ``float64`` of ``float``)."""
    return set(map(type, items)) <= set(types) or all(isinstance(x, types) for x in items)


def _header(raw: memoryview) -> dict[str, Any]:
    """The parsed, type-checked JSON header (see :func:`encode` for its keys)."""
    try:
        text = str(raw, "utf-8")
        try:  # the C scanner straight away (what ``decode`` calls after its whitespace handling)
            h, end = _HEADER_DECODER.scan_once(text, 0)
        except StopIteration:
            h, end = None, -1
        if end != len(text):  # leading or trailing whitespace, or not JSON: the full decoder decides
            h = _HEADER_DECODER.decode(text)
    except MessageError:
        raise
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise MessageError("the message header is not valid UTF-8 JSON.") from None
    if type(h) is not dict or h.keys() != _HEADER_KEYS:
        raise MessageError(f"the message header must be a JSON object with exactly the keys {sorted(_HEADER_KEYS)}.")
    if not (isinstance(h["kind"], str) and isinstance(h["from"], str) and isinstance(h["to"], str)):
        raise MessageError("the message header's kind, from and to must be strings.")
    if not _is_int(h["round"]):
        raise MessageError("the message header's round must be an integer.")
    if not isinstance(h["v"], dict):
        raise MessageError("the message header's values (v) must be a JSON object.")
    for v in h["v"].values():
        if not (
            v is None or type(v) in _SCALAR_TYPES or (isinstance(v, list) and all_instances(v, _SCALARS))
        ):  # the types JSON gives: exact (a dict or a nested list is none of them)
            raise MessageError("a value in the message header is not a number, string, bool, null or flat list.")
    if not isinstance(h["e"], list):
        raise MessageError("the message header's entries (e) must be a JSON list.")
    for j, e in enumerate(h["e"]):
        keys = _ENTRY_KEYS.get(e.get("t")) if type(e) is dict and type(e.get("t")) is str else None
        if keys is None or e.keys() != keys:
            raise MessageError(f"entry {j} of the message header does not have the keys of an array, bytes or list.")
        if type(e["k"]) is not str or not all(type(e[x]) is int for x in _ENTRY_INTS[e["t"]]):
            raise MessageError(f"entry {j} of the message header has a non-string key or a non-integer offset/length.")
    return h


def _array(j: int, e: dict[str, Any], raw: memoryview) -> np.ndarray:
    """Entry ``j`` (an array entry of :func:`encode`) as a writable copy of ``raw``."""
    d, shape = e["d"], e["s"]
    if not isinstance(d, str) or len(d) > 16:
        raise MessageError(f"entry {j} of the message has an invalid dtype.")
    try:
        dt = np.dtype(d)
    except (TypeError, ValueError, SyntaxError):
        raise MessageError(f"entry {j} of the message has an invalid dtype.") from None
    if dt.kind not in _DTYPE_KINDS or dt.fields is not None or dt.subdtype is not None or dt.str != d:
        raise MessageError(f"entry {j} of the message has a dtype that is not a plain numeric or bool type.")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_DIMS
        or not all(_is_int(s) and 0 <= s <= MAX_MESSAGE_BYTES for s in shape)
    ):
        raise MessageError(f"entry {j} of the message has an invalid shape.")
    if math.prod(shape) * dt.itemsize != e["n"]:
        raise MessageError(f"entry {j} of the message has a byte length that does not match its shape and dtype.")
    try:
        return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    except ValueError:
        raise MessageError(f"entry {j} of the message has an invalid shape.") from None


def pack_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: a}`` -> ``{prefix + name: a}`` for putting a group of arrays into a payload."""
    return {prefix + k: v for k, v in arrays.items()}


def unpack_arrays(prefix: str, payload: dict[str, Any]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_arrays`: the payload entries under ``prefix`` with it removed."""
    return {k[len(prefix) :]: v for k, v in payload.items() if k.startswith(prefix) and isinstance(v, np.ndarray)}
