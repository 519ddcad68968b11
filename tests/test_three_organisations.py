"""Issue 14 item 5: three organisations, start to finish, across hosts.

Three separate CSV files (no central dataset anywhere) become three client directories with
``hybridfl client prepare``; the server directory is assembled from their public ``client.json``
only; samples are aligned by PSI (the algorithms' default); HyFDCA (hybrid holdings) and FedBCD
(vertical holdings) train over Flower with TLS and Flower's SuperNode authentication, each
SuperNode in its own network namespace with its own address (``ip netns`` + veth pairs: this test
needs root and iproute2 and fails, not skips, without them). The results equal ``hybridfl run
--federation`` in process on the same directories (which ``test_run_federation`` ties to the
simulation of the same data as one table).

Every organisation also prepared its own test rows (``--test-table``): after training, each gets
its part of the model on its own node (FedBCD's parties write theirs from their own state) equal to
the in-process run's parts, and the label holders evaluate it by federated prediction, so the
deployed results carry the in-process accuracy and AUC. A second HyFDCA run with ``task: predict``
scores the organisations' new tables (each node's ``predict-table``); only the receiver's node
writes predictions, equal to ``hybridfl predict --federation`` in process to 1e-9.

Two hostile nodes join the HyFDCA federation from a fourth host: one with a SuperNode key the
SuperLink never registered (Flower refuses it; its process exits), and one with a registered key
that claims the client "census" holding a copy of census's data but not its ``client_key.pem``
(our hello refuses it; the run goes on and never sends it a message).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from hybridfl.data.federation import assemble_server
from hybridfl.inference.parts import load_org_part
from hybridfl.privacy.credentials import CLIENT_KEY_FILE, new_client_key
from hybridfl.runtime.flower.local import LocalFederation
from hybridfl.runtime.flower.netns import Hosts
from tests.test_prepare import run_cli
from tests.test_run_federation import BLOCKS, _csv, _federation, _rows

HYBRID = {  # organisation -> (its customers, its blocks, holds the labels)
    "bank": (range(0, 48), ["bank", "demo"], True),
    "census": (range(24, 72), ["demo", "shop"], True),
    "shop": (range(0, 72, 2), ["shop", "bank"], True),
}
VERTICAL = {  # the same customers mostly, one block each, labels at the bank
    "bank": (range(0, 60), ["bank"], True),
    "census": (range(6, 72), ["demo"], False),
    "shop": (range(0, 72), ["shop"], False),
}
TESTS = {  # each organisation's own test customers t000.. (its training table's columns)
    "hybrid": {"bank": range(0, 30), "census": range(15, 45), "shop": range(0, 45, 2)},
    "vertical": {"bank": range(0, 40), "census": range(0, 40), "shop": range(5, 40)},
}
NEW = {"bank": range(0, 20), "census": range(10, 30), "shop": range(0, 30, 2)}  # new customers n000..


def _organisations(
    tmp_path: Path, monkeypatch, capsys, algorithm: str, orgs: dict, tests: dict
) -> tuple[Path, list[Path]]:
    """``federation init`` and each organisation's ``client prepare`` of its own CSV and test CSV."""
    schema, dirs, _ = _federation(tmp_path, monkeypatch, capsys, algorithm, orgs, tests)
    return schema, dirs


def _new_tables(tmp_path: Path) -> list[Path]:
    """Each organisation's new customers (the blocks of its training table, no label)."""
    rows, out = _rows(30, 17, "n"), []
    for org, ids in NEW.items():
        p = tmp_path / f"{org}_new.csv"
        p.write_text(_csv([f"n{i:03d}" for i in ids], [c for b in HYBRID[org][1] for c in BLOCKS[b]], rows))
        out.append(p)
    return out


def _parts(dirs: list[Path]) -> dict:
    return {d.name: load_org_part(d / "model") for d in dirs}


def _same_parts(got: dict, want: dict) -> None:
    """Every organisation's part equals the reference part: units, weights and head."""
    for org, a in want.items():
        b = got[org]
        assert b.organisation == org and b.part.units == a.part.units
        assert (a.part.head is None) == (b.part.head is None)
        for k, v in (a.part.head or {}).items():
            np.testing.assert_allclose(b.part.head[k], v, rtol=1e-6, atol=1e-9)
        for u in a.part.units:
            wa, wb = a.part.weights[u], b.part.weights[u]
            if hasattr(wa, "state_dict"):  # a FedBCD bottom model
                for k, v in wa.state_dict().items():
                    np.testing.assert_allclose(wb.state_dict()[k].numpy(), v.numpy(), rtol=1e-6, atol=1e-7)
            else:
                np.testing.assert_allclose(wb, wa, rtol=1e-9, atol=1e-12)


def _in_process(tmp_path: Path, monkeypatch, capsys, schema: Path, dirs: list[Path]) -> Path:
    out = tmp_path / "in-process"
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
    )
    assert code == 0, err
    return out


def _server(schema: Path, dirs: list[Path], out: Path) -> Path:
    infos = [(str(d / "client.json"), json.loads((d / "client.json").read_text())) for d in dirs]
    return assemble_server(schema, infos, out)


def _rows_without_time(path: Path) -> list[dict]:
    import csv

    with open(path) as f:
        # (byte counts differ by a few bytes: replies carry the clients' measured seconds as text)
        return [{k: r[k] for k in ("round", "train_loss", "lr", "messages")} for r in csv.DictReader(f)]


def test_three_organisations_across_hosts_with_tls_and_node_authentication(tmp_path, monkeypatch, capsys):
    hyfdca = "{name: hyfdca, rounds: 2, encryption: none, local_fraction: 0.1, dual_mode: block}"
    schema_d, dirs_d = _organisations(tmp_path / "hyfdca", monkeypatch, capsys, hyfdca, HYBRID, TESTS["hybrid"])
    fedbcd = "{name: fedbcd, rounds: 2, variant: p, local_steps: 3, model: linear, lr: 0.01, batch_size: 16}"
    schema_b, dirs_b = _organisations(tmp_path / "fedbcd", monkeypatch, capsys, fedbcd, VERTICAL, TESTS["vertical"])
    ref_d = _in_process(tmp_path / "hyfdca", monkeypatch, capsys, schema_d, dirs_d)
    ref_b = _in_process(tmp_path / "fedbcd", monkeypatch, capsys, schema_b, dirs_b)
    parts_d, parts_b = _parts(dirs_d), _parts(dirs_b)  # the in-process run's parts, before Flower rewrites them
    for d in dirs_d + dirs_b:
        shutil.rmtree(d / "model")
    tables = _new_tables(tmp_path)
    server_d = _server(schema_d, dirs_d, tmp_path / "hyfdca" / "server")
    server_b = _server(schema_b, dirs_b, tmp_path / "fedbcd" / "server")
    assert not list(server_d.rglob("*.npy")) and not list(server_d.rglob(CLIENT_KEY_FILE))  # no data, no secret

    # the impostor: census's data copied, but not census's key
    impostor = tmp_path / "impostor" / "census"
    shutil.copytree(dirs_d[1], impostor, ignore=shutil.ignore_patterns(CLIENT_KEY_FILE))
    new_client_key(impostor)

    with Hosts(4) as hosts:  # fails loudly without root or iproute2
        configs = [{"predict-table": str(t.resolve())} for t in tables]
        fed = LocalFederation(
            dirs_d, work_dir=tmp_path / "flower-d", start_timeout=120, hosts=hosts, node_configs=configs
        )
        try:
            fed.start()
            assert fed.tls and fed.auth and len(fed.node_ids) == 3
            unknown = fed.add_node(dirs_d[0], host=3, registered=False)
            fed.add_node(impostor, host=3)
            fed.run({"server-dir": str(server_d), "out-dir": str(tmp_path / "res-d")}, timeout=600)
            fed.run({"server-dir": str(server_d), "out-dir": str(tmp_path / "pred-d"), "task": "predict"}, timeout=600)
            assert unknown.wait(timeout=120) != 0  # Flower refused the unregistered key: the node gave up
            link_log = (fed.work_dir / "superlink.log").read_text(errors="replace")
            ids_d = list(fed.node_ids)
        except BaseException:
            print(fed.logs(40))
            raise
        finally:
            fed.close()
        assert "Failed to activate SuperNode" in (fed.work_dir / "supernode-3.log").read_text(errors="replace")
        for k in range(3):  # every organisation's node came from its own host
            assert f"{hosts.address(k)}:" in link_log
        assert "Uvicorn running on https://0.0.0.0:" in link_log

        fed = LocalFederation(dirs_b, work_dir=tmp_path / "flower-b", start_timeout=120, hosts=hosts)
        try:
            fed.start()
            fed.run({"server-dir": str(server_b), "out-dir": str(tmp_path / "res-b")}, timeout=600)
        except BaseException:
            print(fed.logs(40))
            raise
        finally:
            fed.close()

    # HyFDCA: the w of the in-process run, the impostor refused and never sent a message
    w = np.load(tmp_path / "res-d" / "final.npz")["w"]
    np.testing.assert_allclose(w, np.load(ref_d / "final.npz")["w"], rtol=1e-9, atol=1e-12)
    s = json.loads((tmp_path / "res-d" / "summary.json").read_text())
    (why,) = s["refused_nodes"].values()
    assert "claims client 'census' without a valid proof" in why
    assert sorted(s["nodes"].values()) == sorted(ids_d[:3])  # the organisations' registered nodes
    assert s["rejoins"] == [] and s["rounds"] == 2
    # FedBCD: the same per-round training loss as the in-process run
    rows_b = _rows_without_time(tmp_path / "res-b" / "metrics.csv")
    assert rows_b == _rows_without_time(ref_b / "metrics.csv")

    # after training: every organisation's part on its own node equals the in-process part, and the
    # federated evaluation gives the in-process metrics (FedBCD: labels at the bank only)
    _same_parts(_parts(dirs_d), parts_d)
    _same_parts(_parts(dirs_b), parts_b)
    for res, ref in ((tmp_path / "res-d", ref_d), (tmp_path / "res-b", ref_b)):
        got, want = (json.loads((p / "results.json").read_text()) for p in (res, ref))
        assert got["evaluation"] == want["evaluation"] == "federated"
        assert got["test_samples"] == want["test_samples"] > 0
        assert abs(got["accuracy"] - want["accuracy"]) < 1e-9 and abs(got["auc"] - want["auc"]) < 1e-6

    # prediction of new rows over Flower: only the receiver (bank) writes; equal to in process
    written = [sorted((d / "predictions").glob("*.csv")) if (d / "predictions").exists() else [] for d in dirs_d]
    assert [len(w) for w in written] == [1, 0, 0]
    ref_pred = tmp_path / "in-process-predictions.csv"
    args = ["predict", "--federation", str(schema_d), "--clients", ",".join(map(str, dirs_d))]
    code, _, err = run_cli(monkeypatch, capsys, *args, "--tables", ",".join(map(str, tables)), "--out", str(ref_pred))
    assert code == 0, err
    got, want = pd.read_csv(written[0][0]), pd.read_csv(ref_pred)
    assert list(got["ID"]) == list(want["ID"]) and len(got) == len(NEW["bank"])
    assert list(got["prediction"].fillna("")) == list(want["prediction"].fillna(""))
    for c in [c for c in want.columns if c not in ("ID", "prediction")]:
        np.testing.assert_allclose(got[c].to_numpy(float), want[c].to_numpy(float), rtol=1e-9, atol=1e-12)
    summary = json.loads((tmp_path / "pred-d" / "summary.json").read_text())
    assert summary["to"] == "bank" and summary["scored"] == int(got["prediction"].notna().sum()) > 0
