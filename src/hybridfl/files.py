"""Writing files so that a crash never leaves a half-written one.

Every file hybridfl writes (results, metrics, plots, checkpoints, a node's state file, progress)
goes through :func:`atomic_write`: the bytes go to a temporary file in the same directory, which
is flushed and ``fsync``-ed, renamed over the target (``os.replace``), and the directory is
``fsync``-ed so the rename itself survives a power loss. A reader sees the old file or the new
one, never a mixture.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` atomically; create the parent directory.

    Args:
        path: the target file.
        data: its whole new content.
        mode: permission bits of the new file (``0o600`` for anything secret or private).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the directory cannot be created or written (the target is then untouched).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(p.parent)
    return p


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # a platform without directory handles: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def create_private(path: str | Path, data: bytes, what: str = "key file") -> Path:
    """Create the file ``path`` holding ``data`` for its owner only: opened with ``O_CREAT |
    O_EXCL | O_NOFOLLOW`` and mode 0600 from the start (never readable by others, not even
    briefly), so it never overwrites an existing file and never follows a symbolic link. The parent
    directory is created (mode 0700) if missing. A failed write removes the partial file.

    Raises:
        DataError: ``path`` already exists or is a symbolic link (nothing is written); ``what``
            names the file in the message.
    """
    from hybridfl.errors import DataError

    f = Path(path)
    f.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(f, flags, 0o600)
    except FileExistsError:
        raise DataError(
            f"{what} {str(f)!r} already exists (or is a symbolic link): an existing key is never "
            "overwritten, so remove it first or choose another path."
        ) from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(bytes(data))
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        f.unlink(missing_ok=True)
        raise
    return f
