"""Running HyFDCA, hybrid FedAvg and the centralised solver end to end (registered algorithms
``hyfdca``, ``hybrid_fedavg``, ``centralized``).

Per-round metrics (evaluated outside the protocol, like Flower's server-side ``evaluate_fn``; a
*monitor* with the training data and, for HyFDCA, the shared secret key decrypts the server's
``enc(alpha)``; nothing it does is counted as communication):

- ``primal``: ``P(w)`` of the server's output model ``w`` (the last iterate, or with
  ``average_last`` the mean of the averaged rounds' iterates, whose ``alpha`` is then also the
  mean: every HyFDCA metric below is of that averaged pair; ``last_iterate_relative_suboptimality``
  and ``averaged_rounds`` are added once averaging has started);
- ``relative_suboptimality``: ``(P(w) - P*) / P*`` with ``P*`` the cached centralised reference
  (:func:`hybridfl.algorithms.convex.reference.reference_optimum`);
- HyFDCA only: ``dual`` ``D(alpha)``, ``duality_gap`` ``P(w(alpha)) - D(alpha)`` (>= 0, a certificate:
  ``P(w(alpha)) - P* <= gap``), ``relative_duality_gap`` (gap / ``P(w(alpha))``), ``model_gap``
  ``P(w) - D(alpha)`` (certifies the server's model: ``P(w) - P* <= model_gap``);
- ``accuracy``: share of test samples with ``sign(x^T w) = y``;
- time: ``encryption_seconds`` (measured), ``model_seconds`` (clients in parallel + server +
  ``latency`` per exchange), cumulative ``time_model`` and ``time_model_no_encryption``.

The federated problem is the one the clients hold: the union of their samples, with a feature
block of a sample set to zero where no holder of that sample holds the block (in a grid partition
every cell is held, so it is the centralised problem on all training data).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.fedavg import (
    HybridFedAvgClient,
    HybridFedAvgConfig,
    HybridFedAvgServer,
)
from hybridfl.algorithms.convex.losses import dual, primal, sdca, w_of_alpha
from hybridfl.algorithms.convex.problem import features, positive_set, signed_labels
from hybridfl.algorithms.convex.reference import (
    Reference,
    liblinear_solve,
    reference_optimum,
)
from hybridfl.algorithms.hyfdca import HyFDCAClient, HyFDCAConfig, HyFDCAServer
from hybridfl.algorithms.registry import AlgorithmSpec, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.errors import HybridFLError, PartitionError
from hybridfl.privacy.he import KeyDealer, server_backend
from hybridfl.runtime.checkpoint import (
    federation_state,
    open_for_resume,
    restore_federation,
    save_checkpoint,
)
from hybridfl.runtime.simulation import ProgressFn, RunResult, simulate
from hybridfl.runtime.transport import InProcessTransport


@dataclass
class ConvexProblem:
    """The federated problem in the clear, for the monitor only (never given to the server).

    Attributes: ``ids`` ``(N,)``; ``X`` ``(N, d)``; ``y`` ``(N,)`` in {-1, +1}; ``X_test``, ``y_test``;
    ``lam``; ``loss``; ``positive`` class indices labelled +1; ``row`` sample ID -> row.
    """

    ids: np.ndarray
    X: object
    y: np.ndarray
    X_test: object
    y_test: np.ndarray
    lam: float
    loss: str
    positive: list[int]
    row: dict


def check_inputs(split: DatasetSplit, partition: Partition, loss: str, positive_classes, where: str) -> list[int]:
    """All input checks before any training (one sentence each).

    Raises:
        DataError: labels not binary for the loss; PartitionError: an empty client, a client
            without blocks or labels, a block or sample not in the dataset.
    """
    pos = positive_set(split.train, positive_classes, loss, where)
    if not partition.clients:
        raise PartitionError(f"the partition has no clients ({where}).")
    for c in partition.clients:
        if len(c.sample_ids) == 0:
            raise PartitionError(f"client {c.client_id!r} holds no samples ({where}).")
        if not c.blocks:
            raise PartitionError(f"client {c.client_id!r} holds no feature blocks ({where}).")
        if not c.has_labels:
            raise PartitionError(f"client {c.client_id!r} has no labels, but {where} needs the labels of every sample at its holders.")
        unknown = [b for b in c.blocks if b not in split.train.blocks]
        if unknown:
            raise PartitionError(f"client {c.client_id!r} holds block {unknown[0]!r}, which is not in dataset {split.name!r}.")
    return pos


def build_problem(split: DatasetSplit, partition: Partition, loss: str, lam: float, positive: list[int]) -> ConvexProblem:
    """The federated problem (see module docstring) as one matrix, for evaluation."""
    train = split.train
    ids = np.array(sorted({str(s) for c in partition.clients for s in c.sample_ids}))
    rows = train.positions(ids, where="partition")
    sub = train.take(rows)
    names = train.block_names
    held = np.zeros((ids.size, len(names)), dtype=bool)
    pos_of = {s: i for i, s in enumerate(ids)}
    for c in partition.clients:
        r = np.array([pos_of[str(s)] for s in c.sample_ids])
        for b in c.blocks:
            held[r, names.index(b)] = True
    blocks = {b: np.where(held[:, j].reshape(-1, *([1] * (sub.blocks[b].ndim - 1))), sub.blocks[b], 0.0) for j, b in enumerate(names)}
    from hybridfl.data.dataset import HybridDataset

    sub = HybridDataset(sub.name, sub.ids, sub.y, blocks, sub.classes)
    X = features(sub)
    Xt = features(split.test, sparse=sp.issparse(X))
    return ConvexProblem(ids, X, signed_labels(sub.y, positive), Xt, signed_labels(split.test.y, positive), lam, loss, positive,
                         pos_of)


def accuracy_of(w: np.ndarray, X, y: np.ndarray) -> float:
    z = np.asarray(X @ w).ravel()
    return float(np.mean(np.where(z >= 0, 1.0, -1.0) == y))


def _time_columns(history: list[dict], bandwidth_mbps: float | None) -> None:
    t = t_no = 0.0
    for row in history:
        comm = row.get("bytes", 0) * 8 / (bandwidth_mbps * 1e6) if bandwidth_mbps else 0.0
        t += row.get("model_seconds", 0.0) + comm
        t_no += row.get("model_seconds_no_encryption", 0.0) + comm
        row["time_model"] = t
        row["time_model_no_encryption"] = t_no


def plot_suboptimality(histories: dict[str, list[dict]], path: Path, title: str = "") -> None:
    """Relative suboptimality vs round and vs modelled time (log y), one curve per run; for runs
    with encryption time also the curve without it (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, hist in histories.items():
        rows = [r for r in hist if r.get("relative_suboptimality") is not None]
        if not rows:
            continue
        r_ = [r["round"] for r in rows]
        v = [max(r["relative_suboptimality"], 1e-12) for r in rows]
        axes[0].semilogy(r_, v, label=label)
        line = axes[1].semilogy([r["time_model"] for r in rows], v, label=f"{label}")
        enc = sum(r.get("encryption_seconds", 0.0) for r in hist)
        if enc > 0.01 * max(rows[-1]["time_model"], 1e-9):  # visible encryption share
            axes[1].semilogy([r["time_model_no_encryption"] for r in rows], v, "--", color=line[0].get_color(), label=f"{label} without encryption time")
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("modelled time (s): parallel clients + server + latency per exchange")
    for ax in axes:
        ax.set_ylabel("relative suboptimality (P(w) - P*) / P*")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _reference(prob: ConvexProblem, cfg) -> Reference | None:
    if not cfg.reference:
        return None
    return reference_optimum(prob.X, prob.y, prob.lam, prob.loss, sdca_epochs=cfg.reference_sdca_epochs)


# --------------------------------------------------------------------------------------------- HyFDCA
def build_hyfdca(split: DatasetSplit, partition: Partition, cfg: HyFDCAConfig, seed: int = 0,
                 recorder: Callable[[bytes], None] | None = None, dealer: KeyDealer | None = None):
    """Check inputs, deal keys, create server, clients and transport.

    The key dealer (not the server) generates the shared key pair; every client gets a backend
    with the secret key, the server only :meth:`KeyDealer.public_material`.

    Returns:
        ``(server, clients, transport, dealer)``.
    """
    pos = check_inputs(split, partition, cfg.loss, cfg.positive_classes, "HyFDCA")
    dealer = dealer or KeyDealer(cfg.encryption, cfg.paillier_bits, cfg.precision_bits, cfg.ckks_degree, cfg.ckks_scale_bits)
    server = HyFDCAServer(split.train.block_shapes, cfg, server_backend(cfg.encryption, dealer.public_material(), cfg.precision_bits), seed)
    clients = {
        c.client_id: HyFDCAClient(c.client_id, split.train.subset(c.sample_ids, c.blocks), pos, dealer.client_backend(), seed + 1 + i, cfg.sparse)
        for i, c in enumerate(partition.clients)
    }
    return server, clients, InProcessTransport(clients, recorder, cfg.failure_rate, seed), dealer


class Monitor:
    """Evaluates the server's state against the problem in the clear (outside the protocol)."""

    def __init__(self, prob: ConvexProblem, ref: Reference | None, dealer: KeyDealer | None = None):
        self.prob = prob
        self.ref = ref
        self.he = dealer.client_backend() if dealer is not None else None

    def alpha(self, server: HyFDCAServer) -> np.ndarray:
        """The dual variables of the server's output model ``(N,)`` (averaged when ``average_last``)."""
        a = np.zeros(self.prob.ids.size)
        cts, count = server.output_alpha_ciphertexts()
        for ids, c in cts:
            a[[self.prob.row[s] for s in ids]] = self.he.decrypt(c)
        return a / count

    def primal_metrics(self, w: np.ndarray) -> dict[str, float]:
        p = self.prob
        P = primal(p.X, p.y, w, p.lam, p.loss)
        row = {"primal": P, "accuracy": accuracy_of(w, p.X_test, p.y_test), "train_accuracy": accuracy_of(w, p.X, p.y)}
        if self.ref is not None:
            row["relative_suboptimality"] = (P - self.ref.objective) / abs(self.ref.objective)
        return row

    def __call__(self, server: HyFDCAServer) -> dict[str, float]:
        p = self.prob
        row = self.primal_metrics(server.output_w())
        if server.avg_count:  # averaging has started: also the last iterate's suboptimality
            row["averaged_rounds"] = server.avg_count
            if self.ref is not None:
                row["last_iterate_relative_suboptimality"] = (primal(p.X, p.y, server.w, p.lam, p.loss) - self.ref.objective) / abs(self.ref.objective)
        a = self.alpha(server)
        D = dual(p.X, p.y, a, p.lam, p.loss)
        Pa = primal(p.X, p.y, w_of_alpha(p.X, a, p.lam), p.lam, p.loss)
        row.update({"dual": D, "primal_of_alpha": Pa, "duality_gap": Pa - D, "relative_duality_gap": (Pa - D) / abs(Pa),
                    # also a certificate for the server's model: P(w) - P* <= P(w) - D(alpha)
                    "model_gap": row["primal"] - D})
        return row


def run_hyfdca(split: DatasetSplit, partition: Partition, cfg: HyFDCAConfig, seed: int = 0, progress: ProgressFn | None = None,
               recorder: Callable[[bytes], None] | None = None, dealer: KeyDealer | None = None,
               checkpoint: str | Path | None = None, resume: bool = False) -> RunResult:
    """HyFDCA for ``cfg.rounds`` rounds with per-round objective, gap, accuracy, bytes and time.

    Args:
        checkpoint: file to write the run's state to after every round (atomically): server
            (``w``, ``enc(alpha)``, cached shares), clients (duals, inner products), transport log
            and failure draws, history, and with encryption the clients' shared key pair (a
            simulated run holds every party's state: protect the file like the data).
        resume: continue from ``checkpoint`` after its last completed round; the setup exchanges
            are repeated (they are deterministic) and the result equals an uninterrupted run's.

    Raises:
        HybridFLError: ``resume`` without a readable checkpoint of a HyFDCA run with these clients.
    """
    t_start = time.perf_counter()
    start, history0 = 1, []
    if resume:
        names = [c.client_id for c in partition.clients]
        done, ck_arrays, ck_meta = open_for_resume(checkpoint, "hyfdca", names)
        if ck_meta.get("encryption", "none") != cfg.encryption:
            raise HybridFLError(f"checkpoint {str(checkpoint)!r} was written with encryption {ck_meta.get('encryption')!r}, the config says {cfg.encryption!r}.")
        if "dealer" in ck_arrays:
            dealer = KeyDealer.from_bytes(np.asarray(ck_arrays["dealer"], dtype=np.uint8).tobytes())
    server, clients, transport, dealer = build_hyfdca(split, partition, cfg, seed, recorder, dealer)
    if resume:
        server.setup(transport, transport.client_ids)
        restore_federation(ck_arrays, ck_meta, server, clients, transport)
        start, history0 = done + 1, ck_meta["history"]

    def after_round(rnd: int, history: list[dict]) -> None:
        if checkpoint is None:
            return
        arrays, s_meta = federation_state(server, clients)
        if cfg.encryption != "none":
            arrays["dealer"] = np.frombuffer(dealer.to_bytes(), dtype=np.uint8).copy()
        save_checkpoint(checkpoint, rnd, arrays, {"algorithm": "hyfdca", "clients": list(clients), "encryption": cfg.encryption,
                                                  "server": s_meta, "transport": transport.get_state(), "history": history})

    pos = clients[next(iter(clients))].y  # noqa: F841 (labels already checked)
    prob = build_problem(split, partition, cfg.loss, cfg.lam, positive_set(split.train, cfg.positive_classes, cfg.loss, "HyFDCA"))
    t_ref = time.perf_counter()
    ref = _reference(prob, cfg)
    ref_seconds = time.perf_counter() - t_ref
    monitor = Monitor(prob, ref, dealer)
    history = simulate(server, transport, cfg.rounds, lambda rnd: monitor(server), cfg.eval_every, progress, start, history0, after_round)
    _time_columns(history, cfg.bandwidth_mbps)
    last = history[-1]
    rounds_s = [r["seconds"] for r in history]
    summary = {
        "algorithm": "hyfdca",
        "loss": cfg.loss,
        "lambda": cfg.lam,
        "encryption": cfg.encryption,
        "rounds": cfg.rounds,
        "clients": len(clients),
        "samples": int(prob.ids.size),
        "features": int(prob.X.shape[1]),
        "participation": cfg.participation,
        "participation_mode": cfg.participation_mode,
        "failure_rate": cfg.failure_rate,
        "client_failures": len(transport.failures),
        "sigma": server.sigma,
        "local_steps_per_client": {cid: int(c.params["H"]) for cid, c in clients.items()},
        "primal_objective": last["primal"],
        "dual_objective": last["dual"],
        "duality_gap": last["duality_gap"],
        "relative_duality_gap": last["relative_duality_gap"],
        "model_gap": last["model_gap"],
        "reference_objective": ref.objective if ref else None,
        "reference_solver": ref.solver if ref else None,
        "reference": ref.meta() if ref else None,
        "reference_seconds_this_run": ref_seconds,
        "relative_suboptimality": last.get("relative_suboptimality"),
        "accuracy": last["accuracy"],
        "encryption_seconds": float(sum(r["encryption_seconds"] for r in history)),
        "setup": server.setup_stats,
        "round_seconds_mean": float(np.mean(rounds_s)),
        "train_seconds": float(sum(rounds_s)),
        "time_model_total": last["time_model"],
        "time_model_no_encryption_total": last["time_model_no_encryption"],
        "messages_total": transport.log.messages_total,
        "bytes_total": transport.log.bytes_total,
        "bytes_per_client": transport.log.per_client(),
        "averaged_rounds": server.avg_count,
        "last_iterate_relative_suboptimality": last.get("last_iterate_relative_suboptimality", last.get("relative_suboptimality")),
        "w": server.output_w().tolist() if server.w.size <= 2000 else None,
    }
    summary["report"] = [
        ["test accuracy (server model, all blocks)", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        [f"reference objective P* ({summary['reference_solver']})", summary["reference_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
        ["duality gap P(w(alpha)) - D(alpha)", summary["duality_gap"], "sci"],
        *([[f"last iterate's rel. suboptimality (output: mean of the last {server.avg_count} rounds)",
            summary["last_iterate_relative_suboptimality"], "sci"]] if server.avg_count else []),
        [f"encryption seconds ({cfg.encryption}, all rounds)", summary["encryption_seconds"], "plain"],
        ["mean wall seconds per round (clients simulated in sequence)", summary["round_seconds_mean"], "plain"],
    ]
    summary["wall_seconds"] = time.perf_counter() - t_start
    title = f"HyFDCA ({cfg.loss}, lambda={cfg.lam:g}, {cfg.encryption}) on {split.name}"
    return RunResult(summary=summary, history=history, comm=transport.log,
                     plots=[lambda out: plot_suboptimality({"HyFDCA": history}, Path(out) / "suboptimality.png", title)])


# --------------------------------------------------------------------------------------------- hybrid FedAvg
def run_hybrid_fedavg(split: DatasetSplit, partition: Partition, cfg: HybridFedAvgConfig, seed: int = 0,
                      progress: ProgressFn | None = None, recorder: Callable[[bytes], None] | None = None,
                      checkpoint: str | Path | None = None, resume: bool = False) -> RunResult:
    """Hybrid FedAvg (SPEC.md baseline) with the same metrics as HyFDCA (no dual, no encryption).

    Args:
        recorder: receives the raw bytes of every message (audits).
        checkpoint, resume: as :func:`run_hyfdca` (the state is the server's ``w`` and sampling
            RNG, the transport's, and the history: clients keep nothing between rounds).
    """
    pos = check_inputs(split, partition, cfg.loss, cfg.positive_classes, "hybrid FedAvg")
    server = HybridFedAvgServer(split.train.block_shapes, cfg, seed)
    clients = {c.client_id: HybridFedAvgClient(c.client_id, split.train.subset(c.sample_ids, c.blocks), pos, seed + 1 + i)
               for i, c in enumerate(partition.clients)}
    transport = InProcessTransport(clients, recorder, cfg.failure_rate, seed)
    start, history0 = 1, []
    if resume:
        done, ck_arrays, ck_meta = open_for_resume(checkpoint, "hybrid_fedavg", clients)
        server.setup(transport, transport.client_ids)
        server.w = np.asarray(ck_arrays["server.w"], dtype=np.float64).copy()
        server.rng.bit_generator.state = ck_meta["rng"]
        transport.set_state(ck_meta["transport"])
        start, history0 = done + 1, ck_meta["history"]

    def after_round(rnd: int, history: list[dict]) -> None:
        if checkpoint is not None:
            save_checkpoint(checkpoint, rnd, {"server.w": server.w.copy()},
                            {"algorithm": "hybrid_fedavg", "clients": list(clients), "rng": server.rng.bit_generator.state,
                             "transport": transport.get_state(), "history": history})

    prob = build_problem(split, partition, cfg.loss, cfg.lam, pos)
    ref = _reference(prob, cfg)
    monitor = Monitor(prob, ref)
    history = simulate(server, transport, cfg.rounds, lambda rnd: monitor.primal_metrics(server.w), cfg.eval_every, progress,
                       start, history0, after_round)
    _time_columns(history, None)
    last = history[-1]
    summary = {
        "algorithm": "hybrid_fedavg", "loss": cfg.loss, "lambda": cfg.lam, "rounds": cfg.rounds, "lr": cfg.lr,
        "local_steps": cfg.local_steps, "clients": len(clients), "primal_objective": last["primal"],
        "reference_objective": ref.objective if ref else None, "relative_suboptimality": last.get("relative_suboptimality"),
        "accuracy": last["accuracy"], "duality_gap": None, "encryption_seconds": 0.0,
        "messages_total": transport.log.messages_total, "bytes_total": transport.log.bytes_total,
        "bytes_per_client": transport.log.per_client(), "failure_rate": cfg.failure_rate, "client_failures": len(transport.failures),
    }
    summary["report"] = [
        ["test accuracy (server model, all blocks)", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        ["reference objective P*", summary["reference_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
    ]
    title = f"hybrid FedAvg ({cfg.loss}, lambda={cfg.lam:g}) on {split.name}"
    return RunResult(summary=summary, history=history, comm=transport.log,
                     plots=[lambda out: plot_suboptimality({"hybrid FedAvg": history}, Path(out) / "suboptimality.png", title)])


# --------------------------------------------------------------------------------------------- centralised
class CentralizedConfig(BaseModel):
    """The centralised solver of the same problem (``algorithm:`` section with ``name: centralized``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Literal["centralized"] = "centralized"
    loss: Literal["hinge", "logistic", "squared"] = "hinge"
    lam: float = Field(1e-4, gt=0, validation_alias=AliasChoices("lam", "lambda"))
    solver: Literal["liblinear", "sdca"] = "liblinear"
    tol: float = Field(1e-4, gt=0, description="liblinear tolerance")
    epochs: int = Field(100, ge=1, description="SDCA epochs")
    rounds: int = Field(1, ge=1, description="unused (kept so `--rounds` works)")
    positive_classes: list[int] | None = None
    reference: bool = True
    reference_sdca_epochs: int = Field(200, ge=1)


def run_centralized(split: DatasetSplit, partition: Partition, cfg: CentralizedConfig, seed: int = 0,
                    progress: ProgressFn | None = None) -> RunResult:
    """Solve the federated problem (all clients' data in one place) with liblinear or SDCA."""
    pos = check_inputs(split, partition, cfg.loss, cfg.positive_classes, "centralized")
    prob = build_problem(split, partition, cfg.loss, cfg.lam, pos)
    t0 = time.perf_counter()
    if cfg.solver == "liblinear":
        w = liblinear_solve(prob.X, prob.y, cfg.lam, cfg.loss, tol=cfg.tol)
    else:
        w, _, _ = sdca(prob.X, prob.y, cfg.lam, cfg.loss, epochs=cfg.epochs, seed=seed)
    seconds = time.perf_counter() - t0
    ref = _reference(prob, cfg)
    row = {"round": 1, "seconds": seconds, **Monitor(prob, ref).primal_metrics(w)}
    if progress:
        progress(1, 1, row)
    summary = {
        "algorithm": "centralized", "solver": cfg.solver, "loss": cfg.loss, "lambda": cfg.lam, "rounds": 1,
        "primal_objective": row["primal"], "reference_objective": ref.objective if ref else None,
        "reference_solver": ref.solver if ref else None, "relative_suboptimality": row.get("relative_suboptimality"),
        "accuracy": row["accuracy"], "solve_seconds": seconds, "duality_gap": None, "encryption_seconds": 0.0,
    }
    summary["report"] = [
        ["test accuracy", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
        [f"solve seconds ({cfg.solver})", seconds, "plain"],
    ]
    return RunResult(summary=summary, history=[row], comm=None)


def _run_hyfdca(split, partition, cfg, seed, progress=None, checkpoint=None, resume=False):
    return run_hyfdca(split, partition, cfg, seed, progress, checkpoint=checkpoint, resume=resume)


register(AlgorithmSpec("hyfdca", HyFDCAConfig, _run_hyfdca, "HyFDCA: secure primal-dual hybrid FL for convex models (hinge, logistic, squared)"))
register(AlgorithmSpec("hybrid_fedavg", HybridFedAvgConfig, run_hybrid_fedavg, "hybrid FedAvg: local SGD on own blocks, per-feature averaging (HyFDCA's baseline)"))
register(AlgorithmSpec("centralized", CentralizedConfig, run_centralized, "centralised solver (liblinear or SDCA) of the same convex problem"))
