"""One atomic writer for every file hybridfl writes (results, checkpoints, node state, keys)."""

from __future__ import annotations

import os

import pytest

from hybridfl.files import atomic_write


def test_atomic_write_replaces_whole_and_sets_the_mode(tmp_path):
    p = atomic_write(tmp_path / "sub" / "a.json", "old")
    assert p.read_text() == "old"
    atomic_write(p, b"new", mode=0o600)
    assert p.read_bytes() == b"new" and (p.stat().st_mode & 0o777) == 0o600
    assert sorted(os.listdir(p.parent)) == ["a.json"]  # no temporary file left behind


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = atomic_write(tmp_path / "a.bin", b"old")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(p, b"new")
    assert p.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["a.bin"]


def test_every_writer_goes_through_atomic_write():
    """No module of hybridfl writes a file by itself (write_text, write_bytes, os.replace, np.save
    to a path) except through hybridfl.files; exports of arrays go through np.save/np.savez into
    a fresh export directory (data/export.py) and the Flower launcher's own config files."""
    from pathlib import Path

    import hybridfl

    root = Path(hybridfl.__file__).parent
    allowed = {"files.py", "data/export.py", "runtime/flower/local.py"}
    offenders = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root).as_posix()
        if rel in allowed:
            continue
        text = f.read_text()
        for needle in (".write_text(", ".write_bytes(", "os.replace(", "open(tmp", "savefig(path", "savefig(out"):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == []
