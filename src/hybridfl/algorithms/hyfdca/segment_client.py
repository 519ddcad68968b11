"""HyFDCA ``dual_mode: segment``, client side: :class:`SegmentClientMixin`, the steps of a
segment's holder (setup's batch Gram matrices, the passes' exact SDCA steps on decrypted or
unmasked inner products, the position shares of ``output: step_average``). The protocol, its
messages and the server's side are described in :mod:`hybridfl.algorithms.hyfdca.segment`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.hyfdca import gram as gram_mod
from hybridfl.algorithms.hyfdca.gram import (
    GRAM_DTYPES,
    checked_symmetric_grams,
    pack_gram,
    packed_vector,
    symmetric_gram,
)
from hybridfl.algorithms.hyfdca.segment import concat_words, int_list, split_words
from hybridfl.errors import ProtocolError
from hybridfl.privacy.he import HEBackend
from hybridfl.privacy.secagg import to_fixed
from hybridfl.privacy.segmask import SEALED_BYTES
from hybridfl.runtime import secagg_messages as sm
from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError

_EMPTY = np.zeros(0)
"""No ``pdelta`` and ``pw`` (``output`` other than ``step_average``) for the compiled batch steps
(:func:`kernels.csr_batch_steps`, ``dense_batch_steps``)."""

_SWEEP_ARRAYS = ("dw", "delta", "pdelta", "pw")
"""The arrays of a pass under way, kept beside its JSON in the state (``sweep_<name>.<s>``)."""


class SegmentClientMixin:
    """The client steps of ``dual_mode: segment`` (mixed into ``HyFDCAClient``, whose attributes
    they use: ``X``, ``y``, ``ids``, ``he``, ``alpha``, ``w``, ``params``, ``seg_rows``,
    ``seg_colw``, ``seg_scale``).

    State (all part of the client's ``get_state``): ``seg_global`` the global segment IDs,
    ``seg_batches`` the row positions of each fixed mini-batch, ``gram`` ``(b, b)`` the full Gram
    matrix of each mini-batch (float32 or float64: ``params["gram_dtype"]``), ``sweep`` this round's pass over each active segment (batch
    ``order``, position ``j``, ``seed``, ``sigma``, ``tag`` the mask tag of its last shares or
    ``None`` unmasked, ``dw`` ``(d_k,)``, ``delta`` ``(n_k,)``; step average, also ``pdelta``
    ``(n_k,)`` each change times its place, ``pw`` ``(d_k,)`` ``X^T pdelta`` and ``steps``); masked, also ``segmask``
    (:class:`~hybridfl.privacy.segmask.SegmentMasks`: the segment keys and the last tag).
    """

    def _segment_init(self, p: Mapping[str, Any]) -> dict[str, Any]:
        """Setup (``hyfdca.init``): cut each segment into the fixed mini-batches (a permutation drawn
        from the global segment ID and the server's ``batch_seed``, the same at every holder) and
        return, per segment, one encrypted vector: the upper triangles (row by row) of the partial
        Gram matrices ``X_{k,B} diag(1/c) X_{k,B}^T`` of its batches, batch after batch, packed
        together (``sum_B b_B (b_B + 1) / 2`` values; under CKKS the slots of a ciphertext are
        filled across batches instead of one partly filled ciphertext per batch; the same values
        as one vector per batch, and every holder of a segment packs them in the same layout, so
        the server adds them slot by slot). Returns the reply entries: ``gram``, and with
        ``segment_inner_products: masked`` (:mod:`hybridfl.privacy.segmask`) the Gram vectors
        masked instead of encrypted (one ``uint64`` array, the client's segments one after another,
        exchange tag 0) and ``seg_keys``, its segment keys sealed for the other holders. The
        products are computed in ``gram_dtype`` (:mod:`~hybridfl.algorithms.hyfdca.gram`)."""
        b = int(p["batch_size"])
        self.seg_global = [int(g) for g in p["seg_global"]]
        self._batch_cache = {}
        self.seg_batches = []
        for g, rows in zip(self.seg_global, self.seg_rows):
            perm = rows[np.random.default_rng([int(p["batch_seed"]), g]).permutation(rows.size)]
            self.seg_batches.append([perm[m : m + b] for m in range(0, rows.size, b)])
        masked = self.params["seg_masked"] = bool(p.get("seg_masked", False))
        self.params["seg_step_average"] = bool(p.get("seg_step_average", False))
        self.params["gram_dtype"] = gram_mod.GRAM_DTYPE  # its own (checked: the init declared no other)
        dtype = self._gram_dtype()
        sealed = []
        if masked:
            sealed = self.segmask.start(dict(zip(self.seg_global, p["seg_holder_names"])))
            self.segmask.use_tag(0)
        gram: list = []
        scratch: dict = {}
        for s in range(len(self.seg_rows)):
            v, pos = packed_vector(self.X, [rows.size for rows in self.seg_batches[s]], self.seg_colw[s], dtype), 0
            for m in range(len(self.seg_batches[s])):
                pos = pack_gram(self._batch(s, m)[0], self.seg_colw[s], v, pos, scratch, dtype)
            if masked:
                fixed = to_fixed(v, f"the batch Gram matrices of client {self.client_id!r}")
                gram.append(self.segmask.mask(self.seg_global[s], 0, fixed))
            else:
                gram.append(self.he.encrypt(v))
        if masked:
            return {"gram": concat_words(gram), "seg_keys": sealed}
        return {"gram": gram}

    def check_segment_init(self, msg: Message, secure: bool) -> list[list[str]] | None:
        """Check a segment-mode ``hyfdca.init``'s masking entries before anything is set up:
        ``seg_masked`` a bool; if true, ``seg_holders`` one JSON list of names per segment (as many
        as ``holders`` counts), each with this client once and otherwise known peers of secure
        aggregation (whose keys seal the segment keys; ``secure``: the message carried its peer
        table); ``gram_dtype``, if sent, this client's own (:data:`.gram.GRAM_DTYPE`: the holders
        compute in their own precision, which the server only declares, so a server cannot put a
        segment's holders on different precisions, whose steps would then differ). Returns the
        holder names per segment, or ``None`` without masking.

        Raises:
            PayloadError: any of these fails, or masking is asked without secure aggregation's peers.
        """
        p = msg.payload
        if not isinstance(p.get("seg_step_average", False), (bool, np.bool_)):
            raise PayloadError(msg, "seg_step_average", "not a bool")
        own = gram_mod.GRAM_DTYPE
        dtype = p.get("gram_dtype", own)
        if not isinstance(dtype, str) or dtype != own:
            raise PayloadError(msg, "gram_dtype", f"not this client's {own!r}")
        flag = p.get("seg_masked", False)
        if not isinstance(flag, (bool, np.bool_)):
            raise PayloadError(msg, "seg_masked", "not a bool")
        if not flag:
            if "seg_holders" in p:
                raise PayloadError(msg, "seg_holders", "sent without seg_masked")
            return None
        if not secure:
            raise PayloadError(msg, "seg_masked", "asked in a run without secure aggregation's peer keys")
        counts = [int(c) for c in np.asarray(p["holders"])]
        rows = p.get("seg_holders")
        if not isinstance(rows, list) or len(rows) != len(counts) or not all(isinstance(r, str) for r in rows):
            raise PayloadError(msg, "seg_holders", f"not a list of {len(counts)} strings")
        out = []
        for r, c in zip(rows, counts):
            try:
                names = json.loads(r)
            except ValueError:
                names = None
            if not isinstance(names, list) or not all(isinstance(h, str) for h in names) or len(names) != c:
                raise PayloadError(msg, "seg_holders", "holding an item that is not a JSON list of its holders' names")
            if names.count(self.client_id) != 1:
                raise PayloadError(msg, "seg_holders", "naming a segment without this client among its holders")
            try:
                self.secagg.check_peers([h for h in names if h != self.client_id])
            except ProtocolError as e:
                raise PayloadError(msg, "seg_holders", f"refused ({e})") from None
            out.append(names)
        return out

    def _store_gram(self, msg: Message) -> None:
        """Setup (``hyfdca.norms``): decrypt the holders' summed batch Gram matrices: one vector per
        segment, the upper triangles of its batches one after another (:meth:`_segment_init`).

        Raises:
            PayloadError: not one ciphertext per segment, one of another length, or values that are
                not finite in ``gram_dtype`` (float32: over 3.4e38 in magnitude).
        """
        tri = [[rows.size * (rows.size + 1) // 2 for rows in batches] for batches in self.seg_batches]
        if self.params.get("seg_masked"):
            vecs = self._unmasked_grams(msg, [sum(t) for t in tri])
        else:
            # read in place (plaintext: no copy of the message's bytes; the full matrices are built from it)
            vecs = [self.he.decrypt(ct, copy=False) for ct in validate.blobs(msg, "gram", len(self.seg_batches))]
        gram, dtype = [], self._gram_dtype()
        for batches, vec in zip(self.seg_batches, vecs):
            mats = checked_symmetric_grams(np.asarray(vec), [rows.size for rows in batches], dtype)
            if mats is None:
                raise PayloadError(
                    msg, "gram", f"holding triangles of another size or values not finite in {dtype.__name__}"
                )
            gram.append(mats)
        self.gram = gram

    def _gram_dtype(self) -> Any:
        """The dtype of the batch Gram matrices (this client's :data:`.gram.GRAM_DTYPE` at its
        setup, kept in ``params``; float64 for a state from before the precision was kept)."""
        return GRAM_DTYPES[self.params.get("gram_dtype", "float64")]

    def _unmasked_grams(self, msg: Message, sizes: list[int]) -> list[np.ndarray]:
        """Masked setup (``hyfdca.norms`` with ``seg_keys``, its keys checked by the caller): open
        the other holders' segment keys and unmask the summed Gram vectors (one ``uint64`` array,
        the segments one after another, ``sizes`` values each).

        Raises:
            PayloadError: ``seg_keys`` of another count or length or not opening (tampered, or sealed
                for another client or segment); ``gram`` not ``uint64`` of the segments' total
                length, or unmasking to values no holder can have sent.
        """
        sealed = validate.blobs(msg, "seg_keys", self.segmask.sealed_count(), max_bytes=SEALED_BYTES)
        words = sm.uint64_array(msg, "gram", sum(sizes))
        try:
            self.segmask.open(sealed)
        except ProtocolError as e:
            raise PayloadError(msg, "seg_keys", f"refused ({e})") from None
        segs = list(range(len(self.seg_global)))
        return self._unmask_parts(msg, "gram", words, sizes, [0] * len(segs), segs)

    def _unmask_parts(
        self, msg: Message, key: str, words: np.ndarray, sizes: list[int], tags: list[int], segs: list[int]
    ) -> list[np.ndarray]:
        """``words`` (``uint64``: the sums of the local segments ``segs`` one after another,
        ``sizes`` each) unmasked per segment, each with its exchange tag in ``tags``.

        Raises:
            PayloadError: a value no holder can have sent (names ``key``).
        """
        out = []
        for s, part, tag in zip(segs, split_words(words, sizes), tags):
            try:
                out.append(self.segmask.unmask(self.seg_global[s], tag, part))
            except ProtocolError as e:
                raise PayloadError(msg, key, f"refused ({e})") from None
        return out

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
            else:  # the compiled steps' layout (C-ordered float64), made once
                Xb = np.ascontiguousarray(Xb, dtype=np.float64)
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

    def _batch_share(self, s: int, m: int) -> Any:
        """``enc(x_{k,i}^T (w_k + sigma' dw_k))`` for mini-batch ``m`` of segment ``s`` (its own
        block's part of the exact inner products, with the segment's changes this round); masked
        (``uint64`` words, :mod:`hybridfl.privacy.segmask`) with the pass's current ``tag`` instead
        under ``segment_inner_products: masked``.

        Raises:
            DataError: masked, a value too large for the fixed point.
        """
        v = self._own_ip(s, m)
        st = self.sweep[s]
        if self.params.get("seg_masked"):
            fixed = to_fixed(v, f"the inner-product share of client {self.client_id!r}")
            return self.segmask.mask(self.seg_global[s], st["tag"], fixed)
        return self.he.encrypt(v)

    def _own_ip(self, s: int, m: int) -> np.ndarray:
        """``x_{k,i}^T (w_k + sigma' dw_k)`` ``(b,)`` (block-weighted) for mini-batch ``m`` of segment
        ``s``: its own block's part of the batch's inner products, in plaintext."""
        colw = self.seg_colw[s]
        st = self.sweep[s]
        ww = self.w + st["sigma"] * st["dw"]
        if colw is not None:
            ww = ww * colw
        return kernels.matvec(self._batch(s, m)[0], ww)

    def _mask_tag(self, msg: Message) -> int | None:
        """Masked mode: the message's ``tag`` (a fresh exchange number, above every tag this
        client masked with), else ``None`` (and no ``tag`` may be sent).

        Raises:
            PayloadError: missing, not an integer, or not above the last tag.
        """
        if not self.params.get("seg_masked"):
            return None
        tag = validate.integer(msg, "tag", low=0, high=2**62)
        if tag <= self.segmask.last_tag:
            raise PayloadError(msg, "tag", f"not above the last mask tag {self.segmask.last_tag} (a pad used twice)")
        return tag

    def segment_start(self, msg: Message) -> dict:
        """Segment mode, round start (``hyfdca.segstart``): take ``w`` ``(d_k,)`` (and fresh
        ``alpha`` if returning, checked and projected by ``accept_alpha``); for each active segment (every holder
        present) set up this round's batch order and return ``{"ip": [enc(first batch's shares)]}``
        (masked: ``{"ip": uint64 words}``, the segments' shares one after another).

        Raises:
            PayloadError: a malformed payload (``w``, segments, counts, order, seed, sigma, a mask
                ``tag`` missing or not fresh) or a malformed ``alpha``.
        """
        p = msg.payload
        solo = p.get("solo", False)
        if not isinstance(solo, (bool, np.bool_)):
            raise PayloadError(msg, "solo", "not a bool")
        secure = ("sa_tag", "sa_peers", "sa_acked") if solo and self.params.get("secure_aggregation") else ()
        validate.only_keys(msg, ("w", "segs", "count", "order", "seed", "sigma", "alpha", "tag", "solo", *secure))
        w = self._w(msg)
        segs, counts, flat = int_list(msg, "segs"), int_list(msg, "count"), int_list(msg, "order")
        if len(set(segs)) != len(segs) or any(not 0 <= s < len(self.seg_rows) for s in segs):
            raise PayloadError(msg, "segs", "naming a segment twice or one the client does not hold")
        if solo and any(self.holder_count(s) != 1 for s in segs):
            raise PayloadError(msg, "solo", "true for a segment with other holders (their blocks' inner products)")
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
        tag = self._mask_tag(msg)
        if "alpha" in p:
            self.accept_alpha(msg)
        if tag is not None:
            self.segmask.use_tag(tag)
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
                "tag": tag,
            }
            if self.params.get("seg_step_average"):  # each step's change times its place, X^T of it; steps so far
                self.sweep[s].update(pdelta=np.zeros(self.ids.size), pw=np.zeros(self.X.shape[1]), steps=0)
            pos += c
        if solo:
            return self._solo_pass(msg)
        out = [self._batch_share(s, self.sweep[s]["order"][0]) for s in segs]
        return {"ip": concat_words(out) if tag is not None else out}

    def holder_count(self, s: int) -> int:
        """The holders of its local segment ``s`` (``nu / seg_scale``, from the setup)."""
        return int(round(float(self.params["nu"]) / self.seg_scale[s]))

    def _solo_pass(self, msg: Message) -> dict:
        """A ``hyfdca.segstart`` with ``solo`` (every segment of it held by this client alone): the
        whole pass here, every batch's inner products its own (those of the sum the server would
        return: the same floats in plaintext), then its reply as a closing sweep's: every
        segment's ``enc((nu/|B|) dalpha)`` (``dalpha``, ``dalpha_segs``; no ``ip``) and its
        PrimalAggregation share (:meth:`close_pass`). Nothing of the pass crosses but these.

        Raises:
            PayloadError: a bad secure-aggregation field (checked before any step).
            DataError: the share too large for the fixed point.
        """
        if self.params.get("secure_aggregation"):
            self.check_secure(msg, "sa_")
        segs = list(self.sweep)
        dal = []
        for s in segs:
            st = self.sweep[s]
            while st["j"] < len(st["order"]):
                self._step(s, self._own_ip(s, st["order"][st["j"]]))
            dal.append(self.he.encrypt(st["delta"][self.seg_rows[s]] * self.seg_scale[s]))
        ip: Any = concat_words([]) if self.params.get("seg_masked") else []
        return {"ip": ip, "ip_segs": [], "dalpha": dal, "dalpha_segs": segs, **self.close_pass(msg)}

    def check_sweep(self, msg: Message) -> None:
        """Check a ``hyfdca.sweep`` before :meth:`segment_sweep`: only ``segs``, ``u``,
        ``tag``, ``close``; distinct segments with a pass under way; one ``u`` ciphertext of the
        current batch's length per segment (masked: ``uint64`` words of their total length, and a
        fresh ``tag``); ``close`` (a bool, default false) true only if this sweep finishes every
        segment of the client's pass, and then, with secure aggregation, the masked exchange's
        ``sa_tag``, ``sa_peers``, ``sa_acked`` (:meth:`check_secure`).

        Raises:
            ProtocolError: a sweep of a segment whose pass was not started or is already done.
            PayloadError: a malformed payload.
        """
        p = msg.payload
        close = p.get("close", False)
        if not isinstance(close, (bool, np.bool_)):
            raise PayloadError(msg, "close", "not a bool")
        secure = ("sa_tag", "sa_peers", "sa_acked") if close and self.params.get("secure_aggregation") else ()
        validate.only_keys(msg, ("segs", "u", "tag", "close", *secure))
        segs = int_list(msg, "segs")
        if len(set(segs)) != len(segs):
            raise PayloadError(msg, "segs", "naming a segment twice")
        sizes = []
        for s in segs:
            st = self.sweep.get(s)
            if st is None or st["j"] >= len(st["order"]):
                raise ProtocolError(
                    f"HyFDCA client {self.client_id!r} got a sweep of segment {s} without a pass under way."
                )
            sizes.append(self.seg_batches[s][st["order"][st["j"]]].size)
        if close and any(st["j"] + (s in segs) < len(st["order"]) for s, st in self.sweep.items()):
            raise PayloadError(msg, "close", "true for a sweep after which a segment of its pass goes on")
        if secure:
            self.check_secure(msg, "sa_")
        if self._mask_tag(msg) is not None:
            sm.uint64_array(msg, "u", sum(sizes))
            return
        for s, ct, n in zip(segs, validate.blobs(msg, "u", len(segs)), sizes):
            if HEBackend.length(ct) != n:
                raise PayloadError(msg, "u", f"holding a ciphertext of another length than segment {s}'s batch")

    def segment_sweep(self, msg: Message) -> dict:
        """Segment mode (``hyfdca.sweep``, checked by :meth:`check_sweep`): exact SDCA steps on the
        current mini-batch of each listed segment (the decrypted inner products ``u`` are exact: every
        holder's block with the segment's changes so far; the batch Gram gives the changes within
        the batch). Every holder of a segment makes the same steps. Returns the next batch's shares
        (``ip``, ``ip_segs``), or ``enc((nu/|B|) dalpha)`` of the segment once its pass is done
        (``dalpha``, ``dalpha_segs``).

        Raises:
            ProtocolError: ``u`` decrypting to non-finite values (nothing changes then; a sweep of a
                segment whose pass was not started or is already done: :meth:`check_sweep`).
            PayloadError: ``u`` that does not decrypt, or decrypts to another length than its batch.
        """
        p = msg.payload
        segs = [int(v) for v in p["segs"]]  # each with a pass under way (check_sweep)
        sizes = [self.seg_batches[s][self.sweep[s]["order"][self.sweep[s]["j"]]].size for s in segs]
        if self.params.get("seg_masked"):
            tags = [self.sweep[s]["tag"] for s in segs]
            u_all = self._unmask_parts(msg, "u", p["u"], sizes, tags, segs)
            self.segmask.use_tag(int(p["tag"]))
            for s in segs:
                self.sweep[s]["tag"] = int(p["tag"])
        else:
            try:
                u_all = [np.asarray(self.he.decrypt(ct), dtype=np.float64) for ct in p["u"]]
            except ValueError as e:
                raise PayloadError(msg, "u", f"holding a ciphertext that does not decrypt ({e})") from None
            if any(u.shape != (n,) for u, n in zip(u_all, sizes)):  # the steps read u[i], i < n
                raise PayloadError(msg, "u", "decrypting to another length than its batch")
        if not all(np.isfinite(u).all() for u in u_all):
            raise ProtocolError(f"the server sent HyFDCA client {self.client_id!r} a sweep with non-finite 'u'.")
        nxt, nxt_segs, dal, dal_segs = [], [], [], []
        for s, u0 in zip(segs, u_all):
            self._step(s, u0)
            st = self.sweep[s]
            if st["j"] < len(st["order"]):
                nxt.append(self._batch_share(s, st["order"][st["j"]]))
                nxt_segs.append(s)
            else:
                dal.append(self.he.encrypt(st["delta"][self.seg_rows[s]] * self.seg_scale[s]))
                dal_segs.append(s)
        if self.params.get("seg_masked"):
            nxt = concat_words(nxt)
        return {"ip": nxt, "ip_segs": nxt_segs, "dalpha": dal, "dalpha_segs": dal_segs}

    def _step(self, s: int, u0: np.ndarray) -> None:
        """Exact SDCA steps on the current mini-batch of segment ``s`` given its exact inner
        products ``u0`` ``(b,)`` (the batch Gram gives the changes within the batch), in one
        compiled call (:func:`~hybridfl.algorithms.convex.kernels.csr_batch_steps` or, for a dense
        block, ``dense_batch_steps``); the pass moves to its next batch."""
        prm = self.params
        lam_n = float(prm["lam"]) * float(prm["N"])
        st = self.sweep[s]
        m = st["order"][st["j"]]
        rows = self.seg_batches[s][m]
        Xb, yb = self._batch(s, m)
        visit = self._visit_order(s)
        head = (
            kernels.as_index(visit),
            rows,
            self.alpha,
            st["delta"],
            kernels.as_f64(yb),
            kernels.as_f64(u0),
            self.gram[s][m],
            kernels.LOSS_CODES[str(prm["loss"])],
            st["sigma"] / lam_n,
            0.0,
        )
        tail = (lam_n, st["dw"], st.get("pdelta", _EMPTY), st.get("pw", _EMPTY), st.get("steps", 0))
        if sp.issparse(Xb):  # one compiled call each
            kernels.csr_batch_steps(*head, Xb.indptr, Xb.indices, Xb.data, *tail)
        else:
            kernels.dense_batch_steps(*head, Xb, *tail)
        if "pdelta" in st:
            st["steps"] += rows.size
        st["j"] += 1

    def position_share(self, msg: Message) -> np.ndarray:
        """``output: step_average``, PrimalAggregation (``hyfdca.primal``'s ``avg_segs``: its segments whose
        pass this round the server added): its *position share* ``sum_s sum_i (p_i / T_s) delta_i
        x_{k,i} / c`` ``(d_k,)`` over those segments, with ``delta_i`` each SDCA step's change of
        ``alpha_i``, ``p_i`` its 0-based place in the pass and ``T_s`` the pass's steps. With the
        change of its share over the pass (``X_{k,s}^T delta``) it gives its block's part of the mean
        of the pass's iterates: ``mean_t w_t = w_0 + (X^T delta - sum_i (p_i/T) delta_i x_i) /
        (lambda N)`` (:mod:`hybridfl.algorithms.hyfdca.output`).

        Raises:
            PayloadError: ``avg_segs`` not a list of distinct segments of this client each with a
                finished pass this round.
        """
        segs = int_list(msg, "avg_segs")
        if len(set(segs)) != len(segs):
            raise PayloadError(msg, "avg_segs", "naming a segment twice")
        for s in segs:
            st = self.sweep.get(s) if 0 <= s < len(self.seg_rows) else None
            if st is None or st["j"] != len(st["order"]) or "pdelta" not in st:
                raise PayloadError(msg, "avg_segs", f"naming segment {s}, which has no finished pass this round")
        return self.position_share_of(segs)

    def position_share_of(self, segs: list[int]) -> np.ndarray:
        """The position share ``(d_k,)`` (:meth:`position_share`) of the local segments ``segs``,
        each with a finished pass this round (checked by the caller)."""
        out = np.zeros(self.X.shape[1])
        for s in segs:
            st = self.sweep[s]
            v = st["pw"] / max(1, st["steps"])  # X_s^T (place * dalpha), added up batch by batch in the pass
            colw = self.seg_colw[s]
            out += v if colw is None else v * colw
        return out

    def _segment_state(self) -> dict[str, Any]:
        """The segment-mode part of ``get_state`` (``{}`` in the other modes): ``seg_global``,
        ``seg_batches.<s>`` (batch sizes), ``static:batch.<s>.<m>`` rows, ``static:gram.<s>.<m>``
        upper triangles, the pass under way (``sweep`` JSON plus ``sweep_dw.<s>``,
        ``sweep_delta.<s>`` and, ``output: step_average``, ``sweep_pdelta.<s>``, ``sweep_pw.<s>``). The ``static:`` arrays are fixed at setup: they are built once and
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
            {str(k): {f: x for f, x in v.items() if f not in _SWEEP_ARRAYS} for k, v in self.sweep.items()}
        )
        for k, v in self.sweep.items():
            for f in _SWEEP_ARRAYS:  # dw and delta always, the step average's two when it is on
                if f in v:
                    st[f"sweep_{f}.{k}"] = v[f].copy()
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
                    symmetric_gram(
                        np.asarray(st[f"{pre}gram.{s}.{m}"], dtype=np.float64), rows.size, self._gram_dtype()
                    )
                    for m, rows in enumerate(b)
                ]
                for s, b in enumerate(self.seg_batches)
            ]
        self.sweep = {
            int(k): {
                **v,
                "dw": np.asarray(st[f"sweep_dw.{k}"], dtype=np.float64).copy(),
                "delta": np.asarray(st[f"sweep_delta.{k}"], dtype=np.float64).copy(),
                **{
                    f: np.asarray(st[f"sweep_{f}.{k}"], dtype=np.float64).copy()
                    for f in ("pdelta", "pw")
                    if f"sweep_{f}.{k}" in st
                },
            }
            for k, v in json.loads(str(st["sweep"])).items()
        }
        for s, v in self.sweep.items():  # a state from before ``pw``: X_s^T pdelta, what it adds up to
            if "pdelta" in v and "pw" not in v:
                v["pw"] = kernels.rmatvec(self._seg_matrix(s), v["pdelta"][self.seg_rows[s]])
