"""Benchmark: ``hybridfl predict`` on 10^5 rows of one table, through the CLI (issue: <= 5 s), and
federated prediction of 10^4 new IDs across three organisations in process, PSI included (<= 30 s).

Trains HyFDCA and HyFEM (a few rounds, the model's size is what matters for scoring) on a
400-row customers table (``tests/test_predict.make_table``: string IDs, a categorical column,
standardised numeric columns), writes a 100,000-row table of new customers, and times the whole
``hybridfl predict`` process (start-up, reading, encoding, scoring, writing) with farm-bench-like
repeats (``--repeats``, median quoted). Writes ``benchmarks/results/predict_speed.{json,md}``.

    python -m benchmarks.predict_speed [--rows 100000] [--repeats 3]    (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def main() -> None:
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
    res = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "rows": rows,
        "federated": fed,
    }
    out = ROOT / "benchmarks" / "results"
    (out / "predict_speed.json").write_text(json.dumps(res, indent=1))
    md = [
        "# `hybridfl predict`: one table, whole CLI process",
        "",
        f"Machine: {res['machine']}.",
        "",
        "| model | rows | seconds (median of runs) |",
        "|---|---|---|",
    ]
    md += [f"| {r['algorithm']} | {r['rows']:,} | {r['median_seconds']:.2f} |" for r in rows]
    md += [
        "",
        "## Federated prediction: three organisations, in process, PSI included",
        "",
        "The receiver holds the profile block of all its new customers, a second organisation the money "
        "block of 3/4 of them (in another order), a third both blocks of the last half; HyFDCA's model.",
        "",
        "| receiver rows | scored | messages | MB | seconds (median of runs) |",
        "|---|---|---|---|---|",
        f"| {fed['rows']:,} | {fed['scored']:,} | {fed['messages']} | {fed['bytes'] / 1e6:.2f} | {fed['median_seconds']:.2f} |",
    ]
    (out / "predict_speed.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
