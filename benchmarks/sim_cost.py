"""Simulation cost of HyFEM: wall time of a HyFEM run divided by the wall time of training the
same models on the same number of sample-gradient evaluations without federation.

HyFEM with M clients, T rounds, Q local steps and batch B evaluates M*T*Q*B sample gradients,
each on its client's model. The reference trains exactly those models (same architectures, same
data, same batch size) for T*Q steps each, one after another in one process, with nothing else:
no messages, no encoding, no aggregation, no matching. So

    ratio = (HyFEM simulate() wall time, evaluation off) / (sum of the clients' training times)

is what the simulation machinery (message encoding and counting, extractor averaging,
matching, model loading) costs on top of the unavoidable training. For context the script also
times the server-shaped model (all blocks) trained centrally on M*T*Q steps.

Both wall time and CPU time of this process (``time.process_time``, single-threaded) are
recorded; the ratio is taken on CPU time, which other processes on a shared machine disturb far
less than wall time. Best of ``--repeats``; MNIST uses 10 rounds (the ratio is per unit of work).

    nice -n 5 .venv/bin/python benchmarks/sim_cost.py      # mfeat and mnist configs
Writes benchmarks/results/sim_cost.json and .md. Targets (issue 17): ratio <= 1.25 sequential,
<= 1.0 with ``batched_clients: true`` (the clients of a round train as one batched model:
:mod:`hybridfl.algorithms.hyfem.batched`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import dataclasses  # noqa: E402

import torch  # noqa: E402

from hybridfl.algorithms.hyfem import SPEC  # noqa: E402
from hybridfl.algorithms.hyfem.baselines import make_model_factory  # noqa: E402
from hybridfl.algorithms.training import LocalTrainer  # noqa: E402
from hybridfl.config import load_config  # noqa: E402
from hybridfl.experiment import prepare  # noqa: E402
from hybridfl.models.hybrid import default_extractor  # noqa: E402
from hybridfl.runtime.simulation import build_federation, single_threaded  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def measure(dataset: str, rounds: int | None, repeats: int) -> dict:
    prep = prepare(load_config(ROOT / "examples" / "configs" / f"hyfem_{dataset}.yaml"))
    cfg = prep.algorithm.model_copy(update={"baselines": False, **({"rounds": rounds} if rounds else {})})
    split, part, seed = prep.split, prep.partition, prep.config.seed
    make = make_model_factory(split, cfg.extractor_dim, cfg.hidden, default_extractor(cfg.extractor))
    steps = cfg.rounds * cfg.local_steps
    fed, ref, cen, bat = [], [], [], []
    fed_w, ref_w, bat_w = [], [], []

    def run_federation(config, cpu_out: list, wall_out: list) -> None:
        f = build_federation(dataclasses.replace(SPEC, evaluate=None), split, part, config, seed)  # evaluation off
        t0, c0 = time.perf_counter(), time.process_time()
        f.setup()
        f.loop(monitor=False).run()
        cpu_out.append(time.process_time() - c0)
        wall_out.append(time.perf_counter() - t0)

    def federated() -> None:
        run_federation(cfg, fed, fed_w)

    def batched() -> None:  # the clients with the same blocks train as one batched model
        run_federation(cfg.model_copy(update={"batched_clients": True}), bat, bat_w)

    def same_models() -> None:
        cpu = wall = 0.0
        for i, c in enumerate(part.clients):
            data = split.train.subset(c.sample_ids, c.blocks)
            torch.manual_seed(seed + i)
            model = make(list(c.blocks))
            trainer = LocalTrainer(model, data, cfg.batch_size, cfg.lr, cfg.momentum, seed + i)
            t0, c0 = time.perf_counter(), time.process_time()
            for _r in range(cfg.rounds):  # same optimiser re-creation per round as HyFEM
                trainer.steps(cfg.local_steps)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - t0
        ref.append(cpu)
        ref_w.append(wall)

    with single_threaded():
        for k in range(repeats):  # alternate the order so that drifting load hits both sides
            for fn in (federated, batched, same_models) if k % 2 == 0 else (same_models, batched, federated):
                fn()
        model = make(split.train.block_names)
        trainer = LocalTrainer(model, split.train, cfg.batch_size, cfg.lr, cfg.momentum, seed)
        c0 = time.process_time()
        for _r in range(cfg.rounds * len(part.clients)):
            trainer.steps(cfg.local_steps)
        cen.append(time.process_time() - c0)
    best = min(fed), min(ref), min(cen)
    return {
        "dataset": dataset,
        "clients": len(part.clients),
        "rounds": cfg.rounds,
        "local_steps": cfg.local_steps,
        "batch_size": cfg.batch_size,
        "sample_gradients": len(part.clients) * steps * cfg.batch_size,
        "hyfem_seconds": best[0],
        "same_models_seconds": best[1],
        "server_model_central_seconds": best[2],
        "ratio": best[0] / best[1],
        "hyfem_batched_seconds": min(bat),
        "ratio_batched": min(bat) / best[1],
        "all_hyfem_batched_cpu_seconds": bat,
        "all_hyfem_batched_wall_seconds": bat_w,
        "ratio_vs_server_model": best[0] / best[2],
        "repeats": repeats,
        "clock": "process CPU time (single-threaded)",
        "all_hyfem_cpu_seconds": fed,
        "all_same_models_cpu_seconds": ref,
        "all_hyfem_wall_seconds": fed_w,
        "all_same_models_wall_seconds": ref_w,
        "wall_ratio_best": min(fed_w) / min(ref_w),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["mfeat", "mnist"])
    ap.add_argument("--repeats", type=int, default=4, help="best of N")
    ap.add_argument("--out", default=str(RESULTS / "sim_cost"), help="results path without .json/.md")
    args = ap.parse_args()
    rows = []
    for ds in args.datasets:
        row = measure(ds, 10 if ds == "mnist" else None, args.repeats if ds != "mnist" else 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| dataset | clients x rounds x Q x batch | HyFEM simulation (CPU s) | same models, no federation (CPU s) | ratio (CPU) | ratio (wall, best) "
        "| HyFEM, batched clients (CPU s) | ratio, batched (CPU) | server model, central, same steps (CPU s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['clients']} x {r['rounds']} x {r['local_steps']} x {r['batch_size']} | {r['hyfem_seconds']:.2f} | "
            f"{r['same_models_seconds']:.2f} | **{r['ratio']:.3f}** | {r['wall_ratio_best']:.3f} "
            f"| {r['hyfem_batched_seconds']:.2f} | **{r['ratio_batched']:.3f}** "
            f"| {r['server_model_central_seconds']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
