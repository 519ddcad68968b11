"""Federated evaluation: ``client prepare --test-table`` keeps an organisation's own test rows, and
``run --federation`` evaluates the trained model on them through federated prediction (the label
holders compute the metrics; labels and scores never leave them), so results.json, metrics.csv and
the plots carry real metrics.

Three organisations (:mod:`tests.test_run_federation`'s customers) each add their own test
customers ``t000..``: the bank holds the bank and demo blocks of ``t000-t029``, the census the
demo and shop blocks of ``t010-t039``, the shop the shop and bank blocks of the even ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.test_prepare import run_cli
from tests.test_run_federation import BLOCKS, _config, _csv, _rows

TEST_ORGS = {
    "bank": (range(0, 30), ["bank", "demo"]),
    "census": (range(10, 40), ["demo", "shop"]),
    "shop": (range(0, 40, 2), ["shop", "bank"]),
}


def _test_rows() -> dict[str, dict[str, object]]:
    """The organisations' own test customers ``t000-t039`` (other samples than training's)."""
    return _rows(40, 11, "t")


def _prepare(tmp_path: Path, monkeypatch, capsys, algorithm: str, labels: set[str] | None = None):
    """Schema, and every organisation's directory prepared with its training and test tables
    (``labels``: the organisations whose tables have the label column; default all)."""
    from tests.test_run_federation import ORGS

    rows, trows = _rows(), _test_rows()
    cfg = tmp_path / "run.yaml"
    cfg.write_text(_config(algorithm))
    schema = tmp_path / "federation.toml"
    code, _, err = run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(schema))
    assert code == 0, err
    dirs = []
    for index, org in enumerate(ORGS):
        ids, blocks = ORGS[org]
        has = labels is None or org in labels
        cols = [c for b in blocks for c in BLOCKS[b]] + (["default"] if has else [])
        (tmp_path / f"{org}.csv").write_text(_csv([f"c{i:03d}" for i in ids], cols, rows))
        tids, tblocks = TEST_ORGS[org]
        assert tblocks == blocks or set(tblocks) == set(blocks)
        (tmp_path / f"{org}_test.csv").write_text(_csv([f"t{i:03d}" for i in tids], cols, trows))
        d = tmp_path / "clients" / org
        args = ["client", "prepare", "--table", str(tmp_path / f"{org}.csv"), "--schema", str(schema), "--out", str(d)]
        code, _, err = run_cli(
            monkeypatch, capsys, *args, "--index", str(index), "--test-table", str(tmp_path / f"{org}_test.csv")
        )
        assert code == 0, err
        dirs.append(d)
    return schema, dirs, trows


def test_hyfdca_federation_reports_the_accuracy_of_its_model_on_the_organisations_test_rows(
    tmp_path, monkeypatch, capsys
):
    """HyFDCA (no encryption) on three organisations with test tables: results.json's accuracy
    and AUC are those of the run's own model on every label holder's test rows, each scored from
    the organisations' blocks of that customer (rows whose blocks nobody holds are counted
    unscored); metrics.csv's last row and accuracy.png carry it."""
    from hybridfl.inference import load_model

    schema, dirs, trows = _prepare(
        tmp_path, monkeypatch, capsys, "{name: hyfdca, rounds: 4, encryption: none, dual_mode: block}"
    )
    out = tmp_path / "run"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "run",
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
        "--out",
        str(out),
        "-q",
    )
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["evaluation"] == "federated" and res["accuracy"] is not None and res["auc"] is not None
    assert (out / "accuracy.png").is_file()
    last = pd.read_csv(out / "metrics.csv").iloc[-1]
    assert last["accuracy"] == pytest.approx(res["accuracy"])
    # the reference: the run's model on each label holder's test customers, scored where every
    # block is held by some organisation (its own rows' blocks, or another's of the same customer)
    model = load_model(out / "model")
    every = [c for b in BLOCKS.values() for c in b] + ["default"]
    held = {org: {f"t{i:03d}" for i in TEST_ORGS[org][0]} for org in TEST_ORGS}
    correct = n = 0
    for org, (ids, _) in TEST_ORGS.items():
        scored = []
        for i in ids:
            tid = f"t{i:03d}"
            blocks = {b for o, (_, bl) in TEST_ORGS.items() if tid in held[o] for b in bl}
            if blocks == set(BLOCKS):
                scored.append(tid)
        table = tmp_path / f"ref_{org}.csv"
        table.write_text(_csv(scored, every, trows))
        ev = model.evaluate(pd.read_csv(table))
        correct += ev["accuracy"] * ev["n_labelled"]
        n += ev["n_labelled"]
    assert res["test_samples"] == n and res["test_unscored"] == 30 + 30 + 20 - n
    assert res["accuracy"] == pytest.approx(correct / n, abs=1e-12)


def test_fedbcd_federation_with_labels_at_one_organisation_reports_auc(tmp_path, monkeypatch, capsys):
    """FedBCD with the labels at the bank only (vertical: every organisation holds the same
    customers): the bank is the receiver of the evaluation; results.json has a real AUC and
    accuracy, and auc.png is written (with data)."""
    from tests import test_run_federation as trf

    orgs = {"bank": (range(0, 72), ["bank"]), "census": (range(0, 72), ["demo", "shop"])}
    test_orgs = {"bank": (range(0, 40), ["bank"]), "census": (range(0, 40), ["demo", "shop"])}
    monkey = pytest.MonkeyPatch()
    monkey.setattr(trf, "ORGS", orgs)
    monkey.setitem(globals(), "TEST_ORGS", test_orgs)
    try:
        algo = "{name: fedbcd, rounds: 20, model: linear, batch_size: 16, lr: 0.1}"
        schema, dirs, _ = _prepare(tmp_path, monkeypatch, capsys, algo, labels={"bank"})
    finally:
        monkey.undo()
    out = tmp_path / "run"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "run",
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
        "--out",
        str(out),
        "-q",
    )
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["test_samples"] == 40 and 0.0 <= res["auc"] <= 1.0 and 0.0 <= res["accuracy"] <= 1.0
    assert (out / "auc.png").is_file()
    assert not (out / "model").exists()  # the parties keep their models: no server-side FedBCD model


def test_test_table_refusals(tmp_path, monkeypatch, capsys):
    """A test table with other blocks than the training table, or repeating its IDs: one sentence,
    nothing written."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(_config("{name: hybrid_fedavg}"))
    schema = tmp_path / "federation.toml"
    assert run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(schema))[0] == 0
    rows, trows = _rows(), _test_rows()
    train = tmp_path / "a.csv"
    train.write_text(_csv(["c000", "c001", "c002"], ["age", "region", "default"], rows))
    other = tmp_path / "other.csv"
    other.write_text(_csv(["t000", "t001"], ["balance", "loans", "default"], trows))
    same = tmp_path / "same.csv"
    same.write_text(_csv(["c000", "c001"], ["age", "region", "default"], rows))
    for test, words in ((other, "an organisation's test rows have the blocks"), (same, "repeats 2 IDs")):
        d = tmp_path / "clients" / "a"
        code, _, err = run_cli(
            monkeypatch,
            capsys,
            "client",
            "prepare",
            "--table",
            str(train),
            "--schema",
            str(schema),
            "--out",
            str(d),
            "--test-table",
            str(test),
        )
        assert code == 2 and words in err and "Traceback" not in err, err
        assert not d.exists()
