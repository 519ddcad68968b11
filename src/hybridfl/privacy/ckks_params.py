"""CKKS parameters at 128-bit security and seed-compressed secret-key ciphertexts (the byte side of
:mod:`hybridfl.privacy.he`'s CKKS backend).

**Parameters.** The largest total coefficient modulus ``log2 Q`` that keeps ``N``-degree RLWE at
128-bit classical security is the Homomorphic Encryption Standard's table (Albrecht et al.,
"Homomorphic Encryption Standard", 2018, Table 1, uniform/ternary secret, 128 bits):
``N = 4096: 109``, ``8192: 218``, ``16384: 438``, ``32768: 881``
(:data:`MAX_MODULUS_BITS`; also SEAL's ``CoeffModulus::MaxBitCount``). Only additions of
ciphertexts are needed, so one 60-bit data prime and one special prime suffice: ``[60, 60]`` from
degree 8192 on, ``[60, 49]`` (109 bits) at 4096 (:func:`coeff_modulus_bits`). The data level keeps
the 60-bit prime either way, so the value range and precision do not change with the degree.

**Bytes.** A CKKS ciphertext is two polynomials ``(c0, c1)`` of ``N`` coefficients modulo the data
prime (``2 N`` 64-bit words, ``N / 2`` values). Under secret-key (symmetric) encryption ``c1`` is
a uniformly random polynomial that SEAL can draw from a public seed and store as that seed
(SEAL's ``Encryptor::encrypt_symmetric`` returning ``Serializable<Ciphertext>``; Microsoft SEAL
3.6 manual, "seed compression"): a fresh ciphertext of half the size, expanded again by any
``Ciphertext::load``, the server's included. The RLWE sample is the same (``c1`` is public in the
scheme: revealing its seed reveals nothing more). :func:`seeded_ciphertext` builds one and wraps
it as a TenSEAL ``CKKSVector`` (``tensors.proto``'s ``CKKSVectorProto``: ``sizes``,
``ciphertexts``, ``scale``), so every TenSEAL reader takes it; ``tests/test_privacy_he.py`` fails
loudly if a TenSEAL version stops loading it. Sums the server forms are full ciphertexts (their
``c1`` is no longer a seed's).
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading

MAX_MODULUS_BITS = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
"""Polynomial modulus degree -> the largest total coefficient modulus bits at 128-bit security."""

MIN_DEGREE = min(MAX_MODULUS_BITS)
"""The smallest degree with a 128-bit entry that fits a 60-bit data prime (2048 allows 54 bits)."""


def coeff_modulus_bits(degree: int) -> list[int]:
    """The coefficient modulus primes' bit sizes for ``degree``: ``[60, 49]`` at 4096 (the 109-bit
    bound), ``[60, 60]`` from 8192 on; a degree without a 128-bit entry gets ``[60, 60]`` (TenSEAL
    or the key policy refuses it)."""
    return [60, 49] if int(degree) == 4096 else [60, 60]


def security_problem(degree: int, modulus_bits: int) -> str:
    """Why a CKKS key of ``degree`` and ``modulus_bits`` total coefficient modulus bits is below
    128-bit security ("" if it is not): a degree below :data:`MIN_DEGREE`, or more modulus bits
    than :data:`MAX_MODULUS_BITS` allows at that degree."""
    if degree < MIN_DEGREE:
        return f"polynomial modulus degree {degree}, below the minimum {MIN_DEGREE}"
    bound = max((bits for n, bits in MAX_MODULUS_BITS.items() if n <= degree), default=0)
    if modulus_bits > bound:
        return f"{modulus_bits}-bit coefficient modulus at degree {degree}, above the {bound} bits of 128-bit security"
    return ""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return bytes(out + bytes([b]))
        out.append(b | 0x80)


def _in_memory_files() -> bool:
    """Whether this system has in-memory files reachable by path (``memfd_create`` and /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class SeededEncryptor:
    """Secret-key CKKS encryption with seed-compressed ``c1`` (module docstring) for one TenSEAL
    context holding the secret key.

    Args:
        context: a ``tenseal.Context`` with its secret key.
    """

    def __init__(self, context):
        import tenseal.sealapi as sa

        self.ctx = context
        seal = context.seal_context().data
        self._sa = sa
        self._encoder = sa.CKKSEncoder(seal)
        self._encryptor = sa.Encryptor(seal, context.secret_key().data)
        self.scale = float(context.global_scale)
        self._fd: int | None = None  # the in-memory file SEAL saves to, made by this process
        self._pid = -1
        self._lock = threading.Lock()  # one save and read at a time through that file

    def __del__(self):
        if getattr(self, "_fd", None) is not None and self._pid == os.getpid():
            os.close(self._fd)

    def _save(self, serializable) -> bytes:
        """The bytes of SEAL's ``save``, whose binding writes to a path only: an in-memory file of
        this process (Linux with /proc; a forked child makes its own), else a temporary file."""
        if _in_memory_files():
            with self._lock:
                if self._pid != os.getpid():
                    self._fd, self._pid = os.memfd_create("hybridfl-ckks"), os.getpid()
                serializable.save(f"/proc/self/fd/{self._fd}")  # truncates, then writes the whole stream
                return os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        fd, path = tempfile.mkstemp(prefix="hybridfl-ckks-")
        try:
            os.close(fd)
            serializable.save(path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    def encrypt(self, values: list[float]) -> bytes:
        """A serialised TenSEAL ``CKKSVector`` of ``values`` (at most ``N / 2``) whose ciphertext
        is SEAL's seeded form: about ``N`` 64-bit words instead of ``2 N``."""
        pt = self._sa.Plaintext()
        self._encoder.encode(values, self.scale, pt)
        raw = self._save(self._encryptor.encrypt_symmetric(pt))
        sizes = _varint(len(values))
        return (
            b"\x0a"
            + _varint(len(sizes))
            + sizes
            + b"\x12"
            + _varint(len(raw))
            + raw
            + b"\x19"
            + struct.pack("<d", self.scale)
        )
