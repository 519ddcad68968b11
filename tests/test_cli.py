"""The command line: bad input gives exit status 2 and one sentence, nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import cli_in_process
from tests.conftest import DATA


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hybridfl.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def assert_one_sentence_error(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert needle in lines[0], lines[0]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


MFEAT_CFG = """
seed: 0
dataset: {{name: mfeat, data_dir: {data}}}
partition:
  kind: class_block
  clients:
    - {{classes: [0, 1, 2, 3, 4], blocks: [fou, {block}]}}
    - {{classes: [5, 6, 7, 8, 9], blocks: [kar, pix]}}
algorithm: {{name: hyfem, rounds: 1, local_steps: 1, baselines: false}}
"""


def test_missing_config(tmp_path):
    assert_one_sentence_error(
        cli("run", "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")), "none.yaml' does not exist"
    )
    assert not (tmp_path / "o").exists()


def test_missing_data_directory(tmp_path):
    p = cli("run", "--dataset", "mfeat", "--data-dir", str(tmp_path / "nodata"), "--out", str(tmp_path / "o"))
    assert_one_sentence_error(p, "nodata' does not exist")
    assert not (tmp_path / "o").exists()


def test_unknown_block_name(tmp_path, monkeypatch, capsys):
    cfg = write(tmp_path, "c.yaml", MFEAT_CFG.format(data=DATA / "mfeat", block="nope"))
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert_one_sentence_error(p, "unknown block 'nope'")
    assert not (tmp_path / "o").exists()


def test_nan_in_csv_and_missing_label_column(tmp_path, monkeypatch, capsys):
    data = write(tmp_path, "d.csv", "a,b,label\n1,2,0\n3,,1\n5,6,0\n7,8,1\n")
    base = "dataset: {{name: table, path: {p}, label_column: {lab}, blocks: {{x: [a], z: [b]}}}}\npartition: {{kind: iid, num_clients: 2}}\n"
    cfg = write(tmp_path, "c.yaml", base.format(p=data, lab="label"))
    assert_one_sentence_error(
        cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "o")),
        "column 'b' of d.csv has a missing (NaN) value at row 2",
    )
    cfg2 = write(
        tmp_path,
        "c2.toml",
        f'[dataset]\nname = "table"\npath = "{data}"\nlabel_column = "target"\nblocks = {{x = ["a"], z = ["b"]}}\n',
    )
    assert_one_sentence_error(
        cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg2), "--out", str(tmp_path / "o")),
        "label column 'target' is not in d.csv",
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text,needle",
    [
        ("algorithm: {name: hyfem, rounds: 0}\n", "'algorithm.rounds'"),
        ("algorithm: {name: nosuch}\n", "unknown algorithm 'nosuch'"),
        ("dataset: {name: digits, colour: red}\n", "'dataset.colour' in c.yaml: is not a known setting"),
        ("seed: [1, 2\n", "is not valid YAML"),
        ("algorithm: {name: hyfem, lr: fast}\n", "'algorithm.lr'"),
    ],
)
def test_bad_config_fields(tmp_path, monkeypatch, capsys, text, needle):
    cfg = write(tmp_path, "c.yaml", text)
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert_one_sentence_error(p, needle)
    assert not (tmp_path / "o").exists()


def test_main_job_writes_results(tmp_path):
    """`hybridfl run --config` on digits: results.json with the documented keys, metrics.csv,
    the plots; accuracies are sane (server and clients beat chance by far)."""
    cfg = write(tmp_path, "c.yaml", "algorithm: {name: hyfem, rounds: 4, local_steps: 10, lr: 0.1, baselines: true}\n")
    p = cli("run", "--config", str(cfg), "--out", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    for key in (
        "server_accuracy",
        "client_accuracy_mean",
        "centralized_accuracy",
        "standalone_accuracy_mean",
        "rounds",
        "bytes_total",
        "config",
    ):
        assert key in res, key
    assert res["rounds"] == 4 and res["config"]["algorithm"]["rounds"] == 4
    assert res["server_accuracy"] > 0.5 and res["client_accuracy_mean"] > 0.4
    assert res["bytes_total"] > 0 and res["messages_total"] == 6 * 2 * (4 + 1)
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("round,")
    for png in ("accuracy.png", "coverage.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not [f for f in out.iterdir() if f.name.startswith(".")]  # no temporary files left


def test_partition_command_prints_coverage(tmp_path, monkeypatch, capsys):
    p = cli_in_process(
        monkeypatch,
        capsys,
        "partition",
        "--dataset",
        "mfeat",
        "--data-dir",
        str(DATA / "mfeat"),
        "--png",
        str(tmp_path / "c.png"),
        "--save",
        str(tmp_path / "p.json"),
    )
    assert p.returncode == 0, p.stderr
    assert "cells held by no client" in p.stdout and "fou" in p.stdout
    assert (tmp_path / "c.png").exists() and json.loads((tmp_path / "p.json").read_text())["clients"]


def test_every_algorithm_option_has_a_description():
    """``hybridfl algorithms --describe`` prints each field's description: every field of every
    registered algorithm's config (nested sections' fields too) has one."""
    from hybridfl.algorithms.spec import algorithms, config_fields

    missing = [
        f"{name}: {key}"
        for name, spec in sorted(algorithms().items())
        for key, info in config_fields(spec.config_model)
        if not (info.description or "").strip()
    ]
    assert missing == [], "fields without a description:\n" + "\n".join(missing)


def test_algorithms_describe_prints_every_option(monkeypatch, capsys):
    from hybridfl.algorithms.hyfem.config import HyFEMConfig
    from hybridfl.algorithms.spec import config_fields

    p = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "hyfem")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("hyfem: ")
    end = lines.index("", 3) if "" in lines[3:] else len(lines)  # the presets follow a blank line
    heads = {ln.split(":", 1)[0]: ln for ln in lines[3:end] if ln and not ln.startswith(" ")}
    assert list(heads) == [key for key, _ in config_fields(HyFEMConfig)]  # every option, nested ones as section.field
    assert heads["rounds"] == "rounds: integer; >= 1; default 30"
    assert heads["momentum"] == "momentum: number; in [0, 1); default 0.0"
    assert heads["variant"] == "variant: one of avg, prox; default avg"
    assert heads["matching.new_penalty"] == "matching.new_penalty: number or null; > 0; default null"
    assert heads["baselines"] == "baselines: true/false; default false"
    assert heads["matching"] == "matching: section"
    i = lines.index(heads["rounds"])
    assert lines[i + 1] == "    communication rounds T"
    # an alias is shown with the field it sets
    fedavg = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "hybrid_fedavg").stdout
    assert "\nlam (or lambda): number; > 0; default 0.0001\n    L2 regulariser lambda" in fedavg


def test_algorithms_describe_unknown_name(monkeypatch, capsys):
    p = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "nope")
    assert_one_sentence_error(p, "unknown algorithm 'nope' (known: centralized,")
