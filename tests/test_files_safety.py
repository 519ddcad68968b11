"""Files and directories: nothing is written outside the chosen directory, nothing earlier is
overwritten by accident, and private files are private from the moment they exist.

- client names are safe path components (``..`` would have written into the parent);
- an export refuses a non-empty directory (two exports would mix);
- ``hybridfl run --out DIR`` refuses a directory that holds a run unless ``--resume``/``--force``;
- exported directories are 0700 and their files 0600;
- the HE key file is created 0600 with ``O_EXCL | O_NOFOLLOW``: never over an existing file or
  through a symbolic link.

Every refusal is one sentence (exit status 2 at the command line) and leaves the disk as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridfl.config import parse_config
from hybridfl.data.export import SECRET_FILE, export_clients, load_client_dir
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import ConfigError, DataError
from hybridfl.experiment import prepare
from hybridfl.privacy.he import KeyDealer
from hybridfl.privacy.keys import load_secret, write_secret, write_secret_bytes
from tests.cli_helpers import cli_in_process

RUN_CFG = "seed: 0\ndataset: {name: digits}\nalgorithm: {name: hyfem, rounds: 1, local_steps: 1, baselines: false}\n"
EXPORT_CFG = (
    "seed: 0\ndataset: {name: digits}\n"
    "partition: {kind: class_block, num_clients: 2, classes_per_client: [5, 7], blocks_per_client: 2}\n"
    "algorithm: {name: hyfem, rounds: 1, local_steps: 1, baselines: false}\n"
)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hybridfl.cli.main", *args], capture_output=True, text=True, timeout=600
    )


def assert_one_sentence_error(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert needle in lines[0], lines[0]


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` (contents and mtime) and every directory, to show nothing changed."""
    out: dict[str, tuple[bytes, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() and not p.is_symlink() else b"", st.st_mtime_ns)
    return out


def mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o777


def _two_clients(split, a: str = "a", b: str = "b") -> Partition:
    tr = split.train
    blocks = tr.block_names
    return Partition(
        [ClientShard(a, tr.ids[:40], tuple(blocks[:2]), True), ClientShard(b, tr.ids[40:80], tuple(blocks[2:]), False)]
    )


# ---- (a) client names ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "../evil", "a\\b", "", "Server", "x" * 129, "a\0b"])
def test_unsafe_client_name_refused_and_nothing_written(digits_split, tmp_path, name):
    """A client named ``..`` would have been exported into the parent of the output directory."""
    out = tmp_path / "nest" / "export"
    out.parent.mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(DataError, match="cannot be a directory name"):
        export_clients(digits_split, _two_clients(digits_split, a=name), out)
    assert snapshot(tmp_path) == before  # not even the output directory was created


def test_client_names_differing_only_in_case_refused(digits_split, tmp_path):
    with pytest.raises(DataError, match="only in case"):
        export_clients(digits_split, _two_clients(digits_split, "Alice", "alice"), tmp_path / "o")
    assert not (tmp_path / "o").exists()


# ---- (b) non-empty export directory --------------------------------------------------------------
def test_export_into_non_empty_directory_refused(digits_split, tmp_path):
    out = tmp_path / "o"
    export_clients(digits_split, _two_clients(digits_split), out, include_test=False)
    before = snapshot(tmp_path)
    with pytest.raises(DataError, match="is not empty"):
        export_clients(digits_split, _two_clients(digits_split, "c", "d"), out)
    assert snapshot(tmp_path) == before and not (out / "c").exists()
    # a directory holding anything else is refused as well; an existing empty one is used
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="is not empty"):
        export_clients(digits_split, _two_clients(digits_split), other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"] and (other / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    export_clients(digits_split, _two_clients(digits_split), empty, include_test=False)
    assert load_client_dir(empty / "a").data.n_samples == 40


def test_export_clients_command_refuses_non_empty_directory(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(EXPORT_CFG)
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    before = snapshot(tmp_path)
    p = cli_in_process(monkeypatch, capsys, "export-clients", "--config", str(cfg), "--out", str(out))
    assert_one_sentence_error(p, "is not empty")
    assert snapshot(tmp_path) == before


# ---- (d) modes -----------------------------------------------------------------------------------
def test_exported_directories_0700_and_files_0600(digits_split, tmp_path):
    out = tmp_path / "o"
    export_clients(digits_split, _two_clients(digits_split), out, client_test=True)
    paths = [out, *out.rglob("*")]
    assert any(p.suffix == ".npz" for p in paths) and any(p.name == "labels.npy" for p in paths)
    for p in paths:
        assert mode(p) == (0o700 if p.is_dir() else 0o600), (p, oct(mode(p)))
    assert not [p for p in paths if p.name.startswith(".")]  # no temporary file left
    a = load_client_dir(out / "a")  # the files still read back
    assert a.test is not None and a.data.n_samples == 40


def test_export_command_he_key_is_0600_in_0700_directories(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "seed: 0\ndataset: {name: digits}\n"
        "partition: {kind: class_block, num_clients: 2, classes_per_client: [5, 7], blocks_per_client: 2}\n"
        "algorithm: {name: hyfdca, positive_classes: [0, 1, 2, 3, 4], dual_mode: block, encryption: paillier, paillier_bits: 512,"
        " reference: false}\n"
    )
    p = cli("export-clients", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    for c in ("client-0", "client-1"):
        assert mode(tmp_path / "o" / c) == 0o700
        assert mode(tmp_path / "o" / c / SECRET_FILE) == 0o600
        assert load_secret(tmp_path / "o" / c / SECRET_FILE)[0] == "paillier"


# ---- HE key file ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dealer():
    return KeyDealer("paillier", paillier_bits=512)


def test_key_file_created_0600(dealer, tmp_path):
    f = write_secret(dealer, tmp_path / "keys" / "he.key")
    assert mode(f) == 0o600 and mode(f.parent) == 0o700
    assert load_secret(f)[0] == "paillier"


def test_key_file_never_overwrites_an_existing_file(dealer, tmp_path):
    f = tmp_path / "he.key"
    f.write_bytes(b"the earlier key")
    with pytest.raises(DataError, match="already exists"):
        write_secret(dealer, f)
    assert f.read_bytes() == b"the earlier key"
    with pytest.raises(DataError, match="already exists"):
        write_secret_bytes(b"new", f)
    assert f.read_bytes() == b"the earlier key"


def test_key_file_never_follows_a_symlink(dealer, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"victim")
    link = tmp_path / "he.key"
    link.symlink_to(target)
    with pytest.raises(DataError, match="symbolic link"):
        write_secret(dealer, link)
    assert target.read_bytes() == b"victim" and link.is_symlink()
    dangling = tmp_path / "dangling.key"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(DataError, match="symbolic link"):
        write_secret(dealer, dangling)
    assert not (tmp_path / "would-be-created").exists()


def test_he_keys_command_refuses_an_existing_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "he.key"
    f.write_bytes(b"the earlier key")
    p = cli_in_process(
        monkeypatch, capsys, "he-keys", "--scheme", "paillier", "--paillier-bits", "512", "--out", str(f)
    )
    assert_one_sentence_error(p, "already exists")
    assert f.read_bytes() == b"the earlier key"


# ---- (c) run --out into an earlier run -----------------------------------------------------------
@pytest.mark.parametrize("marker", ["config.json", "results.json", "checkpoint.hfl"])
def test_prepare_refuses_a_directory_holding_a_run(tmp_path, marker):
    cfg = parse_config({"dataset": {"name": "digits"}, "algorithm": {"name": "hyfem", "rounds": 1}})
    out = tmp_path / "run"
    out.mkdir()
    (out / marker).write_text("{}")
    (out / "unrelated.txt").write_text("x")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=f"already holds a run \\({marker}\\)"):
        prepare(cfg, out)
    assert snapshot(tmp_path) == before
    prepare(cfg, out, force=True)
    prepare(cfg, out, resume=True)
    prepare(cfg, tmp_path / "new")  # a new directory is fine
    assert snapshot(tmp_path) == before  # prepare writes nothing
    (out / marker).unlink()
    prepare(cfg, out)  # a directory without a run is fine


def test_run_out_refuses_an_earlier_run_and_force_overwrites(tmp_path, monkeypatch, capsys):
    """The earlier run's results survive a second `run --out` into its directory; `--force`
    replaces them; `--force` together with `--resume` is refused."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(RUN_CFG)
    out = tmp_path / "out"
    first = cli("run", "--config", str(cfg), "--out", str(out), "--quiet")
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    assert "results.json" in before and "config.json" in before
    again = cli_in_process(
        monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(out), "--quiet", "--seed", "3"
    )
    assert_one_sentence_error(again, "already holds a run")
    assert "--force" in again.stderr and "--resume" in again.stderr
    assert snapshot(out) == before  # untouched: same bytes, same mtimes, no new file
    p = cli_in_process(monkeypatch, capsys, "run", "--resume", str(out), "--force")
    assert_one_sentence_error(p, "--resume takes the run directory only")
    assert snapshot(out) == before
    forced = cli_in_process(
        monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(out), "--quiet", "--seed", "3", "--force"
    )
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "results.json").read_text())["config"]["seed"] == 3
    assert json.loads((out / "config.json").read_text())["seed"] == 3


def test_run_out_refuses_an_interrupted_run(tmp_path, monkeypatch, capsys):
    """A directory with only a checkpoint (a run killed before its results) is refused too."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(RUN_CFG)
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.hfl").write_bytes(b"an interrupted run's checkpoint")
    before = snapshot(out)
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(out), "--quiet")
    assert_one_sentence_error(p, "already holds a run")
    assert snapshot(out) == before
