"""The message side of secure aggregation (:mod:`hybridfl.privacy.secagg`), shared by HyFDCA's
primal shares and HyFEM's extractors: the checked fields a client takes from the server
(the peer table, a fresh exchange, an unmasking request) and the server's relay of the keys.

Every field is checked before use (:mod:`hybridfl.runtime.validate`) and a bad one is refused
with one :class:`~hybridfl.runtime.validate.PayloadError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

from hybridfl.errors import ProtocolError
from hybridfl.privacy.secagg import SecAggClient, check_public_key
from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError


def peer_table(publics: Mapping[str, bytes], blocks: Mapping[str, Sequence[str]], cid: str) -> dict:
    """The payload entries that tell ``cid`` the other clients' keys and blocks:
    ``secagg_peers`` (names), ``secagg_keys`` (32-byte keys), ``secagg_blocks`` (JSON lists)."""
    peers = [c for c in publics if c != cid]
    return {
        "secagg_peers": peers,
        "secagg_keys": [publics[c] for c in peers],
        "secagg_blocks": [json.dumps(list(blocks[c])) for c in peers],
    }


def set_peers(client: SecAggClient, msg: Message) -> None:
    """Give ``client`` the peer table of ``msg`` (:func:`peer_table`).

    Raises:
        PayloadError: lists of other lengths, a key that is not an X25519 public key, a blocks
            entry that is not a JSON list of names, its own name or key among the peers.
    """
    peers = validate.strings(msg, "secagg_peers")
    keys = validate.blobs(msg, "secagg_keys", len(peers), max_bytes=32)
    blocks = msg.payload.get("secagg_blocks")
    if not isinstance(blocks, list) or len(blocks) != len(peers) or not all(isinstance(b, str) for b in blocks):
        raise PayloadError(msg, "secagg_blocks", f"not a list of {len(peers)} strings")
    table = {}
    for cid, pk, bl in zip(peers, keys, blocks):
        try:
            names = json.loads(bl)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(b, str) for b in names):
            raise PayloadError(msg, "secagg_blocks", "holding an item that is not a JSON list of block names")
        table[cid] = (pk, names)
    try:
        client.set_peers(table)
    except ProtocolError as e:
        raise PayloadError(msg, "secagg_keys", f"refused ({e})") from None


def check_exchange(client: SecAggClient, msg: Message, cap: int | None = None) -> tuple[int, list[str]]:
    """The ``tag`` and ``peers`` of a masked exchange, checked before anything changes.

    Raises:
        PayloadError: ``tag`` not an integer above every tag ``client`` used, ``peers`` not the
            names of known peers of its roster (itself excluded, no repeats), or fewer clients than
            its threshold (:meth:`~hybridfl.privacy.secagg.SecAggClient.check_quorum`, ``cap``).
    """
    tag = validate.integer(msg, "tag", low=0, high=2**62)
    peers = validate.strings(msg, "peers")
    if tag <= client.last_tag:
        raise PayloadError(
            msg, "tag", f"refused (client {client.client_id!r} was asked to reuse secure-aggregation tag {tag})"
        )
    try:
        client.check_quorum(client.check_peers(peers), cap)
    except ProtocolError as e:
        raise PayloadError(msg, "peers", f"refused ({e})") from None
    return tag, peers


def correction(client: SecAggClient, msg: Message) -> np.ndarray:
    """An unmasking request (``tag``, ``dropped``): ``client``'s masks with the dropped clients of
    its last exchange, ``uint64`` (its dimension,).

    Raises:
        PayloadError: a bad ``tag`` or ``dropped``, another key, a client outside its last
            exchange, itself, too few survivors, or a second request for the same exchange
            (:meth:`~hybridfl.privacy.secagg.SecAggClient.correction`).
    """
    validate.only_keys(msg, ("tag", "dropped"))
    tag = validate.integer(msg, "tag", low=0, high=2**62)
    dropped = validate.strings(msg, "dropped")
    try:
        return client.correction(tag, dropped)
    except ProtocolError as e:
        raise PayloadError(msg, "dropped", f"refused ({e})") from None


def public_key(r: Message, known: Mapping[str, bytes]) -> bytes:
    """A reply's ``secagg_public``, checked: 32 bytes of a valid X25519 key, no other client's.

    Raises:
        PayloadError: missing, malformed, or equal to a key in ``known``.
    """
    try:
        pk = check_public_key(r.payload.get("secagg_public"), "it")
    except ProtocolError as e:
        raise PayloadError(r, "secagg_public", str(e).removeprefix("it ").rstrip(".")) from None
    if pk in known.values():
        raise PayloadError(r, "secagg_public", "equal to another client's key")
    return pk


def uint64_array(r: Message, key: str, length: int) -> np.ndarray:
    """``r.payload[key]`` as a ``uint64`` array of exactly ``(length,)`` (masked words).

    Raises:
        PayloadError: missing, another dtype or another shape.
    """
    v = validate.array(r, key, (length,), kinds="u")
    if v.dtype != np.uint64:
        raise PayloadError(r, key, f"of dtype {v.dtype}, not uint64")
    return v
