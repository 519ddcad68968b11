"""HyFDCA's output model (``output: average_last``, ``output: step_average``): averages of the server's iterates.

A round's output iterate is its last iterate ``w`` (``output: last``, HyFDCA Alg. 1), or with
``output: step_average`` (segment mode; our option, the default) the mean of the iterates after every SDCA step of the
round and of the round before (:data:`STEP_WINDOW` rounds): SDCA's averaged output
(Shalev-Shwartz & Zhang 2013, Thm. 2, for Lipschitz losses such as the hinge) taken over the
last two rounds. On MNIST binary (3 x 3 grid, batch 512) segment mode's last iterate reaches
relative suboptimality 1e-3 after 41 rounds or more, the mean over one round after 9-12, over
two rounds after 9-10 (``benchmarks/results/hyfdca_speed.md``; :data:`STEP_WINDOW`). The protocol
still steps from the last iterate.
How the server gets the mean without any iterate but its own ``w``: pass ``k`` of the round
(``T_k`` steps, ``off_k`` steps before it, ``T`` in the round) changed ``w`` by ``dw_k``; its holders
send, with their PrimalAggregation share, their *position share* ``sum_i (p_i / T_k) delta_i x_i``
(``p_i`` a step's 0-based place in the pass,
:meth:`~hybridfl.algorithms.hyfdca.segment_client.SegmentClientMixin.position_share`; securely
aggregated like the shares), added into ``P_k``; then
``mean_t w_t = w - sum_k (off_k / T) dw_k + (T_k / T) P_k / (lambda N)`` (the parallel schedule:
one pass, ``w - P / (lambda N)``, each segment weighted by its own pass length). A pass that lost
a segment (a holder failed) counts only the segments it added; a round in which a holder of an
added segment missed its PrimalAggregation has no step average: its output iterate is then its
last. The
dual paired with the output model stays the last iterate's ``alpha``: ``P(mean w) - D(alpha)``
still bounds the output's suboptimality (the monitor's ``model_gap``).

The output model is the round's output iterate, or with ``output: average_last`` the mean of
the output iterates of the second half of the rounds (suffix averaging, as SDCA's averaged output
for Lipschitz losses). The server keeps the running sums of the public ``w`` and of ``enc(alpha)`` (one
ciphertext addition per segment and round, never decrypted); the protocol itself keeps stepping
from the last iterate. :class:`OutputModelMixin` is part of
:class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`.
"""

from __future__ import annotations

import numpy as np

STEP_WINDOW = 2
"""``output: step_average`` averages the iterates of this many rounds: the round's own mean
iterate ``w_step`` and the one before, weighted by their steps. Measured on MNIST binary (3 x 3
grid, rounds to relative suboptimality 1e-3; seeds 0, 1, 2 at batch 512, seed 0 at 128, seeds
0, 1 at 1024): one round 11, 10, 9, 12, 10, 10; two rounds 10, 9, 9, 10, 10, 9 (never later;
three rounds: the same at 1e-3, later at 2e-3 in two runs; the mean since the middle round:
later in three)."""


class OutputModelMixin:
    """The averaged output model of :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`
    (uses its ``config``, ``he``, ``w``, ``enc_alpha``, ``seg_holders``, ``w_sum``, ``alpha_sum``,
    ``step_window`` and ``avg_count``)."""

    def _output_reset(self) -> None:
        """No averages yet: suffix averaging's (``output: average_last``) running sums of ``w`` and
        ``enc(alpha)`` since :attr:`average_start` and their count; the step average's
        (``output: step_average``) output rounds ``step_window`` (:meth:`set_step_average`)."""
        self.w_sum = np.zeros(self.d)
        self.alpha_sum: list[bytes] = []
        self.avg_count = 0
        self.step_window: list[tuple[np.ndarray, int]] = []

    @property
    def w_step(self) -> np.ndarray | None:
        """The last round's own mean iterate ``(d,)`` (``output: step_average``), the newest of
        ``step_window``; ``None`` when that round had no step average (or before any round)."""
        return self.step_window[-1][0] if self.step_window else None

    @property
    def average_start(self) -> int | None:
        """First round whose iterate enters the averaged output model (``output: average_last``:
        the second half of the ``rounds``; at least the final round), or ``None`` when averaging is off."""
        cfg = self.config
        if cfg.average_last <= 0:
            return None
        return max(1, cfg.rounds - max(1, round(cfg.average_last * cfg.rounds)) + 1)

    def _accumulate_average(self, rnd: int) -> None:
        """Suffix averaging (``output: average_last``): add this round's ``w`` (public) and, under
        encryption, ``enc(alpha)`` per segment to the running sums (the server never decrypts
        them). With ``w = w(alpha)`` (segment and consensus modes) the averaged pair stays
        consistent: ``mean_t w(alpha_t) = w(mean_t alpha_t)``; by convexity
        ``P(mean w) <= mean P(w_t)`` and ``D(mean alpha) >= mean D(alpha_t)``, so the averaged gap is at
        most the mean of the iterates' gaps (Shalev-Shwartz & Zhang 2013, SDCA, Thm. 2 averages
        the second half of the iterates for Lipschitz losses such as the hinge)."""
        start = self.average_start
        if start is None or rnd < start:
            return
        if self.avg_count == 0:
            self.w_sum = self.round_output().copy()
            self.alpha_sum = list(self.enc_alpha)
        else:
            self.w_sum = self.w_sum + self.round_output()
            self.alpha_sum = [self.he.add([a, b]) for a, b in zip(self.alpha_sum, self.enc_alpha)]
        self.avg_count += 1

    def step_average_of(self, passes: list[tuple[np.ndarray, np.ndarray | None, int]]) -> np.ndarray | None:
        """The mean ``(d,)`` of the iterates after every SDCA step of a round (module docstring)
        from its passes in order: (change of ``w`` ``(d,)``, position sum ``P_k`` ``(d,)`` or ``None``
        if the pass's PrimalAggregation missed a reply, steps ``T_k``). ``None`` if any pass has no
        position sum; the last iterate ``w`` if the round made no step."""
        if any(p is None for _, p, _ in passes):
            return None
        total = sum(t for _, _, t in passes)
        if total == 0:
            return self.w.copy()
        out, off = self.w.copy(), 0
        lam_n = self.config.lam * self.N
        for dw, pos, t in passes:
            out -= (off / total) * dw + (t / total) * pos / lam_n
            off += t
        return out

    def set_step_average(self, passes: list[tuple[np.ndarray, np.ndarray | None, int]]) -> None:
        """``output: step_average``, the end of a round: the output window gets its own mean
        iterate (:meth:`step_average_of` of its passes), the last :data:`STEP_WINDOW` rounds'
        ``(w_step, steps)`` in a row kept; a round without a step average empties it."""
        mean = self.step_average_of(passes)
        if mean is None:
            self.step_window = []
            return
        steps = sum(t for _, _, t in passes)
        self.step_window = [*self.step_window, (mean, steps)][-STEP_WINDOW:]

    def round_output(self) -> np.ndarray:
        """The last round's output iterate ``(d,)``: with a step average (``output: step_average``)
        the mean of the iterates of its window, the last :data:`STEP_WINDOW` rounds (each round's
        ``w_step`` weighted by its steps; the round's own when the window made no step), else the
        last iterate ``w``."""
        if self.w_step is None:
            return self.w
        total = sum(t for _, t in self.step_window)
        if len(self.step_window) < 2 or total == 0:
            return self.w_step
        return sum((t / total) * m for m, t in self.step_window)

    def output_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The step average's part of the server's checkpoint: the window's iterates
        ``w_step.<j>`` (the last is ``w_step``) and, in the meta, their steps."""
        arrays = {f"w_step.{j}": m.copy() for j, (m, _) in enumerate(self.step_window)}
        return arrays, {"step_window": [int(t) for _, t in self.step_window]}

    def set_output_state(self, arrays: dict, meta: dict) -> None:
        """Restore :meth:`output_state` (a checkpoint from before the window: ``w_step`` alone)."""
        steps = meta.get("step_window")
        if steps is None:
            w = arrays.get("w_step")
            self.step_window = [] if w is None else [(np.asarray(w, dtype=np.float64).copy(), 1)]
        else:
            self.step_window = [
                (np.asarray(arrays[f"w_step.{j}"], dtype=np.float64).copy(), int(t)) for j, t in enumerate(steps)
            ]

    def output_w(self) -> np.ndarray:
        """The output model ``(d,)``: the mean of the rounds' output iterates over the averaged
        rounds once averaging has started (``output: average_last``), else the last round's output iterate
        (:meth:`round_output`)."""
        return self.w_sum / self.avg_count if self.avg_count else self.round_output()

    def output_alpha_ciphertexts(self) -> tuple[list[tuple[tuple[str, ...], bytes]], int]:
        """The dual of the output model for an outside monitor with the key: ((segment holder set,
        ciphertext) per segment, divisor): the encrypted sums of ``alpha`` over the averaged rounds
        and their count, or ``enc(alpha)`` and 1 before averaging starts. A segment's values are in
        the order of its sample IDs; the server knows only its holders (a sorted tuple of client
        names): the monitor, which holds the partition, maps them to IDs."""
        if self.avg_count:
            return [(tuple(h), c) for h, c in zip(self.seg_holders, self.alpha_sum)], self.avg_count
        return self.alpha_ciphertexts(), 1

    def alpha_ciphertexts(self) -> list[tuple[tuple[str, ...], bytes]]:
        """(segment holder set, ``enc(alpha)``) per segment: for an outside monitor with the key
        (see :meth:`output_alpha_ciphertexts`)."""
        return [(tuple(h), c) for h, c in zip(self.seg_holders, self.enc_alpha)]
