"""Probe (not part of the library): how good are the clients' local dual passes as directions for the
true dual, when every sample has one alpha (consensus)?

Each round, every client of the grid makes one SDCA pass over its samples with its own blocks'
feedback (HyFDCA Alg. 5, ``sigma'`` and the feedback weight given on the command line). Instead of
averaging the proposals, the best non-negative combination of the K proposals is found (a K-variable
QP on the exact hinge dual, with sum_t gamma_st <= 1 per sample group so alpha stays feasible). If
the best weights are far below 1, the proposals are poor directions, whatever the aggregation.

    GRID=3,3 .venv/bin/python benchmarks/hyfdca_consensus_probe.py credit 40 SIGMA FEEDBACK opt|avg [EPOCHS]

Measured once (credit, 40 rounds; not kept in a results file): the best weights are 0.00-0.02, and the
relative suboptimality after 40 rounds is 0.24-0.60; with a pure vertical split (GRID=1,3) the
same; with a pure horizontal one (GRID=3,1) or centrally (GRID=1,1) the weights are about 1.
"""

import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from scipy.optimize import minimize

from hybridfl.algorithms.convex.losses import RowData, dual, primal, row_norms_sq
from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.convex.problem import positive_set
from hybridfl.algorithms.convex.reference import reference_optimum
from hybridfl.data.partitioners import GridPartitioner
from hyfdca_bench import dataset

name = sys.argv[1]
rounds = int(sys.argv[2])
sig = float(sys.argv[3])
cross = float(sys.argv[4])
mode = sys.argv[5]
epochs = int(sys.argv[6]) if len(sys.argv) > 6 else 1
split, pos, lam = dataset(name)
SG, BG = (int(v) for v in __import__("os").environ.get("GRID", "3,3").split(","))
part = GridPartitioner(SG, BG, 1, 0).partition(split.train)
prob = build_problem(split, part, "hinge", lam, positive_set(split.train, pos, "hinge", "x"))
ref = reference_optimum(prob.X, prob.y, lam, "hinge")
X = prob.X.tocsr() if sp.issparse(prob.X) else prob.X
N, d = X.shape
y = prob.y
lamN = lam * N
q = row_norms_sq(X)
names = split.train.block_names
from hybridfl.algorithms.convex.problem import block_offsets  # noqa: E402

offs = block_offsets(split.train.block_shapes)
cells = []  # (group rows, feature cols)
groups = {}
for c in part.clients:
    rows = np.array(sorted(prob.row[str(s)] for s in c.sample_ids))
    cols = np.concatenate([np.arange(*offs[b]) for b in c.blocks])
    key = tuple(rows[:5])
    groups.setdefault(key, len(groups))
    cells.append((groups[key], rows, cols))
S = len(groups)
print(name, N, d, "clients", len(cells), "S", S, "P*", ref.objective, flush=True)
sub = [RowData(X[r][:, c]) for _, r, c in cells]
alpha = np.zeros(N)
w = np.zeros(d)
rng = np.random.default_rng(0)
for t in range(1, rounds + 1):
    u = np.asarray(X @ w).ravel()
    D = []
    V = []
    for k, (g, rows, cols) in enumerate(cells):
        a = alpha[rows].copy()
        dw = np.zeros(cols.size)
        n = rows.size
        order = np.concatenate([rng.permutation(n) for _ in range(epochs)])
        delta = sub[k].dot_and_add(order, a, y[rows], u[rows], q[rows], "hinge", lamN, sig, cross, dw)
        D.append(delta)
        v = np.asarray(X[rows].T @ delta).ravel() / lamN
        V.append(v)
    K = len(cells)
    V = np.array(V)
    c = np.array([(y[rows] @ D[k]) / N - lam * (w @ V[k]) for k, (g, rows, cols) in enumerate(cells)])
    G = lam * V @ V.T
    if mode == "avg":  # paper: average per sample over holders, add across groups
        gam = np.array([1.0 / sum(1 for cc in cells if cc[0] == g) for g, _, _ in cells])
    else:
        cons = [
            {"type": "ineq", "fun": (lambda gg, g=g: 1.0 - sum(gg[k] for k, cc in enumerate(cells) if cc[0] == g))}
            for g in range(S)
        ]

        def f(gg):
            return -(c @ gg - 0.5 * gg @ G @ gg)

        def jac(gg):
            return -(c - G @ gg)

        x0 = np.array([1.0 / sum(1 for cc in cells if cc[0] == g) for g, _, _ in cells])
        r = minimize(
            f,
            x0,
            jac=jac,
            bounds=[(0, None)] * K,
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 200},
        )
        gam = r.x
    for k, (g, rows, cols) in enumerate(cells):
        alpha[rows] += gam[k] * D[k]
    w = w + gam @ V
    if t % max(1, rounds // 20) == 0 or t <= 3:
        P = primal(X, y, w, lam, "hinge")
        Dv = dual(X, y, alpha, lam, "hinge")
        print(
            t, f"subopt {(P - ref.objective) / ref.objective:.3e} gap {P - Dv:.3e} gam {np.round(gam, 2)}", flush=True
        )
