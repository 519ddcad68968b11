"""HyFDCA and hybrid FedAvg under faults: checkpoint/resume after a run stopped mid-way, clients that fail
mid-round, and the message audit of hybrid FedAvg (issue "Reliability and privacy")."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hybridfl.algorithms.hybrid_fedavg import HybridFedAvgConfig, run_hybrid_fedavg
from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.data import load_digits
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.errors import HybridFLError
from hybridfl.privacy.he import KeyDealer
from hybridfl.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint
from tests.cli_helpers import cli, stop_after
from tests.conftest import HYFDCA_BEFORE

HYFDCA = """
seed: 5
dataset: {{name: digits}}
partition: {{kind: grid, sample_groups: 2, block_groups: 2}}
algorithm: {{name: hyfdca, loss: hinge, lambda: 0.01, positive_classes: [5, 6, 7, 8, 9], rounds: {rounds},
            failure_rate: 0.2, eval_every: 2, output: average_last, dual_mode: block, encryption: none}}
"""
FEDAVG = """
seed: 5
dataset: {{name: digits}}
partition: {{kind: grid, sample_groups: 2, block_groups: 2}}
algorithm: {{name: hybrid_fedavg, loss: hinge, lambda: 0.01, positive_classes: [5, 6, 7, 8, 9], rounds: {rounds}, lr: 0.3,
            failure_rate: 0.3, eval_every: 2}}
"""
# what must be identical (timings are not; nor are byte counts to the byte: HyFDCA's replies carry
# their measured compute seconds as JSON numbers, whose printed length varies)
SAME = (
    "w",
    "primal_objective",
    "dual_objective",
    "duality_gap",
    "relative_suboptimality",
    "accuracy",
    "client_failures",
    "messages_total",
)
TIME_COLUMNS = {
    "seconds",
    "bytes",
    "bytes_total",
    "encryption_seconds",
    "model_seconds",
    "model_seconds_no_encryption",
    "time_model",
    "time_model_no_encryption",
    "server_seconds",
    "client_max_seconds",
    "client_encryption_seconds",
    "server_encryption_seconds",
}


def outcome(d: Path) -> tuple[dict, list[dict]]:
    res = json.loads((d / "results.json").read_text())
    with open(d / "metrics.csv") as f:
        rows = [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in csv.DictReader(f)]
    return {k: res.get(k) for k in SAME}, rows


# HyFDCA stops at round 3, the first of the averaged second half (rounds 3-4), so the checkpoint
# holds averaging sums
# hybrid FedAvg's 30 rounds (18 s) run with -m slow; HyFDCA's case runs in CI
@pytest.mark.parametrize(
    "template,rounds,stop",
    [(HYFDCA, 4, 3), pytest.param(FEDAVG, 30, 3, marks=pytest.mark.slow)],
    ids=["hyfdca", "hybrid-fedavg"],
)
def test_stopped_convex_run_resumes_to_the_same_result(tmp_path, template, rounds, stop):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(template.format(rounds=rounds))
    full, part = tmp_path / "full", tmp_path / "part"
    done = subprocess.run(
        cli("run", "--config", str(cfg), "--out", str(full), "-q"), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    stopped = stop_after(cli("run", "--config", str(cfg), "--out", str(part), "-q"), part, stop)
    assert stopped == stop
    assert not (part / "results.json").exists()
    resumed = subprocess.run(cli("run", "--resume", str(part), "-q"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    res_full, rows_full = outcome(full)
    res_part, rows_part = outcome(part)
    assert rows_part == rows_full
    assert res_part == res_full
    assert res_full["client_failures"] > 0  # the failure draws were restored too
    if template is HYFDCA:  # the averaging sums (rounds 3-4, round 3's in the checkpoint) were restored too
        assert json.loads((part / "results.json").read_text())["averaged_rounds"] == 2


class Interrupt(Exception):
    pass


def test_encrypted_hyfdca_resumes_with_the_stored_key_pair(tmp_path):
    """Paillier (exact fixed point): a run stopped after round 2 and resumed from its checkpoint,
    whose stored key pair decrypts the stored enc(alpha), ends at the uninterrupted run's w."""
    split = load_digits()
    part = GridPartitioner(2, 2, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(
        lam=0.01,
        rounds=4,
        positive_classes=[5, 6, 7, 8, 9],
        encryption="paillier",
        paillier_bits=256,
        eval_every=2,
        dual_mode="block",  # the default before the measured best
    )
    full = run_hyfdca(split, part, cfg, seed=1)
    ck = tmp_path / CHECKPOINT_NAME

    def stop(rnd, total, row):
        if rnd == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_hyfdca(split, part, cfg, seed=1, progress=stop, checkpoint=ck)
    assert load_checkpoint(ck)[0] == 2
    resumed = run_hyfdca(split, part, cfg, seed=1, checkpoint=ck, resume=True)
    np.testing.assert_array_equal(np.asarray(resumed.summary["w"]), np.asarray(full.summary["w"]))
    assert resumed.summary["dual_objective"] == full.summary["dual_objective"]
    assert [h["round"] for h in resumed.history] == [1, 2, 3, 4]


def test_key_pair_round_trips_for_checkpoints():
    for scheme in ("paillier", "ckks"):
        d = KeyDealer(scheme, paillier_bits=256)
        back = KeyDealer.from_bytes(d.to_bytes())
        assert back.public_material() == d.public_material()
        v = np.array([0.25, -3.5, 7.0])
        np.testing.assert_allclose(back.client_backend().decrypt(d.client_backend().encrypt(v)), v, atol=1e-6)
    with pytest.raises(Exception, match="unreadable"):
        KeyDealer.from_bytes(b"not a key")


def test_resume_refuses_a_checkpoint_of_another_algorithm(tmp_path):
    split = load_digits()
    part = GridPartitioner(2, 2, 1, 0).partition(split.train)
    ck = tmp_path / CHECKPOINT_NAME
    run_hybrid_fedavg(
        split,
        part,
        HybridFedAvgConfig(lam=0.01, rounds=2, positive_classes=[5, 6, 7, 8, 9], reference=False),
        checkpoint=ck,
    )
    with pytest.raises(HybridFLError, match="not from a hyfdca run"):
        run_hyfdca(
            split,
            part,
            HyFDCAConfig(**HYFDCA_BEFORE, lam=0.01, rounds=3, positive_classes=[5, 6, 7, 8, 9], reference=False),
            checkpoint=ck,
            resume=True,
        )


def test_hyfdca_with_failing_clients_keeps_converging():
    """30 % of the selected clients fail mid-round: lost replies are never half-applied (a client
    whose dual reply was lost drops its changes on the server's word), so the server's
    ``enc(alpha)`` stays the holders' mean dual and the model still converges; logistic loss,
    where the dual certificate is exact at the optimum."""
    split = load_digits()
    part = GridPartitioner(2, 2, 1, 0).partition(split.train)
    runs = {}
    for fr in (0.0, 0.3):
        # the paper's problem (the thresholds below were measured without an intercept; with
        # fit_intercept, 30 % failures: 1.2e-2 at round 10, 8.0e-3 at round 40, a ratio of 0.66)
        cfg = HyFDCAConfig(
            **HYFDCA_BEFORE,
            lam=1e-2,
            loss="logistic",
            rounds=40,
            positive_classes=[5, 6, 7, 8, 9],
            eval_every=10,
            failure_rate=fr,
            fit_intercept=False,
        )
        runs[fr] = run_hyfdca(split, part, cfg, seed=0)
    ok, failing = runs[0.0], runs[0.3]
    assert failing.summary["client_failures"] >= 0.2 * 40 * 4
    sub = [h["relative_suboptimality"] for h in failing.history if "relative_suboptimality" in h]
    assert sub[-1] < 0.6 * sub[0]  # still converging from round 10 to 40
    assert sub[-1] < 2e-2
    assert all(np.isfinite(sub))
    # block-mode duals stay consistent with the server's aggregate: the monitor's mean alpha
    # (decrypted from the server's enc(alpha)) is a valid dual point: D(alpha) <= P*
    ref = failing.summary["reference_objective"]
    assert failing.summary["dual_objective"] <= ref + 1e-9
    assert ok.summary["client_failures"] == 0


def test_hybrid_fedavg_messages_carry_no_raw_feature_or_label():
    """The hybrid FedAvg part of the message audit: canary feature values and the label sequence
    never appear in any serialised message."""
    from hybridfl.data.dataset import DatasetSplit, HybridDataset

    split = load_digits()
    tr = split.train
    rng = np.random.default_rng(0)
    blocks = {b: v.copy() for b, v in tr.blocks.items()}
    canaries = []
    for b in blocks:
        flat = blocks[b].reshape(blocks[b].shape[0], -1)
        for i in rng.choice(flat.shape[0], 5, replace=False):
            c = float(rng.uniform(0.3, 0.9)) + 1.234567e-3
            flat[i, 0] = c
            canaries.append(np.float64(c).tobytes())
            canaries.append(np.float32(c).tobytes())
    train = HybridDataset(tr.name, tr.ids, tr.y, blocks, tr.classes)
    split2 = DatasetSplit(train, split.test)
    part = GridPartitioner(2, 2, 1, 0).partition(train)
    raw: list[bytes] = []
    run_hybrid_fedavg(
        split2,
        part,
        HybridFedAvgConfig(lam=0.01, rounds=3, positive_classes=[5, 6, 7, 8, 9], reference=False, failure_rate=0.3),
        recorder=raw.append,
    )
    assert raw
    labels = tr.y.astype(np.int64)
    runs = [
        labels[:16].tobytes(),
        labels[:16].astype(np.float64).tobytes(),
        np.where(labels[:16] >= 5, 1.0, -1.0).tobytes(),
    ]
    for m in raw:
        for c in canaries:
            assert c not in m
        for r in runs:
            assert r not in m
