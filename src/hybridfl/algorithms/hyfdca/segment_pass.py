"""HyFDCA ``dual_mode: segment``, the server's round: :func:`run_segment_round` gives the active
segments their passes (``segment_schedule``), each a :class:`SegmentPass` whose inputs are the
round, the selected clients, its segments and ``sigma'``, and whose result is a
:class:`PassResult`. The protocol and its messages: :mod:`hybridfl.algorithms.hyfdca.segment`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from hybridfl.algorithms.hyfdca import kinds
from hybridfl.algorithms.hyfdca.segment import concat_words, int_list
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError

if TYPE_CHECKING:
    from hybridfl.algorithms.hyfdca.server import HyFDCAServer


class PassResult(NamedTuple):
    """What one segment pass did."""

    done: set[int]
    """segments whose changes were added"""
    sent: set[str]
    """clients sent the pass"""
    answered: set[str]
    """clients that answered its PrimalAggregation"""
    average: tuple[np.ndarray, np.ndarray | None, int] | None
    """``output: step_average``: the pass's change of ``w`` ``(d,)``, its position sum ``(d,)``
    (``None`` if a holder of an added segment missed its reply) and its steps; else ``None``"""


def run_segment_round(
    srv: HyFDCAServer, rnd: int, transport: Transport, selected: list[str], stats: dict, t0: float, he0: float
) -> dict[str, float]:
    """One round of ``dual_mode: segment`` on the server ``srv``. A segment is active when all its
    holders are selected. ``segment_schedule: sequential`` gives the active segments one pass
    each, one after another in a random order, each pass followed by PrimalAggregation so the next
    one starts from the ``w`` the last one left: together exactly centralised SDCA over the active
    segments' samples (``sigma' = 1``). ``parallel`` runs all active segments' passes at once
    (CoCoA+ over segments, ``sigma'`` = number of active segments) and aggregates once. Returns the
    round's metrics (:meth:`HyFDCAServer.run_round`)."""
    cfg = srv.config
    chosen = set(selected)
    active = [g for g in range(len(srv.seg_n)) if all(h in chosen for h in srv.seg_holders[g])]
    if cfg.segment_schedule == "sequential":
        groups = [[int(g)] for g in srv.rng.permutation(active)] if active else []
    else:
        groups = [active] if active else []
    results: list[PassResult] = []
    sigmas = []
    for group in groups:
        sigma = float(cfg.sigma) if cfg.sigma is not None else float(len(group))
        sigmas.append(sigma)
        results.append(SegmentPass(srv, rnd, selected, group, sigma).run(transport, stats))
    if cfg.step_average:
        srv.set_step_average([r.average for r in results])
    srv._accumulate_average(rnd)
    out = srv._finish(stats, t0, he0)
    if cfg.step_average:
        out["step_average"] = float(srv.w_step is not None)
    sent = set().union(*(r.sent for r in results))
    answered = set().union(*(r.answered for r in results))
    out["participants"] = len(selected)
    out["failed"] = len(sent - answered)
    out["segments_updated"] = len(set().union(*(r.done for r in results)))
    out["segments_active"] = len(active)
    if sigmas:
        out["sigma"] = max(sigmas)
    return out


class SegmentPass:
    """One pass of the segments ``group`` (all holders selected): its holders walk each segment's
    mini-batches in the same order, one exchange per batch: the server adds their shares of the
    batch's inner products (each holder's block with the segment's changes so far, scaled by
    ``sigma'``; encrypted or masked) and returns the sum, so every holder makes the same exact SDCA
    steps. A segment loses the pass if any holder's reply is missing (nothing of it is added). Then
    dual aggregation and PrimalAggregation as in consensus mode (``w = w(alpha)``).

    Args:
        srv: the server; the pass draws its batch orders and seed from ``srv.rng`` and updates
            ``srv.enc_alpha`` and (through PrimalAggregation) ``srv.w``.
        rnd: the round (1-based).
        selected: the round's clients.
        group: the global segment indices of the pass.
        sigma: ``sigma'`` of the pass.
    """

    def __init__(self, srv: HyFDCAServer, rnd: int, selected: list[str], group: list[int], sigma: float):
        cfg = srv.config
        self.srv, self.rnd, self.sigma = srv, rnd, sigma
        self.orders: dict[int, list[int]] = {}  # segment -> its batches in the pass's order
        for g in group:
            nb = srv.seg_batch_counts[g]
            count = max(1, math.ceil(cfg.local_fraction * nb))
            self.orders[g] = [int(m) for _ in range(cfg.local_epochs) for m in srv.rng.permutation(nb)[:count]]
        self.seed = int(srv.rng.integers(2**31))
        self.K = [cid for cid in selected if any(g in self.orders for g in srv.client_segs[cid])]
        self.local = {cid: {g: j for j, g in enumerate(srv.client_segs[cid])} for cid in self.K}
        self.closed: dict[str, Message] = {}  # the closing sweeps' checked replies (with the shares)
        self.tag = 0  # secure aggregation: the exchange number of the closing sweeps' shares

    def _closing(self, cid: str, gs: list[int], step: int, done: set[int]) -> dict[str, Any]:
        """The entries that make client ``cid``'s sweep at ``step`` (of its running segments
        ``gs``) its closing one: ``close`` when ``gs`` all end at ``step`` and its other segments
        of the pass were added; with secure aggregation also the masked exchange's ``sa_tag``,
        ``sa_peers`` (every client of the pass) and ``sa_acked``. ``{}`` otherwise."""
        if any(len(self.orders[g]) != step for g in gs) or any(
            g not in done for g in self._segs(cid, self.orders) if g not in gs
        ):
            return {}
        return {"close": True, **self._share_fields(cid)}

    def _share_fields(self, cid: str) -> dict[str, Any]:
        """With secure aggregation, the entries that make client ``cid``'s message part of the
        pass's one-shot closing exchange (``sa_tag``, drawn once a pass, ``sa_peers``: every client
        of the pass, ``sa_acked``); ``{}`` without."""
        srv = self.srv
        if not srv.config.secure_aggregation:
            return {}
        if not self.tag:
            self.tag = srv.next_secure_tag()
        return srv.secure_fields(self.tag, self.K, cid, "sa_")

    def _share_check(self):
        """The check of a closing reply's PrimalAggregation share: one-shot masked words, or the
        share in the clear."""
        srv = self.srv
        return srv.check_masked(len(self.K) - 1, one_shot=True) if srv.config.secure_aggregation else srv._check_share

    def run(self, transport: Transport, stats: dict) -> PassResult:
        """The pass: ``hyfdca.segstart``, one ``hyfdca.sweep`` per batch position, each client's
        last one closing (its reply carries its PrimalAggregation share), or, when every segment
        of the pass has one holder, one ``hyfdca.segstart`` with ``solo`` (:meth:`_solo`); if a
        segment's pass was not added (a holder's reply missing), ``hyfdca.primal`` instead
        (:meth:`_close`)."""
        self.srv.sa_width = 2 if self.srv.config.step_average else 1
        if self.solo():
            done = self._solo(transport, stats)
        else:
            running = self._start(transport, stats)
            done = self._sweeps(transport, stats, running)
        if done == set(self.orders) and set(self.closed) == set(self.K):
            return self._closed(transport, stats, done)
        return self._close(transport, stats, done)

    def solo(self) -> bool:
        """Whether every segment of the pass has one holder (the pass is one exchange: :meth:`_solo`)."""
        return all(len(self.srv.seg_holders[g]) == 1 for g in self.orders)

    def _segs(self, cid: str, among: Any) -> list[int]:
        """The global segments of client ``cid`` that are in ``among``."""
        return [g for g in self.srv.client_segs[cid] if g in among]

    def _sizes(self, segs: list[int], step: int) -> list[int]:
        """The lengths of the batches at position ``step`` of each of ``segs``' orders."""
        return [len(self.srv.seg_batches_of(g, self.orders[g][step])) for g in segs]

    def _start_payload(self, cid: str, tag: dict) -> dict:
        """Client ``cid``'s ``hyfdca.segstart`` entries (with ``alpha`` if it was absent or failed
        last round; ``tag``: the masked inner products' exchange number, if any)."""
        srv, orders = self.srv, self.orders
        gs = self._segs(cid, orders)
        payload: dict = {
            "w": srv.w[srv.feat[cid]],
            "segs": [self.local[cid][g] for g in gs],
            "count": [len(orders[g]) for g in gs],
            "order": [m for g in gs for m in orders[g]],
            "seed": self.seed,
            "sigma": self.sigma,
            **tag,
        }
        if srv.last_round[cid] < self.rnd - 1:  # absent (or failed) last round: fresh alpha
            payload["alpha"] = [srv.enc_alpha[g] for g in srv.client_segs[cid]]
        return payload

    def _solo(self, transport: Transport, stats: dict) -> set[int]:
        """A pass whose segments each have one holder: one ``hyfdca.segstart`` with ``solo`` (and,
        with secure aggregation, the closing exchange's ``sa_tag``, ``sa_peers``, ``sa_acked``): the
        holder walks every batch itself (its inner products are the whole sum) and replies as a
        closing sweep (its ``enc((nu/|B|) dalpha)`` per segment and its PrimalAggregation share),
        so the pass is one exchange instead of ``1 + sweeps``. Returns the segments added."""
        srv, orders = self.srv, self.orders
        tag = srv._next_mask_tag()
        msgs = [
            Message(
                kinds.SEGSTART,
                SERVER,
                cid,
                self.rnd,
                {**self._start_payload(cid, tag), "solo": True, **self._share_fields(cid)},
            )
            for cid in self.K
        ]
        share_check = self._share_check()

        def check(r: Message) -> None:
            segs = srv.client_segs[r.sender]
            ends = int_list(r, "dalpha_segs")
            if int_list(r, "ip_segs") or sorted(ends) != sorted(
                self.local[r.sender][g] for g in self._segs(r.sender, orders)
            ):
                raise PayloadError(r, "dalpha_segs", "not ending every segment of its solo pass")
            srv._check_shares(r, "ip", [])
            srv.check_ciphertexts(r, "dalpha", [srv.seg_n[segs[j]] for j in ends])
            share_check(r)

        done: set[int] = set()
        for r in srv._exchange(transport, msgs, stats, check):
            self.closed[r.sender] = r
            segs = srv.client_segs[r.sender]
            for j, c in zip(r.payload["dalpha_segs"], r.payload["dalpha"]):
                g = segs[int(j)]
                srv.enc_alpha[g] = srv.he.add([srv.enc_alpha[g], c])
                done.add(g)
        return done

    def _start(self, transport: Transport, stats: dict) -> dict[int, Any]:
        """``hyfdca.segstart`` (:meth:`_start_payload`); returns the summed first-batch inner
        products of each segment all of whose holders answered."""
        srv, orders = self.srv, self.orders
        tag = srv._next_mask_tag()
        msgs = [Message(kinds.SEGSTART, SERVER, cid, self.rnd, self._start_payload(cid, tag)) for cid in self.K]
        shares: dict[int, list[Any]] = defaultdict(list)

        def check(r: Message) -> None:
            srv._check_shares(r, "ip", self._sizes(self._segs(r.sender, orders), 0))

        for r in srv._exchange(transport, msgs, stats, check):
            gs = self._segs(r.sender, orders)
            for g, c in zip(gs, srv._shares_of(r, "ip", self._sizes(gs, 0))):
                shares[g].append(c)
        return {g: srv._add_shares(shares[g]) for g in orders if len(shares[g]) == len(srv.seg_holders[g])}

    def _sweeps(self, transport: Transport, stats: dict, running: dict[int, Any]) -> set[int]:
        """One ``hyfdca.sweep`` exchange per batch position while a segment's pass goes on; a
        segment whose pass is complete at every holder gets its ``(nu/|B|) dalpha`` added to
        ``enc(alpha)``. Returns those segments."""
        srv, orders = self.srv, self.orders
        done: set[int] = set()
        step = 1  # the batch position the sweep replies' next shares are for
        while running:
            msgs = []
            swept: dict[str, list[int]] = {}
            tag = srv._next_mask_tag()
            closing: set[str] = set()
            for cid in self.K:
                gs = self._segs(cid, running)
                if gs:
                    swept[cid] = [self.local[cid][g] for g in gs]
                    u = [running[g] for g in gs]
                    payload = {"segs": swept[cid], "u": concat_words(u) if srv.masked else u, **tag}
                    payload.update(self._closing(cid, gs, step, done))
                    if "close" in payload:
                        closing.add(cid)
                    msgs.append(Message(kinds.SWEEP, SERVER, cid, self.rnd, payload))
            nxt: dict[int, list[Any]] = defaultdict(list)
            dal: dict[int, list[bytes]] = defaultdict(list)
            share_check = self._share_check()

            def check(r: Message, step: int = step) -> None:
                srv._check_sweep(r, swept[r.sender], orders, step)
                if r.sender in closing:  # its PrimalAggregation share
                    share_check(r)

            for r in srv._exchange(transport, msgs, stats, check):
                if r.sender in closing:
                    self.closed[r.sender] = r
                segs = srv.client_segs[r.sender]
                ip_segs = [segs[int(j)] for j in r.payload["ip_segs"]]
                for g, c in zip(ip_segs, srv._shares_of(r, "ip", self._sizes(ip_segs, step))):
                    nxt[g].append(c)
                for j, c in zip(r.payload["dalpha_segs"], r.payload["dalpha"]):
                    dal[segs[int(j)]].append(c)
            new_running = {}
            for g in running:
                n_h = len(srv.seg_holders[g])
                if len(dal[g]) == n_h:  # pass complete at every holder: add (nu/|B|) dalpha of each
                    srv.enc_alpha[g] = srv.he.add([srv.enc_alpha[g], *dal[g]])
                    done.add(g)
                elif len(nxt[g]) == n_h:
                    new_running[g] = srv._add_shares(nxt[g])
            running = new_running
            step += 1
        return done

    def _closed(self, transport: Transport, stats: dict, done: set[int]) -> PassResult:
        """PrimalAggregation from the closing sweeps' shares (HyFDCA Alg. 4 lines 5-6: every
        segment of the pass was added, so every client of the pass holds the server's new
        ``alpha`` and sent its share of it): with secure aggregation the sum of the one-shot masked
        shares, whose pair masks cancel because every client of the pass replied (no unmasking
        exchange: :meth:`~.secure.SecureSharesServerMixin.finish_one_shot`), else the shares in the
        clear; the clients counted took part in the round."""
        srv = self.srv
        w_before = srv.w.copy() if srv.config.step_average else None
        srv.position_sum = None
        if srv.config.secure_aggregation:
            answered = srv.finish_one_shot(self.tag, list(self.K), self.closed)
        else:
            answered = srv.clear_shares([self.closed[cid] for cid in self.K])
        return self._result(done, srv.took_part(self.rnd, answered), w_before)

    def _close(self, transport: Transport, stats: dict, done: set[int]) -> PassResult:
        """The fallback when a segment of the pass was not added (a holder's reply missing; the
        closing sweeps' shares, if any came, are of an ``alpha`` the server does not hold and are
        dropped, never unmasked): PrimalAggregation with the new ``alpha`` (every client that was
        sent the pass); with ``output: step_average`` each client also sends its position share of
        the segments whose pass was added (``avg_segs``)."""
        srv = self.srv
        average = srv.config.step_average
        msgs = []
        for cid in self.K:
            payload = {"alpha": [srv.enc_alpha[g] for g in srv.client_segs[cid]]}
            if average:
                payload["avg_segs"] = [self.local[cid][g] for g in self._segs(cid, done)]
            msgs.append(Message(kinds.PRIMAL, SERVER, cid, self.rnd, payload))
        w_before = srv.w.copy() if average else None
        answered = srv._primal_aggregation(self.rnd, transport, msgs, stats)
        return self._result(done, answered, w_before)

    def _result(self, done: set[int], answered: set[str], w_before: np.ndarray | None) -> PassResult:
        """The pass's :class:`PassResult` after its PrimalAggregation (``w_before``: ``w`` before it,
        ``output: step_average``)."""
        srv = self.srv
        if w_before is None:
            return PassResult(done, set(self.K), answered, None)
        # the position sum is whole when every holder of a segment whose pass was added answered
        # (the others send zeros); a pass that added nothing needs none
        steps = sum(len(srv.seg_batches_of(g, m)) for g in done for m in self.orders[g])
        needed = {cid for cid in self.K if self._segs(cid, done)}
        pos = srv.position_sum if srv.position_sum is not None and needed <= answered else None
        if pos is None and not needed:
            pos = np.zeros(srv.d)
        return PassResult(done, set(self.K), answered, (srv.w - w_before, pos, steps))
