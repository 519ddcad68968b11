"""Checkpoint and resume: a run killed mid-way (SIGKILL) and resumed with `hybridfl run --resume`
ends with the same model metrics and results as an uninterrupted run with the same seed."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hybridfl.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint

CONFIG = """
seed: 3
dataset: {name: digits}
partition: {kind: class_block, num_clients: 4, classes_per_client: [5, 7], blocks_per_client: 3}
algorithm: {name: hyfem, rounds: 12, local_steps: 40, lr: 0.05, momentum: 0.9, eval_every: 4, failure_rate: 0.2}
"""
TIMING = {"seconds", "train_seconds", "centralized_seconds", "wall_seconds", "seconds_total"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hybridfl.cli.main", *args]


def results(d: Path) -> tuple[dict, list[dict]]:
    res = {k: v for k, v in json.loads((d / "results.json").read_text()).items() if k not in TIMING}
    with open(d / "metrics.csv") as f:
        rows = [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]
    return res, rows


def test_killed_run_resumes_to_the_same_result(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    full, part = tmp_path / "full", tmp_path / "part"
    done = subprocess.run(cli("run", "--config", str(cfg), "--out", str(full), "-q"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    proc = subprocess.Popen(cli("run", "--config", str(cfg), "--out", str(part), "-q"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        killed_after = None
        while time.monotonic() < deadline and proc.poll() is None:
            ck = part / CHECKPOINT_NAME
            if ck.exists():
                rnd = load_checkpoint(ck)[0]
                if rnd >= 3:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_after = rnd
                    break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert killed_after is not None, "the run ended before it could be interrupted"
    stopped_at = load_checkpoint(part / CHECKPOINT_NAME)[0]
    assert 3 <= stopped_at < 12
    assert not (part / "results.json").exists()  # killed: no results yet, nothing half-written

    resumed = subprocess.run(cli("run", "--resume", str(part), "-q"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    res_full, rows_full = results(full)
    res_part, rows_part = results(part)
    assert rows_part == rows_full
    assert res_part == res_full
    assert res_full["client_failures"] > 0


def test_resume_errors(tmp_path):
    p = subprocess.run(cli("run", "--resume", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "holds no config.json" in p.stderr
    p = subprocess.run(cli("run", "--resume", str(tmp_path), "--rounds", "3"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--resume takes the run directory only" in p.stderr
