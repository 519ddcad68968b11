"""How many SDCA epochs the visit order of HyFDCA's segment mode costs (issue 17).

HyFDCA ``dual_mode: segment``, ``segment_schedule: sequential`` makes exactly the steps of
centralised SDCA (SDCA-Perm, Shalev-Shwartz & Zhang 2013), but in a restricted order: the segments
one after another (each pass ends in PrimalAggregation), and inside a segment the mini-batches
fixed at setup (their Gram matrices are summed once), visited in a random order, each in a fresh
random order. This script runs centralised SDCA (the compiled kernels HyFDCA uses) on MNIST binary
(the problem of ``hyfdca_speed.py``: 60,000 x 784, hinge, lambda 1e-3) under four visit orders and
reports the first epoch whose primal suboptimality, relative to liblinear's optimum (tol 1e-6), is
at most ``--target``, and the best value reached, for several seeds; and the first epoch whose step
average (the mean of the epoch's iterates, HyFDCA's ``step_average``) is within the target:

- ``permutation``: a fresh random permutation of all samples per epoch (SDCA-Perm);
- ``segments``: the 3 segments of the 3 x 3 grid one after another (random order), each in a fresh
  random permutation (no fixed batches);
- ``fixed batches``: the fixed mini-batches of all segments interleaved in a random order, each in
  a fresh random order (segments not one after another);
- ``segment mode``: both, HyFDCA's order;
- orders segment mode does not have (what a change of the protocol would buy): fixed
  *super-batches* of 8 (or 2) batches whose Gram covers every pair in them (8 or 2 times the
  setup's Gram work and memory), re-split at random into batches every epoch, with the segments
  one after another, or with each segment's batches cut into 8 runs interleaved with the other
  segments' (a PrimalAggregation between runs).

Run (about 3 minutes)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sdca_orders.py --epochs 45 --seeds 1 2 3 --batch-sizes 128 512

Writes ``benchmarks/results/sdca_orders.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import hyfdca_speed as hs
from hybridfl.algorithms.convex.losses import RowData, primal, row_norms_sq
from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.convex.reference import liblinear_solve
from hybridfl.data import load_mnist
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded


def orders(n: int, groups: list[np.ndarray], b: int) -> dict:
    """Visit-order makers ``rng -> (n,)`` permutation, by name (module docstring)."""
    batches = [[g[m : m + b] for m in range(0, g.size, b)] for g in groups]
    flat = [x for bs in batches for x in bs]

    def permutation(r):
        return r.permutation(n)

    def segments(r):
        return np.concatenate([groups[s][r.permutation(groups[s].size)] for s in r.permutation(len(groups))])

    def fixed(r):
        return np.concatenate([flat[m][r.permutation(flat[m].size)] for m in r.permutation(len(flat))])

    def segment_mode(r):
        out = []
        for s in r.permutation(len(groups)):
            for m in r.permutation(len(batches[s])):
                out.append(batches[s][m][r.permutation(batches[s][m].size)])
        return np.concatenate(out)

    def resplit(m: int, chunks: int):
        """Fixed super-batches of ``m`` batches, re-split at random into batches every epoch (the
        Gram of a super-batch covers every pair in it); each segment's batches in a random order,
        cut into ``chunks`` runs, and the runs of all segments interleaved at random (``chunks``
        1: the segments one after another)."""
        sup = [[g[i : i + m * b] for i in range(0, g.size, m * b)] for g in groups]

        def make(r):
            runs = []
            for s in range(len(groups)):
                subs = []
                for S in sup[s]:
                    p = S[r.permutation(S.size)]
                    subs += [p[i : i + b] for i in range(0, p.size, b)]
                runs += [[subs[k] for k in part] for part in np.array_split(r.permutation(len(subs)), chunks)]
            if chunks == 1:
                runs = [runs[s] for s in r.permutation(len(groups))]
            else:
                runs = [runs[k] for k in r.permutation(len(runs))]
            return np.concatenate([x[r.permutation(x.size)] for run in runs for x in run])

        return make

    return {
        "permutation": permutation,
        "segments": segments,
        "fixed batches": fixed,
        "segment mode": segment_mode,
        "super-batches of 8 batches re-split every epoch, segments one after another": resplit(8, 1),
        "super-batches of 8 batches re-split every epoch, segments interleaved in 8 runs each": resplit(8, 8),
        "super-batches of 2 batches re-split every epoch, segments interleaved in 8 runs each": resplit(2, 8),
    }


def run(rows: RowData, X, y, lam: float, p_star: float, make, epochs: int, seed: int, target: float) -> dict:
    """SDCA with ``make(rng)`` as each epoch's order: the relative suboptimality after each epoch
    of the last iterate, and of the epoch's step average (the mean of the iterates after each of
    its steps, HyFDCA's ``step_average``: ``w_0 + X^T (delta (T - p) / T) / (lambda n)`` with ``p``
    a step's place in the epoch; every order here visits each sample once per epoch)."""
    n, d = rows.shape
    q = row_norms_sq(rows.X)
    rng = np.random.default_rng(seed)
    alpha, w, traj, avg = np.zeros(n), np.zeros(d), [], []
    for _ in range(epochs):
        order = make(rng)
        u0 = np.asarray(rows.X @ w).ravel()
        dw = np.zeros(d)
        delta = rows.dot_and_add(order, alpha, y, u0, q, "hinge", lam * n, 1.0, 1.0, dw)
        weight = np.zeros(n)
        weight[order] = (order.size - np.arange(order.size)) / order.size
        w_avg = w + np.asarray(X.T @ (delta * weight)).ravel() / (lam * n)
        w = w + dw
        traj.append((primal(X, y, w, lam, "hinge") - p_star) / p_star)
        avg.append((primal(X, y, w_avg, lam, "hinge") - p_star) / p_star)
    first = next((i + 1 for i, v in enumerate(traj) if v <= target), None)
    first_avg = next((i + 1 for i, v in enumerate(avg) if v <= target), None)
    return {
        "first_epoch": first,
        "best": float(min(traj)),
        "last": float(traj[-1]),
        "trajectory": traj,
        "first_epoch_step_average": first_avg,
        "step_average_trajectory": avg,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=45)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--target", type=float, default=1e-3)
    a = ap.parse_args()
    t0 = time.perf_counter()
    with single_threaded():
        split = load_mnist(hs.DATA / "mnist", layout="tiles", tiles=7, flatten=True)
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
        prob = build_problem(split, part, "hinge", hs.LAM, hs.POSITIVE)
        X, y = prob.X, prob.y
        rows = RowData(X)
        p_star = primal(X, y, liblinear_solve(X, y, hs.LAM, "hinge", tol=1e-6, max_iter=100000), hs.LAM, "hinge")
        # the grid's 3 sample groups as rows of X (segment mode's segments; clients s0-f*, s1-f*, s2-f*)
        groups = [np.array([prob.row[i] for i in part.clients[3 * s].sample_ids]) for s in range(3)]
        results: dict = {}
        for b in a.batch_sizes:
            makers = orders(X.shape[0], groups, b)
            for name, make in makers.items():
                if name in ("permutation", "segments") and b != a.batch_sizes[0]:
                    continue  # no batches: the same at every batch size
                key = name if name in ("permutation", "segments") else f"{name}, batch {b}"
                results[key] = [run(rows, X, y, hs.LAM, p_star, make, a.epochs, s, a.target) for s in a.seeds]
                print(
                    key,
                    [(r["first_epoch"], f"{r['best']:.1e}", r["first_epoch_step_average"]) for r in results[key]],
                    flush=True,
                )
    out = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sdca_orders.py "
        f"--epochs {a.epochs} --seeds {' '.join(map(str, a.seeds))} --batch-sizes {' '.join(map(str, a.batch_sizes))}",
        "target": a.target,
        "reference_primal": p_star,
        "load_average": list(os.getloadavg()),
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    hs.OUT.mkdir(parents=True, exist_ok=True)
    (hs.OUT / "sdca_orders.json").write_text(json.dumps(out, indent=1))
    lines = [
        "# Centralised SDCA under HyFDCA segment mode's visit orders (issue 17)",
        "",
        f"MNIST binary (60,000 x 784, hinge, lambda 1e-3), the 3 x 3 grid's segments. Command: `{out['command']}` "
        f"({out['seconds']:.0f} s). First epoch with relative suboptimality <= {a.target:g} (liblinear tol 1e-6 "
        f"optimum {p_star:.6f}), and the best value in {a.epochs} epochs, per seed; `-`: not reached. Last "
        "column: the first epoch whose *step average* (the mean of the iterates after each of the epoch's "
        "steps; HyFDCA's `step_average: true`) is within the target, the same steps.",
        "",
        "| visit order | first epoch <= target, per seed | best relative suboptimality, per seed "
        "| step average: first epoch <= target, per seed |",
        "|---|---|---|---|",
    ]
    for key, rs in results.items():
        lines.append(
            f"| {key} | {', '.join(str(r['first_epoch'] or '-') for r in rs)} | "
            + ", ".join(format(r["best"], ".1e") for r in rs)
            + f" | {', '.join(str(r['first_epoch_step_average'] or '-') for r in rs)} |"
        )
    lines.append("")
    (hs.OUT / "sdca_orders.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
