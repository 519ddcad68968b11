"""HyFDCA with clients failing mid-round (issue "Reliability": relative suboptimality at 30 %
failures on MNIST binary). Same problems as ``hyfdca_bench.py`` (3 x 3 grid, hinge, lambda 1e-3);
each selected client fails with probability ``--rate`` per round (it does its work, its replies
never arrive). Writes ``benchmarks/results/hyfdca_failures_<dataset>.json`` and prints a table row.

    .venv/bin/python benchmarks/hyfdca_failures.py --dataset mnist --rounds 100 --rate 0.3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded
from hyfdca_bench import OUT, dataset, first_round_below, slim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "credit", "adult"])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--rates", default="0,0.3", help="comma-separated failure rates")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--loss", default="hinge", choices=["hinge", "logistic", "squared"])
    ap.add_argument("--sigma", type=float, default=None, help="sigma' (default: the number of clients, or of segments)")
    ap.add_argument("--dual-mode", default="block", choices=["block", "consensus", "segment"])
    ap.add_argument("--participation", type=float, default=1.0, help="share of clients selected per round")
    args = ap.parse_args()
    split, pos, lam = dataset(args.dataset)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    out: dict = {
        "dataset": args.dataset,
        "loss": args.loss,
        "sigma": args.sigma,
        "dual_mode": args.dual_mode,
        "participation": args.participation,
        "lambda": lam,
        "grid": "3 x 3 = 9 clients",
        "rounds": args.rounds,
        "runs": {},
        "command": " ".join([".venv/bin/python", *sys.argv]),
    }
    for rate in (float(r) for r in args.rates.split(",")):
        cfg = HyFDCAConfig(
            fit_intercept=False,
            lam=lam,
            loss=args.loss,
            sigma=args.sigma,
            rounds=args.rounds,
            positive_classes=pos,
            eval_every=args.eval_every,
            failure_rate=rate,
            dual_mode=args.dual_mode,
            encryption="none",
            output="last",
            segment_inner_products="encrypted",
            participation=args.participation,
        )
        t = time.perf_counter()
        with single_threaded():
            res = run_hyfdca(split, part, cfg, seed=0)
        s = res.summary
        h = first_round_below(res.history, 1e-3)
        out["runs"][f"failure_rate_{rate:g}"] = {
            "failure_rate": rate,
            "client_failures": s["client_failures"],
            "relative_suboptimality": s["relative_suboptimality"],
            "duality_gap": s["duality_gap"],
            "accuracy": s["accuracy"],
            "reach_1e-3_round": None if h is None else h["round"],
            "wall_seconds": time.perf_counter() - t,
            "history": slim(res.history),
        }
        print(
            f"{args.dataset} {args.loss} failure_rate={rate:g}: failures {s['client_failures']}, rel. subopt @{args.rounds} "
            f"{s['relative_suboptimality']:.3e}, gap {s['duality_gap']:.3e}, test acc {s['accuracy']:.4f}",
            flush=True,
        )
    OUT.mkdir(parents=True, exist_ok=True)
    tag = (
        ("" if args.loss == "hinge" else f"_{args.loss}")
        + ("" if args.dual_mode == "block" else f"_{args.dual_mode}")
        + ("" if args.participation == 1.0 else f"_p{args.participation:g}")
    )
    (OUT / f"hyfdca_failures_{args.dataset}{tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
