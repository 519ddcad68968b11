"""Hybrid FedAvg learning-rate sweep beyond the grid of ``hyfdca_bench.py`` (whose best lr, 0.3,
was at the grid's upper edge), compared with the HyFDCA history already in
``benchmarks/results/hyfdca_<dataset>.json``.

    .venv/bin/python benchmarks/hyfdca_fedavg_lr.py --dataset mnist --lrs 1,3,10 --rounds 100 --eval-every 5

Writes ``benchmarks/results/hyfdca_fedavg_lr_<dataset>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hybridfl.algorithms.hybrid_fedavg import HybridFedAvgConfig, run_hybrid_fedavg
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded
from hyfdca_bench import OUT, dataset, slim


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", required=True, choices=["mnist", "credit", "adult"])
    ap.add_argument("--lrs", default="1,3,10")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=5)
    a = ap.parse_args()
    split, pos, lam = dataset(a.dataset)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    prev = json.loads((OUT / f"hyfdca_{a.dataset}.json").read_text())
    hy = {
        h["round"]: h["relative_suboptimality"]
        for h in prev["runs"]["hyfdca_full"]["history"]
        if "relative_suboptimality" in h
    }
    out: dict = {"dataset": a.dataset, "rounds": a.rounds, "runs": {}}
    with single_threaded():
        for lr in [float(x) for x in a.lrs.split(",")]:
            res = run_hybrid_fedavg(
                split,
                part,
                HybridFedAvgConfig(
                    fit_intercept=False, lam=lam, rounds=a.rounds, positive_classes=pos, eval_every=a.eval_every, lr=lr
                ),
                seed=0,
            )
            fa = {h["round"]: h["relative_suboptimality"] for h in res.history if "relative_suboptimality" in h}
            common = [r for r in sorted(fa) if r >= 10 and r in hy]
            out["runs"][f"lr{lr:g}"] = {
                "final": res.summary["relative_suboptimality"],
                "accuracy": res.summary["accuracy"],
                "hyfdca_full_below_at_every_common_round_from_10": all(hy[r] < fa[r] for r in common),
                "rounds_compared": len(common),
                "history": slim(res.history),
            }
            print(
                lr,
                out["runs"][f"lr{lr:g}"]["final"],
                out["runs"][f"lr{lr:g}"]["hyfdca_full_below_at_every_common_round_from_10"],
                flush=True,
            )
    out["command"] = (
        f".venv/bin/python benchmarks/hyfdca_fedavg_lr.py --dataset {a.dataset} --lrs {a.lrs} --rounds {a.rounds} --eval-every {a.eval_every}"
    )
    (OUT / f"hyfdca_fedavg_lr_{a.dataset}.json").write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
