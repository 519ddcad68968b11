"""The convex algorithms' shared evaluation: the federated problem in the clear, its checks, the
simulation's privileged :class:`Monitor`, modelled time columns and the suboptimality plot.

Used by HyFDCA (:mod:`hybridfl.algorithms.hyfdca`), hybrid FedAvg
(:mod:`hybridfl.algorithms.hybrid_fedavg`) and the centralised solver
(:mod:`hybridfl.algorithms.centralized`).

Per-round metrics (evaluated outside the protocol, like Flower's server-side ``evaluate_fn``; the
monitor holds the training data and, for HyFDCA, the clients' shared secret key, with which it
decrypts the server's ``enc(alpha)``; nothing it does is counted as communication):

- ``primal``: ``P(w)`` of the server's output model ``w`` (HyFDCA: the last iterate, or with
  ``output: average_last`` the mean of the averaged rounds' iterates, whose ``alpha`` is then also the
  mean: every HyFDCA metric below is of that averaged pair; ``last_iterate_relative_suboptimality``
  and ``averaged_rounds`` are added once averaging has started);
- ``relative_suboptimality``: ``(P(w) - P*) / P*`` with ``P*`` the cached centralised reference
  (:func:`hybridfl.algorithms.convex.reference.reference_optimum`);
- HyFDCA only: ``dual`` ``D(alpha)``, ``duality_gap`` ``P(w(alpha)) - D(alpha)`` (>= 0, a certificate:
  ``P(w(alpha)) - P* <= gap``), ``relative_duality_gap`` (gap / ``P(w(alpha))``), ``model_gap``
  ``P(w) - D(alpha)`` (certifies the server's model: ``P(w) - P* <= model_gap``);
- ``accuracy``: share of test samples with ``sign(x^T w) = y``; ``train_accuracy`` the same on
  the training samples;
- time (:func:`time_columns`): cumulative ``time_model`` and ``time_model_no_encryption`` from
  each round's modelled seconds (clients in parallel + server + ``latency`` per exchange) and, with
  a bandwidth, the bytes' transfer time.

The federated problem is the one the clients hold: the union of their samples, with a feature
block of a sample set to zero where no holder of that sample holds the block (in a grid partition
every cell is held, so it is the centralised problem on all training data). With
``fit_intercept`` it has one more column, the constant ``intercept`` block held by every client
holding labels (:mod:`hybridfl.algorithms.convex.intercept`), last in the feature order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex.intercept import split_with_intercept
from hybridfl.algorithms.convex.losses import dual, primal, w_of_alpha
from hybridfl.algorithms.convex.problem import features, positive_set, signed_labels
from hybridfl.algorithms.convex.reference import Reference, reference_optimum
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import Partition
from hybridfl.errors import PartitionError, UnknownBlockError
from hybridfl.privacy.he import HEBackend, KeyDealer, PlainBackend


@dataclass
class ConvexProblem:
    """The federated problem in the clear, for the monitor only (never given to the server).

    Attributes:
        ids: ``(N,)`` sample IDs (str, sorted): the union of the clients' samples.
        X: ``(N, d)`` float64 features (dense or CSR), blocks no holder of a sample holds set to 0.
        y: ``(N,)`` labels in {-1, +1}.
        X_test: ``(n_test, d)`` test features (all blocks); y_test: ``(n_test,)`` in {-1, +1}.
        lam: ``lambda`` > 0.
        loss: ``hinge`` | ``logistic`` | ``squared``.
        positive: class indices labelled +1.
        row: sample ID -> row of ``X``.
        segments: holder set (sorted tuple of client names) -> its sample IDs (str, sorted): to map
            HyFDCA's per-segment ``enc(alpha)`` (the server knows holder sets, not IDs) to rows.
    """

    ids: np.ndarray
    X: Any
    y: np.ndarray
    X_test: Any
    y_test: np.ndarray
    lam: float
    loss: str
    positive: list[int]
    row: dict
    segments: dict = field(default_factory=dict)


def check_inputs(
    split: DatasetSplit, partition: Partition, loss: str, positive_classes: Sequence[int] | None, where: str
) -> list[int]:
    """All input checks of a convex algorithm before any training (one sentence each, naming
    ``where``); returns the class indices labelled +1.

    Raises:
        DataError: labels not binary for the loss (and no valid ``positive_classes``).
        PartitionError: no clients, an empty client, a client without blocks or labels.
        UnknownBlockError: a client holds a block that is not in the dataset.
    """
    pos = positive_set(split.train, positive_classes, loss, where)
    if not partition.clients:
        raise PartitionError(f"the partition has no clients ({where}).")
    for c in partition.clients:
        if len(c.sample_ids) == 0:
            raise PartitionError(f"client {c.client_id!r} holds no samples ({where}).")
        if not c.blocks:
            raise PartitionError(f"client {c.client_id!r} holds no feature blocks ({where}).")
        needs_labels(c.client_id, c.has_labels, where)
        unknown = [b for b in c.blocks if b not in split.train.blocks]
        if unknown:
            raise UnknownBlockError(c.client_id, unknown[0], f"dataset {split.name!r}")
    return pos


def needs_labels(client_id: str, has_labels: bool, where: str) -> None:
    """A convex algorithm needs labels at every client (each trains on the rows it holds labels for).

    Raises:
        PartitionError: the client holds no labels (one sentence naming it and ``where``).
    """
    if not has_labels:
        from hybridfl.algorithms.spec import no_labels_message

        raise PartitionError(no_labels_message(where, client_id))


def client_positive_set(cd: Any, loss: str, positive_classes: Sequence[int] | None, where: str) -> list[int]:
    """The class indices labelled +1, from one client's own data (a
    :class:`~hybridfl.data.export.ClientData`), after checking it holds labels.

    Raises:
        PartitionError: the client holds no labels.
        DataError: its labels are not binary for the loss (and no valid ``positive_classes``).
    """
    needs_labels(cd.client_id, cd.has_labels, where)
    return positive_set(cd.data, positive_classes, loss, where)


def build_problem(
    split: DatasetSplit, partition: Partition, loss: str, lam: float, positive: Sequence[int]
) -> ConvexProblem:
    """The federated problem (see the module docstring) as one matrix, for evaluation.

    Raises:
        DataError: a sample ID of the partition is not in the training set.
    """
    train = split.train
    ids = np.array(sorted({str(s) for c in partition.clients for s in c.sample_ids}))
    rows = train.positions(ids, where="partition")
    sub = train.take(rows)
    names = train.block_names
    held = np.zeros((ids.size, len(names)), dtype=bool)
    pos_of = {s: i for i, s in enumerate(ids)}
    holders: dict[str, list[str]] = {}
    for c in partition.clients:
        r = np.array([pos_of[str(s)] for s in c.sample_ids])
        for b in c.blocks:
            held[r, names.index(b)] = True
        for s in c.sample_ids:
            holders.setdefault(str(s), []).append(c.client_id)
    segments: dict[tuple[str, ...], list[str]] = {}
    for s in ids:
        segments.setdefault(tuple(sorted(holders[s])), []).append(str(s))
    blocks = {
        b: np.where(held[:, j].reshape(-1, *([1] * (sub.blocks[b].ndim - 1))), sub.blocks[b], 0.0)
        for j, b in enumerate(names)
    }
    sub = HybridDataset(sub.name, sub.ids, sub.y, blocks, sub.classes)
    X = features(sub)
    Xt = features(split.test, sparse=sp.issparse(X))
    positive = list(positive)
    return ConvexProblem(
        ids,
        X,
        signed_labels(sub.y, positive),
        Xt,
        signed_labels(split.test.y, positive),
        lam,
        loss,
        positive,
        pos_of,
        {k: np.array(v) for k, v in segments.items()},
    )


def accuracy_of(w: np.ndarray, X: Any, y: np.ndarray) -> float:
    """Share of the rows of ``X`` (``(n, d)``, dense or CSR) with ``sign(x^T w) = y`` (``y`` in
    {-1, +1}, ``(n,)``; ``x^T w = 0`` counts as +1), in [0, 1]."""
    z = np.asarray(X @ w).ravel()
    return float(np.mean(np.where(z >= 0, 1.0, -1.0) == y))


_HOLDOUT: list = []  # (test set, (positive classes, intercept), X, y) of the last holdout_accuracy call


def holdout_accuracy(
    w: np.ndarray,
    test: HybridDataset | None,
    loss: str,
    positive_classes: Sequence[int] | None,
    where: str,
    intercept: bool = False,
) -> dict[str, float]:
    """``{"accuracy": ...}`` of ``w`` (``(d,)``, all blocks in schema order) on a labelled test set
    (the server's public evaluation, e.g. over Flower); ``{}`` without a test set. With
    ``intercept`` the test set lacks the constant block that ``w``'s last weight multiplies
    (:mod:`hybridfl.algorithms.convex.intercept`): a column of ones is appended to its features.
    The test features of the last test set are kept between calls (one conversion per run).

    Raises:
        DataError: the labels are not binary for the loss and no valid ``positive_classes``
            (names ``where``).
    """
    if test is None:
        return {}
    pos = positive_set(test, positive_classes, loss, where)
    if not _HOLDOUT or _HOLDOUT[0] is not test or _HOLDOUT[1] != (pos, intercept):
        X = features(test)
        if intercept:
            ones = np.ones((test.n_samples, 1))
            X = sp.hstack([X, sp.csr_matrix(ones)], format="csr") if sp.issparse(X) else np.hstack([X, ones])
        _HOLDOUT[:] = [test, (pos, intercept), X, signed_labels(test.y, pos)]
    return {"accuracy": accuracy_of(w, _HOLDOUT[2], _HOLDOUT[3])}


def time_columns(history: list[dict], bandwidth_mbps: float | None) -> None:
    """Add cumulative ``time_model`` and ``time_model_no_encryption`` (seconds) to every row of
    ``history`` in place: the sum of the rows' ``model_seconds`` (``model_seconds_no_encryption``)
    so far, plus ``bytes * 8 / (bandwidth_mbps * 1e6)`` per row when a bandwidth (Mbit/s) is given."""
    t = t_no = 0.0
    for row in history:
        comm = row.get("bytes", 0) * 8 / (bandwidth_mbps * 1e6) if bandwidth_mbps else 0.0
        t += row.get("model_seconds", 0.0) + comm
        t_no += row.get("model_seconds_no_encryption", 0.0) + comm
        row["time_model"] = t
        row["time_model_no_encryption"] = t_no


def plot_suboptimality(histories: dict[str, list[dict]], path: Path, title: str = "") -> None:
    """Write a PNG to ``path``: relative suboptimality vs round and vs modelled time (log y), one
    curve per run (label -> metrics rows with ``time_model``); for runs with a visible encryption
    share, also the curve without encryption time (dashed). Nothing is written when no run has a
    relative suboptimality (a deployment has no reference optimum)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hybridfl.files import atomic_write

    if not any(r.get("relative_suboptimality") is not None for h in histories.values() for r in h):
        return
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
            axes[1].semilogy(
                [r["time_model_no_encryption"] for r in rows],
                v,
                "--",
                color=line[0].get_color(),
                label=f"{label} without encryption time",
            )
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("modelled time (s): parallel clients + server + latency per exchange")
    for ax in axes:
        ax.set_ylabel("relative suboptimality (P(w) - P*) / P*")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(Path(path), buf.getvalue())


def suboptimality_plots(label: str, history: list[dict], title: str) -> list:
    """The plot writers of one convex run: ``[fn(out_dir)]`` writing ``out_dir/suboptimality.png``."""
    return [lambda out: plot_suboptimality({label: history}, Path(out) / "suboptimality.png", title)]


def reference_of(prob: ConvexProblem, cfg: Any) -> Reference | None:
    """The centralised reference optimum of ``prob`` (computed or loaded from the cache with
    ``cfg.reference_sdca_epochs``), or ``None`` when ``cfg.reference`` is off."""
    if not cfg.reference:
        return None
    return reference_optimum(prob.X, prob.y, prob.lam, prob.loss, sdca_epochs=cfg.reference_sdca_epochs)


class Monitor:
    """Evaluates a server's state against the problem in the clear (outside the protocol; the
    simulation's privileged evaluator).

    Args:
        prob: the federated problem.
        ref: its reference optimum, or ``None`` (no suboptimality metrics).
        dealer: the clients' shared key pair, to decrypt HyFDCA's ``enc(alpha)``; ``None``: no
            encryption (plaintext "ciphertexts").

    Attributes:
        ref_seconds: seconds spent computing (or loading) ``ref`` (set by :func:`make_monitor`).
    """

    def __init__(self, prob: ConvexProblem, ref: Reference | None, dealer: KeyDealer | None = None):
        self.prob = prob
        self.ref = ref
        self.he: HEBackend = dealer.client_backend() if dealer is not None else PlainBackend()
        self.ref_seconds = 0.0

    def alpha(self, server: Any) -> np.ndarray:
        """The dual variables ``(N,)`` of a HyFDCA server's output model (averaged when
        ``output: average_last``), decrypted from its ``output_alpha_ciphertexts()``."""
        cts, count = server.output_alpha_ciphertexts()
        return self.alpha_of(cts) / count

    def alpha_of(self, cts: Sequence[tuple[Any, bytes]]) -> np.ndarray:
        """The ``(N,)`` values of per-segment ciphertexts ``(key, ciphertext)``, the key a holder set
        (sorted tuple of client names; the segment's values in the order of its sorted sample IDs,
        :attr:`ConvexProblem.segments`) or the segment's sample IDs."""
        a = np.zeros(self.prob.ids.size)
        for key, c in cts:
            ids = self.prob.segments[key] if isinstance(key, tuple) else key
            a[[self.prob.row[s] for s in ids]] = self.he.decrypt(c)
        return a

    def primal_metrics(self, w: np.ndarray) -> dict[str, float]:
        """``primal`` ``P(w)``, test ``accuracy``, ``train_accuracy`` and, with a reference,
        ``relative_suboptimality`` of a model ``w`` ``(d,)``."""
        p = self.prob
        P = primal(p.X, p.y, w, p.lam, p.loss)
        row = {"primal": P, "accuracy": accuracy_of(w, p.X_test, p.y_test), "train_accuracy": accuracy_of(w, p.X, p.y)}
        if self.ref is not None:
            row["relative_suboptimality"] = (P - self.ref.objective) / abs(self.ref.objective)
        return row

    def __call__(self, server: Any) -> dict[str, float]:
        """Every metric of a HyFDCA server's output model and its dual (see the module docstring)."""
        p = self.prob
        row = self.primal_metrics(server.output_w())
        stepped = getattr(server, "w_step", None) is not None  # step_average: the output is not w
        if server.avg_count or stepped:  # averaging has started: also the last iterate's suboptimality
            if server.avg_count:
                row["averaged_rounds"] = server.avg_count
            if self.ref is not None:
                row["last_iterate_relative_suboptimality"] = (
                    primal(p.X, p.y, server.w, p.lam, p.loss) - self.ref.objective
                ) / abs(self.ref.objective)
        a = self.alpha(server)
        D = dual(p.X, p.y, a, p.lam, p.loss)
        Pa = primal(p.X, p.y, w_of_alpha(p.X, a, p.lam), p.lam, p.loss)
        row.update(
            {
                "dual": D,
                "primal_of_alpha": Pa,
                "duality_gap": Pa - D,
                "relative_duality_gap": (Pa - D) / abs(Pa),
                # also a certificate for the server's model: P(w) - P* <= P(w) - D(alpha)
                "model_gap": row["primal"] - D,
            }
        )
        return row


def make_monitor(
    split: DatasetSplit, partition: Partition, cfg: Any, where: str, dealer: KeyDealer | None = None
) -> Monitor:
    """A :class:`Monitor` of the federated problem of ``cfg`` (``loss``, ``lam``,
    ``positive_classes``, ``reference``; with ``fit_intercept`` the problem has the constant
    ``intercept`` block, :func:`~hybridfl.algorithms.convex.intercept.split_with_intercept`), with
    the reference's computing time in ``ref_seconds``.

    Raises:
        DataError: labels not binary for the loss (names ``where``); a dataset block already named
            ``intercept`` with ``fit_intercept``.
    """
    if getattr(cfg, "fit_intercept", False):
        split, partition = split_with_intercept(split, partition)
    pos = positive_set(split.train, cfg.positive_classes, cfg.loss, where)
    prob = build_problem(split, partition, cfg.loss, cfg.lam, pos)
    t0 = time.perf_counter()
    ref = reference_of(prob, cfg)
    mon = Monitor(prob, ref, dealer)
    mon.ref_seconds = time.perf_counter() - t0
    return mon
