"""The interface of the additive encryption backends (:class:`HEBackend`: encrypt, add, decrypt,
check, with each scheme's hooks) and the plaintext one (:class:`PlainBackend`, ``encryption:
none``: a "ciphertext" is the vector's float64 bytes, or float32 bytes under the :data:`FLOAT32`
bit of its length header). The encrypted schemes, the keys and their dealer:
:mod:`hybridfl.privacy.he`, which re-exports these names.

A ciphertext of a vector is one ``bytes`` object: a 4-byte big-endian length header (the number of
values) and the scheme's body.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np


class SecretKeyMissing(RuntimeError):
    """Raised when a backend without the secret key (the server's) is asked to decrypt."""


_FINITE_CHUNK = 1 << 15
"""Values per piece of :func:`_all_finite` (256 kB of float64: its temporary stays in the cache)."""


def _all_finite(v: np.ndarray) -> bool:
    """``np.isfinite(v).all()`` for a 1-D ``v``, piece by piece: no temporary of ``v``'s length (a
    HyFDCA setup's Gram sums are 42 MB each on MNIST, checked at the server for every holder)."""
    if v.size <= _FINITE_CHUNK:  # a short vector (a sweep's 512 inner products) in one call
        return bool(np.isfinite(v).all())
    return all(np.isfinite(v[i : i + _FINITE_CHUNK]).all() for i in range(0, v.size, _FINITE_CHUNK))


FLOAT32 = 1 << 31
"""The top bit of a ciphertext's 4-byte length header: set, a plaintext body of float32 values
(:class:`PlainBackend`); no other scheme sets it (a vector's length stays below ``2**31``)."""


class HEBackend:
    """Encrypt / add / decrypt float vectors. Subclasses implement the ``_`` methods.

    Attributes:
        name: scheme name.
        can_decrypt: whether this backend holds the secret key.
        seconds: accumulated wall time (s) of all encrypt, decrypt and add calls.
    """

    name: str = "none"

    def __init__(self, can_decrypt: bool):
        self.can_decrypt = can_decrypt
        self.seconds = 0.0

    def encrypt(self, vec: np.ndarray) -> bytes:
        """Encrypt a 1-D vector (``(n,)``, any real dtype; ``n`` may be 0) into one ``bytes``."""
        t = time.perf_counter()
        v = self._vector(vec)
        body = self._encrypt(v)
        out = b"".join([struct.pack(">I", self._head(v.size, body)), body])  # one copy of the body
        self.seconds += time.perf_counter() - t
        return out

    def add(self, items: list[bytes]) -> bytes:
        """Element-wise sum of ciphertexts of vectors of equal length (public material only).

        Raises:
            ValueError: empty list or vectors of different lengths.
        """
        if not items:
            raise ValueError("nothing to add")
        t = time.perf_counter()
        sizes = {self.length(c) for c in items}
        if len(sizes) != 1:
            raise ValueError(f"cannot add encrypted vectors of different lengths {sorted(sizes)}")
        n = sizes.pop()
        if len(items) == 1:
            out = items[0]
        else:
            body = self._add(self._bodies(items), n)
            out = b"".join([struct.pack(">I", self._head(n, body)), body])
        self.seconds += time.perf_counter() - t
        return out

    def decrypt(self, data: bytes, copy: bool = True) -> np.ndarray:
        """The ``(n,)`` float64 vector in a ciphertext; with ``copy=False`` the plaintext backend
        returns a read-only view of ``data``'s bytes instead of a copy (the others always decode
        into a new array).

        Raises:
            SecretKeyMissing: this backend (the server's) has no secret key.
            ValueError: a length header this scheme does not write for that body (:meth:`_check_head`).
        """
        if not self.can_decrypt:
            raise SecretKeyMissing(f"the {self.name} backend here holds only public material and cannot decrypt.")
        t = time.perf_counter()
        n = self.length(data)
        body = self._bodies([data])[0]
        self._check_head(data, n, body)
        out = self._decrypt(body, n) if copy else self._decrypt_view(body, n)
        self.seconds += time.perf_counter() - t
        return out

    @staticmethod
    def length(data: bytes) -> int:
        """Number of values in a ciphertext (public header, without the :data:`FLOAT32` bit)."""
        return int(struct.unpack(">I", data[:4])[0] & (FLOAT32 - 1))

    def check(self, data: bytes) -> None:
        """Parse an untrusted ciphertext before any use: its length header and a body that is a
        well-formed ciphertext of that many values under this backend's parameters (Plain: ``8 n``
        bytes of finite floats; Paillier: ``n`` integers in ``[1, n^2)``; CKKS: one parsed TenSEAL
        vector per ``slots`` values, of the right sizes). Costs about one parse of each part.

        Raises:
            ValueError: the ciphertext does not parse (one sentence, without the data).
        """
        if len(data) < 4:
            raise ValueError(f"a {self.name} ciphertext of {len(data)} bytes is shorter than its length header")
        n, body = self.length(data), self._bodies([data])[0]
        self._check_head(data, n, body)
        self._check(body, n)

    # -- subclass hooks
    def _vector(self, vec: np.ndarray) -> np.ndarray:
        """What :meth:`encrypt` encrypts of ``vec``: its values as a contiguous float64 vector."""
        return np.ascontiguousarray(np.asarray(vec, dtype=np.float64).ravel())

    def _head(self, n: int, body: Any) -> int:
        """The 4-byte length header of a ciphertext of ``n`` values with this ``body``: ``n``."""
        return n

    def _check_head(self, data: bytes, n: int, body: Any) -> None:
        """Refuse a length header this scheme does not write for ``body`` (here: one with the
        :data:`FLOAT32` bit, which only plaintext uses; the server would otherwise add it to
        another holder's ciphertext of the same length as if it were one).

        Raises:
            ValueError: the header is not :meth:`_head`'s.
        """
        if struct.unpack(">I", data[:4])[0] != n:
            raise ValueError(
                f"a {self.name} ciphertext's length header sets the float32 bit, which only plaintext uses"
            )

    def _bodies(self, items: list[bytes]) -> list[bytes]:
        """The bodies of ciphertexts (after their 4-byte length header), as copies: ``bytes``."""
        return [bytes(c[4:]) for c in items]

    def _check(self, body: bytes, n: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _encrypt(self, v: np.ndarray) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def _add(self, items: list[bytes], n: int) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def _decrypt(self, data: bytes, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _decrypt_view(self, data: bytes, n: int) -> np.ndarray:
        """``decrypt(copy=False)``: a new array unless the scheme can read ``data`` in place."""
        return self._decrypt(data, n)


class PlainBackend(HEBackend):
    """No encryption: the "ciphertext" is the float64 bytes of the vector (anyone can read it), or
    its float32 bytes behind a :data:`FLOAT32` length header when the vector is float32 (HyFDCA's
    batch Gram values: ``ssyrk`` products, so every value is a float32 and nothing is rounded; the
    setup's Gram vectors then cross in half the bytes, 21 MB instead of 42 MB per MNIST holder).

    Sums: float64 additions in order, as one float32 rounding of the float64 sum when every
    vector added is float32 (the precision its senders keep; a float64 one among them keeps the
    sum float64). Decryption gives float64 (``copy=False``: the body as it is, float32 or
    float64)."""

    name = "none"

    def __init__(self, can_decrypt: bool = True):
        # Plaintext can always be read; ``can_decrypt`` is kept True so that code paths agree.
        super().__init__(True)

    def _vector(self, vec: np.ndarray) -> np.ndarray:
        v = np.asarray(vec)
        return np.ascontiguousarray(v.ravel()) if v.dtype == np.float32 else super()._vector(v)

    def _head(self, n: int, body: Any) -> int:
        return n | FLOAT32 if n and len(body) == 4 * n else n

    def _check_head(self, data: bytes, n: int, body: Any) -> None:
        width = 4 if struct.unpack(">I", data[:4])[0] & FLOAT32 else 8
        if len(body) != width * n:
            raise ValueError(f"a plaintext vector of {n} values has {len(body)} bytes, not {width * n}")

    @staticmethod
    def _values(body: Any, n: int) -> np.ndarray:
        """The body's ``n`` values as a read-only view: float32 when it holds ``4 n`` bytes."""
        return np.frombuffer(body, dtype="<f4" if n and len(body) == 4 * n else "<f8")

    # The bodies are read in place (memoryviews) and the vector's bytes copied once, into the
    # ciphertext that :meth:`HEBackend.encrypt` / :meth:`HEBackend.add` join behind the header.
    def _bodies(self, items: list[bytes]) -> list[memoryview]:
        return [memoryview(c).cast("B")[4:] for c in items]

    def _encrypt(self, v: np.ndarray) -> memoryview:
        return memoryview(v.astype("<f4" if v.dtype == np.float32 else "<f8", copy=False)).cast("B")

    def _add(self, items: list[bytes], n: int) -> memoryview:
        vecs = [self._values(b, n) for b in items]
        total = np.empty(n, dtype="<f4" if all(v.dtype == np.float32 for v in vecs) else "<f8")
        acc = np.empty(min(n, _FINITE_CHUNK))
        for i in range(0, n, _FINITE_CHUNK):  # piece by piece: the float64 sums stay in the cache
            a = acc[: min(_FINITE_CHUNK, n - i)]
            # the first two added, not from zeros: the same sums (0 + x is x; a -0.0 stays -0.0)
            np.add(vecs[0][i : i + a.size], vecs[1][i : i + a.size], out=a, dtype=np.float64)
            for v in vecs[2:]:
                a += v[i : i + a.size]
            total[i : i + a.size] = a  # float32 vectors: one rounding of each float64 sum
        return memoryview(total).cast("B")

    def _decrypt(self, data: bytes, n: int) -> np.ndarray:
        return self._values(data, n).astype(np.float64)

    def _decrypt_view(self, data: bytes, n: int) -> np.ndarray:
        return self._values(data, n)  # read-only, the message's own bytes (float32 or float64)

    def _check(self, body: bytes, n: int) -> None:
        if not _all_finite(self._values(body, n)):
            raise ValueError("a plaintext vector holds NaN or infinite values")
