"""The Flower ClientApp of hybridfl (``hybridfl.runtime.flower.clientapp:app``).

Handles ``query.hybridfl`` messages: unwraps our encoded message, answers it with
:func:`hybridfl.runtime.flower.node.serve` as the client whose exported directory is the node
config ``data-dir``, and keeps the client's state between messages in two places on the node:

- Flower's ``context.state`` (the SuperNode keeps it in memory, so it dies with the SuperNode
  process);
- a file in the node's state directory, ``<state-dir>/run-<Flower run ID>.state`` (node config
  ``state-dir``, default ``<data-dir>/.hybridfl-state``; mode 0600), written atomically at the end
  of every message that changed the state. A SuperNode that is killed and started again with the
  same node config continues from it (:func:`hybridfl.runtime.flower.node.serve` makes a re-sent
  message safe). A hello of a new run removes the files of earlier runs.

What the state holds: the run's setup (algorithm, config, seed, layout, session), the client's
algorithm state between messages (its model or dual variables and its **secrets**: the X25519
secret key of secure aggregation ``secagg_sk``, the PSI secrets and the pairwise keys derived from
them), and the last message's number, digest and reply. It never leaves the node. The HE key pair
is not in it (read from ``data-dir`` for every message). The state file is encrypted at rest with
ChaCha20-Poly1305 (RFC 8439, from ``cryptography``) under a 32-byte key kept in the client
directory, ``<data-dir>/node_state.key`` (created with mode 0600 on first use); the file's name is
authenticated with it, so a copied or renamed file does not load. Adversary: someone who reads or
copies the state directory (e.g. a backup, or a ``state-dir`` on shared storage) but not the client
directory learns nothing of the state and cannot change it undetected; whoever reads the client
directory holds the data and its keys anyway.

The warm executor (:mod:`hybridfl.runtime.flower.executor`) answers the same messages with
:func:`answer` in one long-lived process: it keeps the state in a :class:`FileStore` (memory,
backed by the same state file) and the client object in a
:class:`~hybridfl.runtime.flower.node.WarmClient` instead of ``context.state``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from hybridfl.files import atomic_write
from hybridfl.runtime.flower.bridge import HELLO, pack, unpack_meta

STATE = "hybridfl.state"
STATE_DIR = ".hybridfl-state"
FILE_KIND = "hybridfl.node-state"
STATE_KEY_FILE = "node_state.key"
_MAGIC = b"hybridfl-node-state\x00v2\x00"  # encrypted format: magic, 12-byte nonce, ciphertext + tag
app = ClientApp()


def state_key(node_config) -> bytes | None:
    """The node's state-file key: 32 bytes in ``<data-dir>/node_state.key``, created (mode 0600,
    exclusively, so concurrent ClientApp processes agree) on first use; None without ``data-dir``.

    Raises:
        HybridFLError: the key file cannot be created or read, or is not 32 bytes (one sentence).
    """
    from hybridfl.errors import HybridFLError

    data = str(node_config.get("data-dir", "") or "")
    if not data:
        return None
    path = Path(data) / STATE_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise HybridFLError(f"cannot create the node's state key {str(path)!r} ({e.strerror}).") from None
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
            f.flush()
            os.fsync(f.fileno())
    try:
        key = path.read_bytes()
    except OSError as e:
        raise HybridFLError(f"cannot read the node's state key {str(path)!r} ({e.strerror}).") from None
    if len(key) != 32:
        raise HybridFLError(f"the node's state key {str(path)!r} is not 32 bytes: remove it (and the state directory).")
    return key


def state_path(node_config, run_id: int) -> Path | None:
    """The state file of run ``run_id`` on a node with ``node_config`` (None: no directory known)."""
    d = str(node_config.get("state-dir", "") or "")
    if not d:
        data = str(node_config.get("data-dir", "") or "")
        if not data:
            return None
        d = str(Path(data) / STATE_DIR)
    return Path(d) / f"run-{int(run_id)}.state"


def read_state(path: Path, key: bytes) -> dict[str, bytes]:
    """The saved state of one run (the bytes the store held after the last message), decrypted
    with the node's ``key`` (:func:`state_key`).

    Raises:
        ValueError: the file is not an encrypted hybridfl node state file, or does not decrypt
            with ``key`` under its name (another node's file, renamed, or changed).
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from hybridfl.runtime.messages import MessageError, decode

    raw = path.read_bytes()
    if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + 12 + 16:
        raise ValueError(f"{str(path)!r} is not an encrypted hybridfl node state file.")
    nonce, body = raw[len(_MAGIC) : len(_MAGIC) + 12], raw[len(_MAGIC) + 12 :]
    try:
        plain = ChaCha20Poly1305(key).decrypt(nonce, body, path.name.encode())
    except InvalidTag:
        raise ValueError(
            f"{str(path)!r} does not decrypt with this node's state key: it was written by another node, renamed or changed."
        ) from None
    try:
        m = decode(plain)
    except MessageError:
        raise ValueError(f"{str(path)!r} is not a hybridfl node state file.") from None
    if m.kind != FILE_KIND or not all(isinstance(v, bytes) for v in m.payload.values()):
        raise ValueError(f"{str(path)!r} is not a hybridfl node state file.")
    return {str(k): bytes(v) for k, v in m.payload.items()}


def write_state(path: Path, state: dict[str, bytes], key: bytes) -> None:
    """Write ``state`` encrypted under ``key`` (ChaCha20-Poly1305, a fresh 12-byte nonce, the file
    name as associated data) atomically (temporary file, fsync, rename), readable by the owner only."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from hybridfl.runtime.messages import Message as HMessage
    from hybridfl.runtime.messages import encode

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    nonce = os.urandom(12)
    plain = encode(HMessage(FILE_KIND, "node", "node", 0, dict(state)))
    atomic_write(path, _MAGIC + nonce + ChaCha20Poly1305(key).encrypt(nonce, plain, path.name.encode()), mode=0o600)


class _StateStore(MutableMapping[str, bytes]):
    """``context.state[STATE]`` (a ConfigRecord of bytes) as a mutable mapping, backed by the run's
    state file: loaded from it when it exists (it is written last, so it is never behind
    ``context.state``; after a SuperNode restart ``context.state`` is empty), saved by :meth:`save`
    (encrypted under ``key``; no key: no file)."""

    def __init__(self, context: Context, path: Path | None, key: bytes | None):
        if STATE not in context.state:
            context.state[STATE] = ConfigRecord()
        self.rec = context.state[STATE]
        self.path = path if key is not None else None
        self.key = key
        self.dirty = False
        if self.path is not None and self.path.is_file():
            disk = read_state(self.path, key)
            for k in list(self.rec):
                del self.rec[k]
            for k, v in disk.items():
                self.rec[k] = v

    def __getitem__(self, k: str) -> bytes:
        return self.rec[k]  # type: ignore[return-value]

    def __setitem__(self, k: str, v: bytes) -> None:
        self.rec[k] = v
        self.dirty = True

    def __delitem__(self, k: str) -> None:
        del self.rec[k]
        self.dirty = True

    def __iter__(self) -> Iterator[str]:
        return iter(self.rec)

    def __len__(self) -> int:
        return len(self.rec)

    def save(self) -> None:
        if self.dirty and self.path is not None:
            write_state(self.path, {k: bytes(v) for k, v in self.rec.items()}, self.key)  # type: ignore[arg-type]
            self.dirty = False


class FileStore(dict):
    """A node's state for one run in memory (the warm executor's store), backed by its state file
    (encrypted under ``key``, :func:`state_key`; no key: no file): loaded from ``path`` when it
    exists, written back by :meth:`save` after a message changed it.

    Raises:
        ValueError: the file at ``path`` is not a hybridfl node state file or does not decrypt.
    """

    def __init__(self, path: Path | None, key: bytes | None):
        path = path if key is not None else None
        super().__init__(read_state(path, key) if path is not None and path.is_file() else {})
        self.path = path
        self.key = key
        self.saved = dict(self)

    def save(self) -> None:
        """Write the state file if the state changed since it was loaded or last saved."""
        if self.path is not None and self != self.saved:
            write_state(self.path, {k: bytes(v) for k, v in self.items()}, self.key)
            self.saved = dict(self)


def answer(msg: Message, context: Context, store, warm=None) -> Message:
    """Answer one ``query.hybridfl`` Flower message as the client of node config ``data-dir``.

    Unpacks our bytes and sequence numbers, answers with :func:`hybridfl.runtime.flower.node.serve`
    on ``store`` (a mapping of bytes with a ``save()`` method that writes the run's state file),
    saves it, and (for a hello) removes earlier runs' state files. ``warm`` (a
    :class:`~hybridfl.runtime.flower.node.WarmClient`) keeps the client object for the next
    message. Returns the Flower reply carrying our encoded reply.

    Raises:
        ValueError: the Flower message carries no hybridfl message.
        StaleMessage: a message the server had given up, delivered late (not applied).
        RuntimeError: the node's saved state does not belong with the message.
    """
    from hybridfl.runtime.flower.node import serve
    from hybridfl.runtime.messages import decode

    data_dir = context.node_config.get("data-dir")
    if warm is not None:  # predict-table / predict-out for a federated prediction (tasks.py)
        warm.tasks.node_config = dict(context.node_config)
    raw, seq, acked = unpack_meta(msg.content)
    path = state_path(context.node_config, context.run_id)
    reply = serve(raw, seq, str(data_dir) if data_dir else None, store, acked, warm)
    store.save()
    if path is not None and seq is None and decode(raw).kind == HELLO:
        for old in path.parent.glob("run-*.state"):  # earlier runs' state: no longer needed
            if old != path:
                old.unlink(missing_ok=True)
    return Message(pack(reply), reply_to=msg)


@app.query("hybridfl")
def query(msg: Message, context: Context) -> Message:
    """Answer one ``query.hybridfl`` Flower message in a ClientApp process of its own: :func:`answer`
    with the state in ``context.state``, backed by the run's state file.

    Raises:
        ValueError: the Flower message carries no hybridfl message.
        StaleMessage: a message the server had given up, delivered late (not applied).
        RuntimeError: the node's saved state does not belong with the message.
    """
    path = state_path(context.node_config, context.run_id)
    return answer(msg, context, _StateStore(context, path, state_key(context.node_config)))
