"""FedBCD paper Table 1, MNIST-CNN column, re-run (issue 16): rounds to test AUC 99.5 / 99.6 /
99.7 % for FedSGD and FedBCD-p / FedBCD-s with Q in {1, 3, 5, 10}, over seeds, on the full
3-vs-8 test set (1,984 samples), side by side with the paper's counts.

Setup (paper Sec. 8 "MNIST" and Table 1; SPEC.md): MNIST digits 3 vs 8 split into left/right
28x14 halves (left: label party), CNN towers (two 2x2 convolutions, 64 channels, 256-unit
representation), batch 256, eta_t = eta_0 / sqrt(t + 1). Each run goes through the same code path
as ``hybridfl run --config examples/configs/fedbcd_mnist.yaml`` (``load_config`` ->
``parse_config`` -> ``prepare`` -> ``execute``) with the algorithm section overridden.

    # one job = every (method, seed) given, one after the other; one JSON per run
    .venv/bin/python benchmarks/fedbcd_table1.py run sgd:1 p:5 --seeds 0 1 2 --lr 0.1
    .venv/bin/python benchmarks/fedbcd_table1.py run p:3 p:5 p:10 s:3 s:5 s:10 --seeds 0 1 2 --lr 0.1  # full grid
    .venv/bin/python benchmarks/fedbcd_table1.py run p:5 --local-gradient taylor --seeds 0 1 2
    .venv/bin/python benchmarks/fedbcd_table1.py run p:5 --top concat --seeds 0      # the wide top, for bytes
    .venv/bin/python benchmarks/fedbcd_table1.py report
    .venv/bin/python benchmarks/fedbcd_table1.py bytes     # bytes per round, both layouts

``bytes`` measures the bytes of a steady-state round (the transport's count of every message of
round 3; evaluation excluded) for every variant, top layout and local gradient, and writes
benchmarks/results/fedbcd_bytes.{json,md}. The messages carry only ``H_k`` / ``dL/dH_k``
``(B, r_k)``, batch positions and step settings, so their size does not depend on the towers'
channels: those runs use 8-channel towers (256-unit representation as in Table 1) to be cheap.

Evaluation: the AUC on all 1,984 test samples every ``--eval-every`` rounds and every round once
it reached ``--dense-from`` (so crossings of the targets above it are exact to the round; a
crossing below it is known to ``--eval-every`` rounds). A run stops at the highest target or
after ``--rounds``. Costs are CPU seconds of the process (``time.process_time``), which do not
depend on the machine's load.

``run`` writes benchmarks/results/fedbcd_table1_runs/<variant>_q<Q>_<top>_<grad>_lr<eta0>_seed<s>.json;
``report`` assembles benchmarks/results/fedbcd_table1.{json,md} from every run file there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hybridfl.config import load_config, parse_config  # noqa: E402
from hybridfl.experiment import execute, prepare  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
RUNS = OUT / "fedbcd_table1_runs"
CONFIG = ROOT / "examples" / "configs" / "fedbcd_mnist.yaml"
NAMES = {"sgd": "FedSGD", "p": "FedBCD-p", "s": "FedBCD-s", "prox": "FedPBCD-p"}
TARGETS = (0.995, 0.996, 0.997)
PAPER = {("sgd", 1): 46, ("p", 3): 16, ("p", 5): 8, ("s", 1): 48, ("s", 3): 15, ("s", 5): 9}
"""Paper Table 1, MNIST-CNN, rounds to AUC 99.7 % (FedBCD-p Q = 1 is FedSGD)."""


def crossing(curve: list, target: float) -> int | None:
    """First evaluated round with AUC >= target."""
    return next((rnd for rnd, auc in curve if auc is not None and auc >= target), None)


def run_one(variant: str, q: int, seed: int, args) -> dict:
    """One run through the CLI's code path; returns the run record written to RUNS."""
    data = load_config(CONFIG).model_dump(mode="json")
    data["seed"] = seed
    data["dataset"]["data_dir"] = str(ROOT.parent / "shared" / "data" / "mnist")
    data["algorithm"].update(
        variant=variant,
        local_steps=q,
        rounds=args.rounds,
        batch_size=256,
        lr=args.lr,
        model="cnn",
        representation_dim=256,
        channels=64,
        top=args.top,
        local_gradient=args.local_gradient,
        target_auc=max(TARGETS),
        stop_at_target=True,
        eval_every=args.eval_every,
        eval_subset=None,
        eval_dense_from=args.dense_from,
    )
    prep = prepare(parse_config(data))

    def progress(done, total, row):
        if "auc" in row:
            print(f"  {variant}:{q} seed {seed} round {done}: auc {row['auc']:.5f} loss {row.get('train_loss', 0):.4f}")
            sys.stdout.flush()

    c0, w0 = time.process_time(), time.perf_counter()
    res = execute(prep, None, progress)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    s = res.summary
    curve = [[int(r["round"]), r["auc"]] for r in res.history if "auc" in r]
    train_rows = [r for r in res.history if "bytes" in r]
    # bytes of a steady-state round (round 1 also fetches the first batch's H_k)
    steady = [r["bytes"] for r in train_rows if int(r["round"]) > 1]
    return {
        "method": NAMES[variant],
        "variant": variant,
        "Q": q,
        "lr": args.lr,
        "top": args.top,
        "local_gradient": args.local_gradient,
        "seed": seed,
        "rounds_run": s["rounds"],
        "rounds_to": {f"{100 * t:g}": crossing(curve, t) for t in TARGETS},
        "final_auc": s["auc"],
        "best_auc": s["best_auc"],
        "diverged": s["diverged"],
        "eval_samples": s["eval_samples"],
        "eval_every": args.eval_every,
        "dense_from": args.dense_from,
        "bytes_per_round": statistics.median(steady) if steady else None,
        "bytes_train_total": sum(r["bytes"] for r in train_rows),
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "paper_rounds_99.7": PAPER.get((variant, q)),
        "curve": curve,
    }


def run(args) -> None:
    runs = Path(args.runs_dir) if args.runs_dir else RUNS
    runs.mkdir(parents=True, exist_ok=True)
    for spec in args.methods:
        variant, q = spec.split(":")
        for seed in args.seeds:
            out = run_one(variant, int(q), seed, args)
            name = f"{variant}_q{q}_{args.top}_{args.local_gradient}_lr{args.lr:g}_seed{seed}.json"
            (runs / name).write_text(json.dumps(out, indent=1))
            print(
                f"{spec} {args.top} {args.local_gradient} lr={args.lr:g} seed={seed}: rounds to "
                f"{out['rounds_to']} in {out['rounds_run']} rounds, {out['cpu_seconds']:.0f} CPU s",
                flush=True,
            )


def measure_bytes(args) -> None:
    """Bytes per round of every variant x top layout x local gradient (see the module docs)."""
    data = load_config(CONFIG).model_dump(mode="json")
    data["dataset"]["data_dir"] = str(ROOT.parent / "shared" / "data" / "mnist")
    rows = []
    for variant, q in (("sgd", 1), ("p", 5), ("s", 5)):
        for top, grad in (("concat", "fixed"), ("party_slice", "fixed"), ("party_slice", "taylor")):
            d = json.loads(json.dumps(data))
            d["algorithm"].update(
                variant=variant,
                local_steps=q,
                rounds=3,
                batch_size=256,
                lr=0.05,
                model="cnn",
                representation_dim=256,
                channels=8,
                top=top,
                local_gradient=grad,
                target_auc=None,
                stop_at_target=False,
                eval_every=1000,
                eval_subset=10,
                eval_dense_from=None,
            )
            res = execute(prepare(parse_config(d)), None)
            r3 = res.history[2]
            rows.append(
                {
                    "method": NAMES[variant],
                    "Q": q,
                    "top": top,
                    "local_gradient": grad,
                    "bytes_per_round": r3["bytes"],
                    "messages_per_round": r3["messages"],
                }
            )
            print(rows[-1], flush=True)
    lines = [
        "### Bytes per communication round, MNIST 3 vs 8, two parties, batch 256, 256-unit towers",
        "",
        "Every message of round 3 as counted by the transport (evaluation excluded); "
        "`concat` = before (256-wide H_k to a linear top at the label party), `party_slice` = after "
        "(one value per sample per party, paper eq. 2 / Fig. 1a).",
        "",
        "| method | Q | top | local gradient | messages / round | bytes / round | vs concat |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = next(b for b in rows if b["method"] == r["method"] and b["top"] == "concat")
        lines.append(
            f"| {r['method']} | {r['Q']} | {r['top']} | {r['local_gradient']} | {r['messages_per_round']} | "
            f"{r['bytes_per_round']:,} | {r['bytes_per_round'] / base['bytes_per_round']:.4f} |"
        )
    (OUT / "fedbcd_bytes.md").write_text("\n".join(lines) + "\n")
    (OUT / "fedbcd_bytes.json").write_text(json.dumps(rows, indent=1))
    print((OUT / "fedbcd_bytes.md").read_text())


def ingest(args) -> None:
    """A run stopped before its end (e.g. at a deadline) as a run record from its log: the
    evaluated rounds the run printed (``  <variant>:<Q> seed <s> round <r>: auc <a> loss <l>``)
    and, if given, the CPU seconds the process had used (``--cpu-seconds``, read from
    ``/proc/<pid>/stat`` before stopping it). Marked ``stopped_early``; the settings must be
    given as they were run."""
    import re

    pat = re.compile(r"^\s+(\w+):(\d+) seed (\d+) round (\d+): auc ([0-9.naN]+)")
    curve, key = [], None
    for line in Path(args.log).read_text().splitlines():
        m = pat.match(line)
        if m:
            key = (m.group(1), int(m.group(2)), int(m.group(3)))
            curve.append([int(m.group(4)), float(m.group(5))])
    if key is None:
        raise SystemExit(f"no evaluated round in {args.log}")
    variant, q, seed = key
    out = {
        "method": NAMES[variant],
        "variant": variant,
        "Q": q,
        "lr": args.lr,
        "top": args.top,
        "local_gradient": args.local_gradient,
        "seed": seed,
        "rounds_run": curve[-1][0],
        "rounds_to": {f"{100 * t:g}": crossing(curve, t) for t in TARGETS},
        "final_auc": curve[-1][1],
        "best_auc": max(a for _, a in curve),
        "diverged": False,
        "eval_samples": 1984,
        "eval_every": args.eval_every,
        "dense_from": args.dense_from,
        "bytes_per_round": None,
        "bytes_train_total": None,
        "cpu_seconds": args.cpu_seconds,
        "wall_seconds": None,
        "paper_rounds_99.7": PAPER.get((variant, q)),
        "curve": curve,
        "stopped_early": f"stopped by hand after round {curve[-1][0]} (log {Path(args.log).name})"
        + (f": {args.note}" if args.note else ""),
    }
    RUNS.mkdir(parents=True, exist_ok=True)
    name = f"{variant}_q{q}_{args.top}_{args.local_gradient}_lr{args.lr:g}_seed{seed}.json"
    (RUNS / name).write_text(json.dumps(out, indent=1))
    print(name, out["rounds_to"], out["stopped_early"])


def _fmt_rounds(vals: list, runs: list) -> str:
    """Per-seed rounds, '>N' for a run that stopped at N rounds without reaching the target."""
    return ", ".join(str(v) if v is not None else f">{r['rounds_run']}" for v, r in zip(vals, runs))


def report(args) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(RUNS.glob("*.json"))]
    if not runs:
        raise SystemExit("no runs yet")
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["variant"], r["Q"], r["top"], r["local_gradient"], r["lr"]), []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: r["seed"])
    order = {"sgd": 0, "p": 1, "s": 2, "prox": 3}
    keys = sorted(groups, key=lambda k: (k[2] != "party_slice", k[3] != "fixed", order[k[0]], k[1], k[4]))
    sgd: dict = {}
    for k in keys:  # the FedSGD runs of each top layout (the first eta_0 if several)
        if k[0] == "sgd" and k[3] == "fixed":
            sgd.setdefault(k[2], groups[k])
    lines = [
        "### MNIST 3 vs 8, CNN towers: rounds to test AUC (paper Table 1, MNIST-CNN)",
        "",
        "Full 3-vs-8 test set (1,984 samples); batch 256; eta_t = eta_0/sqrt(t+1); per-seed round counts "
        "('>N': stopped after N rounds without reaching it). `top`: party_slice = one value per sample "
        "per party (paper eq. 2, Fig. 1a), concat = 256-wide H_k to a linear top at the label party. "
        "`grad`: fixed = the received dL/dH_k for all Q local steps (paper Alg. 2), taylor = refreshed with "
        "the fresh H_k (reference code). Evaluated every `eval` rounds and every round once the AUC reached "
        "`dense` (crossings above it exact to the round).",
        "",
        "| method | Q | top | grad | eta_0 | seeds | rounds to 99.5 % | rounds to 99.6 % | rounds to 99.7 % "
        "| paper 99.7 % | ratio to FedSGD's rounds (per seed, same seeds) | bytes / round | CPU s / run (mean) | eval / dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in keys:
        g = groups[k]
        variant, q, top, grad, lr = k
        cols = [[r["rounds_to"][f"{100 * t:g}"] for r in g] for t in TARGETS]
        ratio = "-"
        ref = sgd.get(top) or next(iter(sgd.values()), None)
        if ref is not None and variant != "sgd":
            by_seed = {r["seed"]: r for r in ref}
            per_t = []
            for t in TARGETS:
                key, parts = f"{100 * t:g}", []
                for r in g:
                    s, mine = by_seed.get(r["seed"]), r["rounds_to"][f"{100 * t:g}"]
                    if s is None:
                        parts.append("-")
                    elif s["rounds_to"][key] is not None and mine is not None:
                        parts.append(f"{mine / s['rounds_to'][key]:.2f}")
                    elif mine is not None:  # FedSGD had not reached it in rounds_run rounds
                        parts.append(f"<{mine / s['rounds_run']:.2f}")
                    else:
                        parts.append("?")
                per_t.append(f"{key}: " + ", ".join(parts))
            ratio = "; ".join(per_t)
        bprs = [r["bytes_per_round"] for r in g if r["bytes_per_round"] is not None]
        bpr = f"{statistics.median(bprs) / 1e3:.1f} kB" if bprs else "-"
        cpus = [r["cpu_seconds"] for r in g if r["cpu_seconds"] is not None]
        cpu = f"{statistics.mean(cpus):.0f}" if cpus else "-"
        lines.append(
            f"| {NAMES[variant]} | {q} | {top} | {grad} | {lr:g} | {', '.join(str(r['seed']) for r in g)} | "
            + " | ".join(_fmt_rounds(c, g) for c in cols)
            + f" | {PAPER.get((variant, q)) or '-'} | {ratio} | {bpr} | {cpu} | "
            f"{g[0]['eval_every']} / {g[0]['dense_from']} |"
        )
    early = [r for r in runs if r.get("stopped_early")]
    if early:
        lines += [
            "",
            "Runs stopped before their end (recorded from their logs; '>N' = not reached in the N rounds run):",
            "",
        ]
        lines += [f"- {r['method']} Q={r['Q']} seed {r['seed']}: {r['stopped_early']}." for r in early]
    (OUT / "fedbcd_table1.md").write_text("\n".join(lines) + "\n")
    (OUT / "fedbcd_table1.json").write_text(
        json.dumps({"paper_99.7": {f"{v}:{q}": n for (v, q), n in PAPER.items()}, "runs": runs}, indent=1)
    )
    print((OUT / "fedbcd_table1.md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("methods", nargs="+", help="variant:Q, e.g. sgd:1 p:5 s:3")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--lr", type=float, default=0.1, help="eta_0")
    r.add_argument("--rounds", type=int, default=400, help="round cap")
    r.add_argument("--top", choices=["party_slice", "concat"], default="party_slice")
    r.add_argument("--local-gradient", choices=["fixed", "taylor"], default="fixed")
    r.add_argument("--eval-every", type=int, default=5)
    r.add_argument("--dense-from", type=float, default=0.995)
    r.add_argument("--runs-dir", default=None, help="write the run files here instead (probes)")
    sub.add_parser("report")
    sub.add_parser("bytes")
    g = sub.add_parser("ingest", help="record a run stopped early from its log")
    g.add_argument("log")
    g.add_argument("--lr", type=float, required=True)
    g.add_argument("--top", choices=["party_slice", "concat"], default="party_slice")
    g.add_argument("--local-gradient", choices=["fixed", "taylor"], default="fixed")
    g.add_argument("--eval-every", type=int, required=True)
    g.add_argument("--dense-from", type=float, required=True)
    g.add_argument("--cpu-seconds", type=float, default=None)
    g.add_argument("--note", default="", help="why it was stopped")
    args = ap.parse_args()
    {"run": run, "report": report, "bytes": measure_bytes, "ingest": ingest}[args.cmd](args)


if __name__ == "__main__":
    main()
