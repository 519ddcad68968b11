"""Group masks: the holders of a sample segment hide their shares *and* their sum from the server
(HyFDCA ``segment_inner_products: masked``, our addition; :mod:`hybridfl.algorithms.hyfdca.segment`).

Segment mode needs, before each mini-batch, the exact inner products ``u = sum_k u_k`` of the
batch's samples, where holder ``k`` of the segment knows only its block's part ``u_k``. The paper's
way is SecureInnerProduct under homomorphic encryption (``encryption: ckks``: every holder
encrypts ``u_k``, the server adds, every holder decrypts). This module does the same job with
one-time pads in the ring ``Z_(2^64)``:

- **Segment keys** (once, at setup): every holder ``k`` of segment ``g`` draws a random 32-byte
  key ``K_(k,g)`` and sends it to each other holder ``j`` of ``g`` sealed with ChaCha20-Poly1305
  (``cryptography``) under ``HKDF(X25519(sk_k, pk_j))`` with purpose ``"segment key v1"``
  (:meth:`hybridfl.privacy.secagg.SecAggClient.pair_key`; the X25519 keys are those of secure
  aggregation), a random 96-bit nonce, and the associated data ``sender|receiver|g``. The server
  relays the sealed keys; it cannot open them, and a key relayed to another receiver or
  segment fails authentication.
- **Masking** (every exchange ``tag``, a number the client never accepts twice): holder ``k``
  sends ``fixed(u_k) + PRG(K_(k,g), tag)`` (``fixed``: :func:`~hybridfl.privacy.secagg.to_fixed`,
  ``2^-32`` resolution; ``PRG``: :func:`~hybridfl.privacy.secagg.keystream`, ChaCha20). The
  server adds the holders' words and returns ``fixed(u) + R`` with ``R = sum_k PRG(K_(k,g), tag)``;
  every holder knows all ``K_(j,g)`` and subtracts ``R``.

Adversary. An honest-but-curious server (it follows the protocol and reads every byte) that
does not collude with a holder of the segment sees only words that are uniformly distributed
given everything else it holds: each holder's words are masked by its own pad, the sum by the
sum of the pads, and no pad is used twice. So it learns neither a holder's share nor the inner
products. A holder learns the inner products (as under CKKS, where every client holds the secret
key). A client that does not hold the segment cannot open its keys (unlike CKKS, where every
client can decrypt every ciphertext). A *malicious* server that substitutes the X25519 public keys
it relays is refused where the clients hold a roster (the keys are signed, as for secure
aggregation: :mod:`hybridfl.privacy.secagg`); without one it can open the segment keys
(``tests/test_malicious_keys.py``). Not covered: a server colluding with a holder learns what that
holder knows (under CKKS too). ``tests/test_hyfdca_masked.py`` plays these parties.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from hybridfl.errors import ProtocolError
from hybridfl.privacy.secagg import MAGNITUDE_LIMIT, SecAggClient

PURPOSE = "segment key v1"
"""The :meth:`~hybridfl.privacy.secagg.SecAggClient.pair_key` purpose of the sealing keys."""

KEY_BYTES = 32
NONCE_BYTES = 12
SEALED_BYTES = NONCE_BYTES + KEY_BYTES + 16
"""A sealed segment key: nonce, key, Poly1305 tag (60 bytes)."""


PAD_CHUNK = 1 << 15
"""Words per piece of :func:`add_pads` (256 KiB): the pads are made piece by piece into one
reused buffer."""


def _aad(sender: str, receiver: str, segment: int) -> bytes:
    return f"hybridfl segment key v1|{sender}|{receiver}|{int(segment)}".encode()


def add_pads(out: np.ndarray, keys: Sequence[bytes], tag: int, sign: int) -> None:
    """``out`` (``uint64`` ``(n,)``, changed in place) plus (``sign`` 1) or minus (``sign`` -1)
    the pads ``keystream(key, tag, n)`` of every key in ``keys``, modulo ``2^64``.

    The words are those of :func:`~hybridfl.privacy.secagg.keystream` (ChaCha20, nonce ``tag``,
    block counter from 0; a test compares them), made :data:`PAD_CHUNK` words at a time: a
    ChaCha20 encryptor continues its stream from one ``update`` to the next, so the pieces are the
    whole keystream's consecutive parts. One buffer of a piece is reused for every key and piece
    (an ``n``-word pad would allocate and fill three ``8 n``-byte arrays per key: zeros, stream,
    copy)."""
    n = int(out.size)
    if n == 0 or not keys:
        return
    nonce = b"\0\0\0\0" + int(tag).to_bytes(12, "little")  # secagg.keystream's nonce
    encs = [Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor() for key in keys]
    step = min(n, PAD_CHUNK)
    zeros = memoryview(bytes(8 * step))
    buf = bytearray(8 * step + 64)  # update_into may ask for room beyond the data
    words = np.frombuffer(buf, dtype=np.uint64, count=step)
    for start in range(0, n, step):
        m = min(step, n - start)
        part = out[start : start + m]
        for enc in encs:
            enc.update_into(zeros[: 8 * m], buf)
            if sign > 0:
                part += words[:m]
            else:
                part -= words[:m]


class SegmentMasks:
    """One client's group masks for the segments it holds.

    Args:
        secagg: its secure-aggregation keys (the peers must be set: :meth:`SecAggClient.set_peers`).

    State (:meth:`get_state`): ``holders`` (global segment -> its holders' names, sorted),
    ``keys`` (global segment -> holder -> 32-byte key; its own drawn here, the others' opened from
    :meth:`open`) and ``last_tag`` (the last exchange it masked).
    """

    def __init__(self, secagg: SecAggClient):
        self.secagg = secagg
        self.client_id = secagg.client_id
        self.holders: dict[int, list[str]] = {}
        self.keys: dict[int, dict[str, bytes]] = {}
        self.last_tag = -1

    def start(self, holders: Mapping[int, Sequence[str]]) -> list[bytes]:
        """Draw its key for each segment ``g`` (``holders[g]``: the names of ``g``'s holders, itself
        among them) and return its key sealed for each other holder: segments in the order given,
        the other holders in sorted order.

        Raises:
            ProtocolError: a holder list without this client, with a repeat, or naming a client
                that is not a peer.
        """
        out: list[bytes] = []
        self.holders, self.keys, self.last_tag = {}, {}, -1
        for g, names in holders.items():
            names = [str(h) for h in names]
            if self.client_id not in names or len(set(names)) != len(names):
                raise ProtocolError(
                    f"client {self.client_id!r} was given holders of segment {g} that repeat a name or leave it out."
                )
            others = self.secagg.check_peers([h for h in names if h != self.client_id])
            self.holders[int(g)] = sorted(names)
            own = os.urandom(KEY_BYTES)
            self.keys[int(g)] = {self.client_id: own}
            for h in sorted(others):
                aead = ChaCha20Poly1305(self.secagg.pair_key(h, PURPOSE))
                nonce = os.urandom(NONCE_BYTES)
                out.append(nonce + aead.encrypt(nonce, own, _aad(self.client_id, h, g)))
        return out

    def sealed_count(self) -> int:
        """How many sealed keys :meth:`open` expects: per segment, one from each other holder."""
        return sum(len(h) - 1 for h in self.holders.values())

    def open(self, sealed: Sequence[bytes]) -> None:
        """Open the other holders' keys: per segment (the order of :meth:`start`), one sealed key
        from each other holder in sorted order. Nothing is kept unless every one opens.

        Raises:
            ProtocolError: another count or length, or a key that fails authentication (tampered,
                or sealed for another receiver or segment).
        """
        if len(sealed) != self.sealed_count():
            raise ProtocolError(
                f"client {self.client_id!r} got {len(sealed)} sealed segment keys, expected {self.sealed_count()}."
            )
        opened: dict[int, dict[str, bytes]] = {}
        it = iter(sealed)
        for g, names in self.holders.items():
            opened[g] = dict(self.keys[g])
            for h in names:
                if h == self.client_id:
                    continue
                blob = bytes(next(it))
                if len(blob) != SEALED_BYTES:
                    raise ProtocolError(f"the sealed key of holder {h!r} for segment {g} has {len(blob)} bytes.")
                aead = ChaCha20Poly1305(self.secagg.pair_key(h, PURPOSE))
                try:
                    key = aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _aad(h, self.client_id, g))
                except InvalidTag:
                    raise ProtocolError(
                        f"the sealed key of holder {h!r} for segment {g} does not open for client {self.client_id!r}."
                    ) from None
                opened[g][h] = key
        self.keys = opened

    @property
    def ready(self) -> bool:
        """Whether every holder's key of every segment is known (after :meth:`open`)."""
        return all(len(self.keys[g]) == len(n) for g, n in self.holders.items())

    def use_tag(self, tag: int) -> None:
        """Take ``tag`` for the next exchange.

        Raises:
            ProtocolError: ``tag`` not above the last one it masked (a pad used twice would reveal
                the difference of two shares).
        """
        if int(tag) <= self.last_tag:
            raise ProtocolError(f"client {self.client_id!r} was asked to reuse segment mask tag {int(tag)}.")
        self.last_tag = int(tag)

    def mask(self, g: int, tag: int, fixed: np.ndarray) -> np.ndarray:
        """``fixed`` (int64 ``(n,)``, :func:`~hybridfl.privacy.secagg.to_fixed`) plus its own pad of
        segment ``g`` for exchange ``tag`` (taken before with :meth:`use_tag`), ``uint64`` ``(n,)``."""
        out = np.asarray(fixed, dtype=np.int64).view(np.uint64).copy()
        add_pads(out, [self.keys[int(g)][self.client_id]], tag, 1)
        return out

    def unmask(self, g: int, tag: int, total: np.ndarray) -> np.ndarray:
        """The float64 sum ``(n,)`` of the holders' values from the server's ``total`` (``uint64``
        ``(n,)``: the sum of every holder's masked words of exchange ``tag``).

        Raises:
            ProtocolError: a value beyond what the holders can have sent (``|u| > holders x``
                :data:`~hybridfl.privacy.secagg.MAGNITUDE_LIMIT`): a total that is not the sum of
                this exchange's words.
        """
        out = np.asarray(total, dtype=np.uint64).copy()
        add_pads(out, list(self.keys[int(g)].values()), tag, -1)
        vals = out.view(np.int64).astype(np.float64)
        vals /= 2.0**32
        if out.size and max(float(vals.max()), -float(vals.min())) > len(self.keys[int(g)]) * MAGNITUDE_LIMIT:
            raise ProtocolError(
                f"client {self.client_id!r} got masked sums of segment {g} that unmask to values no holder can have sent."
            )
        return vals

    def get_state(self) -> dict:
        """Codec values: ``segmask`` (JSON: ``holders``, ``keys`` in hex, ``tag``); secret, like
        the secure-aggregation private key beside it."""
        keys = {str(g): {h: k.hex() for h, k in ks.items()} for g, ks in self.keys.items()}
        holders = {str(g): names for g, names in self.holders.items()}
        return {"segmask": json.dumps({"holders": holders, "keys": keys, "tag": int(self.last_tag)})}

    def set_state(self, state: Mapping) -> None:
        """Restore :meth:`get_state` (nothing when it is absent)."""
        if "segmask" not in state:
            return
        d = json.loads(str(state["segmask"]))
        self.holders = {int(g): [str(h) for h in names] for g, names in d["holders"].items()}
        self.keys = {int(g): {str(h): bytes.fromhex(k) for h, k in ks.items()} for g, ks in d["keys"].items()}
        self.last_tag = int(d["tag"])
