"""Checkpoint and resume: a run stopped mid-way (its process ended after a chosen round's
checkpoint, as a kill would) and resumed with `hybridfl run --resume`
ends with the same model metrics and results as an uninterrupted run with the same seed (HyFEM
and FedBCD, both with client failures)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hybridfl.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint
from tests.cli_helpers import cli, stop_after

CONFIG = """
seed: 3
dataset: {name: digits}
partition: {kind: class_block, num_clients: 4, classes_per_client: [5, 7], blocks_per_client: 3}
algorithm: {name: hyfem, rounds: 6, local_steps: 20, lr: 0.05, momentum: 0.9, eval_every: 2, failure_rate: 0.2}
"""
# FedBCD-p with MLP towers on UCI credit default, 3 parties, 20 % failures (rounds skipped)
FEDBCD_CONFIG = """
seed: 2
dataset: {{name: credit_default, data_dir: {data_dir}, standardize: true}}
partition: {{kind: vertical, parties: [[demographic], [repayment], [bill, payment]], label_party: 1}}
algorithm: {{name: fedbcd, variant: p, local_steps: 5, rounds: 60, batch_size: 512, lr: 0.3, model: mlp,
            representation_dim: 8, hidden: 64, eval_every: 10, eval_subset: 2000, failure_rate: 0.2}}
"""
TIMING = {
    "seconds",
    "train_seconds",
    "centralized_seconds",
    "wall_seconds",
    "seconds_total",
    "checkpoint_seconds",
    "checkpoint_share",
    "checkpoint_writes",
}


def results(d: Path) -> tuple[dict, list[dict]]:
    res = {k: v for k, v in json.loads((d / "results.json").read_text()).items() if k not in TIMING}
    with open(d / "metrics.csv") as f:
        rows = [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]
    return res, rows


def stop_and_resume(tmp_path: Path, config: str, rounds: int, stop_round: int) -> tuple[dict, dict]:
    """Run ``config`` uninterrupted; run it again, ending its process right after the checkpoint of
    round ``stop_round`` (the test-only ``HYBRIDFL_TEST_STOP_AFTER_ROUND``), resume it; check both
    runs' results agree; return both results.json."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config)
    full, part = tmp_path / "full", tmp_path / "part"
    done = subprocess.run(
        cli("run", "--config", str(cfg), "--out", str(full), "-q"), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr

    stopped_at = stop_after(cli("run", "--config", str(cfg), "--out", str(part), "-q"), part, stop_round)
    assert stopped_at == stop_round < rounds
    assert not (part / "results.json").exists()  # stopped: no results yet, nothing half-written

    resumed = subprocess.run(cli("run", "--resume", str(part), "-q"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    res_full, rows_full = results(full)
    res_part, rows_part = results(part)
    assert len(rows_part) == rounds
    assert rows_part == rows_full
    assert res_part == res_full
    return res_full, res_part


def test_stopped_run_resumes_to_the_same_result(tmp_path):
    res, _ = stop_and_resume(tmp_path, CONFIG, rounds=6, stop_round=3)
    assert res["client_failures"] > 0


@pytest.mark.slow  # 42 s on credit default; test_stopped_run_resumes_to_the_same_result covers resume in CI
def test_stopped_fedbcd_run_resumes_to_the_same_result(tmp_path, credit_dir):
    res, _ = stop_and_resume(tmp_path, FEDBCD_CONFIG.format(data_dir=credit_dir), rounds=60, stop_round=5)
    assert res["algorithm"] == "fedbcd" and res["rounds"] == 60
    assert (
        res["skipped_rounds"] > 0
        and len(res["skipped"]) == res["skipped_rounds"]
        and res["client_failures"] >= res["skipped_rounds"]
    )
    assert res["auc"] > 0.7


def test_test_stop_hook_is_off_unless_set(monkeypatch):
    """The test-only stop hook reads HYBRIDFL_TEST_STOP_AFTER_ROUND: unset or empty, no stop round;
    a round number, that round; anything else is refused."""
    from hybridfl.runtime.checkpoint import TEST_STOP_ENV, stop_round_for_tests

    monkeypatch.delenv(TEST_STOP_ENV, raising=False)
    assert stop_round_for_tests() is None
    monkeypatch.setenv(TEST_STOP_ENV, "")
    assert stop_round_for_tests() is None
    monkeypatch.setenv(TEST_STOP_ENV, "4")
    assert stop_round_for_tests() == 4
    for bad in ("0", "-1", "x"):
        monkeypatch.setenv(TEST_STOP_ENV, bad)
        with pytest.raises(ValueError, match=TEST_STOP_ENV):
            stop_round_for_tests()


@pytest.mark.parametrize("variant,crash", [("p", False), ("s", False), ("p", True)])
def test_fedbcd_resumes_from_any_round_in_process(tmp_path, monkeypatch, variant, crash):
    """In process, from the checkpoint of every round of a short run with failures (skipped rounds,
    parties still owing an undo): the resumed run has the same metrics, the same summary and the
    same final state (every party's parameters and snapshot, the coordinator, the transport), bit
    for bit, as the uninterrupted run. With ``crash``, a failed party also misses the round's
    ``fedbcd.undo``, so it still owes it (and needs its snapshot) when the checkpoint is written."""
    import numpy as np

    import hybridfl.runtime.simulation as simulation
    from hybridfl.algorithms.fedbcd import FedBCDConfig, run_fedbcd
    from hybridfl.runtime.transport import InProcessTransport
    from tests.test_fedbcd_reliability import synthetic, vertical

    class CrashTransport(InProcessTransport):
        def send_and_receive(self, messages):
            messages = list(messages)
            lost = [m for m in messages if m.kind == "fedbcd.undo" and self.fails(m.round, m.receiver)]
            for m in lost:
                self._cross(m)
            return super().send_and_receive([m for m in messages if m not in lost])

    if crash:
        monkeypatch.setattr(simulation, "InProcessTransport", CrashTransport)

    split = synthetic()
    part = vertical(split)
    cfg = FedBCDConfig(
        variant=variant,
        local_steps=3,
        rounds=10,
        batch_size=40,
        lr=0.3,
        model="mlp",
        representation_dim=3,
        hidden=6,
        failure_rate=0.3,
        eval_every=3,
    )
    ck = tmp_path / CHECKPOINT_NAME
    copies = {}

    def keep(rnd, total, row):
        copies[rnd] = tmp_path / f"after-{rnd}.hfl"
        shutil.copy(ck, copies[rnd])

    full = run_fedbcd(split, part, cfg, seed=1, progress=keep, checkpoint=ck)
    assert full.summary["skipped_rounds"] >= 2

    def strip(summary):
        return {k: v for k, v in summary.items() if k not in TIMING and k != "report"}

    def rows(history):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in history]

    _, final, final_meta = load_checkpoint(ck)
    for rnd in range(1, cfg.rounds):
        res = run_fedbcd(split, part, cfg, seed=1, checkpoint=copies[rnd], resume=True)  # continues in copies[rnd]
        assert rows(res.history) == rows(full.history), rnd
        assert strip(res.summary) == strip(full.summary), rnd
        _, arrays, meta = load_checkpoint(copies[rnd])
        assert arrays.keys() == final.keys() and all(np.array_equal(arrays[k], final[k]) for k in final), rnd
        assert (
            meta["server"] == final_meta["server"] and meta["transport"]["failed"] == final_meta["transport"]["failed"]
        )


def test_resume_errors(tmp_path):
    p = subprocess.run(cli("run", "--resume", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "holds no config.json" in p.stderr
    p = subprocess.run(
        cli("run", "--resume", str(tmp_path), "--rounds", "3"), capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2 and "--resume takes the run directory only" in p.stderr


def _hyfem_small(rounds: int = 6):
    from hybridfl.algorithms.hyfem import HyFEMConfig
    from hybridfl.data import load_digits
    from hybridfl.data.partitioners import ClassBlockPartitioner

    split = load_digits()
    part = ClassBlockPartitioner(num_clients=3, classes_per_client=(5, 7), blocks_per_client=3, seed=1).partition(
        split.train
    )
    cfg = HyFEMConfig(rounds=rounds, local_steps=5, baselines=False, eval_every=2)
    return split, part, cfg


def test_checkpoint_every_n_rounds_and_always_the_last(tmp_path):
    from hybridfl.runtime.checkpoint import CheckpointPolicy
    from hybridfl.runtime.simulation import simulate

    split, part, cfg = _hyfem_small(rounds=7)
    ck = tmp_path / CHECKPOINT_NAME
    held = []

    def watch(rnd, total, row):
        held.append(load_checkpoint(ck)[0] if ck.exists() else 0)

    res = simulate(
        "hyfem", split, part, cfg, seed=1, progress=watch, checkpoint=ck, checkpoint_policy=CheckpointPolicy(3)
    )
    assert held == [0, 0, 3, 3, 3, 6, 7]
    s = res.summary
    assert s["checkpoint_writes"] == 3 and 0 < s["checkpoint_seconds"] < s["wall_seconds"]
    assert s["checkpoint_share"] == pytest.approx(s["checkpoint_seconds"] / s["wall_seconds"])


def test_checkpoint_policy_rules():
    from hybridfl.runtime.checkpoint import CheckpointPolicy

    p = CheckpointPolicy(every=2, seconds=0.0, max_share=0.1)
    p.begin(4)  # resumed after round 4
    assert not p.due(5) and p.due(6) and p.due(5, force=True)
    p.record(6, 1e3)  # a very slow write: the budget now forbids the next ones for a long time
    assert not p.due(8) and p.due(8, force=True)
    q = CheckpointPolicy(seconds=3600)
    q.begin()
    assert not q.due(1) and q.due(1, force=True)
    assert q.summary(10.0) == {"checkpoint_writes": 0, "checkpoint_seconds": 0.0, "checkpoint_share": 0.0}


def test_sigint_stops_cleanly_with_a_checkpoint_and_resumes(tmp_path):
    """SIGINT mid-run: the round in progress ends and is checkpointed (although the policy would
    not checkpoint it), the run raises KeyboardInterrupt, and resuming gives the uninterrupted result."""
    import os
    import signal

    from hybridfl.runtime.checkpoint import CheckpointPolicy
    from hybridfl.runtime.simulation import simulate

    split, part, cfg = _hyfem_small(rounds=6)
    full = simulate("hyfem", split, part, cfg, seed=1)
    ck = tmp_path / CHECKPOINT_NAME

    def interrupt(rnd, total, row):
        if rnd == 2:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        simulate(
            "hyfem",
            split,
            part,
            cfg,
            seed=1,
            progress=interrupt,
            checkpoint=ck,
            checkpoint_policy=CheckpointPolicy(100),
        )
    assert load_checkpoint(ck)[0] in (2, 3)  # the signal arrives after round 2's hook, or during round 3
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    res = simulate("hyfem", split, part, cfg, seed=1, checkpoint=ck, resume=True)
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(res.history) == strip(full.history)


def test_cli_checkpoint_settings_and_their_cost_in_results(tmp_path, monkeypatch, capsys):
    """The config's ``checkpoint`` section and ``--checkpoint-every`` pick the checkpointed rounds;
    results.json records what checkpointing cost (the CLI's entry point in process; the runs above
    are real processes)."""
    from tests.cli_helpers import cli_in_process

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "dataset: {name: digits}\n"
        "partition: {kind: class_block, num_clients: 3, classes_per_client: [5, 7], blocks_per_client: 3}\n"
        "algorithm: {name: hyfem, rounds: 5, local_steps: 5, baselines: false}\n"
        "checkpoint: {every: 1, max_share: null}\n"
    )
    out = tmp_path / "run"
    p = cli_in_process(
        monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(out), "-q", "--checkpoint-every", "2"
    )
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["checkpoint_writes"] == 3  # rounds 2, 4 and the last
    assert 0 < res["checkpoint_seconds"] < res["wall_seconds"] and 0 < res["checkpoint_share"] < 1
    assert load_checkpoint(out / CHECKPOINT_NAME)[0] == 5
    assert res["config"]["checkpoint"] == {"every": 2, "seconds": 0.0, "max_share": None}
