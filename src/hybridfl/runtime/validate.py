"""Checks of received payloads: every message is untrusted.

A server checks every reply and a client every server message before using any value: the keys,
dtypes, exact shapes, finiteness, and counts against what is already known. A bad value raises
:class:`PayloadError`, one sentence naming the sender, the message kind and the field, never the
data. Server-side steps then treat the reply as missing (the algorithm's missing-reply policy
applies, exactly as for a failure); client-side steps refuse the message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import Message, all_instances


class PayloadError(ProtocolError):
    """A received payload is malformed or inconsistent (names sender, message kind and field)."""

    def __init__(self, msg: Message, field: str, problem: str):
        super().__init__(f"{msg.sender!r} sent {msg.kind!r} with {field!r} {problem}.")
        self.sender = msg.sender
        self.kind = msg.kind
        self.field = field


def _get(msg: Message, key: str) -> Any:
    if key not in msg.payload:
        raise PayloadError(msg, key, "missing")
    return msg.payload[key]


def array(msg: Message, key: str, shape: Sequence[int | None], kinds: str = "f", finite: bool = True) -> np.ndarray:
    """The array ``msg.payload[key]``, checked: an ndarray of a dtype kind in ``kinds`` (``f``
    float, ``i``/``u`` integers, ``b`` bool), of exactly ``shape`` (``None`` = any length on that
    axis) and, with ``finite``, without NaN or infinity.

    Raises:
        PayloadError: missing, not an array, another dtype kind, another shape, or non-finite.
    """
    v = _get(msg, key)
    if not isinstance(v, np.ndarray):
        raise PayloadError(msg, key, f"of type {type(v).__name__}, not an array")
    if v.dtype.kind not in kinds:
        raise PayloadError(msg, key, f"of dtype {v.dtype}, not of kind {kinds!r}")
    if v.ndim != len(shape) or any(s is not None and int(n) != int(s) for n, s in zip(v.shape, shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise PayloadError(msg, key, f"of shape {tuple(v.shape)}, expected {want}")
    if finite and v.dtype.kind in "fc" and not np.isfinite(v).all():
        raise PayloadError(msg, key, "holding NaN or infinite values")
    return v


def integer(msg: Message, key: str, low: int | None = None, high: int | None = None) -> int:
    """The integer ``msg.payload[key]`` within ``[low, high]`` (bools are not integers).

    Raises:
        PayloadError: missing, not an integer, or out of range.
    """
    v = _get(msg, key)
    if isinstance(v, np.integer):
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise PayloadError(msg, key, f"of type {type(v).__name__}, not an integer")
    if (low is not None and v < low) or (high is not None and v > high):
        raise PayloadError(msg, key, f"= {v}, outside [{low}, {high}]")
    return v


def number(msg: Message, key: str, low: float | None = None, high: float | None = None) -> float:
    """The finite number ``msg.payload[key]`` within ``[low, high]``.

    Raises:
        PayloadError: missing, not a number, non-finite, or out of range.
    """
    v = _get(msg, key)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise PayloadError(msg, key, f"of type {type(v).__name__}, not a number")
    f = float(v)
    if not np.isfinite(f):
        raise PayloadError(msg, key, "not finite")
    if (low is not None and f < low) or (high is not None and f > high):
        raise PayloadError(msg, key, f"= {f:g}, outside [{low}, {high}]")
    return f


def blobs(msg: Message, key: str, count: int, max_bytes: int | None = None) -> list[bytes]:
    """The list of ``count`` byte strings ``msg.payload[key]`` (ciphertexts), each non-empty and
    at most ``max_bytes`` long.

    Raises:
        PayloadError: missing, not a list of bytes, another length, or an empty/oversized item.
    """
    v = _get(msg, key)
    if not isinstance(v, list) or not all(isinstance(x, (bytes, bytearray)) for x in v):
        raise PayloadError(msg, key, "not a list of byte strings")
    if len(v) != count:
        raise PayloadError(msg, key, f"holding {len(v)} items, expected {count}")
    for x in v:
        if not x or (max_bytes is not None and len(x) > max_bytes):
            raise PayloadError(msg, key, f"holding an item of {len(x)} bytes")
    return [bytes(x) for x in v]


def strings(msg: Message, key: str, allowed: Sequence[str] | None = None) -> list[str]:
    """The list of strings ``msg.payload[key]``, without repeats, each in ``allowed`` if given.

    Raises:
        PayloadError: missing, not a list of strings, a repeat, or a value not allowed.
    """
    v = _get(msg, key)
    if not isinstance(v, list) or not all_instances(v, (str,)):  # 100,000 sample IDs at C speed
        raise PayloadError(msg, key, "not a list of strings")
    if len(set(v)) != len(v):
        raise PayloadError(msg, key, "holding a repeated value")
    if allowed is not None:
        ok = set(allowed)
        bad = [x for x in v if x not in ok]
        if bad:
            raise PayloadError(msg, key, f"holding the unknown value {bad[0]!r}")
    return list(v)


def only_keys(msg: Message, allowed: Sequence[str]) -> None:
    """Refuse a payload with a key outside ``allowed`` (a field nobody asked for).

    Raises:
        PayloadError: an unexpected key.
    """
    extra = sorted(set(msg.payload) - set(allowed))
    if extra:
        raise PayloadError(msg, extra[0], "not expected in this message")
