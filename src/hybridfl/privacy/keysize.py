"""A client's key-size policy for its homomorphic-encryption key (the client's own, never the
server's): a Paillier modulus below :data:`~hybridfl.privacy.he.MIN_PAILLIER_BITS` bits or CKKS
parameters below 128-bit security (the HE standard's bounds, HyFDCA Sec. 3.1's keys at a size that
holds: :func:`~hybridfl.privacy.ckks_params.security_problem`) is refused, read from the key itself,
unless the test-only :data:`~hybridfl.privacy.he.WEAK_KEYS_ENV` is set in the client's environment.
"""

from __future__ import annotations

import os

from hybridfl.errors import EncryptionPolicyError
from hybridfl.privacy.ckks_params import security_problem
from hybridfl.privacy.he import MIN_PAILLIER_BITS, WEAK_KEYS_ENV, CKKSBackend, HEBackend, PaillierBackend


def weak_keys_allowed() -> bool:
    """Whether this process's environment sets the test-only :data:`WEAK_KEYS_ENV` to ``1``."""
    return os.environ.get(WEAK_KEYS_ENV, "").strip() == "1"


def key_size(backend: HEBackend) -> int:
    """The size of the key behind ``backend``, read from the key itself: the Paillier modulus ``n``
    in bits, the CKKS polynomial modulus degree, ``0`` without encryption."""
    if isinstance(backend, PaillierBackend):
        return int(backend.pk.n).bit_length()
    if isinstance(backend, CKKSBackend):
        return int(backend.ctx.seal_context().data.first_context_data().parms().poly_modulus_degree())
    return 0


def check_key_size(backend: HEBackend, who: str) -> None:
    """Refuse a key below :data:`MIN_PAILLIER_BITS` or CKKS parameters below 128-bit security
    (:func:`~hybridfl.privacy.ckks_params.security_problem`) unless the test-only
    :data:`WEAK_KEYS_ENV` is set; ``who`` names the key's holder.

    Raises:
        EncryptionPolicyError: the key is too small (one sentence).
    """
    if weak_keys_allowed():
        return
    size = key_size(backend)
    if isinstance(backend, PaillierBackend) and size < MIN_PAILLIER_BITS:
        raise EncryptionPolicyError(
            f"{who} refuses its {size}-bit Paillier key, below the minimum {MIN_PAILLIER_BITS} bits; make a key "
            f"of at least {MIN_PAILLIER_BITS} bits ({WEAK_KEYS_ENV}=1 allows weaker keys in tests only)."
        )
    if isinstance(backend, CKKSBackend):
        bits = int(backend.ctx.seal_context().data.key_context_data().total_coeff_modulus_bit_count())
        why = security_problem(size, bits)
        if why:
            raise EncryptionPolicyError(
                f"{who} refuses its CKKS key of {why} (128-bit security); make a key with hybridfl he-keys "
                f"({WEAK_KEYS_ENV}=1 allows weaker keys in tests only)."
            )
