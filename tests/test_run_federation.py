"""Issue 14 item 1: ``hybridfl run --federation federation.toml --clients DIR ...``.

Three organisations each hold their own CSV (their own customers, partly overlapping, and their
own columns); ``federation init`` writes the schema, ``client prepare`` their directories, and
``run --federation`` trains in process from those directories alone. The result equals the
in-process simulation of the same data given as one table and a partition (the reference a
central party could compute), for HyFEM and HyFDCA; bad input is one sentence with nothing
written; a run is resumed from its directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridfl.config import DatasetConfig
from hybridfl.data.from_config import load_dataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.runtime.simulation import simulate
from tests.test_prepare import run_cli

N = 72
REGIONS = ["north", "south", "east west"]
BLOCKS = {"demo": ["age", "region"], "bank": ["balance", "loans"], "shop": ["spend", "visits"]}
# organisation -> (its customers, its blocks): hybrid, every customer's blocks held by somebody
ORGS = {
    "bank": (range(0, 48), ["bank", "demo"]),
    "census": (range(24, 72), ["demo", "shop"]),
    "shop": (range(0, 72, 2), ["shop", "bank"]),
}


def _rows(n: int = N, seed: int = 3, prefix: str = "c") -> dict[str, dict[str, object]]:
    """``n`` customers ``<prefix>000..``: their columns and a label that depends on them."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        balance, loans = float(np.round(rng.normal(100, 30), 3)), int(rng.integers(0, 4))
        age, spend = int(rng.integers(20, 70)), float(np.round(rng.gamma(2.0, 10.0), 3))
        score = 0.03 * (balance - 100) - 0.5 * loans + 0.04 * (age - 45) + 0.05 * (spend - 20) + rng.normal(0, 0.5)
        out[f"{prefix}{i:03d}"] = {
            "age": age,
            "region": REGIONS[i % 3],
            "balance": balance,
            "loans": loans,
            "spend": spend,
            "visits": int(rng.integers(0, 9)),
            "default": "yes" if score > 0 else "no",
        }
    return out


def _csv(ids, columns: list[str], rows) -> str:
    head = ",".join(["ID", *columns])
    return head + "\n" + "".join(",".join([i, *(str(rows[i][c]) for c in columns)]) + "\n" for i in ids)


def _config(algorithm: str, path: Path | None = None) -> str:
    return f"""seed: 5
dataset:
  name: table
  path: {path or "unused.csv"}
  test_path: {path or "unused.csv"}
  id_column: ID
  label_column: default
  classes: ["no", "yes"]
  standardize: false
  categorical: [region]
  levels: {{region: ["east west", north, south]}}  # the table loader's order (sorted)
  blocks:
    demo: [age, region]
    bank: [balance, loans]
    shop: [spend, visits]
partition: {{kind: iid, num_clients: 3}}
algorithm: {algorithm}
"""


def _federation(
    tmp_path: Path, monkeypatch, capsys, algorithm: str, orgs: dict | None = None, tests: dict | None = None
) -> tuple[Path, list[Path], dict]:
    """Schema and the prepared client directories of ``orgs`` (default :data:`ORGS`, every
    organisation holding the labels of its customers; a value ``(customers, blocks, labels)`` says
    whether its table has the label column); ``tests``: organisation -> its own test customers
    ``t000..`` (``client prepare --test-table``, the columns of its training table)."""
    rows, trows = _rows(), _rows(80, 11, "t")
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(_config(algorithm))
    schema = tmp_path / "federation.toml"
    code, _, err = run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(schema))
    assert code == 0, err
    dirs = []
    for index, (org, (ids, blocks, *labels)) in enumerate((orgs or ORGS).items()):
        cols = [c for b in blocks for c in BLOCKS[b]] + (["default"] if labels in ([], [True]) else [])
        table = tmp_path / f"{org}.csv"
        table.write_text(_csv([f"c{i:03d}" for i in ids], cols, rows))
        d = tmp_path / "clients" / org
        args = ["client", "prepare", "--table", str(table), "--schema", str(schema), "--out", str(d)]
        if tests and org in tests:
            (tmp_path / f"{org}_test.csv").write_text(_csv([f"t{i:03d}" for i in tests[org]], cols, trows))
            args += ["--test-table", str(tmp_path / f"{org}_test.csv")]
        code, _, err = run_cli(monkeypatch, capsys, *args, "--index", str(index))
        assert code == 0, err
        dirs.append(d)
    return schema, dirs, rows


def _reference(tmp_path: Path, algorithm_cfg, rows) -> object:
    """The same data as one table and a partition, simulated in process."""
    every = [c for b in BLOCKS.values() for c in b] + ["default"]
    whole = tmp_path / "whole.csv"
    whole.write_text(_csv(sorted(rows), every, rows))
    test = tmp_path / "whole_test.csv"  # a held-out table (the federation has none; not compared)
    test.write_text(_csv(sorted(rows), every, rows).replace("\nc", "\nt"))
    ds = DatasetConfig.model_validate(
        {
            "name": "table",
            "path": str(whole),
            "test_path": str(test),
            "id_column": "ID",
            "label_column": "default",
            "standardize": False,
            "categorical": ["region"],
            "blocks": BLOCKS,
        }
    )
    split = load_dataset(ds, 5)
    partition = Partition(
        [
            ClientShard(org, np.array([f"c{i:03d}" for i in ids]), tuple(b for b in BLOCKS if b in blocks), True)
            for org, (ids, blocks) in ORGS.items()
        ]
    )
    return simulate(algorithm_cfg.name, split, partition, algorithm_cfg, 5)


def test_hybrid_fedavg_federation_equals_the_simulation_of_the_same_data(tmp_path, monkeypatch, capsys):
    """Hybrid FedAvg (logistic, convex): the final ``w`` of ``run --federation`` equals the
    simulation of the whole table with the same holdings (float32 storage of the prepared blocks
    against the table loader's: 1e-5 relative)."""
    from hybridfl.algorithms.hybrid_fedavg.config import HybridFedAvgConfig

    schema, dirs, rows = _federation(tmp_path, monkeypatch, capsys, "{name: hybrid_fedavg, rounds: 6, loss: logistic}")
    out = tmp_path / "run"
    args = ["run", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "--out", str(out), "-q"]
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["rounds"] == 6 and res["config"]["federation"] == str(schema.resolve())
    w = np.load(out / "final.npz")["w"]
    ref = _reference(tmp_path, HybridFedAvgConfig(rounds=6, loss="logistic"), rows)
    assert ref.final is not None and np.abs(ref.final["w"]).sum() > 0
    np.testing.assert_allclose(w, ref.final["w"], rtol=1e-5, atol=1e-7)
    assert res["messages_total"] == ref.summary["messages_total"]
    # the replies carry the client's measured seconds, whose text length varies by a few bytes
    assert abs(res["bytes_total"] - ref.summary["bytes_total"]) <= 0.01 * ref.summary["bytes_total"]


def test_hyfdca_federation_equals_the_simulation_of_the_same_data(tmp_path, monkeypatch, capsys):
    """HyFDCA without encryption (no key file needed): the same ``w`` as the simulation of the
    whole table, to 1e-5 relative (float32 storage)."""
    from hybridfl.algorithms.hyfdca.config import HyFDCAConfig

    algo = "{name: hyfdca, rounds: 4, encryption: none, local_fraction: 0.1, dual_mode: block}"
    schema, dirs, rows = _federation(tmp_path, monkeypatch, capsys, algo)
    out = tmp_path / "run"
    args = ["run", "--federation", str(schema), "--out", str(out), "-q"]
    code, _, err = run_cli(monkeypatch, capsys, *args, *[a for d in dirs for a in ("--clients", str(d))])
    assert code == 0, err
    w = np.load(out / "final.npz")["w"]
    ref = _reference(tmp_path, HyFDCAConfig(rounds=4, encryption="none", local_fraction=0.1, dual_mode="block"), rows)
    assert np.abs(ref.final["w"]).sum() > 0
    np.testing.assert_allclose(w, ref.final["w"], rtol=1e-5, atol=1e-8)


def test_hyfem_federation_trains_and_resumes(tmp_path, monkeypatch, capsys):
    """HyFEM on the three directories: the run completes and writes its files; a run stopped
    after 2 of 4 rounds (its checkpoint) and resumed with ``--resume DIR`` ends where the
    uninterrupted run ends."""
    algo = "{name: hyfem, rounds: 4, local_steps: 3, batch_size: 8, hidden: 8}"
    schema, dirs, _ = _federation(tmp_path, monkeypatch, capsys, algo)
    base = ["run", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "-q"]
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "full"))
    assert code == 0, err
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "part"), "--rounds", "2")
    assert code == 0, err
    # the 2-round run's checkpoint continued for 2 more rounds = the 4-round run
    saved = json.loads((tmp_path / "part" / "config.json").read_text())
    saved["algorithm"]["rounds"] = 4
    (tmp_path / "part" / "config.json").write_text(json.dumps(saved))
    code, _, err = run_cli(monkeypatch, capsys, "run", "--resume", str(tmp_path / "part"), "-q")
    assert code == 0, err
    part = json.loads((tmp_path / "part" / "results.json").read_text())
    assert part["rounds"] == full["rounds"] == 4
    assert part["messages_total"] == full["messages_total"]
    for key in ("server_accuracy", "client_accuracy_mean"):  # no test set in a federation: no accuracies
        assert full.get(key) is None


@pytest.mark.parametrize(
    "case, needle",
    [
        ("no_clients", "needs the client directories"),
        ("clients_only", "needs the federation schema"),
        ("with_config", "drop --config"),
        ("missing_dir", "does not exist"),
        ("twice", "given twice"),
        ("other_schema", "another federation schema"),
    ],
)
def test_bad_federation_input_is_one_sentence_and_writes_nothing(tmp_path, monkeypatch, capsys, case, needle):
    schema, dirs, _ = _federation(tmp_path, monkeypatch, capsys, "{name: hybrid_fedavg, rounds: 2}")
    out = tmp_path / "run"
    cl = ",".join(map(str, dirs))
    args = {
        "no_clients": ["--federation", str(schema)],
        "clients_only": ["--clients", cl],
        "with_config": ["--federation", str(schema), "--clients", cl, "--config", str(tmp_path / "run.yaml")],
        "missing_dir": ["--federation", str(schema), "--clients", cl + "," + str(tmp_path / "nowhere")],
        "twice": ["--federation", str(schema), "--clients", cl + "," + str(dirs[0])],
        "other_schema": ["--federation", str(tmp_path / "other.toml"), "--clients", cl],
    }[case]
    (tmp_path / "other.toml").write_text(schema.read_text().replace('label_column = "default"', 'label_column = "y"'))
    code, stdout, err = run_cli(monkeypatch, capsys, "run", *args, "--out", str(out), "-q")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and needle in err and len(lines) == 1, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize(
    "case, needle",
    [
        ("neither", "give either --config FILE or --federation FILE"),
        ("both", "give either --config FILE or --federation FILE"),
        ("clients_only", "give either --config FILE or --federation FILE"),
        ("no_clients", "needs the client directories"),
        ("seed", "--seed is the federation schema's"),
        ("missing_dir", "does not exist"),
        ("bad_executor", "--executor must be inline, warm or flower"),
        ("to_only", "--to names the receiver of a prediction"),
        ("predict_flower", "--predict-tables and --to need --federation and a SuperNode"),
        ("predict_missing", "which is not a file"),
        ("predict_count", "names 1 tables for 3 --clients"),
    ],
)
def test_deploy_local_bad_input_is_one_sentence_before_anything_starts(tmp_path, monkeypatch, capsys, case, needle):
    """``deploy-local --federation F --clients ...``: bad arguments stop it with one sentence before
    any directory is written or any Flower process starts."""
    schema, dirs, _ = _federation(tmp_path, monkeypatch, capsys, "{name: hybrid_fedavg, rounds: 2}")
    out = tmp_path / "deploy"
    cl = ",".join(map(str, dirs))
    fed = ["--federation", str(schema)]
    args = {
        "neither": [],
        "both": [*fed, "--clients", cl, "--config", str(tmp_path / "run.yaml")],
        "clients_only": ["--clients", cl],
        "no_clients": fed,
        "seed": [*fed, "--clients", cl, "--seed", "3"],
        "missing_dir": [*fed, "--clients", cl + "," + str(tmp_path / "nowhere")],
        "bad_executor": [*fed, "--clients", cl, "--executor", "fast"],
        "to_only": [*fed, "--clients", cl, "--to", "bank"],
        "predict_flower": [*fed, "--clients", cl, "--predict-tables", str(schema), "--executor", "flower"],
        "predict_missing": [*fed, "--clients", cl, "--predict-tables", str(tmp_path / "nowhere.csv")],
        "predict_count": [*fed, "--clients", cl, "--predict-tables", str(schema)],
    }[case]
    code, _, err = run_cli(monkeypatch, capsys, "deploy-local", *args, "--out", str(out))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and needle in err and len(lines) == 1, err
    assert "Traceback" not in err and not out.exists()
