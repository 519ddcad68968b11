"""Running FedSGD / FedBCD end to end in the in-process simulation (``algorithm: fedbcd``).

Metrics per evaluated round (outside the protocol, like the other algorithms' evaluation: every
party computes ``H_k`` of the test samples from its own blocks, the label party's top model turns
them into logits): ``auc`` (test ROC AUC, ``sklearn.metrics.roc_auc_score``), ``accuracy``
(logit > 0 means class 1), plus the round's mini-batch ``train_loss`` and step size ``lr``.
``results.json`` has the final ``auc``/``accuracy``, ``best_auc`` and, when ``target_auc`` is set,
``rounds_to_target`` (the first *evaluated* round whose test AUC reaches it, ``None`` if none did;
with ``eval_every`` > 1 it is a multiple of ``eval_every`` unless ``eval_dense_from`` switched to
evaluating every round once the AUC reached that value). With ``failure_rate`` > 0 it also has
``client_failures`` (failed (round, party) draws), ``skipped_rounds`` and ``skipped`` (each skipped
round with the parties whose reply was missing; see :mod:`hybridfl.algorithms.fedbcd`, "A missing
party"); a skipped round's row in ``metrics.csv`` has ``skipped = 1`` and ``missing``.

Checkpoint and resume (like HyFEM): with ``checkpoint``, the state after every round is written
atomically (the coordinator's batch, ``H_k``, batch sampler state, pending undos and skipped rounds;
every party's parameters, current batch, stored ``H_j`` and, while it owes an undo, its round
snapshot; torch's global random
state; the transport's log and failure draws; the metrics history); ``resume`` continues from it and
ends with the same model and metrics as an uninterrupted run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from hybridfl.algorithms.fedbcd import (
    MAX_PARTIES,
    MIN_PARTIES,
    FedBCDConfig,
    FedBCDCoordinator,
    FedBCDParty,
)
from hybridfl.algorithms.registry import AlgorithmSpec, register
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import Partition
from hybridfl.errors import ConfigError, DataError, PartitionError
from hybridfl.models.towers import (
    TowerFactory,
    bottom_factory,
    bottom_out_dim,
    make_top,
)
from hybridfl.runtime.checkpoint import (
    federation_state,
    open_for_resume,
    restore_federation,
    save_checkpoint,
)
from hybridfl.runtime.simulation import ProgressFn, RunResult
from hybridfl.runtime.transport import InProcessTransport


def party_input(ds: HybridDataset, blocks: list[str] | tuple[str, ...]) -> np.ndarray:
    """A party's model input from its blocks: one block as is ``(N, *shape)``; several blocks
    flattened and concatenated in the given order ``(N, sum_b d_b)``; float32."""
    if len(blocks) == 1:
        return np.ascontiguousarray(ds.blocks[blocks[0]], dtype=np.float32)
    return np.concatenate([ds.blocks[b].reshape(ds.n_samples, -1) for b in blocks], axis=1).astype(np.float32)


def check_inputs(split: DatasetSplit, partition: Partition, cfg: FedBCDConfig) -> None:
    """Everything that can be wrong with the data and the partition, before any training.

    Raises:
        PartitionError: K outside 2..8, not exactly one label party, a party without blocks or
            without samples, or no sample held by every party.
        DataError: labels that are not binary (FedBCD here trains a logistic model), or a test
            set with one class only (AUC undefined).
        ConfigError: ``model: cnn`` for a party whose input is not one image block.
    """
    K = partition.n_clients
    if not MIN_PARTIES <= K <= MAX_PARTIES:
        raise PartitionError(f"FedBCD needs {MIN_PARTIES} to {MAX_PARTIES} parties, the partition has {K}.")
    labels = [c.client_id for c in partition.clients if c.has_labels]
    if len(labels) != 1:
        raise PartitionError(f"FedBCD needs exactly one label party, the partition has {len(labels)} ({', '.join(labels) or 'none'}); use a vertical partition with label_party.")
    for c in partition.clients:
        if not c.blocks:
            raise PartitionError(f"party {c.client_id!r} holds no feature block.")
        if c.n_samples == 0:
            raise PartitionError(f"party {c.client_id!r} holds no sample.")
    common = set(partition.clients[0].sample_ids.astype(str))
    for c in partition.clients[1:]:
        common &= set(c.sample_ids.astype(str))
    if not common:
        raise PartitionError("no sample ID is held by every party, so the parties cannot be aligned.")
    if split.train.n_classes != 2:
        raise DataError(
            f"FedBCD trains a binary logistic model, but dataset {split.name!r} has {split.train.n_classes} classes "
            "(for MNIST select two digits with dataset.classes, e.g. [3, 8])."
        )
    if len(np.unique(split.test.y)) < 2:
        raise DataError(f"the test set of dataset {split.name!r} holds only one class, so its AUC is undefined.")
    if cfg.model == "cnn":
        shapes = split.train.block_shapes
        for c in partition.clients:
            if len(c.blocks) != 1 or len(shapes[c.blocks[0]]) != 3:
                raise ConfigError(f"algorithm.model 'cnn' needs every party to hold one image block, but party {c.client_id!r} holds {', '.join(c.blocks)}.")


def build_fedbcd(
    split: DatasetSplit,
    partition: Partition,
    cfg: FedBCDConfig,
    seed: int = 0,
    tower_factory: TowerFactory | None = None,
    top_factory: Callable[[list[int]], object] | None = None,
    recorder: Callable[[bytes], None] | None = None,
) -> tuple[FedBCDCoordinator, dict[str, FedBCDParty], InProcessTransport]:
    """The coordinator, one :class:`FedBCDParty` per partition entry and the in-process transport.

    Passive parties receive their blocks and IDs only (no labels). ``tower_factory`` /
    ``top_factory`` replace the built-in bottom/top models (see :mod:`hybridfl.models.towers`).
    The transport fails parties with ``cfg.failure_rate`` (draws seeded with ``seed``).
    """
    check_inputs(split, partition, cfg)
    factory = tower_factory or bottom_factory(cfg.model, cfg.representation_dim, cfg.hidden, cfg.channels)
    out_dim = bottom_out_dim(cfg.model, cfg.representation_dim)
    order = [c.client_id for c in partition.clients]
    torch.manual_seed(seed)
    bottoms, inputs = {}, {}
    for i, c in enumerate(partition.clients):
        ds = split.train.subset(c.sample_ids, list(c.blocks))
        inputs[c.client_id] = (ds, party_input(ds, list(c.blocks)))
        bottoms[c.client_id] = factory(i, tuple(inputs[c.client_id][1].shape[1:]), out_dim)
    with torch.no_grad():
        dims = [int(bottoms[cid](torch.from_numpy(inputs[cid][1][:1])).shape[1]) for cid in order]
    top = top_factory(dims) if top_factory is not None else make_top(cfg.model, dims)
    parties: dict[str, FedBCDParty] = {}
    for c in partition.clients:
        ds, x = inputs[c.client_id]
        if c.has_labels:
            parties[c.client_id] = FedBCDParty(c.client_id, ds.ids, x, bottoms[c.client_id], c.blocks, labels=ds.y, top=top, party_order=order)  # type: ignore[arg-type]
        else:
            parties[c.client_id] = FedBCDParty(c.client_id, ds.ids, x, bottoms[c.client_id], c.blocks)
    return FedBCDCoordinator(cfg, seed), parties, InProcessTransport(parties, recorder, cfg.failure_rate, seed)  # type: ignore[arg-type]


def joint_logits(parties: dict[str, FedBCDParty], partition: Partition, test: HybridDataset) -> np.ndarray:
    """Logits ``(n,)`` of the federated model on ``test`` (each party embeds its own blocks)."""
    hs = {c.client_id: parties[c.client_id].embed(party_input(test, list(c.blocks))) for c in partition.clients}
    label = next(p for p in parties.values() if p.is_label)
    return label.top_logits(hs)


def run_fedbcd(
    split: DatasetSplit,
    partition: Partition,
    cfg: FedBCDConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    tower_factory: TowerFactory | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> RunResult:
    """FedSGD / FedBCD for ``cfg.rounds`` rounds (or until ``target_auc`` with ``stop_at_target``).

    Args:
        checkpoint: file to write the run's state to after every round (atomically).
        resume: continue from ``checkpoint`` (written by an interrupted run with the same config
            and seed) after its last completed round; the result equals an uninterrupted run's.

    Raises:
        PartyMissingError: a party's reply is missing and ``on_missing_party`` is ``error``.
        HybridFLError: ``resume`` without a checkpoint, or a checkpoint of another run.
    """
    t_start = time.perf_counter()
    server, parties, transport = build_fedbcd(split, partition, cfg, seed, tower_factory, recorder=recorder)
    test = split.test
    if cfg.eval_subset is not None and cfg.eval_subset < test.n_samples:
        rows = np.sort(np.random.default_rng(seed + 12345).choice(test.n_samples, cfg.eval_subset, replace=False))
        test = test.take(rows)

    def evaluate() -> dict[str, float]:
        z = joint_logits(parties, partition, test)
        if not np.isfinite(z).all():  # diverged (too large a step size or Q): no AUC
            return {"auc": float("nan"), "accuracy": float("nan"), "diverged": 1.0}
        return {"auc": float(roc_auc_score(test.y, z)), "accuracy": float(np.mean((z > 0).astype(np.int64) == test.y))}

    history: list[dict[str, float]] = []
    rounds_to_target = None
    dense = False  # evaluate every round from now on (eval_dense_from reached)
    start, finished = 1, False
    if resume:
        done, arrays, meta = open_for_resume(checkpoint, "fedbcd", parties, "parties")
        restore_federation(arrays, meta, server, parties, transport, "party", lambda p, st: p.load_state_dict(st))
        torch.set_rng_state(torch.from_numpy(np.ascontiguousarray(arrays["torch_rng"], dtype=np.uint8)))
        history, rounds_to_target, dense, finished = meta["history"], meta["rounds_to_target"], meta["dense"], meta["finished"]
        start = done + 1
    else:
        server.setup(transport, transport.client_ids)

    def party_state(cid: str, p: FedBCDParty) -> dict[str, np.ndarray]:
        # a party's round snapshot can only be restored while it owes an undo: otherwise any
        # later undo is for a round it has not yet snapshotted (saves a copy of every model)
        sd = p.state_dict(snapshot=cid in server.undo)
        sd.setdefault("snap_round", np.array([-1], dtype=np.int64))
        return sd

    def save(rnd: int, stop: bool) -> None:
        arrays, s_meta = federation_state(server, parties, "party", party_state)
        arrays["torch_rng"] = torch.get_rng_state().numpy().copy()
        meta = {"algorithm": "fedbcd", "clients": list(parties), "server": s_meta, "transport": transport.get_state(), "history": history,
                "rounds_to_target": rounds_to_target, "dense": dense, "finished": stop}
        save_checkpoint(checkpoint, rnd, arrays, meta)  # type: ignore[arg-type]

    for rnd in range(start, cfg.rounds + 1):
        if finished:
            break
        n_before = len(transport.log.entries)
        t0 = time.perf_counter()
        row: dict[str, float] = {"round": rnd, **server.run_round(rnd, transport)}
        new = transport.log.entries[n_before:]
        row["bytes"] = sum(e.nbytes for e in new)
        row["messages"] = len(new)
        row["bytes_total"] = transport.log.bytes_total
        row["seconds"] = time.perf_counter() - t0
        last = rnd == cfg.rounds
        if rnd % cfg.eval_every == 0 or last or dense:
            row.update(evaluate())
            dense = dense or (cfg.eval_dense_from is not None and row["auc"] >= cfg.eval_dense_from)
            if rounds_to_target is None and cfg.target_auc is not None and row["auc"] >= cfg.target_auc:
                rounds_to_target = rnd
        history.append(row)
        finished = bool((cfg.stop_at_target and rounds_to_target is not None) or row.get("diverged") or not np.isfinite(row.get("train_loss", 0.0)))
        if checkpoint is not None:
            save(rnd, finished)
        if progress is not None:
            progress(rnd, cfg.rounds, row)
    if "auc" not in history[-1]:
        history[-1].update(evaluate())
    final = history[-1]
    aucs = [r["auc"] for r in history if "auc" in r and np.isfinite(r["auc"])]
    K = partition.n_clients
    summary: dict = {
        "algorithm": "fedbcd",
        "variant": cfg.variant,
        "method": cfg.label(),
        "local_steps": cfg.Q,
        "mu": cfg.mu,
        "parties": K,
        "label_party": server.label_party,
        "model": cfg.model,
        "rounds": int(final["round"]),
        "auc": final["auc"],
        "accuracy": final["accuracy"],
        "best_auc": max(aucs, default=float("nan")),
        "diverged": bool(final.get("diverged", 0.0)) or not np.isfinite(final.get("train_loss", 0.0)),
        "target_auc": cfg.target_auc,
        "rounds_to_target": rounds_to_target,
        "eval_samples": test.n_samples,
        "failure_rate": cfg.failure_rate,
        "on_missing_party": cfg.on_missing_party,
        "client_failures": len(transport.failures),
        "skipped_rounds": len(server.skipped),
        "skipped": [{"round": r, "missing": m} for r, m in server.skipped],
        "messages_total": transport.log.messages_total,
        "bytes_total": transport.log.bytes_total,
        "bytes_per_client": transport.log.per_client(),
        "train_seconds": float(sum(r["seconds"] for r in history)),
        "wall_seconds": time.perf_counter() - t_start,
    }
    report = [
        [f"{cfg.label()} (Q={cfg.Q}{f', mu={cfg.mu:g}' if cfg.mu else ''}, K={K}): test AUC", final["auc"], "percent"],
        ["test accuracy", final["accuracy"], "percent"],
        ["best test AUC", max(aucs, default=None), "percent"],
    ]
    if cfg.target_auc is not None:
        report.append([f"rounds to test AUC {100 * cfg.target_auc:g} %", rounds_to_target, "plain"])
    if cfg.failure_rate or server.skipped:
        report.append(["rounds skipped (a party's reply missing)", len(server.skipped), "plain"])
    summary["report"] = report
    return RunResult(summary=summary, history=history, comm=transport.log, plots=[lambda out: plot_auc(history, cfg, Path(out) / "auc.png")])


def plot_auc(history: list[dict[str, float]], cfg: FedBCDConfig, path: Path) -> Path:
    """Test AUC vs communication round (with the target as a dashed line)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hybridfl.reporting.results import atomic_write

    h = [r for r in history if "auc" in r]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([r["round"] for r in h], [100 * r["auc"] for r in h], "o-", ms=3, label=f"{cfg.label()} Q={cfg.Q}")
    if cfg.target_auc is not None:
        ax.axhline(100 * cfg.target_auc, ls="--", color="gray", label=f"target {100 * cfg.target_auc:g} %")
    ax.set_xlabel("communication round")
    ax.set_ylabel("test AUC (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return path


def _run(
    split: DatasetSplit, partition: Partition, cfg: FedBCDConfig, seed: int, progress: ProgressFn | None = None,
    checkpoint: str | Path | None = None, resume: bool = False,
) -> RunResult:
    return run_fedbcd(split, partition, cfg, seed, progress, checkpoint=checkpoint, resume=resume)


register(AlgorithmSpec("fedbcd", FedBCDConfig, _run, "FedSGD / FedBCD-p / FedBCD-s / FedPBCD-p: vertical FL with K parties and one label party"))
