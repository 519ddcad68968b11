"""HyFDCA PrimalAggregation, client side (:class:`PrimalClientMixin`, part of
:class:`~hybridfl.algorithms.hyfdca.client.HyFDCAClient`): accepting the server's shared ``alpha``
(decrypted, checked and projected: the threat model of :mod:`hybridfl.algorithms.hyfdca.client`),
the share ``X_k^T alpha`` (HyFDCA Alg. 4 lines 2-4) and its reply entries (masked under secure
aggregation: :mod:`.secure`), and segment mode's closing sweep, whose reply carries the share
without a ``hyfdca.primal`` exchange (:meth:`PrimalClientMixin.close_pass`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hybridfl.algorithms.convex.kernels import rmatvec
from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError


class PrimalClientMixin:
    """PrimalAggregation steps of the client (mixed into ``HyFDCAClient``, whose attributes they
    use: ``X``, ``y``, ``he``, ``alpha``, ``params``, ``protocol``, ``seg_rows``, ``seg_colw``,
    ``seg_scale``). State: ``alpha_agg`` ``(n_k,)``, its replica of the server's aggregated
    ``alpha`` before projection (the last decrypted one, or segment mode the one it computed at a
    closing sweep), from which :meth:`PrimalClientMixin.close_pass` adds the pass's changes."""

    def tolerance(self, rnd: int) -> np.ndarray:
        """Per sample ``(n_k,)``: how far a decrypted ``alpha_i`` of round ``rnd`` may stray from
        the protocol's exact bounds through encoding alone: ``1e-6`` plus :meth:`encoding_error`."""
        return 1e-6 + self.encoding_error(rnd)

    def encoding_error(self, rnd: int) -> np.ndarray:
        """Per sample ``(n_k,)``: the bound on the encoding error of a decrypted ``alpha_i`` of
        round ``rnd``: the scheme's resolution (Paillier ``2**-precision_bits``; CKKS ``1e4 *
        2**-scale_bits``, its measured noise; 0 in plaintext) times the values summed into it
        (``rnd`` rounds of ``|B_i|`` changes, plus one)."""
        res = 0.0
        if hasattr(self.he, "scale_bits"):
            res = 1e4 * 2.0 ** -float(self.he.scale_bits)
        elif hasattr(self.he, "scale"):
            res = 1.0 / float(self.he.scale)
        err = np.zeros(self.ids.size)
        nu = float(self.params.get("nu", 1.0))
        for s, rows in enumerate(self.seg_rows):
            holders = nu / self.seg_scale[s] if self.seg_scale[s] > 0 else 1.0
            err[rows] += (max(rnd, 1) * holders + 1.0) * res
        return err

    def accept_alpha(self, msg: Message, key: str = "alpha") -> None:
        """Consensus and segment modes: decrypt the server's ``enc(alpha)`` of its segments and
        take as its copy the point of its own feasible set nearest to it (module docstring, "Threat
        model"): the decrypted values must be finite and of its segments' lengths (refused
        otherwise); they are then projected, coordinate by coordinate, onto

        - hinge/logistic with ``nu <= 1``: the dual domain ``y_i alpha_i`` in ``[0, 1]``;
        - hinge/logistic: the change bound ``|alpha_i - last_i| <= nu R + tol`` (``R`` its own dual
          steps since its last accepted ``alpha``, never the server's round number);
        - squared: the dual ascent bound ``|alpha_i - y_i| <= sqrt(N) + tol``;

        (``tol``: :meth:`tolerance`): intervals holding ``last_i``, so a clip onto their
        intersection, the projection onto the dual feasible set (as SDCA's closed-form steps keep
        the dual in its domain: Shalev-Shwartz & Zhang 2013, the per-loss coordinate updates, e.g.
        hinge ``y_i alpha_i`` clipped to ``[0, 1]``). An honest ``alpha`` lies in it up to the
        encoding error: an honest run is unchanged. It projects rather than refuses: the bounds
        depend on its labels, so a refusal would tell the server a label (module docstring).

        Hinge, ``nu <= 1``, encrypted: a ``y_i alpha_i`` within :meth:`encoding_error` of a bound
        is set to it, where the exact sum lies (a dual a noise away would make each later step on
        it a tiny change, each paying segment mode's ``O(b)`` batch update).

        Raises:
            PayloadError: not one ciphertext of its length per segment, or non-finite values
                (checks of the message alone, never of the labels; the last copy is kept).
        """
        vals = self._decrypt_checked(msg, key)
        new = self.alpha.copy()
        for s, v in enumerate(vals):
            new[self.seg_rows[s]] = v
        self.alpha_agg = new.copy()
        self.take_alpha(new, self.protocol.rounds_now(msg))  # its own count, never the server's round number

    def take_alpha(self, new: np.ndarray, own_round: int) -> None:
        """Take ``new`` ``(n_k,)`` (the server's aggregated ``alpha``, decrypted or, segment mode,
        computed by the client itself: :meth:`close_pass`) projected as :meth:`accept_alpha`
        says as its copy ``alpha``; ``own_round`` is its own round count."""
        prm = self.params
        loss, nu = str(prm["loss"]), float(prm["nu"])
        band = self.encoding_error(own_round)
        tol = 1e-6 + band  # :meth:`tolerance`, with the encoding error computed once
        if loss == "squared":
            radius = math.sqrt(float(prm["N"])) + tol
            new = np.clip(new, self.y - radius, self.y + radius)
        else:
            if nu <= 1.0:
                b = self.y * new
                if loss == "hinge" and band.any():  # onto the box's bounds (docstring)
                    b = np.where(b <= band, 0.0, np.where(b >= 1.0 - band, 1.0, b))
                new = self.y * np.clip(b, 0.0, 1.0)
            reach = nu * self.protocol.rounds_for_alpha() + tol  # its own dual steps since, never msg.round
            new = np.clip(new, self.alpha - reach, self.alpha + reach)
        self.alpha = new
        self.alpha_round = own_round
        self.protocol.alpha_accepted()

    def on_primal(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.primal``: its share (masked with secure aggregation; with step averaging also
        its position share)."""
        # step_average: the position share is checked (and computed) before anything changes
        p = msg.payload
        extra = self.position_share(msg) if "avg_segs" in p and self.params.get("seg_step_average") else None
        return self.share_entries(msg, self.primal_share(msg), extra)

    def share_entries(
        self, msg: Message, share: np.ndarray, extra: np.ndarray | None, prefix: str = "", one_shot: bool = False
    ) -> dict:
        """The reply entries of its share ``(d_k,)`` (and position share ``extra``): with secure
        aggregation ``masked`` (its masked change, the exchange's fields named with ``prefix``:
        :meth:`~.secure.SecureSharesClientMixin.masked_share`) and ``self_shares`` (none in a
        ``one_shot`` exchange); else ``share`` (and ``position_share``) in the clear."""
        if self.params.get("secure_aggregation"):
            masked = self.masked_share(msg, share, extra, prefix, one_shot)
            shares = {"self_shares": self.secagg.last_shares} if self.secagg.last_shares else {}  # double masking
            return {"masked": masked, **shares}
        if extra is not None:
            return {"share": share, "position_share": extra}
        return {"share": share}

    def primal_share(self, msg: Message) -> np.ndarray:
        """PrimalAggregation, client part (HyFDCA Alg. 4 lines 2-4): ``sum_i alpha_i x_{k,i,f} / c``,
        ``(d_k,)`` (plaintext: ``w`` is public, HyFDCA Sec. 3.1).

        Consensus and segment modes first decrypt, check and project the new shared ``alpha``
        (:meth:`accept_alpha`; at the end of a round, Alg. 1 lines 16-17, and in consensus mode
        also at the start of a round for a returning client, lines 6-7); block mode uses no
        server-sent ``alpha`` (only its own duals): it commits its pending cell duals if the
        server says it received them (``commit``), else drops them.

        Raises:
            PayloadError: block mode: any key but ``commit`` (an ``alpha`` above all), or a
                ``commit`` that is not a bool; the other modes: a missing or malformed ``alpha``.
        """
        p = msg.payload
        secure = ("tag", "peers", "acked") if self.params.get("secure_aggregation") else ()
        avg = ("avg_segs",) if self.params.get("seg_step_average") else ()
        validate.only_keys(msg, ("commit" if self.params["dual_mode"] == "block" else "alpha", *secure, *avg))
        if secure:
            self.check_secure(msg)
        if self.params["dual_mode"] == "block":
            if "commit" in p and not isinstance(p["commit"], (bool, np.bool_)):
                raise PayloadError(msg, "commit", f"of type {type(p['commit']).__name__}, not a bool")
        else:
            self.accept_alpha(msg)
        if self.pending is not None:
            if bool(p.get("commit", True)):
                self.alpha = self.pending
            self.pending = None
        return self.own_share()

    def own_share(self) -> np.ndarray:
        """Its share ``sum_i alpha_i x_{k,i,f} / c`` ``(d_k,)`` of its copy ``alpha`` (HyFDCA
        Alg. 4 lines 2-4)."""
        share = np.zeros(self.X.shape[1])
        for s, rows in enumerate(self.seg_rows):
            v = rmatvec(self._seg_matrix(s), self.alpha[rows])  # compiled for CSR; skips the zero duals
            colw = self.seg_colw[s]
            share += v if colw is None else v * colw
        return share

    def close_pass(self, msg: Message) -> dict:
        """Segment mode, a closing ``hyfdca.sweep`` (``close``; checked by :meth:`check_sweep`,
        its pass's segments all finished): PrimalAggregation (HyFDCA Alg. 4 lines 2-4) without the
        ``hyfdca.primal`` exchange. All holders of a segment make the same exact steps, so the
        client knows the segment's new aggregated ``alpha`` itself: the server's sum
        ``enc(alpha) + sum_h enc((nu/|B|) dalpha_h)`` of its ``|B|`` holders' equal changes
        (:meth:`~.segment_pass.SegmentPass`), added here in the server's order (plaintext: the
        same floats; encrypted: the exact value of which the server holds an encoding). It takes
        it as its copy, projected as a decrypted one (:meth:`take_alpha`), and returns its share
        of it (and its position share, ``output: step_average``) as :meth:`share_entries` (the
        exchange's secure-aggregation fields named ``sa_tag``, ``sa_peers``, ``sa_acked``), masked
        as a one-shot exchange (pair masks of their own keys, no self-mask, never unmasked:
        :mod:`hybridfl.privacy.secagg`; the server adds the shares only when every client of the
        pass replied, so no unmasking exchange follows). If
        the server does not add the pass (a holder's reply missing), it sends ``hyfdca.primal``
        with ``enc(alpha)`` instead, which replaces this copy.

        Raises:
            PayloadError: a bad secure-aggregation field (:meth:`check_secure`).
            DataError: the share too large for the fixed point.
        """
        segs = sorted(self.sweep)
        new = self.alpha_agg.copy()
        for s in segs:
            rows = self.seg_rows[s]
            change = self.sweep[s]["delta"][rows] * self.seg_scale[s]  # each holder's enc((nu/|B|) dalpha)
            acc = np.zeros(rows.size)  # the plaintext backend's addition, in the server's order
            acc += new[rows]
            for _ in range(int(round(float(self.params["nu"]) / self.seg_scale[s]))):
                acc += change
            new[rows] = acc
        self.alpha_agg = new
        self.take_alpha(new.copy(), self.protocol.rounds_now(msg))
        extra = self.position_share_of(segs) if self.params.get("seg_step_average") else None
        return self.share_entries(msg, self.own_share(), extra, "sa_", one_shot=True)
