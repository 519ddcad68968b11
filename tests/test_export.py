"""Exporting a partition into one directory per client, and reading it back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.data import ClassBlockPartitioner
from hybridfl.data.export import export_clients, load_client_dir, load_server_dir
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import DataError


def _part(split, seed=0):
    return ClassBlockPartitioner(num_clients=3, classes_per_client=(5, 7), blocks_per_client=2, seed=seed).partition(
        split.train
    )


def test_export_round_trip_equals_subset(digits_split, tmp_path):
    part = _part(digits_split)
    dirs = export_clients(digits_split, part, tmp_path / "out", seed=5)
    assert [d.name for d in dirs] == [c.client_id for c in part.clients]
    for i, (d, c) in enumerate(zip(dirs, part.clients)):
        cd = load_client_dir(d)
        ref = digits_split.train.subset(c.sample_ids, c.blocks)
        assert cd.client_id == c.client_id and cd.index == i and cd.has_labels
        assert cd.data.block_names == list(c.blocks)
        assert np.array_equal(cd.data.ids, ref.ids)
        assert np.array_equal(cd.data.y, ref.y)
        for b in c.blocks:
            assert cd.data.blocks[b].dtype == np.float32
            assert np.array_equal(cd.data.blocks[b], ref.blocks[b])
        assert cd.block_shapes == digits_split.train.block_shapes
        # a client directory holds only its own blocks
        names = json.loads((d / "blocks.json").read_text())["blocks"]
        assert [e["name"] for e in names] == list(c.blocks)
    srv = load_server_dir(tmp_path / "out" / "server")
    assert srv.client_ids == [c.client_id for c in part.clients]
    assert srv.meta["seed"] == 5
    assert np.array_equal(srv.test.ids, digits_split.test.ids)
    assert np.array_equal(srv.test.blocks[srv.test.block_names[0]], digits_split.test.blocks[srv.test.block_names[0]])


def test_export_without_labels_and_without_test(digits_split, tmp_path):
    tr = digits_split.train
    blocks = tr.block_names
    part = Partition(
        [
            ClientShard("a", tr.ids[:50], tuple(blocks[:2]), True),
            ClientShard("b", tr.ids[:50], tuple(blocks[2:]), False),
        ]
    )
    export_clients(digits_split, part, tmp_path, include_test=False)
    b = load_client_dir(tmp_path / "b")
    assert not b.has_labels and not (tmp_path / "b" / "labels.npy").exists()
    assert np.all(b.data.y == 0)
    assert load_server_dir(tmp_path / "server").test is None


def test_missing_directory_and_files_give_one_sentence(digits_split, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_client_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no client.json"):
        load_client_dir(tmp_path / "empty")
    dirs = export_clients(digits_split, _part(digits_split), tmp_path / "x", include_test=False)
    first_block = json.loads((dirs[0] / "blocks.json").read_text())["blocks"][0]["file"]
    (dirs[0] / first_block).unlink()
    with pytest.raises(DataError, match="is missing"):
        load_client_dir(dirs[0])


def test_bad_client_name_rejected(digits_split, tmp_path):
    tr = digits_split.train
    part = Partition([ClientShard("../evil", tr.ids[:10], tuple(tr.block_names), True)])
    with pytest.raises(DataError, match="cannot be a directory name"):
        export_clients(digits_split, part, tmp_path)


def test_export_clients_command(tmp_path, monkeypatch, capsys):
    """``hybridfl export-clients`` through the CLI's entry point, in process (the real process:
    tests/test_files_safety.py::test_export_command_he_key_is_0600_in_0700_directories)."""
    from tests.cli_helpers import cli_in_process

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "seed: 4\ndataset: {name: digits}\n"
        "partition: {kind: class_block, num_clients: 2, classes_per_client: [5, 7], blocks_per_client: 2}\n"
        "algorithm: {name: hyfem, rounds: 3, local_steps: 2, baselines: false}\n"
    )
    p = cli_in_process(
        monkeypatch, capsys, "export-clients", "--config", str(cfg), "--out", str(tmp_path / "o"), "--rounds", "2"
    )
    assert p.returncode == 0, p.stderr
    assert load_client_dir(tmp_path / "o" / "client-1").index == 1
    srv = load_server_dir(tmp_path / "o" / "server")
    assert srv.meta["seed"] == 4 and srv.meta["run_config"]["algorithm"]["rounds"] == 2
    assert srv.meta["run_config"]["algorithm"]["lr"] == 0.05  # the validated config, with defaults
    bad = cli_in_process(
        monkeypatch, capsys, "export-clients", "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "x")
    )
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and "does not exist" in bad.stderr


def test_export_writes_he_keys_to_clients_only(tmp_path, monkeypatch, capsys):
    from hybridfl.privacy.keys import SECRET_FILE, load_secret
    from tests.cli_helpers import cli_in_process

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "seed: 0\ndataset: {name: digits}\n"
        "partition: {kind: class_block, num_clients: 2, classes_per_client: [5, 7], blocks_per_client: 2}\n"
        "algorithm: {name: hyfdca, positive_classes: [0, 1, 2, 3, 4], dual_mode: block, encryption: paillier, paillier_bits: 512, reference: false}\n"
    )
    p = cli_in_process(monkeypatch, capsys, "export-clients", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    keys = [load_secret(tmp_path / "o" / f"client-{i}" / SECRET_FILE) for i in range(2)]
    assert keys[0][0] == "paillier" and keys[0][2] == keys[1][2]  # one shared key pair
    assert not list((tmp_path / "o" / "server").rglob("*.key"))
    be = keys[0][1]
    assert np.allclose(keys[1][1].decrypt(be.encrypt(np.array([1.5, -2.0]))), [1.5, -2.0])
    k = cli_in_process(monkeypatch, capsys, "he-keys", "--scheme", "ckks", "--out", str(tmp_path / "s.key"))
    assert k.returncode == 0, k.stderr
    assert load_secret(tmp_path / "s.key")[0] == "ckks"
    assert (tmp_path / "s.key").stat().st_mode & 0o077 == 0
