"""Secure aggregation by pairwise additive masks: the server learns the sum of the clients'
vectors, never one client's vector.

The construction is the pairwise-mask core of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS 2017, Sec. 4), on coordinates held by several clients:

- **Key agreement** (once per run): every client makes an X25519 key pair and sends the public
  key; the server relays them. Clients ``i`` and ``j`` derive the pair key
  ``k_ij = HKDF-SHA256(X25519(sk_i, pk_j))`` (``cryptography``; nothing here is our own crypto).
- **Fixed point**: a value ``x`` is sent as ``round(x * 2^FRACTION_BITS)`` in the ring
  ``Z_(2^64)`` (``uint64`` arithmetic wraps), so sums are exact integers and the masks cancel
  exactly; the result equals the plaintext sum of the rounded values bit for bit.
- **Masks**: for exchange ``tag`` the pair's mask is the ChaCha20 keystream of ``k_ij`` with nonce
  ``tag`` (one 64-bit word per coordinate the two clients both hold, in a canonical order of the
  common blocks). Client ``i`` adds ``+mask`` if ``i < j`` (string order) and ``-mask`` otherwise,
  for every peer ``j`` in the exchange, so per coordinate the masks of the holders cancel in the
  sum.
- **Double masking** (Bonawitz et al. Sec. 4, "double-masking"): each client also adds a
  *self-mask*, the keystream of a fresh 16-byte seed ``b_i`` drawn for the exchange, and sends
  with its masked vector Shamir shares of ``b_i`` (threshold ``k``, :func:`share_threshold`; PyCryptodome's
  ``Shamir`` over GF(2^128)), one per peer of the exchange, each encrypted to that peer under
  their pair key (ChaCha20-Poly1305, bound to the exchange, sender and receiver).
- **Unmasking** (one request per survivor, after every masked exchange): the server names the
  ``dropped`` clients and relays to each survivor the encrypted shares the *other survivors* sent
  it. A survivor answers once per exchange, and only if ``dropped`` and the survivors named
  partition its exchange: its pair masks with each dropped client (:meth:`SecAggClient.unmask`)
  and the decrypted self-mask shares of each surviving one, never both for the same peer. The
  server subtracts the dropped clients' pair masks and every survivor's self-mask (its seed
  rebuilt from ``k`` shares). A dropped client's vector was never received; a server that
  received a vector and calls its sender dropped gets that sender's pair masks but no share of its
  self-mask, so the vector stays masked (the dropout lie).
- **One-shot exchanges** (``one_shot``; HyFDCA's closing segment sweep): the pair masks alone,
  from pair keys of their own purpose (:data:`ONE_SHOT_PURPOSE`), no self-mask and no shares; the
  client never answers an unmasking request for such an exchange. The server gets the sum only if
  every client of the exchange replied (the masks then cancel) and otherwise drops the replies
  unread; the unmasking round is saved. A server that received a one-shot vector and names its
  sender dropped gets nothing (the sender refuses; its peers, asked about a double-masked exchange
  of the same tag, reveal the masks of the other purpose, which do not cover it).
- **Threshold** (the client's own rule, never the server's: against a malicious server): an exchange has ``m``
  clients (the client and the ``peers`` the server names, all from the peer table it got at setup).
  A client masks only in an exchange of at least :func:`mask_quorum` clients (``t``; by default
  a majority of the run's clients and at least 2, :func:`majority`, Bonawitz et al. take
  ``t > n / 2``), so ``peers=[]`` never returns its vector in the clear; it answers an unmasking
  request only if the survivors (the exchange's clients not named dropped, itself included) are
  at least :func:`unmask_quorum` (``t``; by default a majority of the exchange), never for itself,
  once per exchange.
- **Signed keys** (with a roster, :mod:`hybridfl.privacy.roster`): each client signs its public
  key and blocks (:func:`key_fields`, purpose :data:`KEY_PURPOSE`, the run's label) with its
  Ed25519 credential; a peer keeps a relayed key only if the signature verifies against its own
  roster (:func:`hybridfl.runtime.secagg_messages.set_peers`), and then counts the roster's clients.

Adversary: an honest-but-curious server (it follows the protocol and reads everything) learns,
per coordinate, only the sum over the exchange's clients that hold it, plus the exchange's
membership; a malicious server that lies about dropouts learns no more (double masking); with
rosters, one that substitutes its own public key for a peer's is refused (Ed25519 unforgeability;
``tests/test_malicious_keys.py`` plays it). Not covered (documented in ``docs/privacy.md``):
without a roster (the in-memory simulation) a server that substitutes public keys reads the
victim's vector; a coordinate held by one client of the exchange is that client's value;
colluding clients learn their pair masks and, ``k`` of them, a peer's self-mask seed; a client
that reveals a wrong share corrupts the sum (integrity, not privacy). A client never reuses a tag
(keystream reuse would reveal differences of its vectors).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hybridfl.errors import DataError, ProtocolError
from hybridfl.privacy.roster import PeerAuth

FRACTION_BITS = 32
"""Fixed-point fraction bits: a value is sent as ``round(x * 2^32)`` (resolution 2.3e-10)."""

MAGNITUDE_LIMIT = 2.0**23
"""Largest ``|x|`` one client may send (``2^55`` in fixed point), so that a sum over up to 128
clients stays below ``2^62`` and never wraps."""

PUBLIC_KEY_BYTES = 32

AUTO_THRESHOLD = 0
"""``t = 0`` (the algorithms' default ``secagg_threshold``): a majority, :func:`majority`."""
DEFAULT_THRESHOLD = AUTO_THRESHOLD
"""Default ``t``: a majority of the exchange's honest clients and at least two (:func:`majority`)."""
KEY_PURPOSE = "secagg-key"
"""The roster signature's purpose of a secure-aggregation X25519 key (:func:`key_fields`)."""


ONE_SHOT_PURPOSE = "secagg one-shot v1"
"""The pair-key purpose of one-shot exchanges' masks (never revealed; module docstring)."""
SHARE_CONTEXT = "secagg share v1"
"""The pair-key purpose of the encrypted self-mask shares."""
MAX_SHARE_PEERS = 255
"""Most peers a client shares its self-mask seed with (Shamir share indices 1..255)."""


def share_threshold(threshold: int, roster: int, members: int) -> int:
    """``k``: the shares that rebuild a client's self-mask seed in an exchange of ``members``
    clients: one less than the survivors it unmasks for (:func:`unmask_quorum`, itself included),
    at least 1, so the survivors other than the client always hold enough."""
    return max(1, unmask_quorum(threshold, roster, members) - 1)


def self_mask(seed: bytes, tag: int, n: int) -> np.ndarray:
    """The self-mask of seed ``seed`` (16 bytes) for exchange ``tag``: ``n`` ``uint64`` words of
    the ChaCha20 keystream under ``HKDF-SHA256(seed, info = "hybridfl self mask v1")``."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"hybridfl self mask v1").derive(bytes(seed))
    return keystream(key, int(tag), int(n))


def _share_aad(tag: int, sender: str, receiver: str) -> bytes:
    return json.dumps(["hybridfl self-mask share", int(tag), sender, receiver]).encode()


def rebuild_seed(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The seed from ``k`` Shamir shares ``(index, 16 bytes)`` (server side).

    Raises:
        ProtocolError: a share that is not 16 bytes or a repeated index.
    """
    from Crypto.Protocol.SecretSharing import Shamir

    if len({i for i, _ in shares}) != len(shares) or not all(len(b) == 16 for _, b in shares):
        raise ProtocolError("the self-mask shares are not distinct 16-byte shares.")
    return bytes(Shamir.combine([(int(i), bytes(b)) for i, b in shares]))


def majority(m: int) -> int:
    """``max(2, floor(m / 2) + 1)``: the default threshold over ``m`` clients (Bonawitz et al. 2017
    Sec. 4 take ``t > n / 2``, so two disjoint sets of ``t`` clients cannot both answer)."""
    return max(2, int(m) // 2 + 1)


def own_threshold(threshold: int, client_id: str, peer_auth: PeerAuth | None = None) -> int:
    """The threshold a client takes from a run config (the server's), unchanged once checked: any
    without a roster (a client made in memory); with its own roster of ``m`` clients, ``0`` (a
    majority) or at least ``majority(m)``: a server cannot lower a client's threshold below the
    default (a client's privacy settings are its own; Bonawitz et al. 2017 Sec. 4 take ``t > n / 2``).

    Raises:
        EncryptionPolicyError: a threshold below its roster's majority (one sentence).
    """
    t = int(threshold)
    if peer_auth is None or t <= 0 or t >= majority(len(peer_auth.roster.keys)):
        return t
    roster = peer_auth.roster.keys
    from hybridfl.errors import EncryptionPolicyError

    raise EncryptionPolicyError(
        f"client {client_id!r} refuses a secure-aggregation threshold of {t}: its own minimum is a majority of "
        f"its roster's {len(roster)} clients ({majority(len(roster))}); the server cannot lower it."
    )


def mask_quorum(threshold: int, roster: int, cap: int | None = None) -> int:
    """The fewest clients (itself included) of an exchange a client masks in: ``threshold``
    (``0``, the default: :func:`majority` of the exchange's honest size, ``min(roster, cap)``), but
    at most the ``roster`` (the run's clients, from the client's own roster: a run of one client
    has nobody to mask with, and the server learns its vector from the model anyway) and at most
    ``cap`` (the honest exchange's size where the protocol fixes it smaller, e.g. HyFDCA's pass
    over a segment of one holder)."""
    honest = max(int(roster), 1) if cap is None else max(1, min(int(roster), int(cap)))
    t = majority(honest) if int(threshold) <= AUTO_THRESHOLD else int(threshold)
    need = min(max(t, 1), max(int(roster), 1))
    return need if cap is None else max(1, min(need, int(cap)))


def unmask_quorum(threshold: int, roster: int, members: int) -> int:
    """The fewest survivors (itself included) of an exchange of ``members`` clients for which a
    client reveals its masks with the dropped ones: ``t`` (:func:`mask_quorum`; ``0``, the default:
    :func:`majority` of ``members``) and at least 2, so a server that names all but one client
    dropped (or all its peers, to the client itself) learns nobody's vector alone; the honest
    server drops such an exchange instead."""
    t = majority(members) if int(threshold) <= AUTO_THRESHOLD else mask_quorum(threshold, roster)
    return min(max(2, t), max(int(members), 2))


def key_fields(public: bytes, blocks: Sequence[str]) -> list[bytes]:
    """What a client's roster signature over its secure-aggregation key covers (purpose
    :data:`KEY_PURPOSE`, :class:`~hybridfl.privacy.roster.PeerAuth`): the 32-byte X25519 key and its
    blocks (sorted JSON list: the blocks fix which coordinates a pair masks, so a server that
    changed them could leave a coordinate with the self-mask alone)."""
    return [bytes(public), json.dumps(sorted(str(b) for b in blocks)).encode()]


def to_fixed(x: np.ndarray, what: str) -> np.ndarray:
    """``round(x * 2^FRACTION_BITS)`` as ``int64``, same shape.

    Raises:
        DataError: a non-finite value, or ``|x| > MAGNITUDE_LIMIT`` (names ``what``).
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise DataError(f"{what} holds NaN or infinite values and cannot be securely aggregated.")
    big = float(np.abs(x).max()) if x.size else 0.0
    if big > MAGNITUDE_LIMIT:
        raise DataError(
            f"{what} holds a value of magnitude {big:.3g}, above secure aggregation's limit {MAGNITUDE_LIMIT:.3g} "
            f"(standardise the features)."
        )
    return np.rint(x * 2.0**FRACTION_BITS).astype(np.int64)


def from_fixed(s: np.ndarray) -> np.ndarray:
    """The float64 values of fixed-point sums ``s`` (``uint64`` or ``int64``, read as signed)."""
    return np.asarray(s).view(np.int64).astype(np.float64) / 2.0**FRACTION_BITS


def check_public_key(blob: object, what: str) -> bytes:
    """``blob`` as the 32 raw bytes of an X25519 public key.

    Raises:
        ProtocolError: not bytes of the right length, or not a valid key (names ``what``).
    """
    if not isinstance(blob, (bytes, bytearray)) or len(blob) != PUBLIC_KEY_BYTES:
        raise ProtocolError(f"{what} is not a {PUBLIC_KEY_BYTES}-byte X25519 public key.")
    try:
        X25519PublicKey.from_public_bytes(bytes(blob))
    except ValueError:
        raise ProtocolError(f"{what} is not a valid X25519 public key.") from None
    return bytes(blob)


def keystream(key: bytes, tag: int, n: int) -> np.ndarray:
    """``n`` pseudo-random ``uint64`` words: the ChaCha20 keystream of the 32-byte ``key`` with
    nonce ``tag`` (12 bytes little-endian, block counter from 0). One ``(key, tag)`` must mask one
    vector only: the caller never reuses a tag with a key."""
    nonce = b"\0\0\0\0" + int(tag).to_bytes(12, "little")
    enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(8 * int(n))), dtype=np.uint64).copy()


def _positions(blocks: Sequence[str], sizes: Sequence[int]) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for b, n in zip(blocks, sizes):
        out[b] = np.arange(start, start + int(n), dtype=np.int64)
        start += int(n)
    return out


class SecAggClient:
    """One client's side of secure aggregation over its own coordinates.

    Args:
        client_id: its name (orders the pair signs).
        blocks: its feature blocks, in the order of its vectors.
        block_sizes: coordinates per block (its vectors have ``sum(block_sizes)`` entries).
        private: its X25519 private key (32 raw bytes; a new one when ``None``).

        threshold: ``t``, the fewest clients of an exchange it masks in (:func:`mask_quorum`;
            ``0``: a majority, :func:`majority`).
        double_masking: add a self-mask to every masked vector and share its seed (module docs);
            ``False`` only where no vector is ever unmasked (a federated prediction's one-shot
            sum, which stops on any missing reply).

    State (:meth:`get_state`): the private key, the peers' public keys and blocks, the last tag,
    the last exchange's peers (for :meth:`correction`) and the last tag it unmasked.
    """

    def __init__(
        self,
        client_id: str,
        blocks: Sequence[str],
        block_sizes: Sequence[int],
        private: bytes | None = None,
        threshold: int = DEFAULT_THRESHOLD,
        double_masking: bool = True,
    ):
        self.client_id = client_id
        self.blocks = list(blocks)
        self.sizes = [int(n) for n in block_sizes]
        self.dim = int(sum(self.sizes))
        self._pos = _positions(self.blocks, self.sizes)
        self._sk = X25519PrivateKey.from_private_bytes(private) if private is not None else X25519PrivateKey.generate()
        self.peers: dict[str, tuple[bytes, list[str]]] = {}
        self.roster: int | None = None
        self.last_tag = -1
        self.last_peers: list[str] = []
        self.last_width = 1
        self.unmasked_tag = -1
        self.threshold = int(threshold)
        self.double_masking = bool(double_masking)
        self.last_shares: list[bytes] = []
        self.last_one_shot = False
        self._keys: dict[tuple[str, bool], bytes] = {}  # (peer, one-shot) -> its mask key

    def public_bytes(self) -> bytes:
        """Its X25519 public key, 32 raw bytes (sent in the clear: public)."""
        return self._sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def set_peers(self, peers: Mapping[str, tuple[bytes, Sequence[str]]], roster: int | None = None) -> None:
        """The other clients: ``{client_id: (public key bytes, its blocks)}`` (from the server,
        each key checked against the client's roster by the caller:
        :func:`hybridfl.runtime.secagg_messages.set_peers`); ``roster``: the run's clients in its
        own roster (the thresholds' ``roster``; ``None``: the peers and itself, no roster).

        Raises:
            ProtocolError: a key that is not an X25519 public key, its own key or name among
                the peers, or two peers with the same key.
        """
        mine = self.public_bytes()
        seen: set[bytes] = set()
        out = {}
        for cid, (pk, bl) in peers.items():
            pk = check_public_key(pk, f"the secure-aggregation key of peer {cid!r}")
            if cid == self.client_id or pk == mine:
                raise ProtocolError(f"client {self.client_id!r} was sent its own secure-aggregation key as a peer's.")
            if pk in seen:
                raise ProtocolError(f"two peers of client {self.client_id!r} have the same secure-aggregation key.")
            seen.add(pk)
            out[str(cid)] = (pk, [str(b) for b in bl])
        self.peers = out
        self.roster = None if roster is None else int(roster)
        self._keys = {}

    def run_size(self) -> int:
        """The run's clients as its thresholds count them: its roster's (:meth:`set_peers`), else its peers and itself."""
        return self.roster if self.roster is not None else len(self.peers) + 1

    def _pair_key(self, cid: str, one_shot: bool = False) -> bytes:
        if (cid, one_shot) not in self._keys:
            self._keys[cid, one_shot] = self.pair_key(cid, ONE_SHOT_PURPOSE if one_shot else "secagg v1")
        return self._keys[cid, one_shot]

    def pair_key(self, cid: str, purpose: str) -> bytes:
        """The 32-byte key this client shares with peer ``cid`` for ``purpose`` (a label naming the
        use and its version): ``HKDF-SHA256(X25519(sk, pk_cid), info = "hybridfl <purpose>|lo|hi")``
        with the two names in string order, so both ends derive it and every purpose gets its
        own key (the masks' key is ``purpose = "secagg v1"``).

        Raises:
            KeyError: ``cid`` is not a peer.
        """
        shared = self._sk.exchange(X25519PublicKey.from_public_bytes(self.peers[cid][0]))
        lo, hi = sorted((self.client_id, cid))
        info = b"hybridfl " + purpose.encode() + b"|" + lo.encode() + b"|" + hi.encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)

    def common(self, cid: str) -> np.ndarray:
        """Positions in its own vectors of the coordinates peer ``cid`` also holds (the common
        blocks in sorted name order), ``(m,)`` int64."""
        common = sorted(set(self.blocks) & set(self.peers[cid][1]))
        if not common:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self._pos[b] for b in common])

    def _pair_mask(self, cid: str, tag: int, width: int = 1, one_shot: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``(m,)`` of the coordinates shared with ``cid`` and the pair's signed masks
        ``(width, m)`` for exchange ``tag`` (``width`` vectors of ``dim`` sent as one: row ``r`` masks
        the ``r``-th; width 1 gives the single vector's masks; ``one_shot``: the one-shot keys)."""
        pos = self.common(cid)
        words = keystream(self._pair_key(cid, one_shot), tag, pos.size * width).reshape(width, pos.size)
        return pos, (words if self.client_id < cid else np.zeros_like(words) - words)

    def _mask_sum(self, tag: int, peers: Sequence[str], width: int = 1, one_shot: bool = False) -> np.ndarray:
        out = np.zeros((width, self.dim), dtype=np.uint64)
        for cid in peers:
            pos, m = self._pair_mask(cid, tag, width, one_shot)
            out[:, pos] += m
        return out.ravel()

    def check_quorum(self, peers: Sequence[str], cap: int | None = None) -> None:
        """An exchange with ``peers`` (checked by :meth:`check_peers`) has at least
        :func:`mask_quorum` clients, itself included (``cap``: the protocol's smaller honest size).

        Raises:
            ProtocolError: fewer.
        """
        need = mask_quorum(self.threshold, self.run_size(), cap)
        if len(peers) + 1 < need:
            raise ProtocolError(
                f"client {self.client_id!r} masks only in an exchange of at least {need} clients of its roster, "
                f"not {len(peers) + 1} (secure aggregation threshold)."
            )

    def mask(
        self, fixed: np.ndarray, tag: int, peers: Sequence[str], cap: int | None = None, one_shot: bool = False
    ) -> np.ndarray:
        """``fixed`` (int64 ``(dim,)``, from :func:`to_fixed`, or ``(width * dim,)``: ``width``
        vectors one after another, summed by the server vector by vector) plus its pair masks with
        ``peers`` for exchange ``tag``, as ``uint64`` of the same shape. ``one_shot``: a one-shot
        exchange (module docstring): the one-shot pair masks only, no self-mask, no shares, and
        never unmasked.

        Raises:
            ProtocolError: ``tag`` not above every tag it used before (keystream reuse), an
                unknown peer, itself among the peers, a repeated peer, fewer clients than its
                threshold (:meth:`check_quorum` with ``cap``), or a length that is not a positive
                multiple of ``dim``.
        """
        tag = int(tag)
        if tag <= self.last_tag:
            raise ProtocolError(
                f"client {self.client_id!r} was asked to reuse secure-aggregation tag {tag} (last {self.last_tag})."
            )
        peers = self.check_peers(peers)
        self.check_quorum(peers, cap)
        fixed = np.asarray(fixed, dtype=np.int64).ravel()
        width = fixed.size // self.dim if self.dim else 1
        if fixed.size != width * self.dim or width < 1:
            raise ProtocolError(
                f"client {self.client_id!r} masks vectors of {self.dim} coordinates, not {fixed.size} values."
            )
        double = self.double_masking and not one_shot
        if double and len(peers) > MAX_SHARE_PEERS:
            raise ProtocolError(
                f"client {self.client_id!r} shares its self-mask with at most {MAX_SHARE_PEERS} peers, not {len(peers)}."
            )
        self.last_tag, self.last_peers, self.last_width = tag, list(peers), width
        self.last_one_shot = bool(one_shot)
        out = fixed.view(np.uint64) + self._mask_sum(tag, peers, width, bool(one_shot))
        self.last_shares = []
        if double and peers:  # an exchange of one has no masks at all (nobody to share with)
            out = out + self._self_mask(tag, peers, out.size)
        return out

    def _self_mask(self, tag: int, peers: Sequence[str], n: int) -> np.ndarray:
        """A fresh seed's self-mask ``(n,)``; its Shamir shares, encrypted one per peer (in the
        order of ``peers``), into :attr:`last_shares`. The seed itself is forgotten."""
        import os

        from Crypto.Protocol.SecretSharing import Shamir
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        seed = os.urandom(16)
        k = share_threshold(self.threshold, self.run_size(), len(peers) + 1)
        shares = Shamir.split(k, len(peers), seed)
        out = []
        for cid, (idx, share) in zip(peers, shares):
            nonce = os.urandom(12)
            aead = ChaCha20Poly1305(self.pair_key(cid, SHARE_CONTEXT))
            out.append(nonce + aead.encrypt(nonce, bytes(share), _share_aad(tag, self.client_id, cid)))
        self.last_shares = out
        return self_mask(seed, tag, n)

    def correction(self, tag: int, dropped: Sequence[str]) -> np.ndarray:
        """Its masks with the ``dropped`` peers of its last exchange (``tag``), ``uint64``
        ``(width * dim,)`` (the width of that exchange): the server subtracts them from the sum (Bonawitz et al. Sec. 4, unmasking).

        Raises:
            ProtocolError: ``tag`` is not its last exchange or was unmasked already (one answer per
                exchange), no client or itself named dropped, a dropped client was not a peer of it
                (the server may only ask about the clients it sent that exchange to), or fewer
                survivors than :func:`unmask_quorum` (a server naming all its peers dropped would
                read its vector: reply minus correction).
        """
        if self.double_masking:
            raise ProtocolError(
                f"client {self.client_id!r} unmasks with its self-mask shares only (double masking): use unmask."
            )
        return self._checked_unmask(tag, dropped, need_dropped=True)

    def _checked_unmask(self, tag: int, dropped: Sequence[str], need_dropped: bool = False) -> np.ndarray:
        """The checks of an unmasking request (:meth:`correction`) and its pair-mask words."""
        if int(tag) != self.last_tag:
            raise ProtocolError(
                f"client {self.client_id!r} was asked for the masks of exchange {tag}, its last was {self.last_tag}."
            )
        if int(tag) == self.unmasked_tag:
            raise ProtocolError(f"client {self.client_id!r} was asked twice for the masks of exchange {tag}.")
        if self.last_one_shot:
            raise ProtocolError(
                f"client {self.client_id!r} was asked for the masks of exchange {tag}, a one-shot exchange it never unmasks."
            )
        if self.client_id in [str(d) for d in dropped]:
            raise ProtocolError(f"client {self.client_id!r} was asked to unmask itself.")
        dropped = self.check_peers(dropped)
        if not dropped and need_dropped:
            raise ProtocolError(f"client {self.client_id!r} was asked for masks with no dropped client.")
        if not set(dropped) <= set(self.last_peers):
            raise ProtocolError(
                f"client {self.client_id!r} was asked for masks with a client outside its last exchange."
            )
        members = len(self.last_peers) + 1
        need = unmask_quorum(self.threshold, self.run_size(), members)
        if members - len(dropped) < need:
            raise ProtocolError(
                f"client {self.client_id!r} unmasks only if at least {need} of the {members} clients of the exchange "
                f"survive, not {members - len(dropped)}."
            )
        self.unmasked_tag = int(tag)
        return self._mask_sum(int(tag), dropped, self.last_width)

    def unmask(
        self, tag: int, dropped: Sequence[str], survivors: Sequence[str], shares: Sequence[bytes]
    ) -> tuple[np.ndarray, list[bytes]]:
        """Answer the unmasking of its last exchange (``tag``) with double masking: its pair masks
        with the ``dropped`` peers (:meth:`correction`'s words; zeros when none dropped) and the
        decrypted shares of the self-mask seeds of the surviving peers ``survivors`` (``shares``:
        the encrypted share each of them sent it, same order), never both for one peer.

        Raises:
            ProtocolError: everything :meth:`correction` refuses, ``dropped`` and ``survivors``
                not a partition of its last exchange's peers, or a share that does not decrypt
                as that peer's share to it for this exchange.
        """
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        dropped, survivors = [str(d) for d in dropped], [str(s) for s in survivors]
        if sorted(dropped + survivors) != sorted(self.last_peers) or len(shares) != len(survivors):
            raise ProtocolError(
                f"client {self.client_id!r} unmasks only if the dropped and surviving clients named are exactly "
                "the other clients of its last exchange, each once."
            )
        words = self._checked_unmask(tag, dropped)
        out = []
        for cid, blob in zip(survivors, shares):
            if not isinstance(blob, (bytes, bytearray)) or len(blob) != 12 + 16 + 16:
                raise ProtocolError(f"client {self.client_id!r} got a self-mask share of {cid!r} that is not one.")
            try:
                aead = ChaCha20Poly1305(self.pair_key(cid, SHARE_CONTEXT))
                out.append(aead.decrypt(bytes(blob[:12]), bytes(blob[12:]), _share_aad(tag, cid, self.client_id)))
            except InvalidTag:
                raise ProtocolError(
                    f"client {self.client_id!r} got a self-mask share that is not {cid!r}'s to it for exchange {tag}."
                ) from None
        return words, out

    def check_peers(self, peers: Sequence[str]) -> list[str]:
        """``peers`` as a list, each a known peer (not itself), without repeats.

        Raises:
            ProtocolError: a repeat, itself, or an unknown name.
        """
        peers = [str(p) for p in peers]
        if len(set(peers)) != len(peers):
            raise ProtocolError(f"client {self.client_id!r} got a repeated secure-aggregation peer.")
        for p in peers:
            if p == self.client_id or p not in self.peers:
                raise ProtocolError(f"client {self.client_id!r} got the unknown secure-aggregation peer {p!r}.")
        return peers

    def get_state(self) -> dict:
        """Codec values: ``secagg_sk`` (32 bytes), ``secagg_peers`` (JSON: peers, the last exchange's
        peers and width, the last tag unmasked), ``secagg_tag``."""
        sk = self._sk.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        peers = {cid: [pk.hex(), bl] for cid, (pk, bl) in self.peers.items()}
        return {
            "secagg_sk": sk,
            "secagg_peers": json.dumps(
                {
                    "peers": peers,
                    "last_peers": self.last_peers,
                    "last_width": self.last_width,
                    "unmasked_tag": self.unmasked_tag,
                    "one_shot": self.last_one_shot,
                    "roster": self.roster,
                }
            ),
            "secagg_tag": int(self.last_tag),
        }

    def set_state(self, state: Mapping) -> None:
        """Restore :meth:`get_state` (missing entries keep their values)."""
        if "secagg_sk" in state:
            self._sk = X25519PrivateKey.from_private_bytes(bytes(state["secagg_sk"]))
            self._keys = {}
        if "secagg_peers" in state:
            d = json.loads(str(state["secagg_peers"]))
            self.peers = {cid: (bytes.fromhex(pk), list(bl)) for cid, (pk, bl) in d["peers"].items()}
            self.last_peers = list(d["last_peers"])
            self.last_width = int(d.get("last_width", 1))
            self.unmasked_tag = int(d.get("unmasked_tag", -1))
            self.last_one_shot = bool(d.get("one_shot", False))
            self.roster = None if d.get("roster") is None else int(d["roster"])
            self._keys = {}
        if "secagg_tag" in state:
            self.last_tag = int(state["secagg_tag"])
