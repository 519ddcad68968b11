"""Sample-ID lists of the plaintext alignment (``alignment: plaintext``, the paper's setting).

A client sends its IDs in ``hyfdca.hello`` as one byte string (:func:`pack_ids`: each ID in
UTF-8 followed by a NUL byte), in the message's body: no JSON list in its header, which took 4-6 ms
to encode and decode per 20,000 IDs and capped a client at about 290,000 IDs (the header's
limit); the server reads it back with :func:`unpack_ids`. Clients whose lists are equal share one list object, so that the server's layout
(:func:`~hybridfl.algorithms.hyfdca.align.plaintext_segments`,
:meth:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer.setup`) passes once over each distinct
list: a grid partition's clients of one sample group hold the same samples in the same order
(on MNIST's 3 x 3 grid, three distinct lists of 20,000 IDs for nine clients)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hybridfl.errors import DataError
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError

END = "\x00"
"""What follows each ID in :func:`pack_ids`'s bytes (an ID cannot hold it)."""


def pack_ids(ids: Sequence[str]) -> bytes:
    """The IDs ``(n,)`` as one byte string: each in UTF-8 followed by :data:`END`.

    Raises:
        DataError: an ID holds a NUL character or is not encodable as UTF-8 (one sentence, no ID).
    """
    text = END.join(ids) + END if len(ids) else ""
    if text.count(END) != len(ids):
        raise DataError("a sample ID holds a NUL character, which the plaintext alignment cannot send.")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError("a sample ID is not encodable as UTF-8, which the plaintext alignment needs.") from None


def unpack_ids(msg: Message, key: str) -> list[str]:
    """The IDs of :func:`pack_ids`'s bytes ``msg.payload[key]``, checked: bytes, UTF-8, each ID
    ended, no repeats.

    Raises:
        PayloadError: missing, not bytes, not UTF-8, not ended by a NUL, or a repeated ID.
    """
    v = msg.payload.get(key)
    if not isinstance(v, (bytes, bytearray)):
        raise PayloadError(msg, key, "missing or not bytes" if v is None else f"of type {type(v).__name__}, not bytes")
    try:
        text = bytes(v).decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError(msg, key, "not UTF-8") from None
    if text and not text.endswith(END):
        raise PayloadError(msg, key, "not a list of NUL-ended IDs")
    ids = text[:-1].split(END) if text else []
    if len(set(ids)) != len(ids):
        raise PayloadError(msg, key, "holding a repeated value")
    return ids


def shared_lists(holdings: Mapping[str, Sequence[str]]) -> dict[str, Sequence[str]]:
    """``holdings`` (client -> its sample IDs) with each client's IDs replaced by the first earlier
    client's object when the two are equal, item by item in order (a grid's clients of one sample
    group hold the same samples): the plaintext alignment then passes once over each distinct list.
    A list differs from another at its first unequal item, so the checks cost little."""
    out: dict[str, Sequence[str]] = {}
    distinct: list[Sequence[str]] = []
    for c, ids in holdings.items():
        for other in distinct:
            if other is ids or (len(other) == len(ids) and _equal(other, ids)):
                out[c] = other
                break
        else:
            distinct.append(ids)
            out[c] = ids
    return out


def _equal(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two ID sequences (lists or arrays) are equal item by item, as strings."""
    if isinstance(a, list) and isinstance(b, list):
        return a == b
    return bool(np.array_equal(np.asarray(a).astype(str), np.asarray(b).astype(str)))
