"""Scale of the simulation (issue 17): HyFEM on MNIST quadrants with many clients.

HyFEM on MNIST split into 4 quadrant blocks (CNN extractors), class x block partition (each
client 5-7 digits, 3 of the 4 quadrants, all samples of its digits), 3 rounds of ``Q = 20`` local
steps, evaluation after every round, no baselines, a checkpoint as ``hybridfl run`` writes it
(default ``checkpoint`` settings). Each client count runs in its own process, so that its peak
resident memory (``ru_maxrss``) is its own. Recorded per run: wall time from the loaded dataset
to the summary (``wall_seconds``: build, setup, rounds, evaluation, checkpoints), the training
rounds alone (``train_seconds``), the evaluations (``eval_seconds``), the checkpoints
(``checkpoint_seconds``), the time to load MNIST and partition it (``load_seconds``), and peak RSS.

    nice -n 5 .venv/bin/python benchmarks/scale.py                      # 10 and 100 clients
    nice -n 5 .venv/bin/python benchmarks/scale.py --clients 10 --test-subsample 0

Writes benchmarks/results/scale.json and scale.md (a run with other client counts adds to them,
replacing the rows of the same setting).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "benchmarks" / "results"


def one(clients: int, rounds: int, local_steps: int, test_subsample: int, data_dir: str) -> dict:
    """One run in this process; returns its measurements."""
    import dataclasses

    from hybridfl.algorithms.hyfem import SPEC, HyFEMConfig
    from hybridfl.config import CheckpointConfig, load_config
    from hybridfl.experiment import prepare
    from hybridfl.runtime.checkpoint import CheckpointPolicy
    from hybridfl.runtime.simulation import simulate, single_threaded

    class ScaleConfig(HyFEMConfig):
        """HyFEM's settings with the evaluation's ``test_subsample``."""

        test_subsample: int = 0

    cfg = load_config(ROOT / "examples" / "configs" / "hyfem_mnist.yaml")
    data = cfg.model_dump(mode="json")
    data["dataset"]["data_dir"] = data_dir
    data["partition"].update(num_clients=clients)
    data["algorithm"].update(rounds=rounds, local_steps=local_steps, eval_every=1, baselines=False)
    run = type(cfg).model_validate(data)
    t0 = time.perf_counter()
    prep = prepare(run)
    load_seconds = time.perf_counter() - t0
    algo = ScaleConfig.model_validate({**prep.algorithm.model_dump(), "test_subsample": test_subsample})
    eval_seconds = eval_cpu = 0.0

    def timed_evaluate(ctx):
        nonlocal eval_seconds, eval_cpu
        t, c = time.perf_counter(), time.process_time()
        try:
            return SPEC.evaluate(ctx)
        finally:
            eval_seconds += time.perf_counter() - t
            eval_cpu += time.process_time() - c

    spec = dataclasses.replace(SPEC, evaluate=timed_evaluate)
    ck = CheckpointConfig()
    with tempfile.TemporaryDirectory() as tmp, single_threaded():
        c0 = time.process_time()
        res = simulate(
            spec,
            prep.split,
            prep.partition,
            algo,
            run.seed,
            checkpoint=Path(tmp) / "checkpoint.hfl",
            checkpoint_policy=CheckpointPolicy(ck.every, ck.seconds, ck.max_share),
        )
        cpu = time.process_time() - c0
        ck_bytes = (Path(tmp) / "checkpoint.hfl").stat().st_size
    s = res.summary
    return {
        "clients": clients,
        "rounds": rounds,
        "local_steps": local_steps,
        "batch_size": algo.batch_size,
        "test_subsample": test_subsample,
        "test_samples": prep.split.test.n_samples,
        "train_samples_held": int(sum(c.n_samples for c in prep.partition.clients)),
        "load_seconds": load_seconds,
        "wall_seconds": s["wall_seconds"],
        "train_seconds": s["train_seconds"],
        "eval_seconds": eval_seconds,
        "cpu_seconds": cpu,
        "eval_cpu_seconds": eval_cpu,
        "checkpoint_seconds": s["checkpoint_seconds"],
        "checkpoint_writes": s["checkpoint_writes"],
        "checkpoint_share": s["checkpoint_share"],
        "checkpoint_bytes": ck_bytes,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # KiB on Linux
        "server_accuracy": s["server_accuracy"],
        "client_accuracy_mean": s["client_accuracy_mean"],
        "client_accuracy_local_mean": s["client_accuracy_local_mean"],
    }


def markdown(rows: list[dict]) -> str:
    """The results table."""
    lines = [
        "# HyFEM simulation at scale (MNIST quadrants, class x block, evaluation every round)",
        "",
        "Written by `benchmarks/scale.py` (command in its docstring); single-threaded, on a 2-core machine",
        "shared with other jobs (wall times include waiting for the CPU; CPU times do not). `test subsample`: test samples of the per-client metrics before the last",
        "round (0: all); the server accuracy and the last round always use all 10,000.",
        "",
        "| clients | rounds x Q | test subsample | wall (s) | CPU (s) | training (s) | evaluation, wall / CPU (s) "
        "| checkpoints (s, writes, share) | load MNIST (s) | peak RSS (GB) | server acc. | clients acc. (received / local) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['rounds']} x {r['local_steps']} | {r['test_subsample']} | {r['wall_seconds']:.1f} | "
            f"{r['cpu_seconds']:.1f} | {r['train_seconds']:.1f} | {r['eval_seconds']:.1f} / {r['eval_cpu_seconds']:.1f} | {r['checkpoint_seconds']:.2f}, {r['checkpoint_writes']}, "
            f"{100 * r['checkpoint_share']:.1f} % | {r['load_seconds']:.1f} | {r['peak_rss_gb']:.2f} | "
            f"{100 * r['server_accuracy']:.2f} % | {100 * r['client_accuracy_mean']:.2f} % / "
            f"{100 * r['client_accuracy_local_mean']:.2f} % |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run each client count in a child process and write the results files."""
    from hybridfl.files import atomic_write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--test-subsample", type=int, default=2000)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child: one client count, JSON out
    args = ap.parse_args()
    if args.one:
        row = one(args.clients[0], args.rounds, args.local_steps, args.test_subsample, args.data_dir)
        print(json.dumps(row), flush=True)
        return
    path = RESULTS / "scale.json"
    old = json.loads(path.read_text())["runs"] if path.exists() else []
    rows = []
    for m in args.clients:
        cmd = [sys.executable, __file__, "--one", "--clients", str(m), "--rounds", str(args.rounds)]
        cmd += ["--local-steps", str(args.local_steps), "--test-subsample", str(args.test_subsample)]
        cmd += ["--data-dir", args.data_dir]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    key = lambda r: (r["clients"], r["rounds"], r["local_steps"], r["test_subsample"])  # noqa: E731
    new = {key(r) for r in rows}
    runs = sorted([r for r in old if key(r) not in new] + rows, key=key)
    meta = {"machine": platform.machine(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    atomic_write(path, json.dumps({"meta": meta, "runs": runs}, indent=2))
    atomic_write(RESULTS / "scale.md", markdown(runs))
    print(markdown(runs))


if __name__ == "__main__":
    main()
