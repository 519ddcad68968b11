"""HyFDCA ``dual_mode: segment``: the client and server steps of the exact segment passes (mixins of
:class:`~hybridfl.algorithms.hyfdca.client.HyFDCAClient` and
:class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`).

One ``alpha`` per sample, like consensus mode, but the holders of a segment make the **same
exact** SDCA steps, so averaging them changes nothing and no client ever acts on a wrong inner
product. The segment is cut once into fixed mini-batches of ``batch_size`` samples (the same
random split at every holder); at setup the holders' partial Gram matrices ``X_{k,B} X_{k,B}^T``
of each batch (upper triangles, all batches of a segment packed into one encrypted vector) are
added under encryption and returned, so every holder knows the batch's full
Gram ``X_B X_B^T`` (all blocks; a leak the other modes do not have: the holders learn the inner
products between pairs of their own samples in a batch). Each round (``hyfdca.segstart``, then one
``hyfdca.sweep`` per batch, then ``hyfdca.primal``) the holders walk the batches in a common random
order; before each batch the server adds their encrypted shares ``x_{k,i}^T (w_k + sigma' dw_k)``
(their block with the segment's changes so far) and every holder decrypts the exact inner
products; inside the batch the Gram matrix supplies the changes
(:func:`~hybridfl.algorithms.convex.losses.gram_steps`). A segment steps only when all its holders
are selected and answer (a failed holder costs the segment its pass; nothing partial is added).
``segment_schedule`` says how the active segments share a round:

* ``sequential`` (default): one pass per segment, one segment after another (random order), each
  followed by PrimalAggregation, so the next segment starts from the ``w`` the previous one left.
  The round is then *exactly* one epoch of centralised SDCA over the active segments' samples
  (``sigma' = 1``), whatever the number of segments. Cost: ``2 + n_s / b`` exchanges per segment,
  the segments one after another.
* ``parallel``: all active segments at once, aggregated once: CoCoA+ over segments with an exact
  local solver, ``sigma'`` = number of active segments. ``2 + max n_s / b`` exchanges per round,
  but the safe ``sigma'`` slows every segment down (``docs/results.md`` compares the two
  schedules on MNIST binary).

Either way the dual ascends every round (tested) and ``w = w(alpha)``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.convex.losses import gram_steps
from hybridfl.errors import ProtocolError
from hybridfl.privacy.he import HEBackend
from hybridfl.runtime import validate
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError


class SegmentClientMixin:
    """The client steps of ``dual_mode: segment`` (mixed into ``HyFDCAClient``, whose attributes
    they use: ``X``, ``y``, ``ids``, ``he``, ``alpha``, ``w``, ``params``, ``seg_rows``,
    ``seg_colw``, ``seg_scale``).

    State (all part of the client's ``get_state``): ``seg_global`` the global segment IDs,
    ``seg_batches`` the row positions of each fixed mini-batch, ``gram`` ``(b, b)`` the full Gram
    matrix of each mini-batch, ``sweep`` this round's pass over each active segment (batch
    ``order``, position ``j``, ``seed``, ``sigma``, ``dw`` ``(d_k,)``, ``delta`` ``(n_k,)``).
    """

    def _segment_init(self, p: Mapping[str, Any]) -> list[bytes]:
        """Setup (``hyfdca.init``): cut each segment into the fixed mini-batches (a permutation drawn
        from the global segment ID and the server's ``batch_seed``, the same at every holder) and
        return, per segment, one encrypted vector: the upper triangles (row by row) of the partial
        Gram matrices ``X_{k,B} diag(1/c) X_{k,B}^T`` of its batches, batch after batch, packed
        together (``sum_B b_B (b_B + 1) / 2`` values; under CKKS the slots of a ciphertext are
        filled across batches instead of one partly filled ciphertext per batch; the same values
        as one vector per batch, and every holder of a segment packs them in the same layout, so
        the server adds them slot by slot)."""
        b = int(p["batch_size"])
        self.seg_global = [int(g) for g in p["seg_global"]]
        self._batch_cache = {}
        self.seg_batches = []
        for g, rows in zip(self.seg_global, self.seg_rows):
            perm = rows[np.random.default_rng([int(p["batch_seed"]), g]).permutation(rows.size)]
            self.seg_batches.append([perm[m : m + b] for m in range(0, rows.size, b)])
        gram: list[bytes] = []
        for s in range(len(self.seg_rows)):
            colw = self.seg_colw[s]
            parts = []
            for m, rows in enumerate(self.seg_batches[s]):
                parts.append(kernels.upper_triangle(_partial_gram(self._batch(s, m)[0], colw)))
            gram.append(self.he.encrypt(np.concatenate(parts) if parts else np.zeros(0)))
        return gram

    def _store_gram(self, msg: Message) -> None:
        """Setup (``hyfdca.norms``): decrypt the holders' summed batch Gram matrices: one vector per
        segment, the upper triangles of its batches one after another (:meth:`_segment_init`).

        Raises:
            PayloadError: not one ciphertext per segment, one of another length, or non-finite values.
        """
        cts = validate.blobs(msg, "gram", len(self.seg_batches))
        gram = []
        for batches, ct in zip(self.seg_batches, cts):
            sizes = [rows.size * (rows.size + 1) // 2 for rows in batches]
            v = np.asarray(self.he.decrypt(ct), dtype=np.float64)
            if v.shape != (sum(sizes),) or not np.isfinite(v).all():
                raise PayloadError(msg, "gram", "holding triangles of another size or non-finite values")
            ends = np.cumsum(sizes)
            gram.append([_symmetric(v[e - n : e], rows.size) for rows, n, e in zip(batches, sizes, ends)])
        self.gram = gram

    def _batch(self, s: int, m: int) -> tuple[Any, np.ndarray]:
        """Batch ``m`` of segment ``s``: its rows ``X_{k,B}`` ``(b, d_k)`` (CSR with sorted indices,
        or dense; the same values as ``X[rows]``) and their labels ``(b,)``, sliced once and kept
        (not part of the state): a round then does no fancy row indexing."""
        cache = self.__dict__.setdefault("_batch_cache", {})
        hit = cache.get((s, m))
        if hit is None:
            rows = self.seg_batches[s][m]
            Xb = self.X[rows]
            if sp.issparse(Xb):
                Xb = sp.csr_matrix(Xb, dtype=np.float64)
                Xb.sort_indices()
            hit = cache[(s, m)] = (Xb, np.ascontiguousarray(self.y[rows]))
        return hit

    def _visit_order(self, s: int) -> np.ndarray:
        """The order ``(b,)`` in which this pass visits the samples of segment ``s``'s current
        batch: the next permutation drawn from the pass's generator, seeded by the server's pass
        ``seed`` and the global segment ID (one generator per pass, the same draws at every
        holder). The generator is kept beside the state; after a restored state it is drawn
        forward to the pass's position ``j``."""
        st = self.sweep[s]
        gens = self.__dict__.setdefault("_pass_rng", {})
        hit = gens.get(s)
        if hit is None or hit[1] != st["j"] or hit[2] != st["seed"]:
            gen = np.random.default_rng([st["seed"], self.seg_global[s]])
            for m in st["order"][: st["j"]]:
                gen.permutation(self.seg_batches[s][m].size)
            hit = [gen, st["j"], st["seed"]]
        order = hit[0].permutation(self.seg_batches[s][st["order"][st["j"]]].size)
        hit[1] += 1
        gens[s] = hit
        return order

    def _batch_share(self, s: int, m: int) -> bytes:
        """``enc(x_{k,i}^T (w_k + sigma' dw_k))`` for mini-batch ``m`` of segment ``s`` (its own
        block's part of the exact inner products, with the segment's changes this round)."""
        colw = self.seg_colw[s]
        ww = self.w + self.sweep[s]["sigma"] * self.sweep[s]["dw"]
        if colw is not None:
            ww = ww * colw
        return self.he.encrypt(np.asarray(self._batch(s, m)[0] @ ww, dtype=np.float64).ravel())

    def segment_start(self, msg: Message) -> dict:
        """Segment mode, round start (``hyfdca.segstart``): take ``w`` ``(d_k,)`` (and fresh
        ``alpha`` if returning, checked by ``accept_alpha``); for each active segment (every holder
        present) set up this round's batch order and return ``{"ip": [enc(first batch's shares)]}``.

        Raises:
            PayloadError: a malformed payload (``w``, segments, counts, order, seed, sigma) or a
                refused ``alpha``.
        """
        p = msg.payload
        validate.only_keys(msg, ("w", "segs", "count", "order", "seed", "sigma", "alpha"))
        w = self._w(msg)
        segs, counts, flat = _int_list(msg, "segs"), _int_list(msg, "count"), _int_list(msg, "order")
        if len(set(segs)) != len(segs) or any(not 0 <= s < len(self.seg_rows) for s in segs):
            raise PayloadError(msg, "segs", "naming a segment twice or one the client does not hold")
        if len(counts) != len(segs) or sum(counts) != len(flat) or any(c < 1 for c in counts):
            raise PayloadError(msg, "count", "not matching the segments and the order")
        pos = 0
        for s, c in zip(segs, counts):
            if any(not 0 <= m < len(self.seg_batches[s]) for m in flat[pos : pos + c]):
                raise PayloadError(msg, "order", f"naming a batch segment {s} does not have")
            pos += c
        validate.integer(msg, "seed", low=0)
        if "sigma" in p:
            validate.number(msg, "sigma", low=0.0)
        if "alpha" in p:
            self.accept_alpha(msg)
        self.w = w
        self.sweep = {}
        self._pass_rng = {}
        out, pos = [], 0
        for s, c in zip(segs, counts):
            self.sweep[s] = {
                "order": flat[pos : pos + c],
                "j": 0,
                "dw": np.zeros(self.X.shape[1]),
                "delta": np.zeros(self.ids.size),
                "seed": int(p["seed"]),
                "sigma": float(p.get("sigma", self.params["sigma"])),
            }
            pos += c
            out.append(self._batch_share(s, self.sweep[s]["order"][0]))
        return {"ip": out}

    def check_sweep(self, msg: Message) -> None:
        """Check a ``hyfdca.sweep`` before :meth:`segment_sweep`: only ``segs``, ``u``, ``gamma``;
        distinct segments with a pass under way; one ``u`` ciphertext of the current batch's length
        per segment; ``gamma`` a non-negative number.

        Raises:
            ProtocolError: a sweep of a segment whose pass was not started or is already done.
            PayloadError: a malformed payload.
        """
        p = msg.payload
        validate.only_keys(msg, ("segs", "u", "gamma"))
        segs = _int_list(msg, "segs")
        if len(set(segs)) != len(segs):
            raise PayloadError(msg, "segs", "naming a segment twice")
        cts = validate.blobs(msg, "u", len(segs))
        if "gamma" in p:
            validate.number(msg, "gamma", low=0.0)
        for s, ct in zip(segs, cts):
            st = self.sweep.get(s)
            if st is None or st["j"] >= len(st["order"]):
                raise ProtocolError(
                    f"HyFDCA client {self.client_id!r} got a sweep of segment {s} without a pass under way."
                )
            if HEBackend.length(ct) != self.seg_batches[s][st["order"][st["j"]]].size:
                raise PayloadError(msg, "u", f"holding a ciphertext of another length than segment {s}'s batch")

    def segment_sweep(self, p: Mapping[str, Any]) -> dict:
        """Segment mode (``hyfdca.sweep``, checked by :meth:`check_sweep`): exact SDCA steps on the
        current mini-batch of each listed segment (the decrypted inner products ``u`` are exact: every
        holder's block with the segment's changes so far; the batch Gram gives the changes within
        the batch). Every holder of a segment makes the same steps. Returns the next batch's shares
        (``ip``, ``ip_segs``), or ``enc((nu/|B|) dalpha)`` of the segment once its pass is done
        (``dalpha``, ``dalpha_segs``).

        Raises:
            ProtocolError: a sweep of a segment whose pass was not started or is already done, or
                ``u`` decrypting to non-finite values (nothing changes then).
        """
        prm = self.params
        lam_n = float(prm["lam"]) * float(prm["N"])
        segs = [int(v) for v in p["segs"]]
        for s in segs:
            st = self.sweep.get(s)
            if st is None or st["j"] >= len(st["order"]):
                raise ProtocolError(
                    f"HyFDCA client {self.client_id!r} got a sweep of segment {s} without a pass under way."
                )
        u_all = [np.asarray(self.he.decrypt(ct), dtype=np.float64) for ct in p["u"]]
        if not all(np.isfinite(u).all() for u in u_all):
            raise ProtocolError(f"the server sent HyFDCA client {self.client_id!r} a sweep with non-finite 'u'.")
        nxt, nxt_segs, dal, dal_segs = [], [], [], []
        for s, u0 in zip(segs, u_all):
            st = self.sweep[s]
            m = st["order"][st["j"]]
            rows = self.seg_batches[s][m]
            Xb, yb = self._batch(s, m)
            a = self.alpha[rows] + st["delta"][rows]
            d = gram_steps(
                self._visit_order(s),
                a,
                yb,
                u0,
                self.gram[s][m],
                str(prm["loss"]),
                lam_n,
                st["sigma"],
                float(p.get("gamma", 0.0)),
            )
            st["delta"][rows] += d
            st["dw"] += _rmatvec(Xb, d) / lam_n
            st["j"] += 1
            if st["j"] < len(st["order"]):
                nxt.append(self._batch_share(s, st["order"][st["j"]]))
                nxt_segs.append(s)
            else:
                dal.append(self.he.encrypt(st["delta"][self.seg_rows[s]] * self.seg_scale[s]))
                dal_segs.append(s)
        return {"ip": nxt, "ip_segs": nxt_segs, "dalpha": dal, "dalpha_segs": dal_segs}

    def _segment_state(self) -> dict[str, Any]:
        """The segment-mode part of ``get_state`` (``{}`` in the other modes): ``seg_global``,
        ``seg_batches.<s>`` (batch sizes), ``static:batch.<s>.<m>`` rows, ``static:gram.<s>.<m>``
        upper triangles, the pass under way (``sweep`` JSON plus ``sweep_dw.<s>``,
        ``sweep_delta.<s>``). The ``static:`` arrays are fixed at setup: they are built once and
        the same objects returned every time, so a checkpoint writes them once
        (:data:`~hybridfl.runtime.checkpoint.STATIC_MARK`)."""
        if not self.seg_global:
            return {}
        st: dict[str, Any] = {"seg_global": np.asarray(self.seg_global, dtype=np.int64)}
        fixed = self.__dict__.get("_static_state")
        if fixed is None or fixed[0] is not self.gram or fixed[1] is not self.seg_batches:
            arrays: dict[str, np.ndarray] = {}
            for s, batches in enumerate(self.seg_batches):
                for m, rows in enumerate(batches):
                    arrays[f"static:batch.{s}.{m}"] = np.asarray(rows, dtype=np.int64)
                    if self.gram:
                        arrays[f"static:gram.{s}.{m}"] = kernels.upper_triangle(self.gram[s][m])
            fixed = self._static_state = (self.gram, self.seg_batches, arrays)
        st.update(fixed[2])
        for s, batches in enumerate(self.seg_batches):
            st[f"seg_batches.{s}"] = np.asarray([rows.size for rows in batches], dtype=np.int64)
        st["sweep"] = json.dumps(
            {str(k): {f: x for f, x in v.items() if f not in ("dw", "delta")} for k, v in self.sweep.items()}
        )
        for k, v in self.sweep.items():
            st[f"sweep_dw.{k}"], st[f"sweep_delta.{k}"] = v["dw"].copy(), v["delta"].copy()
        return st

    def _set_segment_state(self, st: Mapping[str, Any]) -> None:
        """Restore what :meth:`_segment_state` returned (nothing if it was empty)."""
        if "seg_global" not in st:
            return
        self.seg_global = [int(g) for g in np.asarray(st["seg_global"])]
        self._batch_cache = {}
        self._pass_rng = {}
        n_seg = len(self.seg_global)
        pre = "static:" if "static:batch.0.0" in st else ""  # checkpoints before the static side file: no prefix
        self.seg_batches = [
            [
                np.asarray(st[f"{pre}batch.{s}.{m}"], dtype=np.int64).copy()
                for m in range(np.asarray(st[f"seg_batches.{s}"]).size)
            ]
            for s in range(n_seg)
        ]
        if n_seg and self.seg_batches[0] and f"{pre}gram.0.0" in st:
            self.gram = [
                [
                    _symmetric(np.asarray(st[f"{pre}gram.{s}.{m}"], dtype=np.float64), rows.size)
                    for m, rows in enumerate(b)
                ]
                for s, b in enumerate(self.seg_batches)
            ]
        self.sweep = {
            int(k): {
                **v,
                "dw": np.asarray(st[f"sweep_dw.{k}"], dtype=np.float64).copy(),
                "delta": np.asarray(st[f"sweep_delta.{k}"], dtype=np.float64).copy(),
            }
            for k, v in json.loads(str(st["sweep"])).items()
        }


def _int_list(msg: Message, key: str) -> list[int]:
    """The list (or integer array) of integers ``msg.payload[key]``.

    Raises:
        PayloadError: missing or not a list of integers.
    """
    v = msg.payload.get(key)
    if isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.ndim == 1:
        return [int(x) for x in v]
    if not isinstance(v, list) or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
        raise PayloadError(msg, key, "not a list of integers")
    return [int(x) for x in v]


DENSE_GRAM_LIMIT = 1 << 22
"""A sparse batch ``(b, d_k)`` with at most this many entries (32 MiB as float64) has its Gram
matrix computed dense (BLAS; several times faster than a sparse product at MNIST's density)."""


def _partial_gram(Xb: Any, colw: np.ndarray | None) -> np.ndarray:
    """``X_B diag(colw) X_B^T`` ``(b, b)`` float64 for a batch ``X_B`` ``(b, d_k)`` (``colw``
    ``(d_k,)`` or None for ones): dense through BLAS when the batch has at most
    :data:`DENSE_GRAM_LIMIT` entries, else as a sparse product."""
    if sp.issparse(Xb) and Xb.shape[0] * Xb.shape[1] > DENSE_GRAM_LIMIT:
        Xw = Xb if colw is None else Xb.multiply(colw[None, :]).tocsr()
        return kernels.as_f64((Xb @ Xw.T).toarray())
    D = kernels.as_f64(Xb.toarray() if sp.issparse(Xb) else Xb)
    return D @ (D if colw is None else D * colw).T


def _rmatvec(X: Any, d: np.ndarray) -> np.ndarray:
    """``X^T d`` ``(d,)`` for a batch ``X`` ``(n, d)`` (CSR: compiled, rows with ``d_i = 0``
    skipped; the same values as scipy's product)."""
    if sp.issparse(X):
        return kernels.csr_rmatvec(X.indptr, X.indices, X.data, kernels.as_f64(d), X.shape[1])
    return np.asarray(X.T @ d, dtype=np.float64).ravel()


def _symmetric(upper: np.ndarray, b: int) -> np.ndarray:
    """The ``(b, b)`` symmetric matrix whose upper triangle (row by row) is ``upper``."""
    return kernels.symmetric_from_upper(kernels.as_f64(upper), b)


class SegmentServerMixin:
    """The server steps of ``dual_mode: segment`` (mixed into ``HyFDCAServer``, whose attributes
    they use: ``config``, ``rng``, ``he``, ``w``, ``feat``, ``enc_alpha``, ``seg_n``,
    ``seg_holders``, ``client_segs``, ``last_round``)."""

    def _segment_init_payload(self, segs: list[int], batch_seed: int) -> dict[str, Any]:
        """The segment-mode entries of one client's ``hyfdca.init``: ``batch_size``, the global
        segment IDs ``seg_global`` and the ``batch_seed`` of the fixed mini-batches."""
        return {"batch_size": self.config.batch_size, "seg_global": list(segs), "batch_seed": batch_seed}

    def _sum_grams(self, replies: list[Message]) -> dict[int, bytes]:
        """Setup: the holders' encrypted partial Gram matrices added per segment (one packed
        vector per segment and holder, :meth:`SegmentClientMixin._segment_init`)."""
        gparts: dict[int, list[bytes]] = defaultdict(list)
        for r in replies:
            for g, c in zip(self.client_segs[r.sender], r.payload["gram"]):
                gparts[g].append(c)
        return {g: self.he.add(v) for g, v in gparts.items()}

    def gram_length(self, g: int) -> int:
        """The length of segment ``g``'s packed Gram vector: ``sum_B b_B (b_B + 1) / 2`` over its batches."""
        sizes = [len(self.seg_batches_of(g, m)) for m in range(self.seg_batch_counts[g])]
        return sum(b * (b + 1) // 2 for b in sizes)

    def seg_batches_of(self, g: int, m: int) -> range:
        """The positions of batch ``m`` of global segment ``g`` (its size is what the server checks)."""
        b = self.config.batch_size
        return range(m * b, min((m + 1) * b, self.seg_n[g]))

    def _check_sweep(self, r: Message, sent: list[int], orders: dict[int, list[int]], step: int) -> None:
        """A ``hyfdca.sweep`` reply: ``ip_segs`` and ``dalpha_segs`` split the segments it was sent
        (local indices, each once); ``ip`` holds one ciphertext of the next batch's length per
        ``ip_segs`` entry (a segment whose pass goes on), ``dalpha`` one of the segment's length
        per ``dalpha_segs`` entry (a finished pass).

        Raises:
            PayloadError: any of these fails.
        """
        segs = self.client_segs[r.sender]
        ip_segs, dal_segs = _int_list(r, "ip_segs"), _int_list(r, "dalpha_segs")
        if sorted(ip_segs + dal_segs) != sorted(sent):
            raise PayloadError(r, "ip_segs", "not splitting the segments it was sent")
        for j in ip_segs:
            if step >= len(orders[segs[j]]):
                raise PayloadError(r, "ip_segs", "continuing a pass that is over")
        for j in dal_segs:
            if step != len(orders[segs[j]]):
                raise PayloadError(r, "dalpha_segs", "ending a pass that is not over")
        self.check_ciphertexts(r, "ip", [len(self.seg_batches_of(segs[j], orders[segs[j]][step])) for j in ip_segs])
        self.check_ciphertexts(r, "dalpha", [self.seg_n[segs[j]] for j in dal_segs])

    def _run_round_segment(
        self, rnd: int, transport: Transport, selected: list[str], stats: dict, t0: float, he0: float
    ) -> dict[str, float]:
        """One round of ``dual_mode: segment``. A segment is active when all its holders are
        selected. ``segment_schedule: sequential`` (default) gives the active segments one pass
        each, one after another in a random order, each pass followed by PrimalAggregation so the
        next one starts from the ``w`` the last one left: together exactly centralised SDCA over
        the active segments' samples (``sigma' = 1``). ``parallel`` runs all active segments' passes
        at once (CoCoA+ over segments, ``sigma'`` = number of active segments) and aggregates once.
        See :meth:`_segment_pass` for one pass."""
        cfg = self.config
        chosen = set(selected)
        active = [g for g in range(len(self.seg_n)) if all(h in chosen for h in self.seg_holders[g])]
        if cfg.segment_schedule == "sequential":
            groups = [[int(g)] for g in self.rng.permutation(active)] if active else []
        else:
            groups = [active] if active else []
        gamma = self.smoothing(rnd)
        done: set[int] = set()
        sent: set[str] = set()
        answered: set[str] = set()
        sigmas = []
        for group in groups:
            sigma = float(cfg.sigma) if cfg.sigma is not None else float(len(group))
            sigmas.append(sigma)
            d, k, a = self._segment_pass(rnd, transport, selected, group, sigma, gamma, stats)
            done |= d
            sent |= k
            answered |= a
        self._accumulate_average(rnd)
        out = self._finish(stats, t0, he0)
        out["participants"] = len(selected)
        out["failed"] = len(sent - answered)
        out["segments_updated"] = len(done)
        out["segments_active"] = len(active)
        if sigmas:
            out["sigma"] = max(sigmas)
        return out

    def _segment_pass(
        self,
        rnd: int,
        transport: Transport,
        selected: list[str],
        group: list[int],
        sigma: float,
        gamma: float,
        stats: dict,
    ) -> tuple[set[int], set[str], set[str]]:
        """One pass of the segments in ``group`` (all holders selected) in ``dual_mode: segment``:
        its holders walk each segment's mini-batches in the same order, one exchange per batch: the
        server adds their encrypted shares of the batch's inner products (each holder's block with
        the segment's changes so far, scaled by ``sigma'``) and returns the sum, so every holder
        makes the same exact SDCA steps. A segment loses the pass if any holder's reply is missing
        (nothing of it is added). Then dual aggregation and PrimalAggregation as in consensus mode
        (``w = w(alpha)``).

        Returns:
            (segments whose changes were added, clients sent the pass, clients that answered PrimalAggregation).
        """
        cfg = self.config
        orders: dict[int, list[int]] = {}
        for g in group:
            nb = self.seg_batch_counts[g]
            count = max(1, math.ceil(cfg.local_fraction * nb))
            orders[g] = [int(m) for _ in range(cfg.local_epochs) for m in self.rng.permutation(nb)[:count]]
        seed = int(self.rng.integers(2**31))
        K = [cid for cid in selected if any(g in orders for g in self.client_segs[cid])]
        local = {cid: {g: j for j, g in enumerate(self.client_segs[cid])} for cid in K}
        msgs = []
        for cid in K:
            gs = [g for g in self.client_segs[cid] if g in orders]
            payload: dict = {
                "w": self.w[self.feat[cid]],
                "segs": [local[cid][g] for g in gs],
                "count": [len(orders[g]) for g in gs],
                "order": [m for g in gs for m in orders[g]],
                "seed": seed,
                "sigma": sigma,
            }
            if self.last_round[cid] < rnd - 1:  # absent (or failed) last round: fresh alpha
                payload["alpha"] = [self.enc_alpha[g] for g in self.client_segs[cid]]
            msgs.append(Message("hyfdca.segstart", SERVER, cid, rnd, payload))

        def check_start(r: Message) -> None:
            self.check_ciphertexts(
                r, "ip", [len(self.seg_batches_of(g, orders[g][0])) for g in self.client_segs[r.sender] if g in orders]
            )

        shares: dict[int, list[bytes]] = defaultdict(list)
        for r in self._exchange(transport, msgs, stats, check_start):
            gs = [g for g in self.client_segs[r.sender] if g in orders]
            for g, c in zip(gs, r.payload["ip"]):
                shares[g].append(c)
        running = {g: self.he.add(shares[g]) for g in orders if len(shares[g]) == len(self.seg_holders[g])}
        done: set[int] = set()
        step = 1  # the batch position the sweep replies' next shares are for
        while running:
            msgs = []
            swept: dict[str, list[int]] = {}
            for cid in K:
                gs = [g for g in self.client_segs[cid] if g in running]
                if gs:
                    swept[cid] = [local[cid][g] for g in gs]
                    payload = {
                        "segs": [local[cid][g] for g in gs],
                        "u": [running[g] for g in gs],
                        **({"gamma": gamma} if gamma else {}),
                    }
                    msgs.append(Message("hyfdca.sweep", SERVER, cid, rnd, payload))
            nxt: dict[int, list[bytes]] = defaultdict(list)
            dal: dict[int, list[bytes]] = defaultdict(list)
            for r in self._exchange(
                transport, msgs, stats, lambda r: self._check_sweep(r, swept[r.sender], orders, step)
            ):
                segs = self.client_segs[r.sender]
                for j, c in zip(r.payload["ip_segs"], r.payload["ip"]):
                    nxt[segs[int(j)]].append(c)
                for j, c in zip(r.payload["dalpha_segs"], r.payload["dalpha"]):
                    dal[segs[int(j)]].append(c)
            new_running = {}
            for g in running:
                n_h = len(self.seg_holders[g])
                if len(dal[g]) == n_h:  # pass complete at every holder: add (nu/|B|) dalpha of each
                    self.enc_alpha[g] = self.he.add([self.enc_alpha[g], *dal[g]])
                    done.add(g)
                elif len(nxt[g]) == n_h:
                    new_running[g] = self.he.add(nxt[g])
            running = new_running
            step += 1
        # PrimalAggregation with the new alpha (every client that was sent the pass)
        msgs = [
            Message("hyfdca.primal", SERVER, cid, rnd, {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]})
            for cid in K
        ]
        answered = self._primal_aggregation(rnd, transport, msgs, stats)
        return done, set(K), answered
