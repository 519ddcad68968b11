"""Running HyFEM end to end in the in-process simulation, with its baselines.

Metrics (HyFEM Sec. 4, SPEC.md "Test data"):

- ``server_accuracy`` (global accuracy): the server model on all test samples with all blocks;
- ``client_accuracy_mean`` (local accuracy): each client's model, i.e. what it receives from the
  server (``P_m Theta_0``, ``Pi_m w_0``), on all test samples with only its own blocks, averaged
  over clients; ``client_accuracy_local_mean`` is the same for the clients' models right after
  their ``Q`` local steps (before aggregation);
- ``centralized_accuracy``: the server-shaped model trained on all training data for ``T * Q``
  steps; ``standalone_accuracy_mean``: each client alone for ``T * Q`` steps, local inference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hybridfl.algorithms.baselines import (
    accuracy,
    make_model_factory,
    train_centralized,
    train_standalone,
)
from hybridfl.algorithms.hyfem import HyFEMClient, HyFEMConfig, HyFEMServer
from hybridfl.algorithms.registry import AlgorithmSpec, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.errors import PartitionError
from hybridfl.models.hybrid import ExtractorFactory, default_extractor
from hybridfl.runtime.checkpoint import (
    federation_state,
    open_for_resume,
    restore_federation,
    save_checkpoint,
)
from hybridfl.runtime.simulation import ProgressFn, RunResult, simulate
from hybridfl.runtime.transport import InProcessTransport


def build_hyfem(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int = 0,
    extractor_factory: ExtractorFactory | None = None,
    recorder: Callable[[bytes], None] | None = None,
) -> tuple[HyFEMServer, dict[str, HyFEMClient], InProcessTransport]:
    """Create the HyFEM server, one client per partition entry, and the in-process transport.

    Raises:
        PartitionError: a client without labels (HyFEM trains a classifier at every client).
    """
    for c in partition.clients:
        if not c.has_labels:
            raise PartitionError(f"HyFEM needs labels at every client, but client {c.client_id!r} has none (use a hybrid or horizontal partition).")
    factory = extractor_factory or default_extractor(cfg.extractor)
    schema = split.train.block_shapes
    C = split.train.n_classes
    server = HyFEMServer(schema, C, cfg, seed, factory)
    clients = {
        c.client_id: HyFEMClient(c.client_id, split.train.subset(c.sample_ids, c.blocks), schema, C, cfg, seed + 1 + i, factory)
        for i, c in enumerate(partition.clients)
    }
    return server, clients, InProcessTransport(clients, recorder, cfg.failure_rate, seed)


def run_hyfem(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    extractor_factory: ExtractorFactory | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> RunResult:
    """HyFEM for ``cfg.rounds`` rounds, then (if ``cfg.baselines``) the two baselines.

    Args:
        checkpoint: file to write the run's state to after every round (atomically).
        resume: continue from ``checkpoint`` (written by an interrupted run with the same config
            and seed) after its last completed round; the result equals an uninterrupted run's.
    """
    t_start = time.perf_counter()
    server, clients, transport = build_hyfem(split, partition, cfg, seed, extractor_factory, recorder)
    test = split.test
    start, history0 = 1, []
    if resume:
        done, arrays, meta = open_for_resume(checkpoint, "hyfem", clients)
        restore_federation(arrays, meta, server, clients, transport)
        start, history0 = done + 1, meta["history"]

    def after_round(rnd: int, history: list[dict[str, float]]) -> None:
        if checkpoint is None:
            return
        arrays, s_meta = federation_state(server, clients)
        save_checkpoint(checkpoint, rnd, arrays, {"algorithm": "hyfem", "clients": list(clients), "server": s_meta,
                                                  "transport": transport.get_state(), "history": history})

    def evaluate(rnd: int) -> dict[str, float]:
        row = {"server_accuracy": accuracy(server.model, test)}
        local = {cid: accuracy(server.client_model(cid), test) for cid in clients}
        after = {cid: accuracy(c.model, test) for cid, c in clients.items()}
        row["client_accuracy_mean"] = float(np.mean(list(local.values())))
        row["client_accuracy_local_mean"] = float(np.mean(list(after.values())))
        for cid, v in local.items():
            row[f"client_accuracy[{cid}]"] = v
        return row

    history = simulate(server, transport, cfg.rounds, evaluate, cfg.eval_every, progress, start, history0, after_round)
    last = history[-1]
    train_seconds = float(sum(r["seconds"] for r in history))
    summary: dict = {
        "algorithm": "hyfem",
        "variant": cfg.variant,
        "server_accuracy": last["server_accuracy"],
        "client_accuracy_mean": last["client_accuracy_mean"],
        "client_accuracy_local_mean": last["client_accuracy_local_mean"],
        "client_accuracy": {cid: last[f"client_accuracy[{cid}]"] for cid in clients},
        "rounds": cfg.rounds,
        "local_steps": cfg.local_steps,
        "clients": len(clients),
        "messages_total": transport.log.messages_total,
        "client_failures": len(transport.failures),
        "bytes_total": transport.log.bytes_total,
        "bytes_per_client": transport.log.per_client(),
        "server_width": server.classifier.width,
        "train_seconds": train_seconds,
    }
    if cfg.baselines:
        make = make_model_factory(split, cfg.extractor_dim, cfg.hidden, extractor_factory or default_extractor(cfg.extractor))
        budget = cfg.rounds * cfg.local_steps
        t0 = time.perf_counter()
        _, cen = train_centralized(split, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed)
        summary["centralized_seconds"] = time.perf_counter() - t0
        alone = train_standalone(split, partition, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed)
        summary["centralized_accuracy"] = cen
        summary["standalone_accuracy_mean"] = float(np.mean(list(alone.values())))
        summary["standalone_accuracy"] = alone
    else:
        summary["centralized_accuracy"] = None
        summary["standalone_accuracy_mean"] = None
    summary["wall_seconds"] = time.perf_counter() - t_start
    return RunResult(summary=summary, history=history, comm=transport.log)


def _run(
    split: DatasetSplit, partition: Partition, cfg: HyFEMConfig, seed: int, progress: ProgressFn | None = None,
    checkpoint: str | Path | None = None, resume: bool = False,
) -> RunResult:
    return run_hyfem(split, partition, cfg, seed, progress, checkpoint=checkpoint, resume=resume)


register(AlgorithmSpec("hyfem", HyFEMConfig, _run, "HyFEM-Avg / HyFEM-Prox: hybrid FL for deep models with classifier matching"))
