"""Hybrid FedAvg, the baseline HyFDCA compares with (HyFDCA Sec. 2 and 5).

Each client runs local mini-batch SGD on its own block of ``w`` over its own samples, i.e. on
``(lambda/2)||w_k||^2 + (1/n_k) sum_{i in I_k} l_i(x_{k,i}^T w_k)`` (it sees only its features);
the server averages each feature's weight over the participating clients holding that feature,
weighted by their sample counts ("concatenating the model weights and averaging at the
overlaps"; with ``fit_intercept``, the default, the constant block ``intercept`` of the label
holders is one more such feature: :mod:`hybridfl.algorithms.convex.intercept`). Step size ``eta_t = lr / sqrt(t)`` in round ``t`` (the paper tunes ``a, b`` of a decaying
rate; our benchmark tunes ``lr`` on a grid).

Messages per round (one exchange): ``fedavg.fit`` server -> client ``w`` on its features, ``lr``,
steps; client -> server its local ``w_k`` and sample count. Setup: ``fedavg.hello`` (block names).

Modules: :mod:`.config`, :mod:`.client`, :mod:`.server`, :mod:`.spec` (:data:`SPEC`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridfl.algorithms.hybrid_fedavg.client import HybridFedAvgClient, loss_gradient_scale
from hybridfl.algorithms.hybrid_fedavg.config import HybridFedAvgConfig
from hybridfl.algorithms.hybrid_fedavg.server import HybridFedAvgServer
from hybridfl.algorithms.hybrid_fedavg.spec import SPEC
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.runtime.loop import ProgressFn
from hybridfl.runtime.simulation import RunResult, simulate

__all__ = [
    "SPEC",
    "HybridFedAvgClient",
    "HybridFedAvgConfig",
    "HybridFedAvgServer",
    "loss_gradient_scale",
    "run_hybrid_fedavg",
]


def run_hybrid_fedavg(
    split: DatasetSplit,
    partition: Partition,
    cfg: HybridFedAvgConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    fail_at: Any = (),
) -> RunResult:
    """Hybrid FedAvg in process (:func:`~hybridfl.runtime.simulation.simulate` of :data:`SPEC`) with
    the same metrics as HyFDCA (no dual, no encryption).

    Args:
        recorder: receives the raw bytes of every message (audits).
        checkpoint, resume: as :func:`hybridfl.algorithms.hyfdca.run_hyfdca` (the state is the
            server's ``w`` and sampling RNG, the transport's, and the history: clients keep
            nothing between rounds).
        fail_at: explicit ``(round, client)`` failures besides ``cfg.failure_rate``.

    Raises:
        HybridFLError: an input problem, or ``resume`` without a checkpoint of this federation.
    """
    return simulate(SPEC, split, partition, cfg, seed, progress, recorder, checkpoint, resume, None, fail_at)
