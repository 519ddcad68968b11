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

from pathlib import Path

from hybridfl.data.export import SECRET_FILE  # noqa: F401  (the one name of the key file)
from hybridfl.errors import ConfigError, DataError, MessageError
from hybridfl.files import create_private
from hybridfl.privacy.he import KEY_PAIR_KIND, HEBackend, KeyDealer
from hybridfl.runtime.messages import decode

KIND = KEY_PAIR_KIND


def dealer_to_bytes(dealer: KeyDealer) -> bytes:
    """Serialise a key dealer's key pair (the secret included): for client machines only."""
    return dealer.to_bytes()


def write_secret(dealer: KeyDealer, path: str | Path) -> Path:
    """Create the shared secret key file, readable by its owner only (mode 0600); see
    :func:`write_secret_bytes`.

    Raises:
        DataError: ``path`` already exists (an existing key is never overwritten) or is a symbolic link.
    """
    return write_secret_bytes(dealer_to_bytes(dealer), path)


def write_secret_bytes(data: bytes, path: str | Path) -> Path:
    """Create the key file ``path`` holding ``data`` with :func:`hybridfl.files.create_private`:
    mode 0600 from the start, never over an existing file, never through a symbolic link.

    Raises:
        DataError: ``path`` already exists or is a symbolic link (nothing is written).
    """
    return create_private(path, data, "HE secret key file")


def backend_from_secret(secret: bytes, where: str) -> tuple[str, HEBackend, bytes]:
    """``(scheme, client backend with the secret key, public material)`` from the bytes of a secret
    key file (``where`` names its origin in errors).

    Raises:
        DataError: the bytes are not a hybridfl secret key file.
    """
    try:
        m = decode(secret)
        if m.kind != KIND:
            raise ValueError(m.kind)
        dealer = KeyDealer.from_bytes(secret)
    except (MessageError, ConfigError, KeyError, TypeError, ValueError, ArithmeticError):
        raise DataError(f"{where} is not a hybridfl HE secret key file.") from None
    return dealer.scheme, dealer.client_backend(), dealer.public_material()


def load_secret(path: str | Path) -> tuple[str, HEBackend, bytes]:
    """``(scheme, client backend with the secret key, public material)`` from a secret key file.

    Raises:
        DataError: the file is missing or is not a hybridfl secret key file.
    """
    f = Path(path)
    if not f.is_file():
        raise DataError(
            f"HE secret key file {str(f)!r} does not exist (make it with `hybridfl he-keys` on a client machine)."
        )
    return backend_from_secret(f.read_bytes(), repr(str(f)))
