"""The centralised solver of the convex problem the clients hold (registered algorithm
``centralized``; not federated): all clients' data in one place, solved with liblinear or SDCA.

It is the reference point of HyFDCA and hybrid FedAvg: the same federated problem
(:func:`~hybridfl.algorithms.convex.monitor.build_problem`), the same metrics
(:meth:`~hybridfl.algorithms.convex.monitor.Monitor.primal_metrics`), one metrics row.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.intercept import FIT_INTERCEPT_DESCRIPTION, intercept_array, split_with_intercept
from hybridfl.algorithms.convex.losses import sdca
from hybridfl.algorithms.convex.monitor import Monitor, build_problem, check_inputs, reference_of
from hybridfl.algorithms.convex.problem import block_offsets
from hybridfl.algorithms.convex.reference import liblinear_solve
from hybridfl.algorithms.spec import AlgorithmSpec, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.runtime.loop import ProgressFn
from hybridfl.runtime.simulation import RunResult


class CentralizedConfig(BaseModel):
    """The centralised solver of the same problem (``algorithm:`` section with ``name: centralized``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Literal["centralized"] = Field("centralized", description="the algorithm (centralised solver, not federated)")
    loss: Literal["hinge", "logistic", "squared"] = Field(
        "hinge",
        description="loss l of the L2-regularised linear problem on labels +-1: hinge (SVM), logistic or squared",
    )
    lam: float = Field(
        1e-4,
        gt=0,
        validation_alias=AliasChoices("lam", "lambda"),
        description="L2 regulariser lambda (> 0) of P(w) = (lambda/2)||w||^2 + (1/N) sum_i l(x_i^T w)",
    )
    fit_intercept: bool = Field(True, description=FIT_INTERCEPT_DESCRIPTION)
    solver: Literal["liblinear", "sdca"] = Field(
        "liblinear",
        description="liblinear: scikit-learn's liblinear (LinearSVC for hinge, LogisticRegression for logistic; normal equations for squared), to tol; sdca: SDCA for epochs passes, seeded by the run seed",
    )
    tol: float = Field(1e-4, gt=0, description="liblinear tolerance")
    epochs: int = Field(100, ge=1, description="SDCA epochs")
    rounds: int = Field(1, ge=1, description="unused (kept so `--rounds` works)")
    positive_classes: list[int] | None = Field(
        None,
        description="class indices labelled +1, the others -1 (required with more than 2 classes; default with 2: class 1)",
    )
    reference: bool = Field(
        True,
        description="compute (or load from the cache) the centralised reference optimum P* for relative_suboptimality",
    )
    reference_sdca_epochs: int = Field(
        200,
        ge=1,
        description="SDCA epochs of the reference solve (P* is the best of liblinear and this SDCA run; cached per problem)",
    )


def run_centralized(
    split: DatasetSplit, partition: Partition, cfg: CentralizedConfig, seed: int = 0, progress: ProgressFn | None = None
) -> RunResult:
    """Solve the federated problem (all clients' data in one place) with liblinear or SDCA
    (``epochs`` passes, seeded by ``seed``); one metrics row (``seconds``: the solve's wall time).
    Its ``final`` arrays are ``w`` (every block in schema order, ``intercept`` last when fitted)
    and ``intercept`` (1 element; 0.0 when not fitted). With ``fit_intercept`` the problem has the constant ``intercept`` column (regularised like
    every weight, :mod:`hybridfl.algorithms.convex.intercept`), as the federated runs' problem.

    Raises:
        DataError, PartitionError: the input checks of the convex algorithms
            (:func:`~hybridfl.algorithms.convex.monitor.check_inputs`).
    """
    pos = check_inputs(split, partition, cfg.loss, cfg.positive_classes, "centralized")
    if cfg.fit_intercept:
        split, partition = split_with_intercept(split, partition)
    prob = build_problem(split, partition, cfg.loss, cfg.lam, pos)
    t0 = time.perf_counter()
    if cfg.solver == "liblinear":
        w = liblinear_solve(prob.X, prob.y, cfg.lam, cfg.loss, tol=cfg.tol)
    else:
        w, _, _ = sdca(prob.X, prob.y, cfg.lam, cfg.loss, epochs=cfg.epochs, seed=seed)
    seconds = time.perf_counter() - t0
    ref = reference_of(prob, cfg)
    row = {"round": 1, "seconds": seconds, **Monitor(prob, ref).primal_metrics(w)}
    if progress:
        progress(1, 1, row)
    summary = {
        "algorithm": "centralized",
        "solver": cfg.solver,
        "loss": cfg.loss,
        "lambda": cfg.lam,
        "fit_intercept": cfg.fit_intercept,
        "rounds": 1,
        "primal_objective": row["primal"],
        "reference_objective": ref.objective if ref else None,
        "reference_solver": ref.solver if ref else None,
        "relative_suboptimality": row.get("relative_suboptimality"),
        "accuracy": row["accuracy"],
        "solve_seconds": seconds,
        "duality_gap": None,
        "encryption_seconds": 0.0,
    }
    summary["report"] = [
        ["test accuracy", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
        [f"solve seconds ({cfg.solver})", seconds, "plain"],
    ]
    final = {
        "w": np.asarray(w, dtype=np.float64),
        "intercept": intercept_array(w, block_offsets(split.train.block_shapes)),
    }
    return RunResult(summary=summary, history=[row], comm=None, final=final)


SPEC = register(
    AlgorithmSpec(
        "centralized",
        CentralizedConfig,
        "centralised solver (liblinear or SDCA) of the same convex problem",
        run=run_centralized,
    )
)
"""The centralised solver's recipe (registered as ``centralized``; not federated)."""
