"""HyFEM's :class:`~hybridfl.algorithms.spec.AlgorithmSpec`: the one place HyFEM is built.

The simulation (:func:`hybridfl.runtime.simulation.simulate`) and Flower consume :data:`SPEC`
unchanged. Metrics (HyFEM Sec. 4, SPEC.md "Test data"):

- ``server_accuracy`` (global accuracy): the server model on all test samples with all blocks;
- ``client_accuracy_mean`` (local accuracy): each client's model, i.e. what it receives from the
  server (``P_m Theta_0``, ``Pi_m w_0``), on all test samples with only its own blocks, averaged
  over clients (``client_accuracy[<client>]`` each); ``client_accuracy_local_mean`` (simulation
  only) is the same for the clients' models right after their ``Q`` local steps;
- ``centralized_accuracy``: the server-shaped model trained on all training data for ``T * Q``
  steps; ``standalone_accuracy_mean``: each client alone for ``T * Q`` steps, local inference
  (simulation only, ``baselines: true``).

Plug-in extractors: :func:`spec_with` returns the spec with another extractor factory.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from hybridfl.algorithms.hyfem.baselines import accuracy, make_model_factory, train_centralized, train_standalone
from hybridfl.algorithms.hyfem.client import HyFEMClient
from hybridfl.algorithms.hyfem.config import HyFEMConfig
from hybridfl.algorithms.hyfem.server import HyFEMServer
from hybridfl.algorithms.spec import AlgorithmSpec, EvalContext, ReportContext, client_seed, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.errors import PartitionError
from hybridfl.models.hybrid import ExtractorFactory, default_extractor

_ACC = "client_accuracy["


def _no_labels(client_id: str) -> PartitionError:
    return PartitionError(
        f"HyFEM needs labels at every client, but client {client_id!r} has none (use a hybrid or horizontal partition)."
    )


def _factory(cfg: HyFEMConfig, extractor_factory: ExtractorFactory | None) -> ExtractorFactory:
    return extractor_factory or default_extractor(cfg.extractor)


def check(split: DatasetSplit, partition: Partition, cfg: HyFEMConfig) -> None:
    """Every client holds labels (HyFEM trains a classifier at every client).

    Raises:
        PartitionError: the first client without labels.
    """
    for c in partition.clients:
        if not c.has_labels:
            raise _no_labels(c.client_id)


def build_server(
    server_data: ServerData,
    cfg: HyFEMConfig,
    seed: int,
    hello: dict | None = None,
    extractor_factory: ExtractorFactory | None = None,
) -> HyFEMServer:
    """The HyFEM server from the public schema (``hello`` is unused: HyFEM asks its clients for
    their properties in :meth:`HyFEMServer.setup`)."""
    return HyFEMServer(server_data.block_shapes, server_data.n_classes, cfg, seed, _factory(cfg, extractor_factory))


def build_client(
    client_data: ClientData,
    cfg: HyFEMConfig,
    seed: int,
    layout: list | None = None,
    extractor_factory: ExtractorFactory | None = None,
) -> HyFEMClient:
    """One HyFEM client from its own data, seeded with :func:`client_seed` of its partition index
    (``layout`` is unused).

    Raises:
        PartitionError: the client holds no labels.
    """
    cd = client_data
    if not cd.has_labels:
        raise _no_labels(cd.client_id)
    return HyFEMClient(
        cd.client_id,
        cd.data,
        cd.block_shapes,
        cd.n_classes,
        cfg,
        client_seed(seed, cd.index),
        _factory(cfg, extractor_factory),
    )


def evaluate(ctx: EvalContext) -> dict[str, float]:
    """Test accuracies in ``[0, 1]`` after a round on the server's test set (``{}`` without one):
    ``server_accuracy``, ``client_accuracy_mean`` and ``client_accuracy[<client>]`` of the models
    the clients receive and, when ``ctx.monitor`` (client ID -> :class:`HyFEMClient`) is given,
    ``client_accuracy_local_mean`` of the clients' models after their ``Q`` local steps."""
    test = ctx.server_data.test
    if test is None:
        return {}
    server: HyFEMServer = ctx.server
    row = {"server_accuracy": accuracy(server.model, test)}
    local = {cid: accuracy(server.client_model(cid), test) for cid in server.clients}
    row["client_accuracy_mean"] = float(np.mean(list(local.values()))) if local else float("nan")
    if ctx.monitor is not None:
        after = {cid: accuracy(c.model, test) for cid, c in ctx.monitor.items()}
        row["client_accuracy_local_mean"] = float(np.mean(list(after.values()))) if after else float("nan")
    for cid, v in local.items():
        row[f"{_ACC}{cid}]"] = v
    return row


def monitor(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int,
    clients: dict[str, HyFEMClient],
    secrets: dict[str, bytes],
) -> dict[str, HyFEMClient]:
    """The simulation's privileged view: the client objects themselves (their models after the
    local steps, for ``client_accuracy_local_mean``)."""
    return clients


def report(ctx: ReportContext) -> tuple[dict[str, Any], list[list]]:
    """HyFEM's summary keys and final table rows.

    Summary: ``variant``, the last evaluation's ``server_accuracy``, ``client_accuracy_mean``,
    ``client_accuracy_local_mean`` (``None`` over Flower), ``client_accuracy`` (client ->
    accuracy), ``local_steps``, ``server_width`` ``H``, and ``centralized_accuracy`` and
    ``standalone_accuracy_mean`` from the baselines (``None`` when they did not run).
    """
    cfg: HyFEMConfig = ctx.config
    last = ctx.history[-1] if ctx.history else {}
    base = ctx.baselines or {}
    s: dict[str, Any] = {
        "variant": cfg.variant,
        "server_accuracy": last.get("server_accuracy"),
        "client_accuracy_mean": last.get("client_accuracy_mean"),
        "client_accuracy_local_mean": last.get("client_accuracy_local_mean"),
        "client_accuracy": {k[len(_ACC) : -1]: v for k, v in last.items() if k.startswith(_ACC)},
        "local_steps": cfg.local_steps,
        "server_width": ctx.server.classifier.width,
        "centralized_accuracy": base.get("centralized_accuracy"),
        "standalone_accuracy_mean": base.get("standalone_accuracy_mean"),
    }
    rows = [
        ["server (global: all test samples, all blocks)", s["server_accuracy"], "percent"],
        ["clients, mean (local: all test samples, own blocks)", s["client_accuracy_mean"], "percent"],
    ]
    if s["client_accuracy_local_mean"] is not None:
        rows.append(["clients, mean after their Q local steps", s["client_accuracy_local_mean"], "percent"])
    rows += [
        ["centralised (all training data, same T*Q budget)", s["centralized_accuracy"], "percent"],
        ["stand-alone clients, mean (no communication)", s["standalone_accuracy_mean"], "percent"],
    ]
    return s, rows


def baselines(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int,
    extractor_factory: ExtractorFactory | None = None,
) -> dict[str, Any]:
    """The centralised and stand-alone baselines (HyFEM Sec. 4) with the federation's budget of
    ``T * Q`` steps: ``centralized_accuracy``, ``centralized_seconds`` (wall time, s),
    ``standalone_accuracy_mean`` and ``standalone_accuracy`` (client -> accuracy); with
    ``cfg.baselines`` false only the two headline keys, ``None``."""
    if not cfg.baselines:
        return {"centralized_accuracy": None, "standalone_accuracy_mean": None}
    make = make_model_factory(split, cfg.extractor_dim, cfg.hidden, _factory(cfg, extractor_factory))
    budget = cfg.rounds * cfg.local_steps
    t0 = time.perf_counter()
    _, cen = train_centralized(split, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed)
    seconds = time.perf_counter() - t0
    alone = train_standalone(split, partition, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed)
    return {
        "centralized_seconds": seconds,
        "centralized_accuracy": cen,
        "standalone_accuracy_mean": float(np.mean(list(alone.values()))),
        "standalone_accuracy": alone,
    }


SPEC = register(
    AlgorithmSpec(
        "hyfem",
        HyFEMConfig,
        "HyFEM-Avg / HyFEM-Prox: hybrid FL for deep models with classifier matching",
        build_server=build_server,
        build_client=build_client,
        check=check,
        evaluate=evaluate,
        report=report,
        monitor=monitor,
        baselines=baselines,
    )
)
"""HyFEM's registered recipe (default extractors of ``config.extractor``)."""


def spec_with(extractor_factory: ExtractorFactory | None) -> AlgorithmSpec:
    """HyFEM's spec with plug-in extractors: ``extractor_factory(block, shape, out_dim) ->
    torch.nn.Module`` for the server, the clients and the baselines (:data:`SPEC` itself for
    ``None``). The result is not registered; pass it to the runtime directly."""
    if extractor_factory is None:
        return SPEC
    return dataclasses.replace(
        SPEC,
        build_server=functools.partial(build_server, extractor_factory=extractor_factory),
        build_client=functools.partial(build_client, extractor_factory=extractor_factory),
        baselines=functools.partial(baselines, extractor_factory=extractor_factory),
    )
