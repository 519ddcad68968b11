"""Per-client credentials: how a deployed server knows that a node speaking for client ``c`` is the
organisation that prepared client ``c``.

Every client directory (``hybridfl client prepare`` or ``hybridfl export-clients``) holds its own
Ed25519 key pair: the private key in ``client_key.pem`` (mode 0600, never leaves the directory)
and the public key, hex, as ``auth_public_key`` in the public ``client.json``, which the server
directory collects (``server.json`` ``client_keys``). At the hello of a run the server sends every
node a fresh 32-byte nonce; the node answers with its client name and an Ed25519 signature over
``"hybridfl-hello-v1" | session | nonce | client name`` (:func:`hello_proof`), which the server
checks against that client's registered key (:func:`verify_hello`) before it maps the client to
the node, at the start of the run and when a restarted node claims the client later.

Adversary: a node that reaches the SuperLink (it got past Flower's own SuperNode authentication,
or that is off) and claims the name of a client whose private key it does not hold. It cannot
produce a signature over a nonce it has never seen signed (Ed25519, ``cryptography``), and a
recorded answer does not verify for another nonce, so it is refused and never receives that
client's messages. Not covered: a stolen ``client_key.pem`` (it is the organisation's secret, like
its data).
"""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hybridfl.errors import ConfigError, DataError
from hybridfl.files import create_private

CLIENT_KEY_FILE = "client_key.pem"
PUBLIC_KEY_FIELD = "auth_public_key"
NONCE_BYTES = 32
SIGNATURE_BYTES = 64
_DOMAIN = b"hybridfl-hello-v1"


def new_client_key(directory: str | Path) -> str:
    """Make a client's key pair: write the private key to ``directory/client_key.pem`` (PKCS#8
    PEM, mode 0600, never over an existing file) and return the public key as 64 hex characters
    (for ``client.json``).

    Raises:
        DataError: the key file exists already (or is a symbolic link).
    """
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    create_private(Path(directory) / CLIENT_KEY_FILE, pem, "client key file")
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_client_key(directory: str | Path | None) -> Ed25519PrivateKey:
    """The private key of the client directory ``directory``.

    Raises:
        DataError: no directory (a client made in memory has no credential), no ``client_key.pem``
            (a directory written before credentials existed: prepare or export it again), or a
            file that is not an Ed25519 private key.
    """
    if directory is None:
        raise DataError("this client was not read from a client directory, so it has no client_key.pem to prove it.")
    f = Path(directory) / CLIENT_KEY_FILE
    try:
        data = f.read_bytes()
    except OSError:
        raise DataError(
            f"client directory {str(directory)!r} has no {CLIENT_KEY_FILE}: the server cannot tell this node from an "
            "impostor; prepare (or export) the client directory again with this version of hybridfl."
        ) from None
    try:
        key = serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise DataError(f"{str(f)!r} is not an Ed25519 private key in PEM form.")
    return key


def public_key_hex(value: object, where: str) -> str:
    """Check a registered public key (``client.json`` / ``server.json``): 64 hex characters.

    Raises:
        ConfigError: anything else (named by ``where``).
    """
    try:
        ok = isinstance(value, str) and len(value) == 64 and len(bytes.fromhex(value)) == 32
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{where}: {PUBLIC_KEY_FIELD} is not a 64-character hex Ed25519 public key.")
    return str(value).lower()


def _signed(session: str, nonce: bytes, client_id: str) -> bytes:
    s, c = session.encode(), client_id.encode()
    return b"|".join([_DOMAIN, len(s).to_bytes(2, "big") + s, nonce, len(c).to_bytes(2, "big") + c])


def hello_proof(key: Ed25519PrivateKey, session: str, nonce: bytes, client_id: str) -> bytes:
    """The node's answer to the hello's challenge: the 64-byte Ed25519 signature over the domain
    tag, the run's ``session``, the server's ``nonce`` (32 bytes) and ``client_id``.

    Raises:
        ValueError: ``nonce`` is not 32 bytes or ``session`` is not a string (an untrusted server's
            hello is checked before anything is signed).
    """
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ValueError(f"the hello's nonce is not {NONCE_BYTES} bytes.")
    if not isinstance(session, str) or not 0 < len(session) <= 128:
        raise ValueError("the hello's session is not a string of 1 to 128 characters.")
    return key.sign(_signed(session, nonce, client_id))


def verify_hello(public_hex: str, session: str, nonce: bytes, client_id: str, proof: object) -> bool:
    """Whether ``proof`` is ``client_id``'s signature (key ``public_hex``) over this hello's
    ``session`` and ``nonce``: False for anything else, including a proof that is not 64 bytes."""
    if not isinstance(proof, bytes) or len(proof) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex)).verify(proof, _signed(session, nonce, client_id))
    except (InvalidSignature, ValueError):
        return False
    return True
