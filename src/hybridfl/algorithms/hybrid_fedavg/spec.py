"""Hybrid FedAvg's :class:`~hybridfl.algorithms.spec.AlgorithmSpec` (:data:`SPEC`): the one place
hybrid FedAvg is built, consumed unchanged by the simulation and by Flower.

Metrics: in the simulation the :class:`~hybridfl.algorithms.convex.monitor.Monitor`'s primal
metrics of the server's ``w`` (objective, relative suboptimality, test and train accuracy; no dual,
no encryption); over Flower the test accuracy on the server's test set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.algorithms.convex.intercept import (
    INTERCEPT,
    check_no_intercept_block,
    client_with_intercept,
    intercept_array,
    server_with_intercept,
)
from hybridfl.algorithms.convex.model import linear_parts
from hybridfl.algorithms.convex.monitor import (
    Monitor,
    check_inputs,
    client_positive_set,
    holdout_accuracy,
    make_monitor,
    suboptimality_plots,
    time_columns,
)
from hybridfl.algorithms.hybrid_fedavg.client import HybridFedAvgClient
from hybridfl.algorithms.hybrid_fedavg.config import HybridFedAvgConfig
from hybridfl.algorithms.hybrid_fedavg.server import HybridFedAvgServer
from hybridfl.algorithms.spec import AlgorithmSpec, EvalContext, LabelRule, ReportContext, client_seed, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.inference.modeldir import ModelParts

WHERE = "hybrid FedAvg"


def check(split: DatasetSplit, partition: Partition, cfg: HybridFedAvgConfig) -> None:
    """Every input check before any training (:func:`~hybridfl.algorithms.convex.monitor.check_inputs`).

    Raises:
        DataError: labels not binary for the loss; PartitionError, UnknownBlockError: see there.
    """
    check_inputs(split, partition, cfg.loss, cfg.positive_classes, WHERE)
    if cfg.fit_intercept:
        check_no_intercept_block(split.train.block_names, WHERE)


def build_client(cd: ClientData, cfg: HybridFedAvgConfig, seed: int, layout: list | None = None) -> HybridFedAvgClient:
    """One client from its own data (seed ``client_seed(seed, index)``); with ``fit_intercept``
    the data gains the constant ``intercept`` block
    (:func:`~hybridfl.algorithms.convex.intercept.client_with_intercept`).

    Raises:
        PartitionError: the client has no labels.
        DataError: labels not binary for the loss; a block already named ``intercept``.
    """
    if cfg.fit_intercept:
        cd = client_with_intercept(cd)
    pos = client_positive_set(cd, cfg.loss, cfg.positive_classes, WHERE)
    return HybridFedAvgClient(cd.client_id, cd.data, pos, client_seed(seed, cd.index))


def build_server(
    sd: ServerData, cfg: HybridFedAvgConfig, seed: int, hello: Mapping[str, dict] | None = None
) -> HybridFedAvgServer:
    """The server from the public schema (``hello`` is unused); with ``fit_intercept`` the schema
    gains the ``intercept`` block, last (:func:`~hybridfl.algorithms.convex.intercept.server_with_intercept`).

    Raises:
        DataError: a block already named ``intercept`` with ``fit_intercept``.
    """
    if cfg.fit_intercept:
        sd = server_with_intercept(sd)
    return HybridFedAvgServer(sd.block_shapes, cfg, seed)


def monitor(
    split: DatasetSplit,
    partition: Partition,
    cfg: HybridFedAvgConfig,
    seed: int,
    clients: Mapping[str, Any],
    secrets: Mapping[str, bytes] | None,
) -> Monitor:
    """The simulation's privileged evaluator: the federated problem in the clear and its reference."""
    return make_monitor(split, partition, cfg, WHERE)


def evaluate(ctx: EvalContext) -> dict[str, float]:
    """After an evaluated round: the :class:`Monitor`'s primal metrics of ``w`` in the simulation,
    else the ``accuracy`` of ``w`` on the server's test set (``{}`` without one)."""
    w = ctx.server.w
    if ctx.monitor is not None:
        return ctx.monitor.primal_metrics(w)
    cfg = ctx.config
    return holdout_accuracy(w, ctx.server_data.test, cfg.loss, cfg.positive_classes, WHERE, cfg.fit_intercept)


def report(ctx: ReportContext) -> tuple[dict, list]:
    """Hybrid FedAvg's summary keys and final table rows; adds the modelled time columns to
    ``ctx.history`` (in place)."""
    cfg: HybridFedAvgConfig = ctx.config
    time_columns(ctx.history, None)
    last = ctx.history[-1] if ctx.history else {}
    ref = ctx.monitor.ref if ctx.monitor is not None else None
    summary = {
        "loss": cfg.loss,
        "lambda": cfg.lam,
        "fit_intercept": cfg.fit_intercept,
        "intercept": float(intercept_array(ctx.server.w, ctx.server.offsets)[0]),
        "lr": cfg.lr,
        "local_steps": cfg.local_steps,
        "primal_objective": last.get("primal"),
        "reference_objective": ref.objective if ref else None,
        "relative_suboptimality": last.get("relative_suboptimality"),
        "accuracy": last.get("accuracy"),
        "duality_gap": None,
        "encryption_seconds": 0.0,
        "failure_rate": cfg.failure_rate,
    }
    rows = [
        ["test accuracy (server model, all blocks)", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        ["reference objective P*", summary["reference_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
    ]
    return summary, rows


def plots(history: list[dict], cfg: HybridFedAvgConfig, title: str) -> list[Callable[[Path], None]]:
    """The suboptimality plot (``suboptimality.png``) of the run."""
    on = f" on {title.split(' on ', 1)[1]}" if " on " in title else ""
    return suboptimality_plots("hybrid FedAvg", history, f"hybrid FedAvg ({cfg.loss}, lambda={cfg.lam:g}){on}")


def final_arrays(server: HybridFedAvgServer) -> dict[str, np.ndarray]:
    """The final model: ``w`` ``(d,)`` float64, the weights of every block of the schema in its
    order (block ``b``'s flattened features at ``block_offsets(schema)[b]``), with ``fit_intercept``
    the ``intercept`` block last (one weight, ``w[-1]``); and ``intercept``, a 1-element float64
    array holding that weight (``[0.0]`` without ``fit_intercept``). A sample's score is
    ``x^T w[:-1] + intercept`` with ``fit_intercept``, ``x^T w`` without."""
    return {"w": server.w.copy(), INTERCEPT: intercept_array(server.w, server.offsets)}


def export_model(server: HybridFedAvgServer, clients: Mapping[str, Any] | None, cfg: HybridFedAvgConfig) -> ModelParts:
    """The final ``w`` cut per block (the ``intercept`` block's weight as the intercept), with
    the loss and the positive classes (:func:`~hybridfl.algorithms.convex.model.linear_parts`)."""
    return linear_parts(final_arrays(server)["w"], server.offsets, cfg.loss, cfg.positive_classes)


SPEC = register(
    AlgorithmSpec(
        "hybrid_fedavg",
        HybridFedAvgConfig,
        "hybrid FedAvg: local SGD on own blocks, per-feature averaging (HyFDCA's baseline)",
        build_server=build_server,
        build_client=build_client,
        check=check,
        labels=LabelRule("hybrid FedAvg", "every"),  # each client trains on the rows it holds labels for
        evaluate=evaluate,
        report=report,
        monitor=monitor,
        final_arrays=final_arrays,
        export_model=export_model,
        plots=plots,
    )
)
"""Hybrid FedAvg's recipe (registered as ``hybrid_fedavg``)."""
