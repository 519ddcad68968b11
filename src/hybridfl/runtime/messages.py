"""Messages between the server and the clients, and their byte codec.

Every value that crosses between a client and the server is a :class:`Message` with a sender, a
receiver, a round and a payload (SPEC.md "Communication and privacy accounting"). The simulation
encodes every message to bytes with :func:`encode` and decodes it on the other side, so the
counted size is the size of real bytes and no Python object is shared between the two sides.

Payload values may be NumPy arrays, ``bytes`` (e.g. ciphertexts), ``int``, ``float``, ``bool``,
``str``, or lists of ``str``/numbers (sent in the JSON header).

Wire format: ``[4-byte big-endian header length][UTF-8 JSON header][raw array/bytes bodies]``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SERVER = "server"
"""The name of the server (the coordinator, in FedBCD) as a message sender or receiver."""


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
    """Serialise a message to bytes (see module docstring for the format).

    Raises:
        TypeError: for a payload value of an unsupported type (names the key).
    """
    entries: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    bodies: list[bytes] = []
    offset = 0
    for key, v in msg.payload.items():
        if isinstance(v, np.ndarray):
            arr = np.ascontiguousarray(v)
            if arr.dtype == object:
                raise TypeError(f"payload entry {key!r} of message {msg.kind!r} is an object array.")
            raw = arr.tobytes()
            entries.append({"k": key, "t": "a", "d": arr.dtype.str, "s": list(arr.shape), "o": offset, "n": len(raw)})
        elif isinstance(v, (bytes, bytearray)):
            raw = bytes(v)
            entries.append({"k": key, "t": "b", "o": offset, "n": len(raw)})
        elif isinstance(v, (bool, int, float, str, np.integer, np.floating)) or v is None:
            values[key] = v.item() if isinstance(v, (np.integer, np.floating)) else v
            continue
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            values[key] = list(v)
            continue
        elif isinstance(v, list) and all(isinstance(x, (bytes, bytearray)) for x in v):
            for j, x in enumerate(v):
                bodies.append(bytes(x))
                entries.append({"k": key, "t": "l", "i": j, "o": offset, "n": len(x)})
                offset += len(x)
            if not v:
                values[key] = []
            continue
        else:
            raise TypeError(f"payload entry {key!r} of message {msg.kind!r} has unsupported type {type(v).__name__}.")
        bodies.append(raw)
        offset += len(raw)
    header = json.dumps(
        {"kind": msg.kind, "from": msg.sender, "to": msg.receiver, "round": msg.round, "v": values, "e": entries},
        separators=(",", ":"),
    ).encode()
    return struct.pack(">I", len(header)) + header + b"".join(bodies)


def decode(data: bytes) -> Message:
    """Inverse of :func:`encode` (arrays are returned as writable copies)."""
    (hlen,) = struct.unpack(">I", data[:4])
    h = json.loads(data[4 : 4 + hlen])
    base = 4 + hlen
    payload: dict[str, Any] = dict(h["v"])
    for e in h["e"]:
        raw = data[base + e["o"] : base + e["o"] + e["n"]]
        if e["t"] == "a":
            payload[e["k"]] = np.frombuffer(raw, dtype=np.dtype(e["d"])).reshape(e["s"]).copy()
        elif e["t"] == "b":
            payload[e["k"]] = bytes(raw)
        else:
            payload.setdefault(e["k"], []).append(bytes(raw))
    return Message(h["kind"], h["from"], h["to"], int(h["round"]), payload)


def pack_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: a}`` -> ``{prefix + name: a}`` for putting a group of arrays into a payload."""
    return {prefix + k: v for k, v in arrays.items()}


def unpack_arrays(prefix: str, payload: dict[str, Any]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_arrays`: the payload entries under ``prefix`` with it removed."""
    return {k[len(prefix) :]: v for k, v in payload.items() if k.startswith(prefix) and isinstance(v, np.ndarray)}
