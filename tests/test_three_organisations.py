"""Issue 14 item 5: three organisations, start to finish, across hosts.

Three separate CSV files (no central dataset anywhere) become three client directories with
``hybridfl client prepare``; the server directory is assembled from their public ``client.json``
only; samples are aligned by PSI (the algorithms' default); HyFDCA (hybrid holdings) and FedBCD
(vertical holdings) train over Flower with TLS and Flower's SuperNode authentication, each
SuperNode in its own network namespace with its own address (``ip netns`` + veth pairs: this test
needs root and iproute2 and fails, not skips, without them). The results equal ``hybridfl run
--federation`` in process on the same directories (which ``test_run_federation`` ties to the
simulation of the same data as one table).

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

from hybridfl.data.federation import assemble_server
from hybridfl.privacy.credentials import CLIENT_KEY_FILE, new_client_key
from hybridfl.runtime.flower.local import LocalFederation
from hybridfl.runtime.flower.netns import Hosts
from tests.test_prepare import run_cli
from tests.test_run_federation import _federation

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


def _organisations(tmp_path: Path, monkeypatch, capsys, algorithm: str, orgs: dict) -> tuple[Path, list[Path]]:
    """``federation init`` and each organisation's ``client prepare`` of its own CSV."""
    schema, dirs, _ = _federation(tmp_path, monkeypatch, capsys, algorithm, orgs)
    return schema, dirs


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
    hyfdca = "{name: hyfdca, rounds: 3, encryption: none, local_fraction: 0.1, dual_mode: block}"
    schema_d, dirs_d = _organisations(tmp_path / "hyfdca", monkeypatch, capsys, hyfdca, HYBRID)
    fedbcd = "{name: fedbcd, rounds: 4, variant: p, local_steps: 3, model: linear, lr: 0.01, batch_size: 16}"
    schema_b, dirs_b = _organisations(tmp_path / "fedbcd", monkeypatch, capsys, fedbcd, VERTICAL)
    ref_d = _in_process(tmp_path / "hyfdca", monkeypatch, capsys, schema_d, dirs_d)
    ref_b = _in_process(tmp_path / "fedbcd", monkeypatch, capsys, schema_b, dirs_b)
    server_d = _server(schema_d, dirs_d, tmp_path / "hyfdca" / "server")
    server_b = _server(schema_b, dirs_b, tmp_path / "fedbcd" / "server")
    assert not list(server_d.rglob("*.npy")) and not list(server_d.rglob(CLIENT_KEY_FILE))  # no data, no secret

    # the impostor: census's data copied, but not census's key
    impostor = tmp_path / "impostor" / "census"
    shutil.copytree(dirs_d[1], impostor, ignore=shutil.ignore_patterns(CLIENT_KEY_FILE))
    new_client_key(impostor)

    with Hosts(4) as hosts:  # fails loudly without root or iproute2
        fed = LocalFederation(dirs_d, work_dir=tmp_path / "flower-d", start_timeout=120, hosts=hosts)
        try:
            fed.start()
            assert fed.tls and fed.auth and len(fed.node_ids) == 3
            unknown = fed.add_node(dirs_d[0], host=3, registered=False)
            fed.add_node(impostor, host=3)
            fed.run({"server-dir": str(server_d), "out-dir": str(tmp_path / "res-d")}, timeout=600)
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
    assert s["rejoins"] == [] and s["rounds"] == 3
    # FedBCD: the same per-round training loss as the in-process run
    assert _rows_without_time(tmp_path / "res-b" / "metrics.csv") == _rows_without_time(ref_b / "metrics.csv")
