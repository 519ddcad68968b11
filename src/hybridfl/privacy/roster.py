"""The roster: every organisation's credential public key, fixed before training, and the
signatures peers put on the keys and blobs they exchange through the server.

**Roster.** ``roster.json`` maps every client name to its Ed25519 credential public key (the
``auth_public_key`` of its ``client.json``, :mod:`hybridfl.privacy.credentials`). Federation
assembly writes it (``hybridfl federation assemble``) and each organisation installs it in its own
client directory (``hybridfl client roster``, which prints every key's fingerprint so the
organisations can compare them out of band); ``hybridfl export-clients`` writes it into every
client directory directly. A client reads it from its own directory, never from a server message,
so the server cannot substitute a key.

**Signed keys** (:class:`PeerAuth`). A client holding a roster signs, with its credential
(Ed25519, ``cryptography``), every X25519 public key (PSI, secure aggregation and the masked inner
products that use its keys: :func:`hybridfl.privacy.secagg.key_fields`) and blinded PSI blob it sends for a peer,
over ``domain | run | client name | purpose | fields`` (each part length-prefixed,
:func:`statement`); ``run`` is the run label of the message that started the alignment, so a
signature made for one run does not verify in another. A peer checks the signature against the
roster's key of the claimed sender and refuses the message otherwise (:class:`PeerAuthError`, one
sentence). Large blobs enter the statement as their SHA-256 digest (:func:`digest`).

Adversary: an active server (or relay) that drops, reorders, replaces or appends to what it
relays between two clients. It holds no roster private key, so it cannot make a signature for a
key or blob of its own (Ed25519 is existentially unforgeable), and a recorded signature of
another run, sender or purpose does not verify. What it can still do: withhold messages (the run
stops), and replay a whole signed blob of an earlier run under that run's label; every run's
blinding and X25519 keys are fresh and never leave their owner, so the replayed blob is of no use
to it (tests/test_malicious_psi.py and tests/test_malicious_keys.py play these). Not covered: a stolen ``client_key.pem`` and a
roster that the organisations did not compare (the fingerprints are for that).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hybridfl.errors import ConfigError, DataError, ProtocolError
from hybridfl.privacy.credentials import PUBLIC_KEY_FIELD, SIGNATURE_BYTES, load_client_key, public_key_hex

ROSTER_FILE = "roster.json"
"""The roster's file name, in the assembly's output and in every client directory."""

FORMAT = "hybridfl-roster-v1"
RUN_BYTES = 32
"""Bytes of a run label (the server's fresh random value, sent with the alignment's first message)."""

_DOMAIN = b"hybridfl-peer-v1"


class PeerAuthError(ProtocolError):
    """A peer's signature is missing, malformed or does not verify against the roster (one sentence)."""


def fingerprint(public_hex: str) -> str:
    """A short, comparable fingerprint of a public key: the first 16 bytes of its SHA-256, hex in
    groups of four (``"ab12 cd34 ..."``)."""
    h = hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:32]
    return " ".join(h[i : i + 4] for i in range(0, 32, 4))


@dataclass(frozen=True)
class Roster:
    """Every client name -> its Ed25519 credential public key (64 hex characters), and the names
    of the clients that hold labels (``labels``; FedBCD's passive parties answer a PSI request of
    the label party only)."""

    keys: Mapping[str, str]
    labels: tuple[str, ...] = ()

    @classmethod
    def from_keys(cls, keys: Mapping[str, object], where: str, labels: object = ()) -> Roster:
        """A roster from ``{name: hex key}`` and the label holders' names, every key checked.

        Raises:
            ConfigError: no client, a name that is not a string, a key that is not 64 hex
                characters, or a label holder that is not in the roster.
        """
        if not isinstance(keys, Mapping) or not keys:
            raise ConfigError(f"{where}: the roster names no client.")
        out = {}
        for c, k in keys.items():
            if not isinstance(c, str) or not c:
                raise ConfigError(f"{where}: a roster entry's client name is not a string.")
            out[c] = public_key_hex(k, f"{where}, client {c!r}")
        if not isinstance(labels, (list, tuple)) or any(c not in out for c in labels):
            raise ConfigError(f"{where}: the roster's label holders are not a list of its clients.")
        return cls(dict(sorted(out.items())), tuple(sorted(set(labels))))

    @classmethod
    def load(cls, path: str | Path) -> Roster:
        """Read a ``roster.json``.

        Raises:
            DataError: the file cannot be read or is not JSON.
            ConfigError: it is not a roster (see :meth:`from_keys`).
        """
        p = Path(path)
        try:
            raw = json.loads(p.read_text())
        except OSError:
            raise DataError(f"cannot read the roster {str(p)!r}.") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"the roster {str(p)!r} is not valid JSON.") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ConfigError(f"{str(p)!r} is not a hybridfl roster (format {FORMAT!r}).")
        return cls.from_keys(raw.get("clients"), str(p), raw.get("labels", []))

    def to_json(self) -> str:
        """The file's content (sorted names)."""
        return json.dumps({"format": FORMAT, "clients": dict(self.keys), "labels": list(self.labels)}, indent=1)

    def fingerprints(self) -> list[str]:
        """One line per client: ``name  fingerprint`` (what the organisations compare)."""
        return [f"{c}  {fingerprint(k)}{'  (labels)' if c in self.labels else ''}" for c, k in self.keys.items()]


def roster_of_dir(directory: str | Path | None) -> Roster | None:
    """The roster installed in a client directory, or ``None`` (none installed: no signed keys).

    Raises:
        DataError, ConfigError: a ``roster.json`` that cannot be read or is not a roster.
    """
    if directory is None or not (Path(directory) / ROSTER_FILE).is_file():
        return None
    return Roster.load(Path(directory) / ROSTER_FILE)


def install_roster(client_dir: str | Path, roster_path: str | Path) -> Roster:
    """Install ``roster_path`` as ``client_dir/roster.json`` after checking that it lists this
    client under its own public key (``client.json`` ``auth_public_key``).

    Raises:
        DataError: no ``client.json``, or the destination is a symbolic link.
        ConfigError: not a roster, or it does not list this client with its own key.
    """
    from hybridfl.files import atomic_write

    d = Path(client_dir)
    try:
        meta = json.loads((d / "client.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise DataError(f"{str(d)!r} is not a client directory (no readable client.json).") from None
    roster = Roster.load(roster_path)
    me, mine = str(meta.get("client_id")), meta.get(PUBLIC_KEY_FIELD)
    if roster.keys.get(me) != mine:
        raise ConfigError(f"the roster does not list client {me!r} with the public key of {str(d)!r}.")
    if (d / ROSTER_FILE).is_symlink():
        raise DataError(f"{str(d / ROSTER_FILE)!r} is a symbolic link; remove it first.")
    atomic_write(d / ROSTER_FILE, roster.to_json(), mode=0o600)
    return roster


def digest(blob: bytes) -> bytes:
    """SHA-256 of a blob (how a large blob enters a signed statement)."""
    return hashlib.sha256(bytes(blob)).digest()


def statement(run: bytes, sender: str, purpose: str, fields: Sequence[bytes]) -> bytes:
    """The bytes a peer signature covers: the domain tag, then ``run``, ``sender``, ``purpose``
    and every field, each prefixed by its length (4 bytes, big-endian)."""
    parts = [bytes(run), sender.encode(), purpose.encode(), *(bytes(f) for f in fields)]
    return _DOMAIN + b"".join(len(p).to_bytes(4, "big") + p for p in parts)


class PeerAuth:
    """A client's signing key and roster: signs what it sends to peers, checks what peers sent.

    Args:
        client_id: its own name (must be in the roster, with the public key of ``key``).
        key: its Ed25519 credential private key.
        roster: every client's public key.

    Raises:
        ConfigError: the roster does not list ``client_id`` with ``key``'s public key.
    """

    def __init__(self, client_id: str, key: Ed25519PrivateKey, roster: Roster):
        mine = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
        if roster.keys.get(client_id) != mine:
            raise ConfigError(f"the roster does not list client {client_id!r} with its own credential key.")
        self.client_id, self._key, self.roster = client_id, key, roster

    def sign(self, run: bytes, purpose: str, fields: Sequence[bytes]) -> bytes:
        """Its 64-byte signature over :func:`statement` (``run``, its own name, ``purpose``, ``fields``)."""
        return self._key.sign(statement(run, self.client_id, purpose, fields))

    def verify(self, run: bytes, sender: str, purpose: str, fields: Sequence[bytes], sig: object) -> None:
        """Check ``sig`` as ``sender``'s signature over :func:`statement`.

        Raises:
            PeerAuthError: ``sender`` is not in the roster, ``sig`` is not 64 bytes, or it does not verify.
        """
        pub = self.roster.keys.get(sender)
        if pub is None:
            raise PeerAuthError(
                f"client {self.client_id!r} refuses a {purpose} of {sender!r}, who is not in its roster."
            )
        if not isinstance(sig, (bytes, bytearray)) or len(sig) != SIGNATURE_BYTES:
            raise PeerAuthError(f"client {self.client_id!r} refuses an unsigned {purpose} of {sender!r}.")
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub)).verify(
                bytes(sig), statement(run, sender, purpose, fields)
            )
        except InvalidSignature:
            raise PeerAuthError(
                f"client {self.client_id!r} refuses a {purpose} of {sender!r} whose signature does not verify "
                "against its roster."
            ) from None


def peer_auth_of(client_id: str, directory: str | Path | None) -> PeerAuth | None:
    """The :class:`PeerAuth` of a client directory holding a roster, or ``None`` (no roster
    installed, or a client made in memory): then nothing is signed or checked (docs/privacy.md
    says what is lost).

    Raises:
        DataError, ConfigError: an unreadable roster or key, or a roster without this client's key.
    """
    roster = roster_of_dir(directory)
    return None if roster is None else PeerAuth(client_id, load_client_key(directory), roster)


def in_memory_auths(names: Sequence[str], labels: Sequence[str] = ()) -> dict[str, PeerAuth]:
    """Fresh credential keys and one shared roster (label holders ``labels``) for in-process
    clients (tests, benchmarks): ``{name: PeerAuth}``."""
    keys = {c: Ed25519PrivateKey.generate() for c in names}
    pub = {
        c: k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
        for c, k in keys.items()
    }
    roster = Roster.from_keys(pub, "in-memory roster", list(labels))
    return {c: PeerAuth(c, keys[c], roster) for c in names}


def roster_from_server_meta(meta: Mapping[str, object]) -> Roster | None:
    """The roster of a federation from its ``server.json`` content (``client_ids``,
    ``client_keys``, ``client_labels``), or ``None`` when a client has no registered key (a
    federation prepared before credentials existed).

    Raises:
        ConfigError: a registered key that is not 64 hex characters.
    """
    ids, keys = list(meta.get("client_ids") or []), meta.get("client_keys") or {}
    if not ids or not isinstance(keys, Mapping) or any(c not in keys for c in ids):
        return None
    labels = meta.get("client_labels") or {}
    held = [c for c in ids if isinstance(labels, Mapping) and labels.get(c, True)]
    return Roster.from_keys({c: keys[c] for c in ids}, "server.json", held)


def write_roster(directory: str | Path, meta: Mapping[str, object]) -> Roster | None:
    """Write ``directory/roster.json`` from a federation's ``server.json`` content
    (:func:`roster_from_server_meta`); nothing when a client has no registered key. Returns it."""
    from hybridfl.files import atomic_write

    roster = roster_from_server_meta(meta)
    if roster is not None:
        atomic_write(Path(directory) / ROSTER_FILE, roster.to_json(), mode=0o600)
    return roster
