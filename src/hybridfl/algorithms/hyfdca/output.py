"""HyFDCA's output model (``average_last``): suffix averaging of the server's iterates.

The output model is the last iterate ``w`` (default), or the mean of the iterates of the final
``average_last`` share of the rounds (suffix averaging, as SDCA's averaged output for Lipschitz
losses). The server keeps the running sums of the public ``w`` and of ``enc(alpha)`` (one
ciphertext addition per segment and round, never decrypted); the protocol itself keeps stepping
from the last iterate. :class:`OutputModelMixin` is part of
:class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`.
"""

from __future__ import annotations

import numpy as np


class OutputModelMixin:
    """The averaged output model of :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`
    (uses its ``config``, ``he``, ``w``, ``enc_alpha``, ``seg_holders``, ``w_sum``, ``alpha_sum`` and
    ``avg_count``)."""

    @property
    def average_start(self) -> int | None:
        """First round whose iterate enters the averaged output model (``average_last`` of the
        ``rounds``; at least the final round), or ``None`` when averaging is off."""
        cfg = self.config
        if cfg.average_last <= 0:
            return None
        return max(1, cfg.rounds - max(1, round(cfg.average_last * cfg.rounds)) + 1)

    def _accumulate_average(self, rnd: int) -> None:
        """Suffix averaging (``average_last``): add this round's ``w`` (public) and, under
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
            self.w_sum = self.w.copy()
            self.alpha_sum = list(self.enc_alpha)
        else:
            self.w_sum = self.w_sum + self.w
            self.alpha_sum = [self.he.add([a, b]) for a, b in zip(self.alpha_sum, self.enc_alpha)]
        self.avg_count += 1

    def output_w(self) -> np.ndarray:
        """The output model ``(d,)``: the mean of ``w`` over the averaged rounds once averaging has
        started (``average_last``), else the last iterate ``w``."""
        return self.w_sum / self.avg_count if self.avg_count else self.w

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
