"""HyFDCA client steps (:class:`HyFDCAClient`): setup, SecureInnerProduct, LocalDualMethod and
PrimalAggregation on the client side (HyFDCA Alg. 1-5), and the client's one state contract.

LocalDualMethod variants (the extracted paper text garbles the closed form; SPEC.md asks to pick
one and prove it by convergence to the centralised optimum):

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

``cross = "energy"`` (experimental) scales the own-block correction by
``sum_i q_i / sum_i ||x_{k,i}||^2``; ``cross = "none"`` drops it (paper Alg. 5: fixed ``u``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex.losses import RowData
from hybridfl.algorithms.convex.problem import features, signed_labels
from hybridfl.algorithms.hyfdca.segment import SegmentClientMixin
from hybridfl.data.dataset import HybridDataset
from hybridfl.errors import ProtocolError
from hybridfl.privacy.he import HEBackend
from hybridfl.runtime.messages import Message

_VECTORS = ("alpha", "u", "q", "w", "own_sq")
"""The client's float64 state vectors (``(n_k,)`` but ``w`` ``(d_k,)``)."""


class HyFDCAClient(SegmentClientMixin):
    """Client-side steps of HyFDCA for one client.

    Args:
        client_id: name.
        data: its samples restricted to its blocks, with labels.
        positive: class indices labelled +1.
        he: its encryption backend (holds the shared secret key; from the clients' key pair).
        seed: seeds its coordinate sampling (round ``t`` uses ``default_rng([seed, t])``).
        sparse: ``auto`` | ``dense`` | ``sparse`` feature storage.

    State kept between messages (:meth:`get_state`): ``alpha`` ``(n_k,)`` its copy of the dual
    variables, ``u`` ``(n_k,)`` the last decrypted inner products, ``q`` ``(n_k,)`` full squared
    norms, ``own_sq`` ``(n_k,)`` squared norms of its own blocks, ``w`` ``(d_k,)`` the primal
    weights of its features, ``pending`` (block mode: new duals awaiting the server's commit), the
    constants of ``hyfdca.init`` (``params``), the segment layout, and the segment-mode state
    (:class:`~hybridfl.algorithms.hyfdca.segment.SegmentClientMixin`).
    """

    def __init__(
        self,
        client_id: str,
        data: HybridDataset,
        positive: Sequence[int],
        he: HEBackend,
        seed: int = 0,
        sparse: str = "auto",
    ):
        self.client_id = client_id
        self.ids = np.asarray(data.ids).astype(str)
        self.blocks = list(data.block_names)
        self.block_sizes = [int(np.prod(data.block_shapes[b])) for b in self.blocks]
        self.X = features(data, sparse="auto" if sparse == "auto" else sparse == "sparse")
        self.rows = RowData(self.X)
        self.y = signed_labels(data.y, positive)
        self.he = he
        self.seed = seed
        n, d = self.X.shape
        self.alpha = np.zeros(n)
        self.u = np.zeros(n)
        self.q = np.zeros(n)
        self.own_sq = np.zeros(n)
        self.w = np.zeros(d)
        self.pending: np.ndarray | None = None  # block mode: new own duals awaiting the server's commit
        self.params: dict = {}
        self.seg_rows: list[np.ndarray] = []
        self.seg_colw: list[np.ndarray | None] = []
        self.seg_scale: list[float] = []
        self.seg_global: list[int] = []  # segment mode: global segment ids (to agree on orders with the other holders)
        self.seg_batches: list[list[np.ndarray]] = []  # segment mode: row positions of each fixed mini-batch
        self.gram: list[list[np.ndarray]] = []  # segment mode: full Gram matrix of each mini-batch (all blocks)
        self.sweep: dict[int, dict] = {}  # segment mode: this round's pass over each active segment

    # -- helpers
    def _reply(self, msg: Message, t0: float, he0: float, **payload) -> Message:
        payload["client_seconds"] = time.perf_counter() - t0
        payload["he_seconds"] = self.he.seconds - he0
        return msg.reply(**payload)

    def _seg_matrix(self, s: int):
        return self.X[self.seg_rows[s]]

    def _decrypt_segments(self, cts: list[bytes], out: np.ndarray) -> None:
        for s, c in enumerate(cts):
            out[self.seg_rows[s]] = self.he.decrypt(c)

    def handle(self, msg: Message) -> Message:
        """Answer one server message (``hyfdca.hello``, ``init``, ``norms``, ``ip``, ``dual``,
        ``primal``, ``segstart``, ``sweep``); every reply carries ``client_seconds`` (compute
        wall time) and ``he_seconds`` (encryption time).

        Raises:
            ProtocolError: an unknown message kind, or a round message before ``hyfdca.init``.
        """
        t0, he0 = time.perf_counter(), self.he.seconds
        p = msg.payload
        if msg.kind == "hyfdca.hello":
            return self._reply(msg, t0, he0, ids=self.ids.tolist(), blocks=self.blocks, n_samples=int(self.ids.size))
        if msg.kind == "hyfdca.init":
            norms, gram = self.init(p)
            return self._reply(msg, t0, he0, norms=norms, **({"gram": gram} if gram else {}))
        if msg.kind not in _ROUND_KINDS:
            raise ProtocolError(f"HyFDCA client {self.client_id!r} got unknown message kind {msg.kind!r}.")
        if not self.params:
            raise ProtocolError(f"HyFDCA client {self.client_id!r} got {msg.kind!r} before its setup (hyfdca.init).")
        if msg.kind == "hyfdca.norms":
            self._decrypt_segments(p["norms"], self.q)
            if "gram" in p:
                self._store_gram(p["gram"])
            return self._reply(msg, t0, he0)
        if msg.kind == "hyfdca.segstart":
            return self._reply(msg, t0, he0, **self.segment_start(p))
        if msg.kind == "hyfdca.sweep":
            return self._reply(msg, t0, he0, **self.segment_sweep(p))
        if msg.kind == "hyfdca.ip":
            return self._reply(msg, t0, he0, ip=self.inner_product_shares(p))
        if msg.kind == "hyfdca.dual":
            return self._reply(msg, t0, he0, dalpha=self.local_dual_method(p, msg.round))
        return self._reply(msg, t0, he0, share=self.primal_share(p))

    def get_state(self) -> dict[str, Any]:
        """Everything the client keeps between two messages, as codec values (checkpoints and
        Flower's per-message rebuild both use it): the vectors ``alpha``, ``u``, ``q``,
        ``own_sq`` ``(n_k,)`` and ``w`` ``(d_k,)``; ``pending`` ``(n_k,)`` if set; after
        ``hyfdca.init`` the constants ``params`` (JSON), ``seg_scale`` ``(S,)``, ``seg_rows.<s>``
        and ``seg_colw.<s>`` per segment; in segment mode the batches, Gram matrices and the pass
        under way. The data, labels and backend come from the constructor."""
        st: dict[str, Any] = {k: getattr(self, k).copy() for k in _VECTORS}
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
        return st

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_state` returned into a freshly built client (a missing entry
        keeps its constructor value, so ``{}`` restores nothing)."""
        for k in _VECTORS:
            if k in state:
                setattr(self, k, np.asarray(state[k], dtype=np.float64).copy())
        self.pending = np.asarray(state["pending"], dtype=np.float64).copy() if "pending" in state else None
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

    def init(self, p: Mapping[str, Any]) -> tuple[list[bytes], list[bytes]]:
        """Setup (``hyfdca.init``; SPEC.md "the full squared norm, obtainable once by the same
        secure sum"): store the problem constants and segment layout; return the encrypted partial
        squared norms ``sum_b ||x_{k,i,b}||^2 / c(s, b)`` per segment and (segment mode) the
        encrypted partial Gram matrix of each mini-batch; the client keeps neither."""
        self.params = {k: p[k] for k in ("N", "lam", "loss", "H", "sigma", "cross", "nu", "dual_mode")}
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
        for s in range(holders.size):
            Xs = self._seg_matrix(s)
            sq = Xs.multiply(Xs) if sp.issparse(Xs) else Xs * Xs
            colw = self.seg_colw[s]
            norms = np.asarray(sq @ (colw if colw is not None else np.ones(Xs.shape[1]))).ravel()
            out.append(self.he.encrypt(norms))
        self.own_sq = (
            np.asarray(self.X.multiply(self.X).sum(axis=1)).ravel()
            if sp.issparse(self.X)
            else np.einsum("ij,ij->i", self.X, self.X)
        )
        gram = self._segment_init(p) if self.params["dual_mode"] == "segment" else []
        return out, gram

    def inner_product_shares(self, p: Mapping[str, Any]) -> list[bytes]:
        """SecureInnerProduct, client part (HyFDCA Alg. 2 lines 2-6): take ``w_k`` and return
        ``enc(x_{k,i}^T w_k)`` per segment (its block's share of the inner products, weighted
        ``1/c`` on shared blocks). A returning client got the fresh ``enc(alpha)`` just before, in
        the round's first PrimalAggregation (Alg. 1 lines 6-7, :meth:`primal_share`)."""
        self.w = np.asarray(p["w"], dtype=np.float64)
        out = []
        for s in range(len(self.seg_rows)):
            colw = self.seg_colw[s]
            ww = self.w if colw is None else self.w * colw
            out.append(self.he.encrypt(np.asarray(self._seg_matrix(s) @ ww).ravel()))
        return out

    def local_dual_method(self, p: Mapping[str, Any], rnd: int) -> list[bytes]:
        """LocalDualMethod (HyFDCA Alg. 3/5): ``H`` SDCA steps on own samples (chosen without
        replacement, ``local_epochs`` passes) from the decrypted ``x_i^T w``; returns
        ``enc((nu/|B_i|) dalpha)`` per segment."""
        self._decrypt_segments(p["ip"], self.u)
        prm = self.params
        n = self.ids.size
        H = min(int(prm["H"]), n)
        rng = np.random.default_rng([self.seed, rnd])
        order = rng.choice(n, size=H, replace=False) if H < n else rng.permutation(n)
        if int(prm.get("epochs", 1)) > 1:  # further passes over the same H samples, fresh orders
            order = np.concatenate([order] + [rng.permutation(order) for _ in range(int(prm["epochs"]) - 1)])
        lam_n = float(prm["lam"]) * float(prm["N"])
        sigma = float(prm["sigma"])
        cross = {"own": sigma, "none": 0.0}.get(str(prm["cross"]))
        if cross is None:  # energy: extrapolate own-block overlaps to all blocks
            own = float(self.own_sq.sum())
            cross = sigma * (float(self.q.sum()) / own if own > 0 else 1.0)
        # block mode: the client's own cell duals persist, but only once the server confirms it
        # received this round's changes (PrimalAggregation's ``commit``; a reply lost to a failure
        # must not leave the client and the server with different duals); consensus: start from the
        # shared alpha received from the server
        alpha = self.alpha.copy()
        dw = np.zeros(self.X.shape[1])
        delta = self.rows.dot_and_add(
            order, alpha, self.y, self.u, self.q, str(prm["loss"]), lam_n, sigma, cross, dw, float(p.get("gamma", 0.0))
        )
        self.pending = alpha if prm["dual_mode"] == "block" else None
        return [self.he.encrypt(delta[rows] * self.seg_scale[s]) for s, rows in enumerate(self.seg_rows)]

    def primal_share(self, p: Mapping[str, Any]) -> np.ndarray:
        """PrimalAggregation, client part (HyFDCA Alg. 4 lines 2-4): ``sum_i alpha_i x_{k,i,f} / c``,
        ``(d_k,)`` (plaintext: ``w`` is public, HyFDCA Sec. 3.1).

        Consensus and segment modes first decrypt the new shared ``alpha`` (at the end of a round,
        Alg. 1 lines 16-17, and in consensus mode also at the start of a round for a returning
        client, lines 6-7); block mode first commits its pending cell duals if the server says it
        received them (``commit``), else drops them."""
        if "alpha" in p:
            self._decrypt_segments(p["alpha"], self.alpha)
        if self.pending is not None:
            if bool(p.get("commit", True)):
                self.alpha = self.pending
            self.pending = None
        share = np.zeros(self.X.shape[1])
        for s, rows in enumerate(self.seg_rows):
            v = np.asarray(self._seg_matrix(s).T @ self.alpha[rows]).ravel()
            colw = self.seg_colw[s]
            share += v if colw is None else v * colw
        return share


_ROUND_KINDS = frozenset(
    {"hyfdca.norms", "hyfdca.segstart", "hyfdca.sweep", "hyfdca.ip", "hyfdca.dual", "hyfdca.primal"}
)
