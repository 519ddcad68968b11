"""FedBCD on UCI credit default (issue 4, must-show 2 and 3).

Part A, rounds to a target test AUC (paper Table 1, MIMIC-LR column, here on credit default):
logistic regression split over K = 2 parties ([demographic, bill] / [repayment, payment], labels
at the second) and K = 4 parties (demographic / repayment / bill / payment, labels at
repayment), for FedSGD, FedBCD-p and FedBCD-s with Q in {1, 5, 50}. The paper tunes eta_0 per
experiment: every (method, Q, K) gets the eta_0 of the grid that needs the fewest rounds (median
over seeds) to reach the highest target; reported is that median and the per-seed rounds.

Part B, large Q (paper Fig. 4b): FedBCD-p vs FedPBCD-p (mu = 0.1) with Q in {25, 50, 100}, same
eta_0 for both, fixed number of rounds; final and best test AUC (mean over seeds). Model: MLP
towers (the paper's Fig. 4b task NUS-FTL uses one-hidden-layer towers) and linear.

    .venv/bin/python benchmarks/fedbcd_credit.py [--quick]

Writes benchmarks/results/fedbcd_credit.json and fedbcd_credit.md. Single-threaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hybridfl.algorithms.fedbcd import FedBCDConfig, run_fedbcd  # noqa: E402
from hybridfl.data import VerticalPartitioner, load_credit_default, standardize  # noqa: E402
from hybridfl.runtime.simulation import single_threaded  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "default_credit_card"
OUT = ROOT / "benchmarks" / "results"
PARTIES = {
    2: ([["demographic", "bill"], ["repayment", "payment"]], 1),
    4: ([["demographic"], ["repayment"], ["bill"], ["payment"]], 1),
}
METHODS = [("sgd", 1), ("p", 5), ("p", 50), ("s", 1), ("s", 5), ("s", 50)]
NAMES = {"sgd": "FedSGD", "p": "FedBCD-p", "s": "FedBCD-s", "prox": "FedPBCD-p"}


def first_round(history, target):
    for r in history:
        if "auc" in r and r["auc"] >= target:
            return int(r["round"])
    return None


def med(values):
    """Median with 'not reached' (None) counted as +inf."""
    v = sorted(float("inf") if x is None else x for x in values)
    m = statistics.median(v)
    return None if m == float("inf") else m


def part_a(split, seeds, lrs, rounds, targets):
    rows = []
    for K, (parties, label) in PARTIES.items():
        part = VerticalPartitioner(parties=parties, label_party=label).partition(split.train)
        for variant, Q in METHODS:
            best = None
            for lr in lrs:
                per_seed = {t: [] for t in targets}
                aucs = []
                for seed in seeds:
                    cfg = FedBCDConfig(
                        variant=variant,
                        local_steps=Q,
                        rounds=rounds,
                        batch_size=64,
                        lr=lr,
                        model="linear",
                        target_auc=max(targets),
                        stop_at_target=True,
                    )
                    res = run_fedbcd(split, part, cfg, seed=seed)
                    for t in targets:
                        per_seed[t].append(first_round(res.history, t))
                    aucs.append(res.summary["best_auc"])
                key = tuple((med(per_seed[t]) or float("inf")) for t in sorted(targets, reverse=True))
                cand = {
                    "K": K,
                    "method": NAMES[variant],
                    "variant": variant,
                    "Q": Q,
                    "lr": lr,
                    "rounds_median": {str(t): med(per_seed[t]) for t in targets},
                    "rounds_per_seed": {str(t): per_seed[t] for t in targets},
                    "best_auc_mean": float(np.mean(aucs)),
                    "_key": key,
                }
                print(f"K={K} {NAMES[variant]} Q={Q} lr={lr}: {cand['rounds_median']}", flush=True)
                ALL.append({k: v for k, v in cand.items() if k != "_key"})
                if best is None or key < best["_key"]:
                    best = cand
            best.pop("_key")
            rows.append(best)
    return rows


ALL: list[dict] = []  # every (K, method, Q, eta_0) tried in part A


def part_b(split, seeds, lr_by_model, rounds, Qs, mu):
    rows = []
    parties, label = PARTIES[4]
    part = VerticalPartitioner(parties=parties, label_party=label).partition(split.train)
    for model, lr in lr_by_model.items():
        for Q in Qs:
            for variant in ("p", "prox"):
                finals, bests, curves = [], [], []
                for seed in seeds:
                    cfg = FedBCDConfig(
                        variant=variant,
                        local_steps=Q,
                        mu=mu if variant == "prox" else None,
                        rounds=rounds,
                        batch_size=64,
                        lr=lr,
                        model=model,
                        representation_dim=16,
                        hidden=32,
                        eval_every=5,
                    )
                    res = run_fedbcd(split, part, cfg, seed=seed)
                    finals.append(res.summary["auc"])
                    bests.append(res.summary["best_auc"])
                    curves.append([(int(r["round"]), r["auc"]) for r in res.history if "auc" in r])
                row = {
                    "model": model,
                    "method": NAMES[variant],
                    "Q": Q,
                    "mu": mu if variant == "prox" else 0.0,
                    "lr": lr,
                    "rounds": rounds,
                    "final_auc_mean": float(np.mean(finals)),
                    "final_auc_per_seed": finals,
                    "best_auc_mean": float(np.mean(bests)),
                    "curve_seed0": curves[0],
                }
                print(
                    f"{model} Q={Q} {NAMES[variant]}: final {row['final_auc_mean']:.4f} best {row['best_auc_mean']:.4f}",
                    flush=True,
                )
                rows.append(row)
    return rows


def pct(x):
    return "diverged" if x is None or not np.isfinite(x) else f"{100 * x:.2f} %"


def fmt_r(x):
    return "not reached" if x is None else (f"{x:g}")


def write_md(a, b, meta, path):
    lines = [
        "### UCI credit default: rounds to a target test AUC (logistic regression)",
        "",
        f"Batch 64, eta_t = eta_0/sqrt(t+1) with eta_0 tuned per row from {meta['lrs']}, median over seeds {meta['seeds']} "
        f"(at most {meta['rounds']} rounds; centralised logistic regression reaches test AUC {meta['central_auc']:.4f}).",
        "",
    ]
    t_hi, t_lo = max(meta["targets"]), min(meta["targets"])
    lines += [
        f"| K | method | Q | eta_0 | rounds to AUC {100 * t_lo:g} % | rounds to AUC {100 * t_hi:g} % | per seed ({100 * t_hi:g} %) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in a:
        lines.append(
            f"| {r['K']} | {r['method']} | {r['Q']} | {r['lr']:g} | {fmt_r(r['rounds_median'][str(t_lo)])} | "
            f"{fmt_r(r['rounds_median'][str(t_hi)])} | {', '.join(fmt_r(x) for x in r['rounds_per_seed'][str(t_hi)])} |"
        )
    lines += [
        "",
        "### Large Q: FedBCD-p vs FedPBCD-p (credit default, K = 4)",
        "",
        f"Same eta_0 for both, {meta['rounds_b']} rounds, mean over seeds {meta['seeds_b']}; mu = {meta['mu']}.",
        "",
        "| model | Q | FedBCD-p final AUC | FedPBCD-p final AUC | FedBCD-p best AUC | FedPBCD-p best AUC |",
        "|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in b):
        for Q in dict.fromkeys(r["Q"] for r in b if r["model"] == model):
            p = next(r for r in b if r["model"] == model and r["Q"] == Q and r["method"] == "FedBCD-p")
            x = next(r for r in b if r["model"] == model and r["Q"] == Q and r["method"] == "FedPBCD-p")
            lines.append(
                f"| {model} | {Q} | {pct(p['final_auc_mean'])} | {pct(x['final_auc_mean'])} | "
                f"{pct(p['best_auc_mean'])} | {pct(x['best_auc_mean'])} |"
            )
    path.write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one seed, two step sizes, fewer rounds")
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
    args = ap.parse_args()
    if args.report_only:
        d = json.loads((OUT / "fedbcd_credit.json").read_text())
        write_md(d["rounds_to_target"], d["large_q"], d["meta"], OUT / "fedbcd_credit.md")
        print((OUT / "fedbcd_credit.md").read_text())
        return
    seeds = [0] if args.quick else [0, 1, 2]
    lrs = [0.1, 0.5] if args.quick else [0.1, 0.2, 0.5, 1.0]
    rounds = 200 if args.quick else 600
    targets = [0.70, 0.71]
    split = standardize(load_credit_default(DATA))
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    X = np.concatenate([split.train.blocks[b] for b in split.train.block_names], 1)
    Xt = np.concatenate([split.test.blocks[b] for b in split.train.block_names], 1)
    central = float(
        roc_auc_score(
            split.test.y, LogisticRegression(max_iter=3000, C=1e4).fit(X, split.train.y).decision_function(Xt)
        )
    )
    t0 = time.time()
    with single_threaded():
        a = part_a(split, seeds, lrs, rounds, targets)
        rounds_b = 60 if args.quick else 100
        b = part_b(split, seeds, {"mlp": 0.5, "linear": 1.0}, rounds_b, [25, 50, 100], 0.1)
    meta = {
        "seeds": seeds,
        "lrs": lrs,
        "rounds": rounds,
        "targets": targets,
        "central_auc": central,
        "rounds_b": rounds_b,
        "seeds_b": seeds,
        "mu": 0.1,
        "seconds": time.time() - t0,
        "command": "python benchmarks/fedbcd_credit.py" + (" --quick" if args.quick else ""),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fedbcd_credit.json").write_text(
        json.dumps({"meta": meta, "rounds_to_target": a, "large_q": b, "all_step_sizes": ALL}, indent=1)
    )
    write_md(a, b, meta, OUT / "fedbcd_credit.md")
    print((OUT / "fedbcd_credit.md").read_text())


if __name__ == "__main__":
    main()
