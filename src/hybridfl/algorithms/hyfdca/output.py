"""HyFDCA's output model (``output: average_last``, ``output: step_average``): averages of the server's iterates.

A round's output iterate is its last iterate ``w`` (``output: last``, HyFDCA Alg. 1), or with
``output: step_average`` (segment mode; our option, the default) the mean of the iterates after every SDCA step of the
round: SDCA's averaged output (Shalev-Shwartz & Zhang 2013, Thm. 2, for Lipschitz losses such as
the hinge) taken over one round. On MNIST binary (3 x 3 grid, batch 512) segment mode's last
iterate reaches relative suboptimality 1e-3 after 41 rounds or more, its step average after 9-10
(``benchmarks/results/hyfdca_speed.md``, batch 512). The protocol still steps from the last iterate.
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


class OutputModelMixin:
    """The averaged output model of :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`
    (uses its ``config``, ``he``, ``w``, ``enc_alpha``, ``seg_holders``, ``w_sum``, ``alpha_sum``,
    ``w_step`` and ``avg_count``)."""

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

    def round_output(self) -> np.ndarray:
        """The last round's output iterate ``(d,)``: its step average (``output: step_average``) when it
        has one, else the last iterate ``w``."""
        return self.w_step if self.w_step is not None else self.w

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
