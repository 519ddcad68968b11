"""Privacy: additive homomorphic encryption backends (``none``, ``paillier``, ``ckks``)."""

from hybridfl.privacy.he import (
    SCHEMES,
    CKKSBackend,
    HEBackend,
    KeyDealer,
    PaillierBackend,
    PlainBackend,
    SecretKeyMissing,
    server_backend,
)

__all__ = [
    "SCHEMES",
    "CKKSBackend",
    "HEBackend",
    "KeyDealer",
    "PaillierBackend",
    "PlainBackend",
    "SecretKeyMissing",
    "server_backend",
]
