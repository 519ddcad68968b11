"""HyFEM must-show accuracy benchmark (issue "Foundation and the main job").

Runs the example configs ``examples/configs/hyfem_mfeat.yaml`` and ``examples/configs/hyfem_mnist.yaml`` for
several seeds (the seed changes the partition draw, the train/test split of mfeat, the model
initialisation and the mini-batches) and checks, per run:

- server accuracy >= centralised accuracy - 2 points, and >= "centralised on the cells the clients
  hold" - 2 points (the fair bound, issue 16);
- mean client accuracy >= mean stand-alone accuracy + 15 points, for both client models: the one
  after the ``Q`` local steps (HyFEM Alg. 1 output, Sec. 4: the paper's) and the one a client
  receives from the server (the server cut to its blocks).

Every row names the matching options that produced it (``matching.cost``, ``matching.uncovered``).
Writes ``benchmarks/results/<name>.json`` and ``.md`` and, with ``--keep-runs``, for the first seed
of each dataset, the run's results files under ``benchmarks/results/hyfem-<dataset>/``.

    .venv/bin/python benchmarks/hyfem_accuracy.py --unconstrained --keep-runs   # mfeat 0-4 (+ unconstrained), mnist 0 1
    .venv/bin/python benchmarks/hyfem_accuracy.py --datasets mfeat --seeds 0
    .venv/bin/python benchmarks/hyfem_accuracy.py --datasets mnist --seeds 0 1 2 --lr-decay 0.2 10 \
        --name hyfem_accuracy_mnist_decay      # HyFEM-Avg with the workshop paper's step schedule
    .venv/bin/python benchmarks/hyfem_accuracy.py --datasets mfeat --only-unconstrained --uncovered previous \
        --name hyfem_uncovered_previous
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hybridfl.config import load_config, parse_config  # noqa: E402
from hybridfl.experiment import execute, prepare  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def run_one(
    dataset: str,
    seed: int,
    out: Path | None,
    min_cell_coverage: int | None = None,
    matching: dict | None = None,
    algorithm: dict | None = None,
) -> dict:
    """One run of the example config of ``dataset`` with ``seed`` (and overrides of
    ``partition.min_cell_coverage``, ``algorithm.matching`` and ``algorithm``): its row."""
    cfg = load_config(ROOT / "examples" / "configs" / f"hyfem_{dataset}.yaml").model_dump(mode="json")
    cfg["seed"] = seed
    if min_cell_coverage is not None:
        cfg["partition"]["min_cell_coverage"] = min_cell_coverage
    cfg["algorithm"]["matching"].update(matching or {})
    cfg["algorithm"].update(algorithm or {})
    prep = prepare(parse_config(cfg))
    t0 = time.perf_counter()
    s = execute(prep, out).summary
    row = {
        "dataset": dataset,
        "seed": seed,
        "variant": s["variant"],
        "mu1": prep.config.algorithm_config().mu1,
        "mu2": prep.config.algorithm_config().mu2,
        "lr": prep.config.algorithm_config().lr,
        "lr_decay": prep.config.algorithm_config().lr_decay,
        "lr_decay_every": prep.config.algorithm_config().lr_decay_every,
        "matching_cost": s["matching_cost"],
        "matching_sigma": prep.config.algorithm_config().matching.sigma,
        "matching_uncovered": s["matching_uncovered"],
        "min_cell_coverage": cfg["partition"]["min_cell_coverage"],
        "clients": [
            f"{c['blocks']} / {n} classes"
            for c, n in zip(prep.partition.summary(), [len(x["classes"]) for x in prep.partition.meta["clients"]])
        ],
        "unused_cells": prep.partition.coverage(prep.split.train).unused_share,
        "server_width": s["server_width"],
        "matching_uncovered_share": s.get("matching_uncovered_share"),
        "server_accuracy": s["server_accuracy"],
        "centralized_accuracy": s["centralized_accuracy"],
        "centralized_held_accuracy": s["centralized_held_accuracy"],
        "client_accuracy_local_mean": s["client_accuracy_local_mean"],
        "client_accuracy_mean": s["client_accuracy_mean"],
        "standalone_accuracy_mean": s["standalone_accuracy_mean"],
        "server_minus_centralized": s["server_accuracy"] - s["centralized_accuracy"],
        "server_minus_held": s["server_accuracy"] - s["centralized_held_accuracy"],
        "held_minus_centralized": s["centralized_held_accuracy"] - s["centralized_accuracy"],
        "client_local_minus_standalone": s["client_accuracy_local_mean"] - s["standalone_accuracy_mean"],
        "client_minus_standalone": s["client_accuracy_mean"] - s["standalone_accuracy_mean"],
        "bytes_total": s["bytes_total"],
        "seconds": time.perf_counter() - t0,
    }
    row["pass_server"] = row["server_minus_centralized"] >= -0.02
    row["pass_server_held"] = row["server_minus_held"] >= -0.02
    row["pass_client_local"] = row["client_local_minus_standalone"] >= 0.15
    row["pass_client"] = row["client_minus_standalone"] >= 0.15
    return row


def table(rows: list[dict]) -> list[str]:
    """The markdown table of ``rows`` (accuracies in %)."""
    pct = lambda v: f"{100 * v:.2f}"  # noqa: E731
    d = lambda v: f"{100 * v:+.2f}"  # noqa: E731
    yn = lambda b: "yes" if b else "NO"  # noqa: E731
    variant = lambda r: "avg" if r.get("variant", "avg") == "avg" else f"prox ({r['mu1']:g}, {r['mu2']:g})"  # noqa: E731

    def lr(r: dict) -> str:
        if r.get("lr") is None:
            return "example config's"
        decay = r.get("lr_decay", 1.0)
        return f"{r['lr']:g}" + (f" x{decay:g} every {r['lr_decay_every']}" if decay < 1 else " const")

    lines = [
        "| dataset | seed | variant | lr (per round) | matching (cost, sigma, uncovered) | every (class, block) held | unused cells | server | centralised "
        "| centralised, held cells | server - centralised | server - held cells | clients after Q local steps (mean) "
        "| clients, received model (mean) | stand-alone (mean) | after Q steps - stand-alone | received - stand-alone "
        "| server width | MB sent | s | server >= centralised - 2 | server >= held - 2 | clients (both) >= stand-alone + 15 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['seed']} | {variant(r)} | {lr(r)} | {r['matching_cost']}, {r['matching_sigma']:g}, {r['matching_uncovered']} "
            f"| {'yes' if r['min_cell_coverage'] else 'not required'} | {100 * r['unused_cells']:.1f} % "
            f"| {pct(r['server_accuracy'])} | {pct(r['centralized_accuracy'])} | {pct(r['centralized_held_accuracy'])} "
            f"| {d(r['server_minus_centralized'])} | {d(r['server_minus_held'])} "
            f"| {pct(r['client_accuracy_local_mean'])} | {pct(r['client_accuracy_mean'])} "
            f"| {pct(r['standalone_accuracy_mean'])} | {d(r['client_local_minus_standalone'])} "
            f"| {d(r['client_minus_standalone'])} | {r['server_width']} | {r['bytes_total'] / 1e6:.1f} | {r['seconds']:.0f} "
            f"| {yn(r['pass_server'])} | {yn(r['pass_server_held'])} | {yn(r['pass_client_local'] and r['pass_client'])} |"
        )
    return lines


def main() -> None:
    """Run the configured jobs and write ``<name>.json`` and ``<name>.md``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["mfeat", "mnist"])
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: mfeat 0-4, mnist 0 1")
    ap.add_argument(
        "--unconstrained",
        action="store_true",
        help="also run mfeat with min_cell_coverage 0 (cells may be held by nobody)",
    )
    ap.add_argument("--only-unconstrained", action="store_true", help="run mfeat with min_cell_coverage 0 only")
    ap.add_argument("--uncovered", choices=["zero", "previous"], default=None, help="override matching.uncovered")
    ap.add_argument("--cost", choices=["pfnm", "euclidean", "index"], default=None, help="override matching.cost")
    ap.add_argument("--sigma", type=float, default=None, help="override matching.sigma (PFNM client noise)")
    ap.add_argument("--prox", nargs=2, type=float, metavar=("MU1", "MU2"), help="run HyFEM-Prox with these weights")
    ap.add_argument(
        "--lr-decay",
        nargs=2,
        type=float,
        metavar=("FACTOR", "EVERY"),
        help="algorithm.lr_decay and lr_decay_every (the workshop paper's step schedule)",
    )
    ap.add_argument("--keep-runs", action="store_true", help="write the first seed's run files to results/hyfem-<ds>/")
    ap.add_argument("--name", default="hyfem_accuracy", help="result file stem")
    args = ap.parse_args()
    over = (("uncovered", args.uncovered), ("cost", args.cost), ("sigma", args.sigma))
    matching = {k: v for k, v in over if v is not None}
    rows = []
    jobs = []
    for ds in args.datasets:
        seeds = args.seeds if args.seeds is not None else ([0, 1, 2, 3, 4] if ds == "mfeat" else [0, 1])
        if not args.only_unconstrained:
            jobs += [(ds, seed, None, i == 0 and args.keep_runs) for i, seed in enumerate(seeds)]
        if (args.unconstrained or args.only_unconstrained) and ds == "mfeat":
            jobs += [(ds, seed, 0, False) for seed in seeds]
    for ds, seed, mcc, keep in jobs:
        out = RESULTS / f"hyfem-{ds}" if keep else None
        if out is not None and out.exists():
            shutil.rmtree(out)
        algo = {"variant": "prox", "mu1": args.prox[0], "mu2": args.prox[1]} if args.prox else {}
        if args.lr_decay:
            algo.update(lr_decay=args.lr_decay[0], lr_decay_every=int(args.lr_decay[1]))
        row = run_one(ds, seed, out, mcc, matching, algo)
        print(json.dumps({k: v for k, v in row.items() if k != "clients"}), flush=True)
        rows.append(row)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(rows, indent=2))
    lines = table(rows)
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
