"""HyFDCA in the paper's regularisation regime (issue 16): small lambda (1e-5, 5e-5; HyFDCA Sec. 5.1
uses lambda = 1e-3 for MNIST, 1e-5 for News20 and 5e-5 for Covtype, neither of which is available
offline) on MNIST binary (dense-ish pixels, 60,000 x 784, the 3 x 3 grid of ``benchmarks.hyfdca bench``) and
on one-hot Adult kept sparse (CSR, 32,561 x 108), hinge loss, against liblinear.

Setting: plaintext (``encryption: none``, ``alignment: plaintext``, ``secure_aggregation: false``)
so that the rounds are affordable; encryption does not change the iterates (CKKS: relative
difference of ``w`` 1e-9 or less, ``hyfdca_encryption.json``). Two dual modes: ``block`` (the
paper's protocol, HyFDCA Alg. 1 with Alg. 5's local steps; the default) and ``segment`` (our
extension: ``segment_schedule: sequential``, ``batch_size: 128``). By default no output averaging
(``average_last: 0``): the last iterate is reported; ``--average-last 0.5`` adds our recommended
suffix averaging (stored as ``<mode>_avg0.5``).

Adult here is not ``standardize``-d (centring would fill every one-hot zero): each block is scaled
by its columns' maximum absolute value (scikit-learn ``MaxAbsScaler``, train statistics), so the
one-hot columns stay 0/1 and the three numeric ones land in [0, 1]. The problem matrix is then CSR
(11.2 % non-zeros) for liblinear and the evaluation, and the clients' cells of the
``demographic`` and ``work`` blocks are CSR too (``sparse: auto``, below 25 % non-zeros).

Reference ``P*``: liblinear (``LinearSVC(loss="hinge", C=1/(lambda N), fit_intercept=False,
dual=True, random_state=0)``) at three tolerances (1e-4, 1e-6, 1e-8) with their iteration counts.
Its tightest solution is certified by a dual point built from its KKT conditions and improved by
``--cert-epochs`` passes of centralised SDCA (:func:`certify`); weak duality ``P* >= D`` for that
and for every HyFDCA dual iterate. ``P*`` is the smallest primal value seen (liblinear's, that
SDCA's or any HyFDCA iterate's), so a relative suboptimality is only resolved down to about
``(P* - best D) / P*``, which the markdown reports.

One (dataset, lambda) problem per call; every call merges its runs into the reports
``benchmarks/results/hyfdca_lambda.json`` (the HyFDCA runs) and ``hyfdca_lambda_reference.json``
(the reference optimum of every problem), with their ``.md``, and redraws ``hyfdca_lambda.png``::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_lambda --data adult --lam 1e-5 --rounds 300
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_lambda --data mnist --lam 5e-5 \\
        --rounds 120 --segment-rounds 240
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_lambda --data adult --lam 1e-5 --rounds 300 \\
        --mode segment --average-last 0.5

The exact commands of the committed results are listed in the notes of ``hyfdca_lambda.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import scipy.sparse as sp

from benchmarks import harness
from benchmarks.harness import dispatch
from benchmarks.hyfdca import DATA, OUT, dataset
from hybridfl.algorithms.convex.losses import primal
from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.data import load_adult
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded

RESULT = OUT / "hyfdca_lambda.json"
TOLS = ((1e-4, 1000), (1e-6, 10000), (1e-8, 20000))
SEGMENT = {"segment_schedule": "sequential", "batch_size": 128}
KEEP = ("round", "primal", "dual", "duality_gap", "relative_duality_gap", "accuracy", "seconds")


def adult_sparse() -> DatasetSplit:
    """UCI Adult with one-hot categoricals, every block scaled by ``MaxAbsScaler`` (train statistics)
    so that zeros stay zeros."""
    from sklearn.preprocessing import MaxAbsScaler

    s = harness.shrink(load_adult(DATA / "adult"))
    tr, te = {}, {}
    for b, x in s.train.blocks.items():
        m = MaxAbsScaler().fit(x.astype(np.float64))
        tr[b], te[b] = m.transform(x.astype(np.float64)), m.transform(s.test.blocks[b].astype(np.float64))
    return DatasetSplit(
        HybridDataset(s.train.name, s.train.ids, s.train.y, tr, s.train.classes),
        HybridDataset(s.test.name, s.test.ids, s.test.y, te, s.test.classes),
    )


def problem(name: str):
    """(split, positive classes, description) of a benchmark problem."""
    if name == "mnist":
        split, pos, _ = dataset("mnist")  # hyfdca_bench's MNIST binary: 0-4 vs 5-9, 49 tiles
        return split, pos, "MNIST binary (digits 5-9 vs 0-4), pixels in [0, 1], 49 4x4 tiles"
    if name == "adult":
        return adult_sparse(), None, "Adult, one-hot categoricals, MaxAbsScaler per block (sparsity kept)"
    raise SystemExit(f"unknown dataset {name}")


def liblinear_reference(X, y: np.ndarray, lam: float, cert_epochs: int) -> list[dict]:
    """liblinear's hinge solution at each tolerance of ``TOLS``: objective, iterations, CPU seconds."""
    from sklearn.svm import LinearSVC

    out = []
    for tol, max_iter in TOLS:
        c, t = time.process_time(), time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = LinearSVC(
                loss="hinge",
                C=1.0 / (lam * X.shape[0]),
                fit_intercept=False,
                dual=True,
                tol=tol,
                max_iter=max_iter,
                random_state=0,
            ).fit(X, y)
        w = m.coef_.ravel().astype(np.float64)
        n_iter = int(np.max(m.n_iter_))
        out.append(
            {
                "tol": tol,
                "max_iter": max_iter,
                "n_iter": n_iter,
                "hit_max_iter": n_iter >= max_iter,
                "objective": float(primal(X, y, w, lam, "hinge")),
                "cpu_seconds": time.process_time() - c,
                "wall_seconds": time.perf_counter() - t,
            }
        )
        print("liblinear", out[-1], flush=True)
    out[-1]["certificate"] = certify(X, y, w, lam, epochs=cert_epochs)
    print("certificate", out[-1]["certificate"], flush=True)
    return out


def certify(X, y: np.ndarray, w: np.ndarray, lam: float, eps: float = 1e-3, epochs: int = 20) -> dict:
    """A dual point for liblinear's ``w`` (``(d,)``) and its value ``D``, a lower bound on ``P*``.

    KKT of the hinge problem: ``w = X^T alpha / (lambda N)`` with ``b_i = y_i alpha_i`` = 1 for
    margins ``y_i x_i^T w < 1``, 0 for margins > 1, in [0, 1] on the margin. The margin samples
    (within ``eps``) get their ``b`` from a bounded least-squares fit of that equation
    (``scipy.optimize.lsq_linear``); then ``epochs`` passes of centralised SDCA from this point
    (:func:`hybridfl.algorithms.convex.losses.sdca`, which only increases ``D``); the primal value
    of SDCA's ``w(alpha)`` is a further candidate for ``P*``.
    """
    from scipy.optimize import lsq_linear

    from hybridfl.algorithms.convex.losses import dual, sdca

    c = time.process_time()
    n = X.shape[0]
    m = y * np.asarray(X @ w).ravel()
    on = np.abs(m - 1.0) <= eps
    b = np.where(m < 1.0, 1.0, 0.0)
    b[on] = 0.0
    rest = lam * n * w - np.asarray(X.T @ (y * b)).ravel()
    if on.any():
        A = X[on].T.multiply(y[on]) if sp.issparse(X) else X[on].T * y[on]
        A = A.toarray() if sp.issparse(A) else A
        b[on] = lsq_linear(A, rest, bounds=(0.0, 1.0)).x
    alpha = y * b
    d0 = dual(X, y, alpha, lam, "hinge")
    w_s, alpha, _ = sdca(X, y, lam, "hinge", epochs=epochs, seed=0, alpha0=alpha)
    d1 = dual(X, y, alpha, lam, "hinge")
    p = float(primal(X, y, w, lam, "hinge"))
    return {
        "margin_samples": int(on.sum()),
        "eps": eps,
        "dual_kkt": d0,
        "sdca_epochs": epochs,
        "dual": d1,
        "sdca_primal": float(primal(X, y, w_s, lam, "hinge")),
        "gap": p - d1,
        "relative_gap": (p - d1) / abs(p),
        "cpu_seconds": time.process_time() - c,
    }


def run_mode(split, part, pos, lam: float, mode: str, rounds: int, eval_every: int, average_last: float = 0.0) -> dict:
    cfg = HyFDCAConfig(
        fit_intercept=False,
        lam=lam,
        rounds=rounds,
        positive_classes=pos,
        eval_every=eval_every,
        dual_mode=mode,
        encryption="none",
        alignment="plaintext",
        secure_aggregation=False,
        reference=False,
        output="average_last" if average_last else "last",  # average_last: the second half
        segment_inner_products="encrypted",
        **(SEGMENT if mode == "segment" else {}),
    )

    def show(r, n, row):
        if "primal" in row:
            print(f"  {mode} round {r}/{n}: P={row['primal']:.8g} gap={row['duality_gap']:.3g}", flush=True)

    c, t = time.process_time(), time.perf_counter()
    res = run_hyfdca(split, part, cfg, seed=0, progress=show)
    return {
        "config": cfg.model_dump(mode="json"),
        "cpu_seconds": time.process_time() - c,
        "wall_seconds": time.perf_counter() - t,
        "round_seconds_mean": float(np.mean([h["seconds"] for h in res.history])),
        "history": [{k: h[k] for k in KEEP if k in h} for h in res.history if "primal" in h],
    }


def finish(entry: dict) -> None:
    """Fill ``p_star``, the certificate and each run's relative suboptimality from the runs so far."""
    ll = entry["liblinear"]
    runs = entry["modes"].values()
    evals = [h for r in runs for h in r["history"]]
    p_ll = min(x["objective"] for x in ll)
    p_sdca = ll[-1]["certificate"].get("sdca_primal", np.inf)
    p_star = min([p_ll, p_sdca] + [h["primal"] for h in evals])
    best_dual = max([h["dual"] for h in evals] + [ll[-1]["certificate"]["dual"]])
    entry["p_star"] = p_star
    entry["p_star_source"] = {p_ll: "liblinear", p_sdca: "sdca from liblinear's KKT point"}.get(
        p_star, "hyfdca iterate"
    )
    entry["best_dual"] = best_dual
    entry["liblinear_tightest_minus_best_dual"] = None if best_dual is None else ll[-1]["objective"] - best_dual
    entry["liblinear_relative_spread"] = (max(x["objective"] for x in ll) - p_ll) / abs(p_ll)
    entry["liblinear_relative_suboptimality"] = {f"{x['tol']:g}": (x["objective"] - p_star) / abs(p_star) for x in ll}
    for r in runs:
        for h in r["history"]:
            h["relative_suboptimality"] = (h["primal"] - p_star) / abs(p_star)
        last = r["history"][-1]
        r["final"] = {
            "round": last["round"],
            "relative_suboptimality": last["relative_suboptimality"],
            "duality_gap": last["duality_gap"],
            "relative_duality_gap": last["relative_duality_gap"],
            "accuracy": last["accuracy"],
        }
        for target in (1e-2, 1e-3, 1e-4):
            hit = next((h["round"] for h in r["history"] if h["relative_suboptimality"] <= target), None)
            r[f"first_round_below_{target:g}"] = hit


RUN_COLUMNS = [
    "data",
    "lambda",
    "mode",
    ("final_round", "rounds"),
    ("relative_suboptimality", "final rel. subopt."),
    ("duality_gap", "final gap"),
    ("relative_duality_gap", "final rel. gap"),
    ("first_round_below_0.01", "first round <= 1e-2"),
    ("first_round_below_0.001", "<= 1e-3"),
    ("first_round_below_0.0001", "<= 1e-4"),
    "accuracy",
    ("cpu_seconds", "CPU s"),
    ("round_seconds_mean", "s/round"),
]
REFERENCE_COLUMNS = [
    "data",
    "lambda",
    ("shape", "X"),
    ("density", "non-zeros"),
    ("p_star", "P*"),
    ("p_star_source", "P* from"),
    ("best_dual", "best dual D"),
    ("resolved", "(P* - D) / P*"),
    ("liblinear_relative_spread", "liblinear spread over tol"),
    ("liblinear_hit_max_iter", "liblinear at its iteration cap"),
]
NOTES = [
    "Hinge loss, 3 x 3 grid (3 sample groups x 3 block groups = 9 clients), plaintext (`encryption: none`, "
    "`alignment: plaintext`, `secure_aggregation: false`: encryption does not change the iterates, it only "
    "costs time), last iterate unless the mode ends in `_avg<x>` (`average_last: x`), seed 0. `block` = the "
    "paper's protocol (`dual_mode: block`); `segment` = our extension (`dual_mode: segment`, "
    "`segment_schedule: sequential`, `batch_size: 128`). Relative suboptimality `(P(w) - P*) / P*`; gap = "
    "absolute duality gap `P(w(alpha)) - D(alpha)` (a certificate in segment mode; in block mode the gap of "
    "the holders' mean dual certifies nothing useful). CPU seconds are one core's process time, evaluation "
    "included; each row keeps the load average and its evaluated rounds (`history`).",
]


def rows_of(res: dict) -> tuple[list[dict], list[dict]]:
    """The HyFDCA runs (one row per problem and mode, its evaluated rounds under ``history``) and the
    reference optimum of every problem (one row each, liblinear's tolerances under ``liblinear``)."""
    runs, refs = [], []
    for key, e in res["problems"].items():
        meta = {k: v for k, v in e.items() if k != "modes"}
        hit = all(x["hit_max_iter"] for x in e["liblinear"])
        resolved = (e["p_star"] - e["best_dual"]) / abs(e["p_star"])
        refs.append({"config": key, "seed": 0, **meta, "resolved": resolved, "liblinear_hit_max_iter": hit})
        for mode, r in e["modes"].items():
            final = {k: v for k, v in r["final"].items() if k != "round"}
            row = {"config": f"{key} {mode}", "seed": 0, "problem": key, "data": e["data"], "lambda": e["lambda"]}
            run = {k: v for k, v in r.items() if k not in ("final", "config")}
            runs.append(
                {**row, "mode": mode, "final_round": r["final"]["round"], **final, **run, "hyfdca": r["config"]}
            )
    return runs, refs


def load_results() -> dict:
    """The stored problems (from the two reports :func:`save` writes), ``{"problems": {}, "commands": []}``
    when there are none."""
    if not RESULT.is_file():
        return {"problems": {}, "commands": []}
    runs, refs = harness.read_report("hyfdca_lambda", OUT), harness.read_report("hyfdca_lambda_reference", OUT)
    drop = {"config", "seed", "resolved", "liblinear_hit_max_iter"}
    problems = {r["config"]: {**{k: v for k, v in r.items() if k not in drop}, "modes": {}} for r in refs["rows"]}
    keep = ("cpu_seconds", "wall_seconds", "round_seconds_mean", "load_average", "history")
    for r in runs["rows"]:
        problems[r["problem"]]["modes"][r["mode"]] = {"config": r["hyfdca"], **{k: r[k] for k in keep if k in r}}
    for e in problems.values():
        finish(e)
    return {"problems": problems, "commands": runs.get("commands", [])}


def plot(res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datas = sorted({e["data"] for e in res["problems"].values()})
    fig, axes = plt.subplots(len(datas), 2, figsize=(11, 4 * len(datas)), squeeze=False)
    for i, d in enumerate(datas):
        for e in res["problems"].values():
            if e["data"] != d:
                continue
            for mode, r in e["modes"].items():
                rounds = [h["round"] for h in r["history"]]
                style = "-" if mode.startswith("block") else ":" if "avg" in mode else "--"
                lab = f"lambda={e['lambda']:g}, {mode}"
                sub = [max(h["relative_suboptimality"], 1e-12) for h in r["history"]]
                axes[i, 0].semilogy(rounds, sub, style, label=lab)
                axes[i, 1].semilogy(rounds, [max(h["duality_gap"], 1e-12) for h in r["history"]], style, label=lab)
        axes[i, 0].set_title(f"{d}: relative suboptimality (P - P*) / P*")
        axes[i, 1].set_title(f"{d}: duality gap P(w(alpha)) - D(alpha)")
        for ax in axes[i]:
            ax.set_xlabel("round")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("HyFDCA, hinge, 3x3 grid, plaintext: block (paper) vs segment (ours)")
    fig.tight_layout()
    fig.savefig(OUT / "hyfdca_lambda.png", dpi=110)
    plt.close(fig)


def save(res: dict, cmd: str) -> None:
    """Record ``cmd`` and write the two reports (:func:`rows_of`) and the plot."""
    if cmd not in res["commands"]:
        res["commands"].append(cmd)
    runs, refs = rows_of(res)
    commands = ["Commands of the rows: " + "; ".join(f"`{c}`" for c in res["commands"]) + "."]
    extra = {"commands": res["commands"]}
    harness.write_report(
        "hyfdca_lambda",
        runs,
        title="HyFDCA at the paper's small lambda: relative suboptimality and duality gap",
        command=cmd,
        columns=RUN_COLUMNS,
        notes=NOTES + commands,
        out=OUT,
        extra=extra,
    )
    harness.write_report(
        "hyfdca_lambda_reference",
        refs,
        title="HyFDCA at the paper's small lambda: the reference optimum",
        command=cmd,
        columns=REFERENCE_COLUMNS,
        notes=[
            "liblinear (`LinearSVC(loss='hinge', dual=True, fit_intercept=False)`) at tolerances 1e-4, 1e-6, "
            "1e-8 (`liblinear`: objective, iterations, CPU seconds of each). `P*` = the smallest primal value "
            "seen (liblinear's, SDCA's from liblinear's KKT dual point, or any HyFDCA iterate's); the best "
            "dual value `D` bounds `P*` from below, so relative suboptimalities below `(P* - D) / P*` are not "
            "resolved.",
            *commands,
        ],
        out=OUT,
        extra=extra,
    )
    plot(res)


def run_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, choices=["mnist", "adult"])
    ap.add_argument("--lam", type=float, required=True, help="lambda (paper: 1e-5 News20, 5e-5 Covtype)")
    ap.add_argument("--rounds", type=int, default=100, help="rounds of the block (paper) mode")
    ap.add_argument("--segment-rounds", type=int, default=None, help="rounds of segment mode (default --rounds)")
    ap.add_argument("--mode", choices=["block", "segment"], nargs="+", default=["block", "segment"])
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument(
        "--average-last",
        type=float,
        default=0.0,
        help="HyFDCA average_last (share of final rounds averaged into the output); the run is stored as <mode>_avg<x>",
    )
    ap.add_argument("--cert-epochs", type=int, default=50, help="SDCA passes from liblinear's KKT dual point")
    ap.add_argument(
        "--reference-only",
        action="store_true",
        help="recompute the reference (liblinear and its certificate with --cert-epochs) of a stored problem; no runs",
    )
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    res = load_results()
    key = f"{a.data}_lambda{a.lam:g}"
    split, pos, desc = problem(a.data)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    prob = build_problem(split, part, "hinge", a.lam, pos if pos is not None else [1])
    X = prob.X
    density = X.nnz / (X.shape[0] * X.shape[1]) if sp.issparse(X) else np.count_nonzero(X) / X.size
    entry = res["problems"].get(key) or {
        "data": a.data,
        "description": desc,
        "lambda": a.lam,
        "grid": "3 sample groups x 3 block groups = 9 clients",
        "shape": list(X.shape),
        "X_sparse": bool(sp.issparse(X)),
        "density": float(density),
        "modes": {},
    }
    with single_threaded():
        if "liblinear" not in entry or a.reference_only:
            entry["liblinear"] = liblinear_reference(X, prob.y, a.lam, a.cert_epochs)
        if a.reference_only:
            res["problems"][key] = entry
            finish(entry)
            save(
                res,
                f".venv/bin/python -m benchmarks.hyfdca_lambda --data {a.data} --lam {a.lam:g} --reference-only --cert-epochs {a.cert_epochs}",
            )
            return
        for mode in a.mode:
            rounds = (a.segment_rounds or a.rounds) if mode == "segment" else a.rounds
            label = mode + (f"_avg{a.average_last:g}" if a.average_last else "")
            print(f"{key} {label} {rounds} rounds", flush=True)
            entry["modes"][label] = run_mode(split, part, pos, a.lam, mode, rounds, a.eval_every, a.average_last)
            entry["modes"][label]["load_average"] = os.getloadavg()
            res["problems"][key] = entry
            finish(entry)
            cmd = (
                f".venv/bin/python -m benchmarks.hyfdca_lambda --data {a.data} --lam {a.lam:g} --rounds {a.rounds}"
                + (f" --segment-rounds {a.segment_rounds}" if a.segment_rounds else "")
                + f" --mode {' '.join(a.mode)} --eval-every {a.eval_every} --cert-epochs {a.cert_epochs}"
                + (f" --average-last {a.average_last:g}" if a.average_last else "")
            )
            save(res, cmd)
            print(json.dumps(entry["modes"][label]["final"]), flush=True)


PARTS = {
    "": (run_main, "--data adult --lam 5e-5 --rounds 2 --mode block --eval-every 1 --cert-epochs 2".split()),
}


def main() -> None:
    """``python -m benchmarks.hyfdca_lambda [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("hyfdca_lambda", PARTS, globals())


if __name__ == "__main__":
    main()
