"""HyFEM: Hybrid Federated Matching (HyFEM paper, Algorithms 1-3, problem (6)).

Written once as client-side steps (:class:`HyFEMClient`, Alg. 2) and server-side steps
(:class:`HyFEMServer`, Alg. 1 with classifier matching, Alg. 3) that exchange
:class:`~hybridfl.runtime.messages.Message` objects, and built in one place, :data:`SPEC`, which
the in-process simulation and Flower consume unchanged.

Parts: :mod:`.config` (settings), :mod:`.client`, :mod:`.server`, :mod:`.baselines` (the
centralised and stand-alone baselines of HyFEM Sec. 4), :mod:`.spec` (the recipe: build,
evaluate, report).

HyFEM-Avg is ``mu1 = mu2 = 0``; HyFEM-Prox uses ``mu1``, ``mu2`` > 0 in the local steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from hybridfl.algorithms.hyfem.client import HyFEMClient
from hybridfl.algorithms.hyfem.config import HyFEMConfig, MatchingSettings
from hybridfl.algorithms.hyfem.server import HyFEMServer
from hybridfl.algorithms.hyfem.spec import SPEC, spec_with
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.models.hybrid import ExtractorFactory
from hybridfl.runtime.loop import ProgressFn
from hybridfl.runtime.simulation import RunResult, simulate

__all__ = ["SPEC", "HyFEMClient", "HyFEMConfig", "HyFEMServer", "MatchingSettings", "run_hyfem"]


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
    fail_at: Iterable[tuple[int, str]] = (),
) -> RunResult:
    """HyFEM in process for ``cfg.rounds`` rounds, then (if ``cfg.baselines``) the two baselines:
    :func:`hybridfl.runtime.simulation.simulate` of :data:`SPEC` (of :func:`spec_with` for
    plug-in extractors).

    Args:
        extractor_factory: plug-in extractors ``(block, shape, out_dim) -> torch.nn.Module``.
        recorder: receives the raw bytes of every message (audits).
        checkpoint: file to write the run's state to after every round (atomically).
        resume: continue from ``checkpoint`` (written by an interrupted run with the same config
            and seed) after its last completed round; the result equals an uninterrupted run's.
        fail_at: explicit ``(round, client)`` failures besides ``cfg.failure_rate``.

    Raises:
        PartitionError: a client without labels.
        HybridFLError: ``resume`` without a checkpoint of this federation.
    """
    return simulate(
        spec_with(extractor_factory),
        split,
        partition,
        cfg,
        seed,
        progress,
        recorder,
        checkpoint,
        resume,
        fail_at=fail_at,
    )
