"""HyFDCA client steps (:class:`HyFDCAClient`): setup, SecureInnerProduct, LocalDualMethod and
PrimalAggregation on the client side (HyFDCA Alg. 1-5), and the client's one state contract.

LocalDualMethod variants (the extracted paper text garbles the closed form of Alg. 5 line 5; we
pick one and check it by convergence to the centralised optimum, tests/test_hyfdca.py):

- ``dual_mode: block`` (default). Client ``k`` holding cell (samples ``I_k``, blocks ``M_k``) keeps
  its own dual variables ``alpha^(k)`` for its samples and its PrimalAggregation share is
  ``X_k^T alpha^(k)``, so its dual steps move only its own block of ``w``. Its inner-product
  estimate during the local pass is then exact for what it changes:
  ``u_i = x_i^T w + sigma' x_{k,i}^T dw_k`` (the other clients' simultaneous changes are unseen, as
  in CoCoA+), and ``sigma'`` defaults to the number of clients ``K`` (CoCoA+'s safe value for ``K``
  additive parts: ``||sum_k v_k||^2 <= K sum_k ||v_k||^2``). Each client is a block-coordinate
  step on ``P`` for its (samples x blocks) cell solved through its local dual. The server still
  aggregates ``enc(alpha) += sum_k enc((nu/|B_i|) dalpha_{k,i})`` (the holders' mean dual, never
  decrypted by the server); the duality gap is reported for that mean ``alpha`` (a valid but loose
  certificate: the holders' duals may differ on margin samples).
- ``dual_mode: consensus``: the paper's Alg. 1 literally: one ``alpha`` per sample, the holders'
  steps averaged (``nu / |B_i|``), the new ``enc(alpha)`` sent back and used for the primal shares
  (``w = w(alpha)`` exactly with full participation; with partial participation an absent
  client's share goes stale: :mod:`hybridfl.algorithms.hyfdca.server`), fresh ``alpha`` and a
  PrimalAggregation for returning clients (Alg. 1 lines 6-7). A client's own-block feedback
  then misses the other blocks' part of ``x_i^T x_j``, so a local pass over many samples
  overshoots (measured: divergence on MNIST and credit with full local passes); it needs small
  ``H`` and a large ``sigma'``, and converges slowly.
- ``dual_mode: segment``: exact steps shared by the holders of a segment
  (:mod:`hybridfl.algorithms.hyfdca.segment`).

Threat model. The server is *honest but curious*: it follows the protocol and reads
everything it is sent. Every ciphertext is under the clients' key, and the only value a client
sends in the clear is its PrimalAggregation share ``X_k^T a`` (``1/c`` weights aside), which is
public by design (``w``). A *malicious* server holds the public key, so it can encrypt anything;
had the client decrypted any ``alpha`` it was sent and returned ``X_k^T alpha``, the server's
``enc(e_j)`` would have returned raw row ``j`` exactly. Hence, before any share, the client checks
every server message (keys, exact shapes, finite values, ciphertext counts and decrypted lengths:
:mod:`hybridfl.runtime.validate`) and refuses a bad one with one sentence
(:class:`~hybridfl.runtime.validate.PayloadError`), computing and returning nothing:

- block mode uses no server-sent ``alpha`` at all: its share is built from its own duals only, and
  a ``hyfdca.primal`` carrying ``alpha`` (or any key but ``commit``) is refused;
- segment mode's closing sweep uses none either: the client adds its pass's own changes to its
  copy of the aggregated ``alpha`` (:meth:`~.primal.PrimalClientMixin.close_pass`, projected as
  below), and a ``close`` before its pass is over is refused; a server-sent ``alpha`` comes only
  in the fallback ``hyfdca.primal`` and a returning client's ``hyfdca.segstart``;
- consensus and segment modes decrypt the shared ``alpha``, refuse it only if it is malformed
  (count, lengths, finiteness: facts of the message alone) and otherwise take the nearest point of
  the set the protocol can have produced (:meth:`HyFDCAClient.accept_alpha`). What is exact: every
  holder's local step ends in its loss's dual domain, and the server adds ``(nu/|B_i|)`` times each
  of at most ``|B_i|`` holders' changes per round (segment mode: per pass, at most one pass of a
  segment per round). So with ``nu <= 1`` the new ``alpha_i`` is a convex combination of feasible
  points: for hinge and logistic ``y_i alpha_i`` lies in ``[0, 1]``; and since each holder's change
  is at most the box width 1, ``|alpha_i - last_i| <= nu R`` with ``R`` the client's own dual steps
  since it last accepted ``alpha`` (``last`` its own copy; ``R >= 1``). The squared loss has no
  box; dual ascent from ``alpha = 0`` (``D(alpha) >= D(0) = 0``) gives ``sum_i (alpha_i - y_i)^2
  <= N``, so ``|alpha_i - y_i| <= sqrt(N)``. Every bound is widened by the encryption's rounding
  (:meth:`HyFDCAClient.tolerance`: ``1e-6`` plus the scheme's resolution times the number of
  encrypted values summed into ``alpha_i``).

  These bounds depend on the client's labels (the box through ``y_i``, the change bound through
  ``last_i``, whose sign is ``y_i``), so the client projects onto them instead of refusing: were a
  message outside them refused, accept or refuse would be a label (the *label oracle*: ``alpha_k
  = 0.5`` is inside the box iff ``y_k = +1``). An honest ``alpha`` lies in them already, and a
  projected one is a feasible ``alpha`` the server could have sent itself. What a malicious server
  learns from the refusals is then the one stop bit of the fail-closed rule
  (:mod:`hybridfl.algorithms.hyfdca.protocol`), set by the message's form, never by a label
  (tests/test_malicious_server.py).

Known leakage, not prevented: a malicious server can still choose an ``alpha`` inside these
bounds, and it can steer a client's own duals (every mode, block included) through crafted
``enc(x_i^T w)`` and ``enc(q)`` (the steps are clipped to the box but otherwise follow the decrypted
values). Without secure aggregation the share then reveals ``X_k^T a`` for a chosen ``a`` with
bounded coefficients (``|a_i| <= 1``, sign fixed by the label, a change of at most ``nu`` per
round): e.g. a positive sample's row alone. The projection bounds this leakage (a unit vector on a
negative sample becomes 0, no large coefficients, no jump); it does not remove it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex.losses import RowData
from hybridfl.algorithms.convex.problem import features, signed_labels
from hybridfl.algorithms.hyfdca import kinds
from hybridfl.algorithms.hyfdca.align import AlignClientMixin
from hybridfl.algorithms.hyfdca.idlists import pack_ids
from hybridfl.algorithms.hyfdca.primal import PrimalClientMixin
from hybridfl.algorithms.hyfdca.protocol import ClientProtocol
from hybridfl.algorithms.hyfdca.secure import SecureSharesClientMixin
from hybridfl.algorithms.hyfdca.segment_client import SegmentClientMixin
from hybridfl.data.dataset import HybridDataset
from hybridfl.errors import ProtocolError
from hybridfl.privacy.he import HEBackend
from hybridfl.privacy.roster import PeerAuth
from hybridfl.privacy.segmask import SegmentMasks
from hybridfl.runtime import validate
from hybridfl.runtime.handlers import handler
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError

_VECTORS = ("alpha", "alpha_agg", "u", "q", "w")
"""The client's float64 state vectors (``(n_k,)`` but ``w`` ``(d_k,)``)."""

CSR_DENSITY = 0.5
"""``sparse: auto``: a client's features are CSR below this share of non-zeros. Its passes over
its rows (the inner products, ``X^T alpha``, the steps' updates of ``w``) stream 12 bytes per
non-zero as CSR and 8 per entry dense, so CSR reads fewer bytes below 2/3; measured on MNIST
binary's 3 x 3 grid (batch 512), whose middle block group has 32 % non-zeros: as CSR the 10
rounds to 1e-3 took 1.40 s of CPU against 1.48 s dense (medians of five alternating pairs in one
process), the setup the same (0.79 s)."""


class HyFDCAClient(PrimalClientMixin, SegmentClientMixin, SecureSharesClientMixin, AlignClientMixin):
    """Client-side steps of HyFDCA for one client.

    Args:
        client_id: name.
        data: its samples restricted to its blocks, with labels.
        positive: class indices labelled +1.
        he: its encryption backend (holds the shared secret key; from the clients' key pair).
        seed: seeds its coordinate sampling (round ``t`` uses ``default_rng([seed, t])``).
        sparse: ``auto`` (CSR below :data:`CSR_DENSITY` non-zeros) | ``dense`` | ``sparse``
            feature storage.
        require_secagg: refuse a run without secure aggregation of the primal shares (its own
            policy: set when it holds an HE key pair; :mod:`.secure`).
        secagg_threshold: ``t``, the fewest clients of a masked exchange it answers in
            (:func:`~hybridfl.privacy.secagg.mask_quorum`; at least 2; ``0``: a majority).
        peer_auth: its credential and the federation's roster
            (:class:`~hybridfl.privacy.roster.PeerAuth`): it signs its PSI blobs and keys and its
            secure-aggregation key, and refuses a peer's that do not verify (:mod:`.align`,
            :mod:`.secure`); ``None``: nothing signed.

    State kept between messages (:meth:`get_state`): ``alpha`` ``(n_k,)`` its copy of the dual
    variables, ``u`` ``(n_k,)`` the last decrypted inner products, ``q`` ``(n_k,)`` full squared
    norms, ``w`` ``(d_k,)`` the primal weights of its features, ``pending`` (block mode: new duals
    awaiting the server's commit), the constants of ``hyfdca.init`` (``params``), the segment
    layout, the segment-mode state
    (:class:`~hybridfl.algorithms.hyfdca.segment_client.SegmentClientMixin`) and its own view of the
    protocol (``protocol``: :class:`~hybridfl.algorithms.hyfdca.protocol.ClientProtocol`: order,
    own counters, whether it stopped after a refusal).
    """

    def __init__(
        self,
        client_id: str,
        data: HybridDataset,
        positive: Sequence[int],
        he: HEBackend,
        seed: int = 0,
        sparse: str = "auto",
        require_secagg: bool = False,
        secagg_threshold: int = 0,
        peer_auth: PeerAuth | None = None,
    ):
        self.client_id = client_id
        self.peer_auth = peer_auth
        self.protocol = ClientProtocol(client_id)  # its own view of the protocol (fail closed)
        self.secagg_threshold = int(secagg_threshold) if int(secagg_threshold) <= 0 else max(2, int(secagg_threshold))
        self.ids = np.asarray(data.ids).astype(str)
        self.blocks = list(data.block_names)
        self.block_sizes = [int(np.prod(data.block_shapes[b])) for b in self.blocks]
        self.X = features(data, sparse="auto" if sparse == "auto" else sparse == "sparse", density=CSR_DENSITY)
        self.rows = RowData(self.X)
        self.y = signed_labels(data.y, positive)
        self.he = he
        self.seed = seed
        n, d = self.X.shape
        self.alpha = np.zeros(n)
        self.alpha_agg = np.zeros(n)  # its replica of the server's aggregated alpha (:mod:`.primal`)
        self.u = np.zeros(n)
        self.q = np.zeros(n)
        self.w = np.zeros(d)
        self.pending: np.ndarray | None = None  # block mode: new own duals awaiting the server's commit
        self.alpha_round = 0  # consensus/segment mode: the round of the last accepted server alpha (0: setup)
        self.params: dict = {}
        self.seg_rows: list[np.ndarray] = []
        self.seg_colw: list[np.ndarray | None] = []
        self.seg_scale: list[float] = []
        self.seg_global: list[int] = []  # segment mode: global segment ids (to agree on orders with the other holders)
        self.seg_batches: list[list[np.ndarray]] = []  # segment mode: row positions of each fixed mini-batch
        self.gram: list[list[np.ndarray]] = []  # segment mode: full Gram matrix of each mini-batch (all blocks)
        self.sweep: dict[int, dict] = {}  # segment mode: this round's pass over each active segment
        self.require_secagg = require_secagg
        self._secure_init()  # secure aggregation of its primal shares: key pair, counted base
        self.segmask = SegmentMasks(self.secagg)  # segment mode, masked inner products: segment keys
        self._align_init()  # alignment by PSI (alignment: psi): keys and holder sets between setup messages

    # -- helpers
    def _reply(self, msg: Message, t0: float, he0: float, **payload) -> Message:
        payload["client_seconds"] = time.perf_counter() - t0
        payload["he_seconds"] = self.he.seconds - he0
        return msg.reply(**payload)

    def _seg_matrix(self, s: int):
        """Rows ``X[seg_rows[s]]`` of segment ``s`` ``(n_s, d_k)`` (CSR or dense), sliced once per
        segment layout and kept (not part of the state): a round then does no fancy row indexing.
        A segment of all the client's rows in order is ``X`` itself (no copy)."""
        rows = self.seg_rows[s]
        cache = self.__dict__.setdefault("_seg_cache", {})
        hit = cache.get(s)
        if hit is None or hit[0] is not rows:
            whole = len(rows) == self.X.shape[0] and np.array_equal(rows, np.arange(len(rows)))
            hit = cache[s] = (rows, self.X if whole else self.X[rows])
        return hit[1]

    def _cts(self, msg: Message, key: str, count: int | None = None) -> list[bytes]:
        """The checked ciphertext list ``msg.payload[key]``: one per segment unless ``count``."""
        return validate.blobs(msg, key, len(self.seg_rows) if count is None else count)

    def _decrypt_segments(self, msg: Message, key: str, out: np.ndarray) -> None:
        """Decrypt one ciphertext per segment of ``msg.payload[key]`` into ``out`` (checked:
        count, lengths, finite; ``out`` is untouched if any check fails).

        Raises:
            PayloadError: another count, a ciphertext of another length, or non-finite values.
        """
        vals = self._decrypt_checked(msg, key)
        for s, v in enumerate(vals):
            out[self.seg_rows[s]] = v

    def _decrypt_checked(self, msg: Message, key: str) -> list[np.ndarray]:
        """The decrypted per-segment vectors of ``msg.payload[key]``, each of its segment's size and finite."""
        out = []
        for s, c in enumerate(self._cts(msg, key)):
            if HEBackend.length(c) != self.seg_rows[s].size:
                raise PayloadError(msg, key, f"holding a ciphertext of another length than segment {s}")
            v = np.asarray(self.he.decrypt(c), dtype=np.float64)
            if v.shape != (self.seg_rows[s].size,) or not np.isfinite(v).all():
                raise PayloadError(msg, key, "decrypting to values of another shape or not finite")
            out.append(v)
        return out

    def _w(self, msg: Message) -> np.ndarray:
        """The checked primal weights of its features: float ``(d_k,)``, finite."""
        return np.asarray(validate.array(msg, "w", (self.X.shape[1],)), dtype=np.float64).copy()

    def handle(self, msg: Message) -> Message:
        """Answer one server message (``hyfdca.hello``, ``init``, ``norms``, ``ip``, ``dual``,
        ``primal``, ``segstart``, ``sweep``); every reply carries ``client_seconds`` (compute
        wall time) and ``he_seconds`` (encryption time). The message must first be one the
        protocol puts here (:meth:`ClientProtocol.admit
        <hybridfl.algorithms.hyfdca.protocol.ClientProtocol.admit>`); any refusal stops the
        client for the run (fail closed: every later message is refused in one sentence).

        Raises:
            ProtocolError: an unknown message kind, a round message before ``hyfdca.init``, a
                message out of place (order, round number, a request answered already), or any
                message after the client stopped.
            PayloadError: a malformed server message (an ``alpha`` outside the protocol's bounds
                is projected, not refused: :meth:`accept_alpha`); block mode: any ``alpha`` at all.
                Nothing is computed or returned then.
        """
        steps = self._steps()
        try:
            if not self.protocol.stopped:
                handler(steps, msg, f"HyFDCA client {self.client_id!r}", "unknown message kind")
                if msg.kind in kinds.ROUND_KINDS and not self.params:
                    raise ProtocolError(
                        f"HyFDCA client {self.client_id!r} got {msg.kind!r} before its setup (hyfdca.init)."
                    )
            self.protocol.admit(msg, self.params.get("dual_mode") if self.params else None)
            t0, he0 = time.perf_counter(), self.he.seconds  # the reply carries the step's compute and HE time
            reply = self._reply(msg, t0, he0, **steps[msg.kind](msg))
        except Exception as e:
            self.protocol.stop(msg, e)
            raise
        self.protocol.commit(msg, self.params.get("dual_mode"))
        return reply

    def failed_state(self) -> dict[str, Any]:
        """The state entries to keep after a refused message (only the fail-closed stop; Flower's
        node saves them although the message failed: :func:`hybridfl.runtime.flower.node.client_step`)."""
        return self.protocol.get_state()

    def _steps(self) -> dict[str, Callable[[Message], dict[str, Any]]]:
        """Message kind (:mod:`.kinds`) -> the step that computes its reply's entries."""
        return {
            kinds.HELLO: self._on_hello,
            kinds.PSI_SERVE: self.align_serve,
            kinds.PSI_RESULT: self.align_result,
            kinds.PSI_TAGS: self.align_tags,
            kinds.INIT: self._on_init,
            kinds.NORMS: self._on_norms,
            kinds.SEGSTART: self.segment_start,
            kinds.SWEEP: self._on_sweep,
            kinds.IP: lambda msg: {"ip": self.inner_product_shares(msg)},
            kinds.DUAL: lambda msg: {"dalpha": self.local_dual_method(msg, msg.round)},
            kinds.UNMASK: self._on_unmask,
            kinds.PRIMAL: self.on_primal,
        }

    def _on_hello(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.hello``: its IDs (``alignment: plaintext``, the paper's setting: the server
        learns them) or its PSI offer (:meth:`align_hello`), its blocks, sample count and
        secure-aggregation public key."""
        alignment = msg.payload.get("alignment", "plaintext")
        if not isinstance(alignment, str) or alignment not in ("psi", "plaintext"):
            raise PayloadError(msg, "alignment", "not 'psi' or 'plaintext'")
        if alignment == "plaintext":  # the paper's setting: the server learns its IDs
            validate.only_keys(msg, ("alignment", "run"))
        ids = self.align_hello(msg) if alignment == "psi" else {"ids": pack_ids(self.ids.tolist())}
        return {**ids, "blocks": self.blocks, "n_samples": int(self.ids.size), **self.secure_hello_entries(msg)}

    def _on_init(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.init``: the segment layout (given, or with ``alignment: psi`` found from the
        holder sets) and the run's constants (:meth:`init`); replies ``norms`` and the segment
        mode's entries."""
        p = msg.payload
        if "segment_sets" in p:  # alignment: psi: it finds its rows' segments from their holder sets
            seg = self.align_segment(msg)
            if validate.array(msg, "holders", (None,), kinds="iu").size != int(seg.max()) + 1:
                raise PayloadError(msg, "holders", "not holding one count per segment of segment_sets")
            p = {**{k: v for k, v in p.items() if k != "segment_sets"}, "segment": seg}
        else:
            validate.array(msg, "segment", (self.ids.size,), kinds="iu")
        n_seg = validate.array(msg, "holders", (None,), kinds="iu").size
        validate.array(msg, "block_weight", (n_seg * len(self.blocks),))
        secure = self.secure_setup(msg)
        if p.get("dual_mode") == "segment":
            p = {**p, "seg_holder_names": self.check_segment_init(msg, secure)}
        norms, seg = self.init(p)
        self.params["secure_aggregation"] = secure
        return seg if p.get("dual_mode") == "segment" else {"norms": norms}

    def _on_norms(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.norms``: the full squared norms ``q``, projected onto ``q >= 0`` (as the Gram
        diagonals: :func:`~.gram.symmetric_gram`), or, segment mode, the batch Gram matrices
        (whose diagonals are the squared norms its steps use)."""
        if self.params["dual_mode"] == "segment":
            validate.only_keys(msg, ("gram", "seg_keys") if self.params.get("seg_masked") else ("gram",))
            self._store_gram(msg)
            return {}
        validate.only_keys(msg, ("norms",))
        q = self.q.copy()
        self._decrypt_segments(msg, "norms", q)
        self.q = np.maximum(q, 0.0)
        return {}

    def _on_sweep(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.sweep`` (segment mode), checked first (:meth:`check_sweep`); a closing one
        (``close``) also carries its PrimalAggregation share (:meth:`close_pass`)."""
        self.check_sweep(msg)
        out = self.segment_sweep(msg)
        return {**out, **self.close_pass(msg)} if msg.payload.get("close") else out

    def _on_unmask(self, msg: Message) -> dict[str, Any]:
        """``hyfdca.unmask``: its answer to the unmasking request (:meth:`unmask`; only in a run with
        secure aggregation)."""
        if not self.params.get("secure_aggregation"):
            raise ProtocolError(
                f"HyFDCA client {self.client_id!r} got 'hyfdca.unmask' in a run without secure aggregation."
            )
        return self.unmask(msg)

    def get_state(self) -> dict[str, Any]:
        """Everything the client keeps between two messages, as codec values (checkpoints and
        Flower's per-message rebuild both use it): the vectors ``alpha``, ``u``, ``q`` ``(n_k,)`` and
        ``w`` ``(d_k,)``; ``alpha_round``; ``pending`` ``(n_k,)`` if set; after ``hyfdca.init`` the
        constants ``params`` (JSON), ``seg_scale`` ``(S,)``, ``seg_rows.<s>`` and ``seg_colw.<s>``
        per segment; in segment mode the batches, Gram matrices and the pass under way. The data,
        labels and backend come from the constructor. (A state's ``own_sq`` from before is
        ignored: nothing used it.)"""
        st: dict[str, Any] = {k: getattr(self, k).copy() for k in _VECTORS}
        st["alpha_round"] = int(self.alpha_round)
        if self.pending is not None:
            st["pending"] = self.pending.copy()
        if self.params:
            st["params"] = json.dumps(self.params)
            st["seg_scale"] = np.asarray(self.seg_scale, dtype=np.float64)
            for s, rows in enumerate(self.seg_rows):
                st[f"seg_rows.{s}"] = np.asarray(rows, dtype=np.int64)
                if self.seg_colw[s] is not None:
                    st[f"seg_colw.{s}"] = np.asarray(self.seg_colw[s], dtype=np.float64)
        st.update(self._segment_state())
        st.update(self._secure_state())
        st.update(self.segmask.get_state() if self.params.get("seg_masked") else {})
        st.update(self._align_state())
        st.update(self.protocol.get_state())
        return st

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_state` returned into a freshly built client (a missing entry
        keeps its constructor value, so ``{}`` restores nothing)."""
        for k in _VECTORS:
            if k in state:
                setattr(self, k, np.asarray(state[k], dtype=np.float64).copy())
        if "alpha" in state and "alpha_agg" not in state:  # a state from before the replica: its copy
            self.alpha_agg = self.alpha.copy()
        self.pending = np.asarray(state["pending"], dtype=np.float64).copy() if "pending" in state else None
        self.alpha_round = int(state.get("alpha_round", self.alpha_round))
        if "params" in state:
            self.params = json.loads(str(state["params"]))
            scale = np.asarray(state["seg_scale"], dtype=np.float64)
            self.seg_scale = [float(v) for v in scale]
            self.seg_rows = [np.asarray(state[f"seg_rows.{s}"], dtype=np.int64).copy() for s in range(scale.size)]
            self.seg_colw = [
                np.asarray(state[f"seg_colw.{s}"], dtype=np.float64).copy() if f"seg_colw.{s}" in state else None
                for s in range(scale.size)
            ]
        self._set_segment_state(state)
        self._set_secure_state(state)
        self.segmask.set_state(state)
        self._set_align_state(state)
        self.protocol.set_state(state)

    def init(self, p: Mapping[str, Any]) -> tuple[list[bytes], dict[str, Any]]:
        """Setup (``hyfdca.init``; the full squared norms ``q_i`` the closed form of
        HyFDCA Sec. 5 needs, obtained once by the same secure sum as Alg. 2's, ours): store the problem constants and segment layout; return the encrypted partial
        squared norms ``sum_b ||x_{k,i,b}||^2 / c(s, b)`` per segment (none in segment mode, whose
        steps read them from the batch Gram diagonals) and (segment mode) the reply entries of
        :meth:`_segment_init` (the partial Gram matrices, encrypted or masked); the client keeps
        neither."""
        self.params = {k: p[k] for k in ("N", "lam", "loss", "H", "sigma", "nu", "dual_mode")}
        self.params["epochs"] = int(p.get("epochs", 1))
        seg = np.asarray(p["segment"], dtype=np.int64)
        holders = np.asarray(p["holders"], dtype=np.float64)
        bw = np.asarray(p["block_weight"], dtype=np.float64).reshape(holders.size, len(self.blocks))
        self.seg_rows, self.seg_colw, self.seg_scale = [], [], []
        for s in range(holders.size):
            rows = np.flatnonzero(seg == s)
            rows = rows[np.argsort(self.ids[rows], kind="stable")]
            self.seg_rows.append(rows)
            colw = np.repeat(bw[s], self.block_sizes)
            self.seg_colw.append(None if np.all(colw == 1.0) else colw)
            self.seg_scale.append(float(self.params["nu"]) / holders[s])
        out = []
        for s in range(0 if self.params["dual_mode"] == "segment" else holders.size):  # segment: Gram diagonals
            Xs = self._seg_matrix(s)
            sq = Xs.multiply(Xs) if sp.issparse(Xs) else Xs * Xs
            colw = self.seg_colw[s]
            norms = np.asarray(sq @ (colw if colw is not None else np.ones(Xs.shape[1]))).ravel()
            out.append(self.he.encrypt(norms))
        seg = self._segment_init(p) if self.params["dual_mode"] == "segment" else {}
        return out, seg

    def inner_product_shares(self, msg: Message) -> list[bytes]:
        """SecureInnerProduct, client part (HyFDCA Alg. 2 lines 2-6): take ``w_k`` and return
        ``enc(x_{k,i}^T w_k)`` per segment (its block's share of the inner products, weighted
        ``1/c`` on shared blocks). A returning client got the fresh ``enc(alpha)`` just before, in
        the round's first PrimalAggregation (Alg. 1 lines 6-7, :meth:`primal_share`).

        Raises:
            PayloadError: ``w`` is not a finite float array of shape ``(d_k,)``, or another key is sent.
        """
        validate.only_keys(msg, ("w",))
        self.w = self._w(msg)
        out = []
        for s in range(len(self.seg_rows)):
            colw = self.seg_colw[s]
            ww = self.w if colw is None else self.w * colw
            out.append(self.he.encrypt(np.asarray(self._seg_matrix(s) @ ww).ravel()))
        return out

    def local_dual_method(self, msg: Message, rnd: int) -> list[bytes]:
        """LocalDualMethod (HyFDCA Alg. 3/5): ``H`` SDCA steps on own samples (chosen without
        replacement, ``local_epochs`` passes) from the decrypted ``x_i^T w``; returns
        ``enc((nu/|B_i|) dalpha)`` per segment.

        Raises:
            PayloadError: not one ``ip`` ciphertext of the right length per segment, non-finite
                values, or another key.
        """
        validate.only_keys(msg, ("ip",))
        self._decrypt_segments(msg, "ip", self.u)
        prm = self.params
        n = self.ids.size
        H = min(int(prm["H"]), n)
        rng = np.random.default_rng([self.seed, rnd])
        order = rng.choice(n, size=H, replace=False) if H < n else rng.permutation(n)
        if int(prm.get("epochs", 1)) > 1:  # further passes over the same H samples, fresh orders
            order = np.concatenate([order] + [rng.permutation(order) for _ in range(int(prm["epochs"]) - 1)])
        lam_n = float(prm["lam"]) * float(prm["N"])
        sigma = float(prm["sigma"])
        # block mode: the client's own cell duals persist, but only once the server confirms it
        # received this round's changes (PrimalAggregation's ``commit``; a reply lost to a failure
        # must not leave the client and the server with different duals); consensus: start from the
        # shared alpha received from the server
        alpha = self.alpha.copy()
        dw = np.zeros(self.X.shape[1])
        delta = self.rows.dot_and_add(
            order, alpha, self.y, self.u, self.q, str(prm["loss"]), lam_n, sigma, sigma, dw, 0.0
        )
        self.pending = alpha if prm["dual_mode"] == "block" else None
        return [self.he.encrypt(delta[rows] * self.seg_scale[s]) for s, rows in enumerate(self.seg_rows)]
