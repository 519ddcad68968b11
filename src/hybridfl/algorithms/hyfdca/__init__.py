"""HyFDCA: Hybrid Federated Dual Coordinate Ascent (HyFDCA paper, Sec. 3, Algorithms 1-5).

Solves ``min_w P(w) = (lambda/2)||w||^2 + (1/N) sum_i l_i(x_i^T w)`` (hinge, logistic or squared
loss; :mod:`hybridfl.algorithms.convex.losses`) when client ``k`` holds the samples ``I_k`` and,
for them, the feature blocks ``M_k`` (with ``fit_intercept``, the default, the label holders also
hold a constant block ``intercept`` whose weight is the intercept, regularised like every weight:
:mod:`hybridfl.algorithms.convex.intercept`; the paper fits none). Written once as client-side steps (:mod:`.client`,
:mod:`.segment`) and server-side steps (:mod:`.server`) that exchange
:class:`~hybridfl.runtime.messages.Message` objects, built in one place, :data:`SPEC`
(:mod:`.spec`); the server never touches client data. Settings: :mod:`.config`.

Samples are grouped into **segments**: the samples held by exactly the same set of clients
``B_i`` (in the grid partition of HyFDCA Fig. 2, one segment per sample group). Every vector the
protocol encrypts is per segment, in the segment's canonical order (sorted sample IDs), so the
server can add the ciphertexts of the clients of ``B_i`` slot by slot (CKKS) or value by value
(Paillier) without learning anything but the segment layout.

Setup (once, 3 exchanges; 6 with the default ``alignment: psi``):

1. ``hyfdca.hello``: client -> server its block names (no feature value, no label) and either its
   PSI blobs (``alignment: psi``, default: then ``hyfdca.psi_serve``, ``psi_result`` and
   ``psi_tags`` find every sample's holder set by private set intersection between the clients,
   the server relaying opaque blobs and learning only holder sets and sizes, :mod:`.align`) or its
   sample IDs (``alignment: plaintext``, the paper's setting);
2. ``hyfdca.init``: server -> client ``N``, ``lambda``, loss, ``H``, ``sigma'``, the segment of each
   of its samples (under ``psi``: its segments as holder sets), ``|B_s|`` and the per-(segment, block) weights ``1 / c(s, b)`` (``c`` = number of
   clients of the segment holding the block; 1 in a grid without replicas);
   client -> server ``enc(sum_b ||x_{k,i,b}||^2 / c)`` per segment (partial squared norms);
3. ``hyfdca.norms``: server -> client the encrypted sums over ``B_i``; clients decrypt
   ``q_i = ||x_i||^2``, the full squared norm that the closed form of Sec. 5 needs (ours: obtained
   once by the same secure sum as SecureInnerProduct, Alg. 2).

Round ``t`` with available clients ``K^t`` (Alg. 1; the practical variant of Sec. 5 that omits the
second SecureInnerProduct, line 18; 3 exchanges, 4 in a consensus-mode round with returning clients):

0. consensus mode only, if some client of ``K^t`` did not take part in round ``t-1`` (the
   returning clients ``K̂^t``): ``hyfdca.primal`` to them with the current ``enc(alpha)`` of their
   segments, and the server rebuilds ``w`` from their fresh primal shares (Alg. 1 lines 5-7).
1. ``hyfdca.ip`` (SecureInnerProduct, Alg. 2): server -> client ``w`` on its features (always, so a
   returning client is never stale in ``w``); client -> server ``enc(x_{k,i}^T w_k)`` per segment.
   The server adds, per segment, the newest share of every client of ``B_i`` (an absent client's
   share is its last one: stale under partial participation, exact with full participation).
2. ``hyfdca.dual`` (LocalDualMethod, Alg. 3 / 5): server -> client ``enc(x_i^T w)`` of its
   segments; the client decrypts and makes ``H`` SDCA coordinate steps on its own samples chosen
   without replacement (:meth:`RowData.dot_and_add`; the step is the closed form for hinge of
   Alg. 5 line 5, Sec. 5, garbled in the extracted text: our reading, with the CoCoA+ safety
   factor ``sigma'``, :mod:`hybridfl.algorithms.convex.losses`); client -> server ``enc((nu / |B_i|) dalpha_{k,i})``.
   Server: ``enc(alpha_i) += sum_{k in B_i and K^t} enc(...)`` (Alg. 1 lines 13-15).
3. ``hyfdca.primal`` (PrimalAggregation, Alg. 4): server -> client (consensus mode) the new
   ``enc(alpha)`` of its segments; client -> server, per feature,
   ``sum_{i in I_k} alpha_i x_{k,i,f} / c(s_i, b_f)`` (plaintext: ``w`` is public, HyFDCA
   Sec. 3.1). Server: ``w_f = (1/(lambda N)) sum_k share_{k,f}`` (an absent client's share is its
   last one). In consensus mode, with every (sample, block) cell held by exactly one client, this
   is exactly ``w(alpha)``.

LocalDualMethod variants (``dual_mode``): :mod:`.client` (``block``, ``consensus``) and
:mod:`.segment` (``segment``). Failures and partial participation: :mod:`.server`; reply checks: :mod:`.checks`; the output model (``output: average_last``): :mod:`.output`.

Encryption (:mod:`hybridfl.privacy`): every ``enc(...)`` above is a real ciphertext of the
configured scheme. The clients share one secret key given to them by a key dealer that is not the
server (:func:`.spec.deal_secrets`); the server object holds only the public material. ``alpha``
is never in the clear at the server (Sec. 3.1: "we choose to encrypt alpha"), nor are
inner-product shares.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridfl.algorithms.convex.monitor import ConvexProblem, Monitor, build_problem, plot_suboptimality
from hybridfl.algorithms.hyfdca.client import HyFDCAClient
from hybridfl.algorithms.hyfdca.config import PAPER_LATENCY, HyFDCAConfig
from hybridfl.algorithms.hyfdca.server import HyFDCAServer
from hybridfl.algorithms.hyfdca.spec import SPEC, dealer_of
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.partition import Partition
from hybridfl.privacy.he import KeyDealer
from hybridfl.runtime.loop import ProgressFn
from hybridfl.runtime.simulation import RunResult, simulate

__all__ = [
    "PAPER_LATENCY",
    "SPEC",
    "ConvexProblem",
    "HyFDCAClient",
    "HyFDCAConfig",
    "HyFDCAServer",
    "Monitor",
    "build_problem",
    "dealer_of",
    "plot_suboptimality",
    "run_hyfdca",
]


def run_hyfdca(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFDCAConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    recorder: Callable[[bytes], None] | None = None,
    dealer: KeyDealer | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    fail_at: Any = (),
) -> RunResult:
    """HyFDCA for ``cfg.rounds`` rounds in process (:func:`~hybridfl.runtime.simulation.simulate`
    of :data:`SPEC`) with per-round objective, gap, accuracy, bytes and modelled time.

    Args:
        recorder: receives the raw bytes of every message (audits).
        dealer: the clients' key pair (default: a new one of ``cfg.encryption``; on resume the
            checkpoint's).
        checkpoint: file to write the run's state to after every round (atomically, mode 0600):
            server (``w``, ``enc(alpha)``, cached shares), clients (their ``get_state``), transport
            log and failure draws, history, and with encryption the clients' shared key pair.
        resume: continue from ``checkpoint`` after its last completed round (build, setup,
            restore); the result equals an uninterrupted run's.
        fail_at: explicit ``(round, client)`` failures besides ``cfg.failure_rate``.

    Raises:
        HybridFLError: an input problem, or ``resume`` without a readable checkpoint of a HyFDCA
            run with these clients.
    """
    secrets = {"he_secret": dealer.to_bytes()} if dealer is not None else None
    return simulate(SPEC, split, partition, cfg, seed, progress, recorder, checkpoint, resume, secrets, fail_at)
