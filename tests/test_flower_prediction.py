"""After training over Flower: the model's parts, federated evaluation and federated prediction.

Three organisations prepared with their own training and test tables (``client prepare
--test-table``) train HyFDCA over Flower (loopback, TLS, SuperNode authentication, the inline warm
executor). The run leaves each organisation its part of the model in its own directory, equal to
the parts ``run --federation`` writes in process; its results carry the federated evaluation's
accuracy and AUC, equal to the in-process run's. A second Flower run with ``task: predict`` scores
the organisations' new tables (each node's ``predict-table``), and only the receiver's node writes
predictions: equal (to 1e-9) to ``hybridfl predict --federation`` in process on the same tables.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hybridfl.inference.parts import load_org_part
from hybridfl.runtime.flower.local import LocalFederation
from tests.test_federated_evaluation import _prepare
from tests.test_prepare import run_cli
from tests.test_run_federation import BLOCKS, ORGS, _csv, _rows

NEW = {  # each organisation's new customers n000-n029 (partly shared) with its blocks
    "bank": range(0, 20),
    "census": range(10, 30),
    "shop": range(0, 30, 2),
}


def _new_tables(tmp_path: Path) -> list[Path]:
    rows = _rows(30, 17, "n")
    out = []
    for org, ids in NEW.items():
        cols = [c for b in ORGS[org][1] for c in BLOCKS[b]]
        p = tmp_path / f"{org}_new.csv"
        p.write_text(_csv([f"n{i:03d}" for i in ids], cols, rows))
        out.append(p)
    return out


def _server(schema: Path, dirs: list[Path], out: Path) -> Path:
    from hybridfl.data.federation import assemble_server

    infos = [(str(d / "client.json"), json.loads((d / "client.json").read_text())) for d in dirs]
    return assemble_server(schema, infos, out)


def test_flower_run_leaves_parts_evaluates_and_predicts_as_in_process(tmp_path, monkeypatch, capsys):
    algo = "{name: hyfdca, rounds: 3, encryption: none, local_steps: 10}"
    schema, dirs, _ = _prepare(tmp_path, monkeypatch, capsys, algo)
    # the organisations' directories before any run, for the deployment
    flower_dirs = [shutil.copytree(d, tmp_path / "flower-clients" / d.name) for d in dirs]
    tables = _new_tables(tmp_path)

    ref = tmp_path / "in-process"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "run",
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
        "--out",
        str(ref),
    )
    assert code == 0, err
    ref_pred = tmp_path / "in-process-predictions.csv"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "predict",
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
        "--tables",
        ",".join(map(str, tables)),
        "--out",
        str(ref_pred),
    )
    assert code == 0, err

    server = _server(schema, flower_dirs, tmp_path / "server")
    configs = [{"predict-table": str(t.resolve())} for t in tables]
    fed = LocalFederation(flower_dirs, work_dir=tmp_path / "flower", start_timeout=120, node_configs=configs)
    try:
        fed.start()
        assert fed.tls and fed.auth
        fed.run({"server-dir": str(server), "out-dir": str(tmp_path / "res")}, timeout=600)
        fed.run({"server-dir": str(server), "out-dir": str(tmp_path / "pred"), "task": "predict"}, timeout=600)
    except BaseException:
        print(fed.logs(40))
        raise
    finally:
        fed.close()

    # training: the in-process run's model, metrics from the federated evaluation
    res, want = (json.loads((p / "results.json").read_text()) for p in (tmp_path / "res", ref))
    assert res["evaluation"] == "federated" and res["test_samples"] == want["test_samples"] > 0
    assert res["accuracy"] == pytest.approx(want["accuracy"], abs=1e-12)
    assert res["auc"] == pytest.approx(want["auc"], abs=1e-9)
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["model_parts"] == {d.name: "written" for d in dirs}
    # every organisation's part, written on its own node, equals the in-process part
    for d, f in zip(dirs, flower_dirs):
        a, b = load_org_part(d / "model"), load_org_part(f / "model")
        assert a.organisation == b.organisation == d.name and a.part.units == b.part.units
        for u in a.part.units:
            np.testing.assert_allclose(b.part.weights[u], a.part.weights[u], rtol=1e-9, atol=1e-12)
        assert (a.part.head is None) == (b.part.head is None)
    # prediction: only the receiver (the first label holder, bank) writes predictions
    written = {
        f.name: sorted((f / "predictions").glob("*.csv")) if (f / "predictions").exists() else [] for f in flower_dirs
    }
    assert [len(v) for v in written.values()] == [1, 0, 0]
    got = pd.read_csv(written["bank"][0])
    want_pred = pd.read_csv(ref_pred)
    assert list(got["ID"]) == list(want_pred["ID"])
    assert list(got["prediction"].fillna("")) == list(want_pred["prediction"].fillna(""))
    for c in [c for c in want_pred.columns if c.startswith(("p(", "margin"))]:
        np.testing.assert_allclose(got[c].to_numpy(float), want_pred[c].to_numpy(float), rtol=1e-9, atol=1e-12)
    pred_summary = json.loads((tmp_path / "pred" / "summary.json").read_text())
    assert pred_summary["task"] == "predict" and pred_summary["to"] == "bank"
    assert pred_summary["scored"] + pred_summary["unscored"] == len(NEW["bank"])
