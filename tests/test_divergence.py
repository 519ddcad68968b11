"""A diverging run (issue 15, item 8) ends with one sentence, not a traceback: the server refuses
non-finite model values with :class:`~hybridfl.errors.TrainingDiverged` before using them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.config import default_config, parse_config
from hybridfl.errors import TrainingDiverged
from hybridfl.experiment import prepare
from hybridfl.runtime.simulation import build_federation
from tests.cli_helpers import cli_in_process


def _main_job(**algorithm) -> dict:
    """The main job's config (HyFEM on digits) with ``algorithm`` fields replaced."""
    data = default_config().model_dump(mode="json")
    data["algorithm"].update(algorithm)
    return data


def test_cli_run_with_huge_lr_is_one_sentence(tmp_path, monkeypatch, capsys):
    """``hybridfl run`` of the main job with ``lr: 1000`` (the CLI's entry point, in process):
    exit status 2 and one line ``error: ...`` naming the round and the lr (before: a rich traceback
    of the matching's ValueError, status 1)."""
    cfg = tmp_path / "diverge.yaml"
    cfg.write_text(json.dumps(_main_job(lr=1000, rounds=5)))  # JSON is YAML
    p = cli_in_process(monkeypatch, capsys, "run", "-c", str(cfg), "--out", str(tmp_path / "o"), "-q")
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr[-3000:])
    assert "Traceback" not in p.stdout + p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-3000:]
    assert "training diverged in round 1" in lines[0] and "lower algorithm.lr (now 1000)" in lines[0], lines[0]
    assert "client 'client-" in lines[0] and "non-finite" in lines[0]
    assert len((p.stdout + p.stderr).splitlines()) < 20


def _hyfem_federation(lr: float):
    prep = prepare(parse_config(_main_job(lr=lr, rounds=2, baselines=False)))
    return build_federation("hyfem", prep.split, prep.partition, prep.algorithm, prep.config.seed)


def test_hyfem_server_refuses_non_finite_replies_before_using_them():
    """The round that diverges changes nothing on the server: its model, classifier and the
    clients' neuron assignments are those from before the round."""
    fed = _hyfem_federation(1000.0)
    fed.setup()
    arrays, meta = fed.server.get_state()
    with pytest.raises(TrainingDiverged, match=r"^training diverged in round 1: client '[^']+' sent non-finite"):
        fed.server.run_round(1, fed.transport)
    after, meta_after = fed.server.get_state()
    assert after.keys() == arrays.keys()
    for k in arrays:
        np.testing.assert_array_equal(after[k], arrays[k], err_msg=k)
        assert np.isfinite(after[k]).all()
    assert meta_after["clients"] == meta["clients"]


def test_hyfem_normal_lr_passes_the_check():
    fed = _hyfem_federation(0.05)
    fed.setup()
    row = fed.server.run_round(1, fed.transport)
    assert np.isfinite(row["train_loss"]) and row["clients_answered"] == 6


def test_hybrid_fedavg_server_refuses_non_finite_weights():
    prep = prepare(
        parse_config(
            {
                "seed": 0,
                "dataset": {"name": "digits"},
                "partition": {"kind": "grid", "sample_groups": 2, "block_groups": 2},
                "algorithm": {
                    "name": "hybrid_fedavg",
                    "rounds": 2,
                    "loss": "logistic",
                    "lr": 1e30,
                    "positive_classes": [0, 1, 2, 3, 4],
                },
            }
        )
    )
    fed = build_federation("hybrid_fedavg", prep.split, prep.partition, prep.algorithm, prep.config.seed)
    fed.setup()
    w0 = fed.server.w.copy()
    with np.errstate(all="ignore"), pytest.raises(TrainingDiverged) as e:
        fed.server.run_round(1, fed.transport)
    assert str(e.value).startswith("training diverged in round 1: client 'client-")
    assert str(e.value).endswith("sent non-finite model weights; lower algorithm.lr (now 1e+30).")
    np.testing.assert_array_equal(fed.server.w, w0)
