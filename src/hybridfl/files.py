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
