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

``segment_inner_products`` says how the shares cross the server: ``encrypted`` (default, the
paper's SecureInnerProduct under the run's encryption: one ciphertext per holder and batch) or
``masked`` (our option, :mod:`hybridfl.privacy.segmask`): at setup every holder seals a segment key
for the other holders (``seg_keys`` in the ``hyfdca.init`` reply, relayed in ``hyfdca.norms``) and
the batch Gram vectors travel as padded ``uint64`` words (exchange tag 0); every ``hyfdca.segstart``
and ``hyfdca.sweep`` carries a fresh ``tag``, the shares and sums are padded words (one array per
message, the listed segments one after another), and every holder removes all holders' pads from
the sum. The duals (``dalpha``, ``alpha``) stay under the run's encryption.

``step_average`` (our option, :mod:`hybridfl.algorithms.hyfdca.output`): ``hyfdca.init`` carries
``seg_step_average``; during a pass every holder also sums each step's change times its place in
the pass, and each ``hyfdca.primal`` names in ``avg_segs`` the client's segments whose pass the
server added: the reply then carries their position share (masked together with the share under
secure aggregation, ``position_share`` without), from which the server forms the round's mean
iterate.
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
from hybridfl.privacy.secagg import to_fixed
from hybridfl.privacy.segmask import SEALED_BYTES
from hybridfl.runtime import secagg_messages as sm
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
    ``order``, position ``j``, ``seed``, ``sigma``, ``tag`` the mask tag of its last shares or
    ``None`` unmasked, ``dw`` ``(d_k,)``, ``delta`` ``(n_k,)``); masked, also ``segmask``
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
        exchange tag 0) and ``seg_keys``, its segment keys sealed for the other holders."""
        b = int(p["batch_size"])
        self.seg_global = [int(g) for g in p["seg_global"]]
        self._batch_cache = {}
        self.seg_batches = []
        for g, rows in zip(self.seg_global, self.seg_rows):
            perm = rows[np.random.default_rng([int(p["batch_seed"]), g]).permutation(rows.size)]
            self.seg_batches.append([perm[m : m + b] for m in range(0, rows.size, b)])
        masked = self.params["seg_masked"] = bool(p.get("seg_masked", False))
        self.params["seg_step_average"] = bool(p.get("seg_step_average", False))
        sealed = []
        if masked:
            sealed = self.segmask.start(dict(zip(self.seg_global, p["seg_holder_names"])))
            self.segmask.use_tag(0)
        gram: list = []
        for s in range(len(self.seg_rows)):
            colw = self.seg_colw[s]
            parts = []
            for m, rows in enumerate(self.seg_batches[s]):
                parts.append(kernels.upper_triangle(_partial_gram(self._batch(s, m)[0], colw)))
            v = np.concatenate(parts) if parts else np.zeros(0)
            if masked:
                fixed = to_fixed(v, f"the batch Gram matrices of client {self.client_id!r}")
                gram.append(self.segmask.mask(self.seg_global[s], 0, fixed))
            else:
                gram.append(self.he.encrypt(v))
        if masked:
            return {"gram": _concat_words(gram), "seg_keys": sealed}
        return {"gram": gram}

    def check_segment_init(self, msg: Message, secure: bool) -> list[list[str]] | None:
        """Check a segment-mode ``hyfdca.init``'s masking entries before anything is set up:
        ``seg_masked`` a bool; if true, ``seg_holders`` one JSON list of names per segment (as many
        as ``holders`` counts), each with this client once and otherwise known peers of secure
        aggregation (whose keys seal the segment keys; ``secure``: the message carried its peer
        table). Returns the holder names per segment, or ``None`` without masking.

        Raises:
            PayloadError: any of these fails, or masking is asked without secure aggregation's peers.
        """
        p = msg.payload
        if not isinstance(p.get("seg_step_average", False), (bool, np.bool_)):
            raise PayloadError(msg, "seg_step_average", "not a bool")
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
            PayloadError: not one ciphertext per segment, one of another length, or non-finite values.
        """
        tri = [[rows.size * (rows.size + 1) // 2 for rows in batches] for batches in self.seg_batches]
        if self.params.get("seg_masked"):
            vecs = self._unmasked_grams(msg, [sum(t) for t in tri])
        else:
            vecs = [self.he.decrypt(ct) for ct in validate.blobs(msg, "gram", len(self.seg_batches))]
        gram = []
        for batches, vec, sizes in zip(self.seg_batches, vecs, tri):
            v = np.asarray(vec, dtype=np.float64)
            if v.shape != (sum(sizes),) or not np.isfinite(v).all():
                raise PayloadError(msg, "gram", "holding triangles of another size or non-finite values")
            ends = np.cumsum(sizes)
            gram.append([_symmetric(v[e - n : e], rows.size) for rows, n, e in zip(batches, sizes, ends)])
        self.gram = gram

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
        for s, part, tag in zip(segs, _split_words(words, sizes), tags):
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
        colw = self.seg_colw[s]
        st = self.sweep[s]
        ww = self.w + st["sigma"] * st["dw"]
        if colw is not None:
            ww = ww * colw
        v = np.asarray(self._batch(s, m)[0] @ ww, dtype=np.float64).ravel()
        if self.params.get("seg_masked"):
            fixed = to_fixed(v, f"the inner-product share of client {self.client_id!r}")
            return self.segmask.mask(self.seg_global[s], st["tag"], fixed)
        return self.he.encrypt(v)

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
        ``alpha`` if returning, checked by ``accept_alpha``); for each active segment (every holder
        present) set up this round's batch order and return ``{"ip": [enc(first batch's shares)]}``
        (masked: ``{"ip": uint64 words}``, the segments' shares one after another).

        Raises:
            PayloadError: a malformed payload (``w``, segments, counts, order, seed, sigma, a mask
                ``tag`` missing or not fresh) or a refused ``alpha``.
        """
        p = msg.payload
        validate.only_keys(msg, ("w", "segs", "count", "order", "seed", "sigma", "alpha", "tag"))
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
            if self.params.get("seg_step_average"):  # each step's change times its place; steps so far
                self.sweep[s].update(pdelta=np.zeros(self.ids.size), steps=0)
            pos += c
            out.append(self._batch_share(s, self.sweep[s]["order"][0]))
        return {"ip": _concat_words(out) if tag is not None else out}

    def check_sweep(self, msg: Message) -> None:
        """Check a ``hyfdca.sweep`` before :meth:`segment_sweep`: only ``segs``, ``u``, ``gamma``,
        ``tag``; distinct segments with a pass under way; one ``u`` ciphertext of the current
        batch's length per segment (masked: ``uint64`` words of their total length, and a fresh
        ``tag``); ``gamma`` a non-negative number.

        Raises:
            ProtocolError: a sweep of a segment whose pass was not started or is already done.
            PayloadError: a malformed payload.
        """
        p = msg.payload
        validate.only_keys(msg, ("segs", "u", "gamma", "tag"))
        segs = _int_list(msg, "segs")
        if len(set(segs)) != len(segs):
            raise PayloadError(msg, "segs", "naming a segment twice")
        if "gamma" in p:
            validate.number(msg, "gamma", low=0.0)
        sizes = []
        for s in segs:
            st = self.sweep.get(s)
            if st is None or st["j"] >= len(st["order"]):
                raise ProtocolError(
                    f"HyFDCA client {self.client_id!r} got a sweep of segment {s} without a pass under way."
                )
            sizes.append(self.seg_batches[s][st["order"][st["j"]]].size)
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
            ProtocolError: a sweep of a segment whose pass was not started or is already done, or
                ``u`` decrypting to non-finite values (nothing changes then).
        """
        p = msg.payload
        prm = self.params
        lam_n = float(prm["lam"]) * float(prm["N"])
        segs = [int(v) for v in p["segs"]]
        for s in segs:
            st = self.sweep.get(s)
            if st is None or st["j"] >= len(st["order"]):
                raise ProtocolError(
                    f"HyFDCA client {self.client_id!r} got a sweep of segment {s} without a pass under way."
                )
        if self.params.get("seg_masked"):
            sizes = [self.seg_batches[s][self.sweep[s]["order"][self.sweep[s]["j"]]].size for s in segs]
            tags = [self.sweep[s]["tag"] for s in segs]
            u_all = self._unmask_parts(msg, "u", p["u"], sizes, tags, segs)
            self.segmask.use_tag(int(p["tag"]))
            for s in segs:
                self.sweep[s]["tag"] = int(p["tag"])
        else:
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
            visit = self._visit_order(s)
            d = gram_steps(
                visit,
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
            if "pdelta" in st:  # step_average: each step's change times its position in the pass
                place = np.empty(rows.size)
                place[visit] = st["steps"] + np.arange(rows.size)
                st["pdelta"][rows] += place * d
                st["steps"] += rows.size
            st["j"] += 1
            if st["j"] < len(st["order"]):
                nxt.append(self._batch_share(s, st["order"][st["j"]]))
                nxt_segs.append(s)
            else:
                dal.append(self.he.encrypt(st["delta"][self.seg_rows[s]] * self.seg_scale[s]))
                dal_segs.append(s)
        if self.params.get("seg_masked"):
            nxt = _concat_words(nxt)
        return {"ip": nxt, "ip_segs": nxt_segs, "dalpha": dal, "dalpha_segs": dal_segs}

    def position_share(self, msg: Message) -> np.ndarray:
        """``step_average``, PrimalAggregation (``hyfdca.primal``'s ``avg_segs``: its segments whose
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
        segs = _int_list(msg, "avg_segs")
        if len(set(segs)) != len(segs):
            raise PayloadError(msg, "avg_segs", "naming a segment twice")
        out = np.zeros(self.X.shape[1])
        for s in segs:
            st = self.sweep.get(s) if 0 <= s < len(self.seg_rows) else None
            if st is None or st["j"] != len(st["order"]) or "pdelta" not in st:
                raise PayloadError(msg, "avg_segs", f"naming segment {s}, which has no finished pass this round")
            weights = st["pdelta"][self.seg_rows[s]] / max(1, st["steps"])
            v = _rmatvec(self._seg_matrix(s), weights)  # compiled; skips the samples that did not change
            colw = self.seg_colw[s]
            out += v if colw is None else v * colw
        return out

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
            {str(k): {f: x for f, x in v.items() if f not in ("dw", "delta", "pdelta")} for k, v in self.sweep.items()}
        )
        for k, v in self.sweep.items():
            st[f"sweep_dw.{k}"], st[f"sweep_delta.{k}"] = v["dw"].copy(), v["delta"].copy()
            if "pdelta" in v:
                st[f"sweep_pdelta.{k}"] = v["pdelta"].copy()
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
                **(
                    {"pdelta": np.asarray(st[f"sweep_pdelta.{k}"], dtype=np.float64).copy()}
                    if f"sweep_pdelta.{k}" in st
                    else {}
                ),
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


def _concat_words(parts: list[np.ndarray]) -> np.ndarray:
    """Masked words of several segments as one ``uint64`` array (one after another)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _split_words(words: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``words`` cut into consecutive parts of ``sizes``."""
    return np.split(words, np.cumsum(sizes)[:-1]) if sizes else []


def _wrap_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of ``uint64`` word arrays modulo ``2^64`` (the masks' ring)."""
    out = parts[0].copy()
    for v in parts[1:]:
        out += v
    return out


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

    @property
    def masked(self) -> bool:
        """Whether the segment passes mask the inner products (``segment_inner_products: masked``,
        :mod:`hybridfl.privacy.segmask`) instead of encrypting them."""
        return self.config.segment_inner_products == "masked"  # the config allows it in segment mode only

    def _segment_init_payload(self, segs: list[int], batch_seed: int) -> dict[str, Any]:
        """The segment-mode entries of one client's ``hyfdca.init``: ``batch_size``, the global
        segment IDs ``seg_global`` and the ``batch_seed`` of the fixed mini-batches; masked, also
        ``seg_masked`` and ``seg_holders`` (per segment a JSON list of its holders' names, sorted)."""
        out: dict[str, Any] = {"batch_size": self.config.batch_size, "seg_global": list(segs), "batch_seed": batch_seed}
        if self.config.step_average:
            out["seg_step_average"] = True
        if self.masked:
            out["seg_masked"] = True
            out["seg_holders"] = [json.dumps(sorted(self.seg_holders[g])) for g in segs]
        return out

    def _check_segment_init(self, r: Message) -> None:
        """A segment-mode ``hyfdca.init`` reply's ``gram`` (one ciphertext per segment of its
        packed length, or masked: ``uint64`` words of the total length) and, masked, ``seg_keys``
        (one sealed key per segment and other holder).

        Raises:
            PayloadError: any of these fails.
        """
        segs = self.client_segs[r.sender]
        if not self.masked:
            self.check_ciphertexts(r, "gram", [self.gram_length(g) for g in segs])
            return
        sm.uint64_array(r, "gram", sum(self.gram_length(g) for g in segs))
        count = sum(len(self.seg_holders[g]) - 1 for g in segs)
        for blob in validate.blobs(r, "seg_keys", count, max_bytes=SEALED_BYTES):
            if len(blob) != SEALED_BYTES:
                raise PayloadError(r, "seg_keys", f"holding a sealed key of {len(blob)} bytes, not {SEALED_BYTES}")

    def _segment_norms_payloads(self, replies: list[Message]) -> dict[str, dict[str, Any]]:
        """Setup, segment mode: each client's ``hyfdca.norms`` entries: ``gram``, the holders'
        partial Gram matrices added per segment (encrypted: one packed ciphertext per segment,
        :meth:`SegmentClientMixin._segment_init`; masked: the ``uint64`` sums modulo ``2^64``, its
        segments one after another) and, masked, ``seg_keys``: the keys the other holders of its
        segments sealed for it (per segment, holders in sorted order), relayed unopened."""
        gparts: dict[int, list[Any]] = defaultdict(list)
        sealed: dict[tuple[str, str, int], bytes] = {}
        for r in replies:
            segs = self.client_segs[r.sender]
            if self.masked:
                parts = _split_words(r.payload["gram"], [self.gram_length(g) for g in segs])
                it = iter(r.payload["seg_keys"])
                for g in segs:
                    for h in sorted(self.seg_holders[g]):
                        if h != r.sender:
                            sealed[(r.sender, h, g)] = next(it)
            else:
                parts = r.payload["gram"]
            for g, c in zip(segs, parts):
                gparts[g].append(c)
        out = {}
        for cid in self.client_ids:
            segs = self.client_segs[cid]
            if not self.masked:
                out[cid] = {"gram": [self.he.add(gparts[g]) for g in segs]}
                continue
            out[cid] = {
                "gram": _concat_words([_wrap_sum(gparts[g]) for g in segs]),
                "seg_keys": [sealed[(h, cid, g)] for g in segs for h in sorted(self.seg_holders[g]) if h != cid],
            }
        return out

    def _next_mask_tag(self) -> dict[str, int]:
        """Masked: ``{"tag": t}`` with a fresh exchange number (the segment passes' counter,
        part of the server's state); ``{}`` otherwise."""
        if not self.masked:
            return {}
        self.seg_tag = int(self.seg_tag) + 1
        return {"tag": self.seg_tag}

    def _check_shares(self, r: Message, key: str, sizes: list[int]) -> None:
        """A reply's inner-product shares ``key``: one ciphertext per size, or masked, ``uint64``
        words of the total size.

        Raises:
            PayloadError: otherwise.
        """
        if self.masked:
            sm.uint64_array(r, key, sum(sizes))
        else:
            self.check_ciphertexts(r, key, sizes)

    def _shares_of(self, r: Message, key: str, sizes: list[int]) -> list[Any]:
        """The per-segment shares of a checked reply (:meth:`_check_shares`)."""
        return _split_words(r.payload[key], sizes) if self.masked else list(r.payload[key])

    def _add_shares(self, parts: list[Any]) -> Any:
        """The holders' shares added: under encryption, or masked words modulo ``2^64``."""
        return _wrap_sum(parts) if self.masked else self.he.add(parts)

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
        self._check_shares(r, "ip", [len(self.seg_batches_of(segs[j], orders[segs[j]][step])) for j in ip_segs])
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
        passes: list = []  # step_average: (change of w, position sum, steps) per pass
        for group in groups:
            sigma = float(cfg.sigma) if cfg.sigma is not None else float(len(group))
            sigmas.append(sigma)
            d, k, a, p = self._segment_pass(rnd, transport, selected, group, sigma, gamma, stats)
            passes.append(p)
            done |= d
            sent |= k
            answered |= a
        if cfg.step_average:
            self.w_step = self.step_average_of(passes)
        self._accumulate_average(rnd)
        out = self._finish(stats, t0, he0)
        if cfg.step_average:
            out["step_average"] = float(self.w_step is not None)
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
    ) -> tuple[set[int], set[str], set[str], tuple | None]:
        """One pass of the segments in ``group`` (all holders selected) in ``dual_mode: segment``:
        its holders walk each segment's mini-batches in the same order, one exchange per batch: the
        server adds their encrypted shares of the batch's inner products (each holder's block with
        the segment's changes so far, scaled by ``sigma'``) and returns the sum, so every holder
        makes the same exact SDCA steps. A segment loses the pass if any holder's reply is missing
        (nothing of it is added). Then dual aggregation and PrimalAggregation as in consensus mode
        (``w = w(alpha)``).

        Returns:
            (segments whose changes were added, clients sent the pass, clients that answered
            PrimalAggregation, and with ``step_average`` the pass's (change of ``w``, position sum or
            ``None`` if a holder of an added segment missed its reply, steps), else ``None``).
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
        tag = self._next_mask_tag()
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
                **tag,
            }
            if self.last_round[cid] < rnd - 1:  # absent (or failed) last round: fresh alpha
                payload["alpha"] = [self.enc_alpha[g] for g in self.client_segs[cid]]
            msgs.append(Message("hyfdca.segstart", SERVER, cid, rnd, payload))

        def first_sizes(cid: str) -> list[int]:
            return [len(self.seg_batches_of(g, orders[g][0])) for g in self.client_segs[cid] if g in orders]

        shares: dict[int, list[Any]] = defaultdict(list)
        for r in self._exchange(transport, msgs, stats, lambda r: self._check_shares(r, "ip", first_sizes(r.sender))):
            gs = [g for g in self.client_segs[r.sender] if g in orders]
            for g, c in zip(gs, self._shares_of(r, "ip", first_sizes(r.sender))):
                shares[g].append(c)
        running = {g: self._add_shares(shares[g]) for g in orders if len(shares[g]) == len(self.seg_holders[g])}
        done: set[int] = set()
        step = 1  # the batch position the sweep replies' next shares are for
        while running:
            msgs = []
            swept: dict[str, list[int]] = {}
            tag = self._next_mask_tag()
            for cid in K:
                gs = [g for g in self.client_segs[cid] if g in running]
                if gs:
                    swept[cid] = [local[cid][g] for g in gs]
                    u = [running[g] for g in gs]
                    payload = {
                        "segs": [local[cid][g] for g in gs],
                        "u": _concat_words(u) if self.masked else u,
                        **({"gamma": gamma} if gamma else {}),
                        **tag,
                    }
                    msgs.append(Message("hyfdca.sweep", SERVER, cid, rnd, payload))
            nxt: dict[int, list[Any]] = defaultdict(list)
            dal: dict[int, list[bytes]] = defaultdict(list)
            for r in self._exchange(
                transport, msgs, stats, lambda r: self._check_sweep(r, swept[r.sender], orders, step)
            ):
                segs = self.client_segs[r.sender]
                ip_segs = [segs[int(j)] for j in r.payload["ip_segs"]]
                sizes = [len(self.seg_batches_of(g, orders[g][step])) for g in ip_segs]
                for g, c in zip(ip_segs, self._shares_of(r, "ip", sizes)):
                    nxt[g].append(c)
                for j, c in zip(r.payload["dalpha_segs"], r.payload["dalpha"]):
                    dal[segs[int(j)]].append(c)
            new_running = {}
            for g in running:
                n_h = len(self.seg_holders[g])
                if len(dal[g]) == n_h:  # pass complete at every holder: add (nu/|B|) dalpha of each
                    self.enc_alpha[g] = self.he.add([self.enc_alpha[g], *dal[g]])
                    done.add(g)
                elif len(nxt[g]) == n_h:
                    new_running[g] = self._add_shares(nxt[g])
            running = new_running
            step += 1
        # PrimalAggregation with the new alpha (every client that was sent the pass); step_average:
        # each client also sends its position share of the segments whose pass was added
        msgs = []
        for cid in K:
            payload = {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]}
            if cfg.step_average:
                payload["avg_segs"] = [local[cid][g] for g in self.client_segs[cid] if g in done]
            msgs.append(Message("hyfdca.primal", SERVER, cid, rnd, payload))
        w_before = self.w.copy() if cfg.step_average else None
        answered = self._primal_aggregation(rnd, transport, msgs, stats)
        if not cfg.step_average:
            return done, set(K), answered, None
        # the position sum is whole when every holder of a segment whose pass was added answered
        # (the others send zeros); a pass that added nothing needs none
        steps = sum(len(self.seg_batches_of(g, m)) for g in done for m in orders[g])
        needed = {cid for cid in K if any(g in done for g in self.client_segs[cid])}
        pos = self.position_sum if self.position_sum is not None and needed <= answered else None
        if pos is None and not needed:
            pos = np.zeros(self.d)
        return done, set(K), answered, (self.w - w_before, pos, steps)
