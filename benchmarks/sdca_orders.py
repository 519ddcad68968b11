"""Why HyFDCA segment mode needs about 10 rounds on MNIST binary (issue 30): exact centralised SDCA
in the visit orders segment mode can make, each epoch's output the mean of the iterates of that
epoch and the ``--window - 1`` before it (the ``output: step_average`` of a round, over
:data:`~hybridfl.algorithms.hyfdca.output.STEP_WINDOW` rounds), to relative suboptimality 1e-3.

The problem of ``benchmarks/hyfdca_speed.py``: MNIST binary (60,000 x 784, 0-4 vs 5-9), hinge,
``lambda = 1e-3``, no intercept; ``P*`` from :func:`~hybridfl.algorithms.convex.reference.reference_optimum`.
One epoch is one exact SDCA pass (:meth:`~hybridfl.algorithms.convex.losses.RowData.dot_and_add`,
``sigma = cross = 1``: every step sees the exact ``w``) over all samples in an order drawn by:

* ``random``: a fresh permutation of all samples each epoch (SDCA with random reshuffling);
* ``fresh``: three random sample groups (the 3 x 3 grid's segments), one after another in a random
  order; each cut each epoch into fresh random batches of ``b``, visited in a random order, each in
  a random order inside (segment mode's ``sequential`` schedule, were the batches cut anew);
* ``fixed``: the same, the batches cut once and kept (segment mode as it is: a batch's Gram matrix
  is summed once, at setup);
* ``alt2``: two such cuts, used in alternate epochs (twice the Gram matrices of one cut);
* ``stored``: ``fixed``, each batch visited in the order it was cut in, the same every epoch (what
  would let a holder read its Gram rows one after another instead of at random);
* ``split4``: ``fixed``, each batch split every epoch into 4 random parts, the parts of a segment
  visited in a random order (4 times the exchanges of a round; each part's Gram is a block of its
  batch's).

The mean iterate of the last ``R`` epochs (``--window``), which changed ``alpha`` by ``delta``
(step ``i`` at place ``p_i`` of the ``T = R N`` steps, 0-based): ``w_0 + sum_i delta_i x_i (T - p_i)
/ (T lambda N)`` (:mod:`hybridfl.algorithms.hyfdca.output`); the first epochs average over as many
epochs as there were.
Reported per order: the first epoch at or below 1e-3 for each seed and their median, and the mean
curve. Single-threaded, about a minute per order and five seeds::

    OMP_NUM_THREADS=1 python -m benchmarks.sdca_orders [--seeds 5] [--epochs 12] [--window 2] [--orders random,fresh:512,...]

Writes ``benchmarks/results/sdca_orders.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import dispatch
from hybridfl.algorithms.convex.losses import RowData, primal, row_norms_sq
from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.convex.reference import reference_optimum
from hybridfl.algorithms.hyfdca.output import STEP_WINDOW
from hybridfl.data import load_mnist
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results"
LAM, TARGET, POSITIVE = 1e-3, 1e-3, [5, 6, 7, 8, 9]
ORDERS = ["random", "fresh:512", "fixed:512", "alt2:512", "fixed:256", "alt2:256", "stored:512", "split4:512"]


def cut(groups: list[np.ndarray], b: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Each group's samples cut into random batches of ``b`` (the last one shorter)."""
    out = []
    for g in groups:
        p = g[rng.permutation(g.size)]
        out.append([p[m : m + b] for m in range(0, p.size, b)])
    return out


def epoch_order(kind: str, b: int, cuts: list, groups: list[np.ndarray], epoch: int, rng) -> np.ndarray:
    """The visit order ``(N,)`` of one epoch (module docstring)."""
    if kind == "random":
        return rng.permutation(sum(g.size for g in groups))
    batches = cut(groups, b, rng) if kind == "fresh" else cuts[epoch % len(cuts)]
    parts = []
    for s in rng.permutation(len(groups)):
        if kind == "split4":
            pieces = [p for bt in batches[s] for p in np.array_split(bt[rng.permutation(bt.size)], 4)]
            parts += [pieces[m] for m in rng.permutation(len(pieces))]
            continue
        for m in rng.permutation(len(batches[s])):
            bt = batches[s][m]
            parts.append(bt if kind == "stored" else bt[rng.permutation(bt.size)])
    return np.concatenate(parts)


def run_order(prob, p_star: float, spec: str, seed: int, epochs: int, window: int = 2) -> list[float]:
    """Relative suboptimality after each epoch of the mean iterate of the last ``window`` epochs,
    for the order ``spec`` (``kind[:b]``)."""
    kind, _, size = spec.partition(":")
    b = int(size or 0)
    X, y = prob.X, np.asarray(prob.y, dtype=np.float64)
    n = X.shape[0]
    lam_n = LAM * n
    rows, q = RowData(X), row_norms_sq(X)
    setup = np.random.default_rng([seed, 1])
    groups = np.array_split(setup.permutation(n), 3)
    cuts = [cut(groups, b, setup) for _ in range(2 if kind == "alt2" else 1)] if kind != "random" else []
    rng = np.random.default_rng([seed, 2])
    alpha, w, out = np.zeros(n), np.zeros(X.shape[1]), []
    # per epoch of the window: w at its start, X^T delta and X^T (place * delta), each made once
    recent: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for ep in range(epochs):
        order = epoch_order(kind, b, cuts, groups, ep, rng)
        u0 = np.asarray(X @ w).ravel()
        dw = np.zeros(X.shape[1])
        delta = rows.dot_and_add(order, alpha, y, u0, q, "hinge", lam_n, 1.0, 1.0, dw)
        place = np.empty(n)
        place[order] = np.arange(n)
        xd, xpd = (np.asarray(X.T @ v).ravel() for v in (delta, place * delta))
        recent = [*recent, (w, xd, xpd)][-window:]
        T = n * len(recent)
        # step i of window epoch k weighs (T - k n - p_i) / T: the iterates from it to the window's end
        mean_w = recent[0][0] + sum((T - k * n) * a - c for k, (_, a, c) in enumerate(recent)) / (T * lam_n)
        w = w + dw
        out.append((float(primal(X, y, mean_w, LAM, "hinge")) - p_star) / abs(p_star))
    return out


def run_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--window", type=int, default=STEP_WINDOW, help="epochs averaged (output.STEP_WINDOW)")
    a = ap.parse_args()
    with single_threaded():
        split = harness.shrink(load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True))
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
        prob = build_problem(split, part, "hinge", LAM, POSITIVE)
        p_star = reference_optimum(prob.X, np.asarray(prob.y, dtype=np.float64), LAM, "hinge").objective
        rows = []
        for spec in a.orders.split(","):
            curves = [run_order(prob, p_star, spec, s, a.epochs, a.window) for s in range(a.seeds)]
            hits = [next((i + 1 for i, v in enumerate(c) if v <= TARGET), None) for c in curves]
            reached = [h for h in hits if h is not None]
            rows.append(
                {
                    "order": spec,
                    "epochs_to_1e-3": hits,
                    "median": float(np.median(reached)) if len(reached) == len(hits) else None,
                    "mean_curve": [float(v) for v in np.mean(curves, axis=0)],
                    "load": harness.load(),
                }
            )
            print(rows[-1]["order"], hits, flush=True)
    harness.write_report(
        "sdca_orders",
        rows,
        title="Exact centralised SDCA on MNIST binary in segment mode's visit orders: epochs to 1e-3",
        command="OMP_NUM_THREADS=1 python -m benchmarks.sdca_orders"
        + (
            ""
            if (a.seeds, a.epochs, a.orders, a.window) == (5, 12, ",".join(ORDERS), STEP_WINDOW)
            else f" --seeds {a.seeds} --epochs {a.epochs} --window {a.window} --orders {a.orders}"
        ),
        columns=["order", "epochs_to_1e-3", "median", "load"],
        notes=[
            f"Each epoch's output is the mean of the iterates of the last {a.window} epochs (HyFDCA's step_average over output.STEP_WINDOW rounds); relative suboptimality against the reference optimum.",
            "random: a fresh permutation of all samples; fresh: segment mode's order with the batches cut anew each epoch; fixed: cut once (segment mode as it is); alt2: two cuts in alternate epochs; stored: fixed, each batch in the order it was cut in every epoch; split4: fixed, each batch split into 4 random parts every epoch, a segment's parts in a random order (4x the exchanges).",
            "median: None when a seed did not reach 1e-3 within the epochs.",
        ],
        out=OUT,
    )


PARTS = {"": (run_main, ["--seeds", "1", "--epochs", "3", "--orders", "random,fixed:64,alt2:64,stored:64,split4:64"])}


def main() -> None:
    """``python -m benchmarks.sdca_orders [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("sdca_orders", PARTS, globals())


if __name__ == "__main__":
    main()
