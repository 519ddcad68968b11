"""HE key files for deployments: generated on the client side, the secret never sent to the server.

HyFDCA's clients share one key pair (:class:`hybridfl.privacy.he.KeyDealer`: "a key dealer that is
not the server"). In a deployment one client organisation runs ``hybridfl he-keys`` (or the
export does it for a simulated set-up), gives the resulting secret key file to the other client
organisations out of band, and each SuperNode reads it from its own data directory
(``he_secret.key``). The server never reads such a file: in the hello exchange every client sends
only the *public* material (Paillier modulus ``n``, public CKKS context), the server checks that all
clients sent the same, and builds its encrypt/add-only backend from it.

File format: our message codec (:func:`hybridfl.runtime.messages.encode`) with ``kind``
``hybridfl.he-secret`` and payload ``scheme``, ``precision_bits``, ``public`` (bytes) and the secret
(Paillier: ``p``, ``q`` big-endian bytes; CKKS: ``context``, the TenSEAL context with its secret
key, and ``slots``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hybridfl.errors import DataError
from hybridfl.privacy.he import CKKSBackend, HEBackend, KeyDealer, PaillierBackend, PlainBackend
from hybridfl.runtime.messages import Message, decode, encode

SECRET_FILE = "he_secret.key"
KIND = "hybridfl.he-secret"


def _int_bytes(v: int) -> bytes:
    return int(v).to_bytes((int(v).bit_length() + 7) // 8, "big")


def dealer_to_bytes(dealer: KeyDealer) -> bytes:
    """Serialise a key dealer's key pair (the secret included): for client machines only."""
    p: dict = {"scheme": dealer.scheme, "precision_bits": int(dealer.precision_bits), "public": dealer.public_material()}
    secret = dealer._secret  # noqa: SLF001 (KeyDealer has no export API yet)
    if dealer.scheme == "paillier":
        _, sk = secret
        p["p"], p["q"] = _int_bytes(sk.p), _int_bytes(sk.q)
    elif dealer.scheme == "ckks":
        p["context"], p["slots"] = secret, int(dealer._slots)  # noqa: SLF001
    return encode(Message(KIND, "client", "client", 0, p))


def write_secret(dealer: KeyDealer, path: str | Path) -> Path:
    """Write the shared secret key file (mode 0600)."""
    p = Path(path)
    p.write_bytes(dealer_to_bytes(dealer))
    os.chmod(p, 0o600)
    return p


def load_secret(path: str | Path) -> tuple[str, HEBackend, bytes]:
    """``(scheme, client backend with the secret key, public material)`` from a secret key file.

    Raises:
        DataError: the file is missing or is not a hybridfl secret key file.
    """
    f = Path(path)
    if not f.is_file():
        raise DataError(f"HE secret key file {str(f)!r} does not exist (make it with `hybridfl he-keys` on a client machine).")
    try:
        m = decode(f.read_bytes())
    except Exception:  # noqa: BLE001
        raise DataError(f"{str(f)!r} is not a hybridfl HE secret key file.") from None
    if m.kind != KIND:
        raise DataError(f"{str(f)!r} is not a hybridfl HE secret key file.")
    p = m.payload
    scheme, prec, public = str(p["scheme"]), int(p["precision_bits"]), bytes(p["public"])
    if scheme == "paillier":
        from phe import paillier

        pk = paillier.PaillierPublicKey(int.from_bytes(public, "big"))
        sk = paillier.PaillierPrivateKey(pk, int.from_bytes(p["p"], "big"), int.from_bytes(p["q"], "big"))
        return scheme, PaillierBackend(pk, sk, prec), public
    if scheme == "ckks":
        import tenseal as ts

        return scheme, CKKSBackend(ts.context_from(bytes(p["context"])), int(p["slots"])), public
    return scheme, PlainBackend(), public
