"""Exchanges, messages and bytes per round of HyFDCA's default settings, per batch size.

Credit default (standardised, as ``hybridfl run`` loads it): ``--case small`` its first 600
training rows in a 1 x 3 grid (three organisations holding one block group each: one segment,
issue 30's federation size), ``--case credit`` all 22,500 rows in a 3 x 3 grid. Prints one JSON
line: the round rows' ``exchanges`` (the distinct values), mean ``messages`` and ``bytes``, the
setup's exchanges, the mean CPU seconds of a round and the relative suboptimality reached.

    .venv/bin/python benchmarks/hyfdca_exchanges.py --case small --batch-size 1024 --rounds 5 \
        --settings '{"loss": "logistic", "lam": 1e-3}'
    .venv/bin/python benchmarks/hyfdca_exchanges.py --case credit --batch-size 1024 --rounds 25
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.config import parse_config
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.experiment import prepare

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "default_credit_card"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["small", "credit"], default="small")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--settings", default="{}", help="further HyFDCA settings (JSON) over the defaults")
    a = ap.parse_args()
    run = parse_config(
        {
            "dataset": {"name": "credit_default", "data_dir": a.data},
            "partition": {"kind": "grid", "sample_groups": 3, "block_groups": 3},
            "algorithm": {"name": "hyfdca"},
        }
    )
    split = prepare(run).split
    if a.case == "small":
        split = DatasetSplit(split.train.take(np.arange(600)), split.test)
        part = GridPartitioner(1, 3, 1, 0).partition(split.train)
    else:
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(**{"rounds": a.rounds, "batch_size": a.batch_size, "lam": 1e-4, **json.loads(a.settings)})
    t = time.perf_counter()
    res = run_hyfdca(split, part, cfg, seed=0)
    h = res.history
    setup = res.summary["setup"]
    row = {
        "case": a.case,
        "settings": {k: v for k, v in cfg.model_dump().items() if k in ("dual_mode", "batch_size", "output", "loss")},
        "samples": res.summary["samples"],
        "exchanges_per_round": sorted({int(r["exchanges"]) for r in h}),
        "messages_per_round": float(np.mean([r["messages"] for r in h])),
        "bytes_per_round": float(np.mean([r["bytes"] for r in h])),
        "setup_exchanges": setup["exchanges"],
        "round_seconds_mean": res.summary["round_seconds_mean"],
        "relative_suboptimality": h[-1].get("relative_suboptimality"),
        "wall_seconds": time.perf_counter() - t,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
