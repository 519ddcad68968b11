"""Privacy: additive homomorphic encryption backends (``none``, ``paillier``, ``ckks``) and private set
intersection of sample IDs (:mod:`hybridfl.privacy.psi`)."""

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
from hybridfl.privacy.psi import PSIClient, PSIError, PSIServer

__all__ = [
    "SCHEMES",
    "CKKSBackend",
    "HEBackend",
    "KeyDealer",
    "PSIClient",
    "PSIError",
    "PSIServer",
    "PaillierBackend",
    "PlainBackend",
    "SecretKeyMissing",
    "server_backend",
]
