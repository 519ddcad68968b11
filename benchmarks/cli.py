"""The CLI as a user runs it: every example config through ``hybridfl run``, and ``hybridfl predict`` / federated prediction speed.

Run from the repository root: ``python -m benchmarks.cli PART [options]``.

Part ``examples``
-----------------

Every example config run through the CLI, as a user runs it (issue 17: "what the user runs is
what the benchmark measured").

For each ``examples/configs/*.yaml`` this runs ``hybridfl run --config FILE --out DIR --rounds R``
in a fresh process (so the time includes start-up, data loading, the partition, PSI alignment,
every round, evaluation, checkpoints and the result files), with ``R`` the config's own rounds or
fewer (``--max-rounds``), and records: the whole wall time, the rounds run, the per-round wall
time after the first round, the checkpoint seconds and their share of the run (from
``results.json``), and the full-length time extrapolated from those: ``wall(R) + (rounds -
R) x per-round``, the process's CPU seconds (user and system, from ``getrusage`` of the child) and
the headline numbers of its ``results.json`` (:data:`RESULT_KEYS`: what the config's header
promises, e.g. HyFDCA's relative suboptimality and duality gap, FedBCD's rounds to the target
AUC). The machine's load average is recorded at the start and the end of every run (two cores,
shared with other jobs: a loaded machine runs slower in wall time; the CPU seconds much less).

    nice -n 5 .venv/bin/python -m benchmarks.cli examples          # every example, full length
    nice -n 5 .venv/bin/python -m benchmarks.cli examples --only hyfdca_mnist --cap hyfdca=20

Writes ``benchmarks/results/examples_cli.json`` and ``.md`` (merged with earlier rows by config).

Part ``predict``
----------------

Benchmark: ``hybridfl predict`` on 10^5 rows of one table, through the CLI (issue: <= 5 s), and
federated prediction of 10^4 new IDs across three organisations in process, PSI included (<= 30 s).

Trains HyFDCA and HyFEM (a few rounds, the model's size is what matters for scoring) on a
400-row customers table (``tests/test_predict.make_table``: string IDs, a categorical column,
standardised numeric columns), writes a 100,000-row table of new customers, and times the whole
``hybridfl predict`` process (start-up, reading, encoding, scoring, writing) with farm-bench-like
repeats (``--repeats``, median quoted). Writes ``benchmarks/results/predict_speed.{json,md}``.

    python -m benchmarks.cli predict [--rows 100000] [--repeats 3]    (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.harness import commit, dispatch, write_report

# ======================================== part examples

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
EXAMPLES = ROOT / "examples" / "configs"


RESULT_KEYS = (
    "relative_suboptimality",
    "duality_gap",
    "relative_duality_gap",
    "model_gap",
    "accuracy",
    "server_accuracy",
    "client_accuracy_mean",
    "centralized_accuracy",
    "standalone_accuracy_mean",
    "auc",
    "best_auc",
    "rounds_to_target",
    "train_seconds",
)
"""The headline numbers of a run's ``results.json`` kept in a row (those it has)."""


def _commit() -> str:
    """The checkout's commit (short hash), with ``+`` when src/ or examples/ have uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "src", "examples"], capture_output=True, text=True).stdout
    return head + ("+" if dirty.strip() else "")


def run_one(config: Path, max_rounds: int, timeout: float) -> dict:
    """One CLI run of ``config`` (at most ``max_rounds`` rounds; 0: all); its times and shares."""
    rounds = int(yaml.safe_load(config.read_text())["algorithm"].get("rounds", 1))
    run_rounds = rounds if max_rounds <= 0 else min(rounds, max_rounds)
    hybridfl = str(Path(sys.executable).parent / "hybridfl")
    with tempfile.TemporaryDirectory(prefix="hfl-example-") as tmp:
        out = Path(tmp) / "run"
        cmd = [hybridfl, "run", "--config", str(config), "--out", str(out), "--rounds", str(run_rounds), "-q"]
        load0 = os.getloadavg()[0]
        t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load1 = os.getloadavg()[0]
        if p.returncode != 0:
            lines = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
            return {"config": config.stem, "error": lines[-1] if lines else f"exit {p.returncode}"}
        res = json.loads((out / "results.json").read_text())
        rows = [json.loads(json.dumps(r)) for r in res.get("history", [])]
        if not rows and (out / "metrics.csv").is_file():
            import csv

            with open(out / "metrics.csv") as f:
                rows = list(csv.DictReader(f))
    done = int(res.get("rounds", run_rounds))
    per_round = [float(r["seconds"]) for r in rows if r.get("seconds") not in (None, "")]
    steady = sorted(per_round[1:] or per_round)
    per = steady[len(steady) // 2] if steady else wall / max(done, 1)
    share = res.get("checkpoint_share")
    return {
        "config": config.stem,
        "algorithm": res.get("config", {}).get("algorithm", {}).get("name"),
        "config_rounds": rounds,
        "rounds_run": done,
        "wall_seconds": wall,
        "cpu_seconds": {"user": ru1.ru_utime - ru0.ru_utime, "system": ru1.ru_stime - ru0.ru_stime},
        "result": {k: res[k] for k in RESULT_KEYS if isinstance(res.get(k), (int, float))},
        "round_seconds_median": per,
        "checkpoint_seconds": res.get("checkpoint_seconds"),
        "checkpoint_writes": res.get("checkpoint_writes"),
        "checkpoint_share": share,
        "extrapolated_full_seconds": wall + (0 if res.get("stopped_early") else max(rounds - done, 0) * per),
        "load_start": load0,
        "load_end": load1,
        "commit": _commit(),
    }


EXAMPLE_COLUMNS = [
    "config",
    ("rounds_run", "rounds run"),
    ("config_rounds", "config rounds"),
    ("wall_seconds", "wall s"),
    ("cpu_s", "CPU s"),
    ("round_seconds_median", "median round s"),
    ("checkpoint_seconds", "checkpoint s"),
    ("checkpoint_writes", "checkpoint writes"),
    ("checkpoint_share", "checkpoint share"),
    ("extrapolated_full_seconds", "full length s (extrapolated)"),
    ("load_start", "load start"),
    ("load_end", "load end"),
    ("result_text", "result"),
    ("commit", "commit"),
    "error",
]


def _fmt_result(res: dict) -> str:
    """A row's headline numbers, ``key value`` joined by commas (``-`` when none)."""
    parts = [f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items() if k != "train_seconds"]
    return ", ".join(parts) or "-"


def write(rows: list[dict]) -> None:
    """Merge ``rows`` into ``examples_cli.json`` by config (earlier rows keep their own commit)
    and rewrite ``examples_cli.json`` and ``.md`` through :func:`benchmarks.harness.write_report`."""
    path = OUT / "examples_cli.json"
    old = json.loads(path.read_text())["rows"] if path.is_file() else []
    keep = {r["config"]: r for r in old}
    keep.update({r["config"]: {"commit": commit(), **r} for r in rows})
    for r in keep.values():  # the table's cells of a row's nested measurements
        cpu = r.get("cpu_seconds")
        if isinstance(cpu, dict):
            r["cpu_s"] = round(cpu["user"] + cpu["system"], 1)
        if isinstance(r.get("result"), dict):
            r["result_text"] = _fmt_result(r["result"])
    write_report(
        "examples_cli",
        [keep[k] for k in sorted(keep)],
        title="Example configs through the CLI",
        command="nice -n 5 .venv/bin/python -m benchmarks.cli examples",
        columns=EXAMPLE_COLUMNS,
        out=OUT,
        notes=[
            "`hybridfl run --config examples/configs/NAME.yaml --out DIR --rounds R -q` in a fresh process; "
            "`R` = the config's rounds, or fewer where a cap was given (`--max-rounds`, `--cap PREFIX=R`; none by "
            "default: every example runs full length; a capped HyFDCA example has no baselines, so the "
            "extrapolation holds); the full length is "
            "extrapolated from the run (`wall + (rounds - R) x median round`). Two cores shared with other jobs: "
            "see the load. Each row keeps the commit it was measured at. CPU s: the `hybridfl` process's user + "
            "system seconds; result: the headline numbers of its results.json (what the config's header promises)."
        ],
    )


def main_examples() -> None:
    """Run the example configs (``--only`` names a subset) and write the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-rounds", type=int, default=0, help="cap on rounds per config (0: the config's own)")
    ap.add_argument(
        "--cap",
        nargs="*",
        default=[],
        help="PREFIX=R: cap configs whose name starts with PREFIX at R rounds",
    )
    ap.add_argument("--only", nargs="*", default=None, help="config names without .yaml")
    ap.add_argument("--timeout", type=float, default=3600.0)
    a = ap.parse_args()
    configs = sorted(EXAMPLES.glob("*.yaml"))
    if a.only:
        configs = [c for c in configs if c.stem in set(a.only)]
    rows = []
    caps = [(k, int(v)) for k, v in (x.split("=", 1) for x in a.cap or [])]
    for c in configs:
        cap = next((r for k, r in caps if c.stem.startswith(k)), a.max_rounds)
        r = run_one(c, cap, a.timeout)
        print(json.dumps(r), flush=True)
        rows.append(r)
        write(rows)


# ======================================== part predict


def federated(tmp: Path, n: int, repeats: int) -> dict:
    """Federated prediction of ``n`` receiver rows across three organisations (HyFDCA's model)."""
    import pandas as pd
    from tests.test_predict import make_table

    from hybridfl.inference import load_model
    from hybridfl.inference.federated import federated_predict

    new = pd.read_csv(make_table(tmp / "fed.csv", n, seed=2))
    prof, money = ["region", "age", "calls"], ["income", "debt"]
    tables = {
        "a": new[["customer", *prof, "label"]],
        "b": new.iloc[n // 4 :][["customer", *money]].iloc[::-1],
        "c": new.iloc[n // 2 :][["customer", *prof, *money]],
    }
    model = load_model(tmp / "hyfdca" / "model")
    times, stats = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, stats = federated_predict(model, tables, "a")
        times.append(time.perf_counter() - t0)
    return {
        "rows": n,
        "scored": stats["scored"],
        "messages": stats["messages"],
        "bytes": stats["bytes"],
        "seconds": times,
        "median_seconds": statistics.median(times),
    }


def main_predict() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fed-rows", type=int, default=10_000)
    args = ap.parse_args()
    from tests.test_predict import config, make_table

    from hybridfl.config import parse_config
    from hybridfl.experiment import execute, prepare

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train = make_table(tmp / "train.csv", 400, seed=0)
        new = make_table(tmp / "new.csv", args.rows, seed=1)
        for algo in ("hyfdca", "hyfem"):
            cfg = parse_config(config(train, algo))
            out = tmp / algo
            execute(prepare(cfg, out), out)
            times = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                p = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "hybridfl.cli.main",
                        "predict",
                        "--model",
                        str(out / "model"),
                        "--table",
                        str(new),
                        "--out",
                        str(tmp / f"{algo}-{r}.csv"),
                    ],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                )
                times.append(time.perf_counter() - t0)
                if p.returncode != 0:
                    raise SystemExit(p.stderr)
            rows.append(
                {"algorithm": algo, "rows": args.rows, "seconds": times, "median_seconds": statistics.median(times)}
            )
        fed = federated(tmp, args.fed_rows, args.repeats)
    fed_row = {"config": "federated", "algorithm": "hyfdca", **fed}
    write_report(
        "predict_speed",
        [{"config": r["algorithm"], **r} for r in rows] + [fed_row],
        title="`hybridfl predict` (one table, whole CLI process) and federated prediction",
        command=f"python -m benchmarks.cli predict --rows {args.rows} --repeats {args.repeats} "
        f"--fed-rows {args.fed_rows}",
        columns=[
            "config",
            "algorithm",
            "rows",
            ("scored", "scored"),
            ("messages", "messages"),
            ("bytes", "bytes"),
            ("median_seconds", "seconds (median of runs)"),
        ],
        out=OUT,
        notes=[
            "Rows `hyfdca` and `hyfem`: the whole `hybridfl predict` process (start-up, reading, encoding, "
            "scoring, writing) on one table of new customers. Row `federated`: federated prediction across "
            "three organisations in process, PSI included: the receiver holds the profile block of all its "
            "new customers, a second organisation the money block of 3/4 of them (in another order), a third "
            "both blocks of the last half; HyFDCA's model."
        ],
    )


PARTS = {
    "examples": (main_examples, "--max-rounds 1 --only hyfem_mfeat fedbcd_credit_2party".split()),
    "predict": (main_predict, "--rows 2000 --repeats 1 --fed-rows 200".split()),
}


def main() -> None:
    """``python -m benchmarks.cli PART [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("cli", PARTS, globals())


if __name__ == "__main__":
    main()
