"""The message side of secure aggregation (:mod:`hybridfl.privacy.secagg`), shared by HyFDCA's
primal shares and HyFEM's extractors: the checked fields a client takes from the server
(the peer table, a fresh exchange, an unmasking request), the server's relay of the keys, and
the one secure-sum workflow both servers run after a masked exchange (:func:`unmask_exchange`:
double masking's unmasking round, Bonawitz et al. 2017 Sec. 4).

Every field is checked before use (:mod:`hybridfl.runtime.validate`) and a bad one is refused
with one :class:`~hybridfl.runtime.validate.PayloadError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridfl.errors import ProtocolError
from hybridfl.privacy.credentials import SIGNATURE_BYTES
from hybridfl.privacy.roster import RUN_BYTES, PeerAuth, PeerAuthError
from hybridfl.privacy.secagg import (
    KEY_PURPOSE,
    SecAggClient,
    check_public_key,
    key_fields,
    rebuild_seed,
    self_mask,
    share_threshold,
)
from hybridfl.runtime import validate
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.validate import PayloadError


def peer_table(
    publics: Mapping[str, bytes],
    blocks: Mapping[str, Sequence[str]],
    cid: str,
    sigs: Mapping[str, bytes] | None = None,
) -> dict:
    """The payload entries that tell ``cid`` the other clients' keys and blocks:
    ``secagg_peers`` (names), ``secagg_keys`` (32-byte keys), ``secagg_blocks`` (JSON lists) and,
    if any client signed its key (``sigs``), ``secagg_sigs`` (64 bytes each, ``b""`` for a peer
    that sent none)."""
    peers = [c for c in publics if c != cid]
    out = {
        "secagg_peers": peers,
        "secagg_keys": [publics[c] for c in peers],
        "secagg_blocks": [json.dumps(list(blocks[c])) for c in peers],
    }
    if sigs:
        out["secagg_sigs"] = [sigs.get(c, b"") for c in peers]
    return out


PEER_TABLE_KEYS = ("secagg_peers", "secagg_keys", "secagg_blocks", "secagg_sigs")
"""The fields of a peer table (:func:`peer_table`)."""


def run_label(msg: Message, auth: PeerAuth | None) -> bytes:
    """The run label ``run`` of a setup message (32 bytes; required with a roster, ``auth``),
    ``b""`` when absent without a roster.

    Raises:
        PayloadError: with a roster, missing; present, not 32 bytes.
    """
    if auth is None and "run" not in msg.payload:
        return b""
    run = msg.payload.get("run")
    if not isinstance(run, (bytes, bytearray)) or len(run) != RUN_BYTES:
        raise PayloadError(msg, "run", f"missing or not {RUN_BYTES} bytes")
    return bytes(run)


def sign_key(client: SecAggClient, auth: PeerAuth | None, run: bytes) -> dict:
    """The reply entry ``secagg_sig``: ``client``'s roster signature over its key and blocks for
    run ``run`` (:func:`~hybridfl.privacy.secagg.key_fields`); nothing without a roster."""
    if auth is None:
        return {}
    return {"secagg_sig": auth.sign(run, KEY_PURPOSE, key_fields(client.public_bytes(), client.blocks))}


def set_peers(client: SecAggClient, msg: Message, auth: PeerAuth | None = None, run: bytes = b"") -> None:
    """Give ``client`` the peer table of ``msg`` (:func:`peer_table`). With a roster (``auth``)
    every peer must be in it and its key and blocks must carry the peer's signature for run
    ``run`` (against a server that substitutes a key of its own, Ed25519 unforgeability); the
    thresholds then count the roster's clients.

    Raises:
        PayloadError: lists of other lengths, a key that is not an X25519 public key, a blocks
            entry that is not a JSON list of names, its own name or key among the peers.
        PeerAuthError: with a roster, a peer not in it, or a key whose signature is missing or
            does not verify (names the peer).
    """
    peers = validate.strings(msg, "secagg_peers")
    keys = validate.blobs(msg, "secagg_keys", len(peers), max_bytes=32)
    sigs: list = [None] * len(peers)
    if auth is not None and "secagg_sigs" in msg.payload:  # b"" for a peer that signed nothing: refused below
        sigs = msg.payload["secagg_sigs"]
        if not isinstance(sigs, list) or len(sigs) != len(peers) or not all(isinstance(x, bytes) for x in sigs):
            raise PayloadError(msg, "secagg_sigs", f"not a list of {len(peers)} byte strings")
    blocks = msg.payload.get("secagg_blocks")
    if not isinstance(blocks, list) or len(blocks) != len(peers) or not all(isinstance(b, str) for b in blocks):
        raise PayloadError(msg, "secagg_blocks", f"not a list of {len(peers)} strings")
    table = {}
    for i, (cid, pk, bl) in enumerate(zip(peers, keys, blocks)):
        try:
            names = json.loads(bl)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(b, str) for b in names):
            raise PayloadError(msg, "secagg_blocks", "holding an item that is not a JSON list of block names")
        table[cid] = (pk, names)
        if auth is not None:
            try:
                auth.verify(run, cid, KEY_PURPOSE, key_fields(pk, names), sigs[i])
            except PeerAuthError as e:
                raise PeerAuthError(f"{str(e).rstrip('.')} (secure-aggregation key).") from None
    try:
        client.set_peers(table, None if auth is None else len(auth.roster.keys))
    except ProtocolError as e:
        raise PayloadError(msg, "secagg_keys", f"refused ({e})") from None


def check_exchange(
    client: SecAggClient, msg: Message, cap: int | None = None, prefix: str = ""
) -> tuple[int, list[str]]:
    """The ``tag`` and ``peers`` of a masked exchange, checked before anything changes (the fields
    named ``prefix + "tag"`` and ``prefix + "peers"``: a message that also carries other fields of
    those names, as HyFDCA's ``hyfdca.sweep`` carrying its PrimalAggregation share, prefixes them).

    Raises:
        PayloadError: ``tag`` not an integer above every tag ``client`` used, ``peers`` not the
            names of known peers of its roster (itself excluded, no repeats), or fewer clients than
            its threshold (:meth:`~hybridfl.privacy.secagg.SecAggClient.check_quorum`, ``cap``).
    """
    tag = validate.integer(msg, prefix + "tag", low=0, high=2**62)
    peers = validate.strings(msg, prefix + "peers")
    if tag <= client.last_tag:
        raise PayloadError(
            msg,
            prefix + "tag",
            f"refused (client {client.client_id!r} was asked to reuse secure-aggregation tag {tag})",
        )
    try:
        client.check_quorum(client.check_peers(peers), cap)
    except ProtocolError as e:
        raise PayloadError(msg, prefix + "peers", f"refused ({e})") from None
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


UNMASK_KEYS = ("tag", "dropped", "survivors", "shares")
"""The fields of an unmasking request."""
SHARE_BYTES = 12 + 16 + 16
"""An encrypted self-mask share: nonce, 16-byte share, Poly1305 tag."""


def unmask_reply(client: SecAggClient, msg: Message) -> dict:
    """A client's answer to an unmasking request (``tag``, ``dropped``, ``survivors``, ``shares``):
    ``correction`` (``uint64``, its pair masks with the dropped clients) and ``revealed`` (the
    16-byte self-mask shares of the survivors, same order), from
    :meth:`~hybridfl.privacy.secagg.SecAggClient.unmask`.

    Raises:
        PayloadError: another key, a bad field, or a request the client refuses (not its last
            exchange, a second one, dropped and survivors not a partition of its exchange, too few
            survivors, a share that is not the survivor's to it).
    """
    validate.only_keys(msg, UNMASK_KEYS)
    tag = validate.integer(msg, "tag", low=0, high=2**62)
    dropped = validate.strings(msg, "dropped")
    survivors = validate.strings(msg, "survivors")
    shares = validate.blobs(msg, "shares", len(survivors), max_bytes=SHARE_BYTES) if survivors else []
    try:
        words, revealed = client.unmask(tag, dropped, survivors, shares)
    except ProtocolError as e:
        raise PayloadError(msg, "dropped", f"refused ({e})") from None
    return {"correction": words, "revealed": revealed}


def check_shares(r: Message, peers: int) -> None:
    """A masked reply's ``self_shares``: ``peers`` encrypted shares (one per other client of the
    exchange, in the order of its ``peers``); none for an exchange of one.

    Raises:
        PayloadError: missing, another count, or an item that is not an encrypted share.
    """
    if peers == 0:
        return
    got = validate.blobs(r, "self_shares", peers, max_bytes=SHARE_BYTES)
    if any(len(b) != SHARE_BYTES for b in got):
        raise PayloadError(r, "self_shares", "holding an item that is not an encrypted share")


def unmask_exchange(
    exchange: Callable[[list[Message], Callable[[Message], None]], list[Message]],
    kind: str,
    rnd: int,
    tag: int,
    names: Sequence[str],
    replies: Mapping[str, Message],
    total: np.ndarray,
    positions: Mapping[str, np.ndarray],
    roster: int,
    threshold: int,
    extra_keys: Sequence[str] = (),
) -> bool:
    """The unmasking round after masked exchange ``tag`` with the clients ``names`` (server side,
    HyFEM and HyFDCA): ask every survivor (``replies``: the masked replies that arrived) for its
    pair masks with the dropped clients and the self-mask shares the other survivors sent it;
    subtract the pair masks and every survivor's self-mask (its seed rebuilt from ``k`` shares,
    :func:`~hybridfl.privacy.secagg.share_threshold`) from ``total`` ``(width, d)`` ``uint64`` in
    place, at each client's ``positions`` in ``d``. An exchange of one client has no masks.

    Args:
        exchange: sends messages and returns the replies that passed ``check`` (the algorithm's
            exchange with its reply policy).
        kind: the algorithm's unmasking message kind.
        extra_keys: reply fields the algorithm adds to every reply (HyFDCA's timings).

    Returns:
        Whether ``total`` is now the plain sum (``False``: a survivor's answer is missing or
        malformed, or a seed cannot be rebuilt; the caller drops the exchange).
    """
    got = [c for c in names if c in replies]
    if len(names) <= 1 or not got:
        return True
    dropped = [c for c in names if c not in replies]
    width = total.shape[0]
    peers_of = {c: [p for p in names if p != c] for c in got}
    survivors_of = {j: [s for s in got if s != j] for j in got}
    asks = [
        Message(
            kind,
            SERVER,
            j,
            rnd,
            {
                "tag": tag,
                "dropped": dropped,
                "survivors": survivors_of[j],
                "shares": [replies[s].payload["self_shares"][peers_of[s].index(j)] for s in survivors_of[j]],
            },
        )
        for j in got
    ]

    def check(r: Message) -> None:
        validate.only_keys(r, ("correction", "revealed", *extra_keys))
        uint64_array(r, "correction", width * len(positions[r.sender]))
        n = len(survivors_of[r.sender])
        if n:
            validate.blobs(r, "revealed", n, max_bytes=16)

    fixes = {r.sender: r for r in exchange(asks, check) if r.sender in survivors_of}
    if set(fixes) != set(got):
        return False
    k = share_threshold(threshold, roster, len(names))
    for j, r in fixes.items():
        total[:, positions[j]] -= r.payload["correction"].reshape(width, -1)
    for s in got:
        shares = [
            (peers_of[s].index(j) + 1, fixes[j].payload["revealed"][survivors_of[j].index(s)]) for j in got if j != s
        ][:k]
        try:
            seed = rebuild_seed(shares)
        except ProtocolError:
            return False
        total[:, positions[s]] -= self_mask(seed, tag, width * len(positions[s])).reshape(width, -1)
    return True


def key_signature(r: Message) -> bytes | None:
    """A reply's ``secagg_sig`` (64 bytes), or ``None`` when it sent none (a client without a roster).

    Raises:
        PayloadError: present but not 64 bytes.
    """
    if "secagg_sig" not in r.payload:
        return None
    sig = r.payload["secagg_sig"]
    if not isinstance(sig, (bytes, bytearray)) or len(sig) != SIGNATURE_BYTES:
        raise PayloadError(r, "secagg_sig", f"not a {SIGNATURE_BYTES}-byte signature")
    return bytes(sig)


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
