"""Cost of secure aggregation of HyFDCA's primal shares (issue 15 item 4, "the cost of each
mitigation, measured"): the same run with ``secure_aggregation`` off and on, side by side, in one
process: wall seconds per round, bytes per round (all messages, counted by our codec), the bytes of
the PrimalAggregation exchange alone, the extra unmasking exchanges, and the largest difference of
``w``. Same problems as ``hyfdca_bench.py`` (3 x 3 grid, hinge, lambda 1e-3).

    .venv/bin/python benchmarks/secagg_cost.py --dataset credit --rounds 10 --rates 0,0.2

Writes ``benchmarks/results/secagg_cost.json`` and ``secagg_cost.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import build_federation, single_threaded
from hyfdca_bench import OUT, dataset


def measure(split, part, cfg: HyFDCAConfig) -> dict:
    fed = build_federation("hyfdca", split, part, cfg)
    fed.setup()
    secs = []
    for rnd in range(1, cfg.rounds + 1):  # single-threaded, so CPU time is the round's compute time
        t0 = time.process_time()  # CPU time of this process: the machine's load does not enter
        fed.server.run_round(rnd, fed.transport)
        secs.append(time.process_time() - t0)
    log = fed.transport.log.entries
    rounds = [e for e in log if e.round >= 1]
    primal = sum(e.nbytes for e in rounds if e.kind == "hyfdca.primal")
    unmask = [e for e in rounds if e.kind == "hyfdca.unmask"]
    return {
        "round_cpu_seconds_median": statistics.median(secs),
        "bytes_per_round": sum(e.nbytes for e in rounds) / cfg.rounds,
        "primal_bytes_per_round": primal / cfg.rounds,
        "unmask_messages": len(unmask),
        "unmask_bytes": sum(e.nbytes for e in unmask),
        "failures": len(fed.transport.failures),
        "w": fed.server.w.copy(),
    }


def mask_seconds(dim: int, peers: int, reps: int = 200) -> float:
    """Median seconds of one client's masking (fixed point + pair masks with ``peers`` peers that
    all hold its ``dim`` coordinates): the client-side cost per PrimalAggregation exchange."""
    from hybridfl.privacy.secagg import SecAggClient, to_fixed

    others = {f"p{i}": SecAggClient(f"p{i}", ["x"], [dim]) for i in range(peers)}
    me = SecAggClient("me", ["x"], [dim])
    me.set_peers({c: (o.public_bytes(), ["x"]) for c, o in others.items()})
    x = np.random.default_rng(0).normal(size=dim)
    times = []
    for tag in range(reps):
        t0 = time.process_time()
        me.mask(to_fixed(x, "x"), tag, list(others))
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", default="credit", choices=["mnist", "credit", "adult"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rates", default="0,0.2", help="comma-separated failure rates")
    ap.add_argument("--dual-mode", default="block", choices=["block", "consensus", "segment"])
    args = ap.parse_args()
    split, pos, lam = dataset(args.dataset)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    out: dict = {
        "dataset": args.dataset,
        "grid": "3 x 3 = 9 clients",
        "dual_mode": args.dual_mode,
        "rounds": args.rounds,
        "encryption": "none (secure aggregation concerns the plaintext shares; its cost does not depend on the scheme)",
        "runs": {},
        "command": " ".join([".venv/bin/python", *sys.argv]),
    }
    rows = []
    with single_threaded():
        warm = HyFDCAConfig(
            fit_intercept=False,
            lam=lam,
            rounds=2,
            positive_classes=pos,
            eval_every=0,
            reference=False,
            encryption="none",
        )
        measure(split, part, warm)  # first-use costs (imports, caches) outside the comparison
        for rate in (float(r) for r in args.rates.split(",")):
            res = {}
            for secure in (False, True):
                cfg = HyFDCAConfig(
                    fit_intercept=False,
                    lam=lam,
                    rounds=args.rounds,
                    positive_classes=pos,
                    eval_every=0,
                    reference=False,
                    failure_rate=rate,
                    dual_mode=args.dual_mode,
                    secure_aggregation=secure,
                    batch_size=128,
                    encryption="none",
                    output="last",
                    segment_inner_products="encrypted",
                )
                res[secure] = measure(split, part, cfg)
            diff = float(np.abs(res[True].pop("w") - res[False].pop("w")).max())
            out["runs"][str(rate)] = {
                "plain_shares": res[False],
                "secure_aggregation": res[True],
                "w_max_abs_diff": diff,
            }
            p, s = res[False], res[True]
            rows.append(
                f"| {rate:g} | {p['round_cpu_seconds_median']:.3f} | {s['round_cpu_seconds_median']:.3f} | "
                f"{s['round_cpu_seconds_median'] / p['round_cpu_seconds_median']:.2f} | {p['bytes_per_round'] / 1e3:.1f} | "
                f"{s['bytes_per_round'] / 1e3:.1f} | {p['primal_bytes_per_round'] / 1e3:.1f} | "
                f"{s['primal_bytes_per_round'] / 1e3:.1f} | {s['unmask_messages']} | {diff:.1e} |"
            )
    micro = {f"d={d}, {k} peers": mask_seconds(d, k) for d, k in ((784, 8), (784, 99), (100_000, 8))}
    out["mask_seconds_median"] = micro
    out["benchmark_seconds"] = time.perf_counter() - t_start
    out["load_average"] = [load0, os.getloadavg()[0]]
    (OUT / "secagg_cost.json").write_text(json.dumps(out, indent=2))
    md = [
        f"HyFDCA, {args.dataset}, {out['grid']}, dual_mode {args.dual_mode}, {args.rounds} rounds, encryption none; "
        "secure aggregation of the primal shares off vs on, same seed and failures, one process; "
        f"load average (1 min) {out['load_average'][0]:.1f} at start, {out['load_average'][1]:.1f} at end, 2 cores.",
        "",
        "| failure rate | CPU s/round plain | CPU s/round secure | ratio | kB/round plain | kB/round secure | "
        "primal kB/round plain | primal kB/round secure | unmask messages | max abs diff of w |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Client-side masking per exchange (fixed point + ChaCha20 pair masks), median of 200: "
        + ", ".join(f"{k}: {v * 1e3:.3f} ms" for k, v in micro.items())
        + ". Round times above are CPU seconds of the whole simulated round (server and all 9 clients in "
        "sequence, one thread), so the machine's load does not enter them.",
        "",
        f"Command: `{out['command']}`",
    ]
    (OUT / "secagg_cost.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
