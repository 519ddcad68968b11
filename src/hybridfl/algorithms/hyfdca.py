"""HyFDCA: Hybrid Federated Dual Coordinate Ascent (HyFDCA paper, Algorithms 1-5; SPEC.md "HyFDCA").

Solves ``min_w P(w) = (lambda/2)||w||^2 + (1/N) sum_i l_i(x_i^T w)`` (hinge, logistic or squared
loss; :mod:`hybridfl.algorithms.convex.losses`) when client ``k`` holds the samples ``I_k`` and,
for them, the feature blocks ``M_k``. Written once as client-side and server-side steps that
exchange :class:`Message` objects; the server never touches client data.

Samples are grouped into **segments**: the samples held by exactly the same set of clients
``B_i`` (in the grid partition of HyFDCA Fig. 2, one segment per sample group). Every vector the
protocol encrypts is per segment, in the segment's canonical order (sorted sample IDs), so the
server can add the ciphertexts of the clients of ``B_i`` slot by slot (CKKS) or value by value
(Paillier) without learning anything but the segment layout.

Setup (once, 3 exchanges):

1. ``hyfdca.hello``: client -> server its sample IDs, block names (no feature value, no label);
2. ``hyfdca.init``: server -> client ``N``, ``lambda``, loss, ``H``, ``sigma'``, the segment of each
   of its samples, ``|B_s|`` and the per-(segment, block) weights ``1 / c(s, b)`` (``c`` = number of
   clients of the segment holding the block; 1 in a grid without replicas);
   client -> server ``enc(sum_b ||x_{k,i,b}||^2 / c)`` per segment (partial squared norms);
3. ``hyfdca.norms``: server -> client the encrypted sums over ``B_i``; clients decrypt
   ``q_i = ||x_i||^2`` (SPEC.md: "the full squared norm, obtainable once by the same secure sum").

Round ``t`` with available clients ``K^t`` (Alg. 1; the practical variant of Sec. 5 that omits the
second SecureInnerProduct, line 18; 3 exchanges):

1. ``hyfdca.ip`` (SecureInnerProduct, Alg. 2): server -> client ``w`` on its features (always, so a
   returning client is never stale in ``w``), and, in consensus mode for a client that did not take
   part in round ``t-1``, fresh ``enc(alpha)`` of its segments (Alg. 1 lines 4-7); client -> server ``enc(x_{k,i}^T w_k)`` per segment. The server adds, per
   segment, the newest share of every client of ``B_i`` (an absent client's share is its last one:
   stale under partial participation, exact with full participation).
2. ``hyfdca.dual`` (LocalDualMethod, Alg. 3 / 5): server -> client ``enc(x_i^T w)`` of its
   segments; the client decrypts and makes ``H`` SDCA coordinate steps on its own samples chosen
   without replacement (:meth:`RowData.dot_and_add`; the step is SPEC.md's closed form for hinge
   with the CoCoA+ safety factor ``sigma'``); client -> server ``enc((nu / |B_i|) dalpha_{k,i})``.
   Server: ``enc(alpha_i) += sum_{k in B_i and K^t} enc(...)`` (Alg. 1 lines 13-15).
3. ``hyfdca.primal`` (PrimalAggregation, Alg. 4): server -> client (consensus mode) the new
   ``enc(alpha)`` of its segments; client -> server ``sum_{i in I_k} alpha_i x_{k,i,f} / c(s_i, b_f)`` per feature
   (plaintext: ``w`` is public, HyFDCA Sec. 3.1). Server: ``w_f = (1/(lambda N)) sum_k share_{k,f}``
   (an absent client's share is its last one). In consensus mode, with every (sample, block) cell
   held by exactly one client, this is exactly ``w(alpha)``.

Failures (``failure_rate``; a client that does its work but whose replies never arrive): the
server adds only the dual changes that arrived and tells each client in PrimalAggregation whether
its changes arrived (``commit``); a block-mode client keeps its new duals only then. A client that
did not answer PrimalAggregation counts as absent (fresh ``alpha`` next time in consensus mode),
and a selected client whose segment lacks an inner-product share from some holder (one that has
never answered) sits the round out.

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
  (``w = w(alpha)`` exactly), fresh ``alpha`` for returning clients. A client's own-block feedback
  then misses the other blocks' part of ``x_i^T x_j``, so a local pass over many samples
  overshoots (measured: divergence on MNIST and credit with full local passes); it needs small
  ``H`` and a large ``sigma'``, and converges slowly.

``cross = "energy"`` (experimental) scales the own-block correction by
``sum_i q_i / sum_i ||x_{k,i}||^2``; ``cross = "none"`` drops it (paper Alg. 5: fixed ``u``).

Encryption (:mod:`hybridfl.privacy`): every ``enc(...)`` above is a real ciphertext of the
configured scheme. The clients share one secret key given to them by a key dealer that is not the
server; the server object holds only the public material. ``alpha`` is never in the clear at the
server (Sec. 3.1: "we choose to encrypt alpha"), nor are inner-product shares.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.losses import RowData
from hybridfl.algorithms.convex.problem import (
    block_offsets,
    feature_index,
    features,
    signed_labels,
)
from hybridfl.algorithms.participation import select_participants
from hybridfl.data.dataset import HybridDataset
from hybridfl.errors import PartitionError
from hybridfl.privacy.he import HEBackend
from hybridfl.runtime.messages import Message
from hybridfl.runtime.transport import Transport

SERVER = "server"
PAPER_LATENCY = 0.2575  # seconds per round trip (HyFDCA Sec. 5.1, Fig. 3/5)


class HyFDCAConfig(BaseModel):
    """HyFDCA settings (``algorithm:`` section with ``name: hyfdca``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Literal["hyfdca"] = "hyfdca"
    loss: Literal["hinge", "logistic", "squared"] = "hinge"
    lam: float = Field(1e-4, gt=0, validation_alias=AliasChoices("lam", "lambda"), description="L2 regulariser lambda (> 0)")
    rounds: int = Field(100, ge=1, description="outer iterations T")
    local_steps: int | None = Field(None, ge=1, description="H: SDCA steps per client per round (default: local_fraction of its samples)")
    local_fraction: float = Field(1.0, gt=0, le=1, description="H as a share of the client's samples when local_steps is not set")
    local_epochs: int = Field(1, ge=1, description="passes over the H chosen samples per round (each in a fresh random order)")
    dual_mode: Literal["block", "consensus"] = Field("block", description="block: each client keeps the dual variables of its own cell; consensus: one alpha per sample, averaged over its holders (paper Alg. 1)")
    sigma: float | None = Field(None, gt=0, description="CoCoA+ safety factor sigma' (default: clients (block) or segments (consensus))")
    cross: Literal["own", "energy", "none"] = Field("own", description="how a client's own dual changes enter its inner-product estimate")
    nu: float = Field(1.0, gt=0, description="dual aggregation weight nu (1 averages over the clients of a sample)")
    participation: float = Field(1.0, gt=0, le=1, description="share (or probability) of clients per round")
    participation_mode: Literal["fraction", "probability", "cyclic"] = "fraction"
    cyclic_groups: int = Field(2, ge=2, description="number of cyclic client groups (participation_mode: cyclic)")
    failure_rate: float = Field(0.0, ge=0, lt=1, description="probability that a selected client fails mid-round (does its work, its replies never arrive)")
    positive_classes: list[int] | None = Field(None, description="class indices labelled +1 (required with more than 2 classes)")
    sparse: Literal["auto", "dense", "sparse"] = Field("auto", description="client feature storage (auto: CSR below 25 % non-zeros)")
    encryption: Literal["none", "paillier", "ckks"] = "none"
    paillier_bits: int = Field(2048, ge=256)
    precision_bits: int = Field(40, ge=16, le=60, description="Paillier fixed-point fraction bits")
    ckks_degree: Literal[4096, 8192, 16384] = 8192
    ckks_scale_bits: int = Field(40, ge=20, le=50)
    latency: float = Field(PAPER_LATENCY, ge=0, description="modelled seconds per round trip (paper: 0.2575)")
    bandwidth_mbps: float | None = Field(None, gt=0, description="modelled link bandwidth; None: bytes cost no time")
    eval_every: int = Field(1, ge=0)
    reference: bool = Field(True, description="compute (or load from the cache) the centralised reference optimum")
    reference_sdca_epochs: int = Field(200, ge=1)


# ---------------------------------------------------------------------------------------------
class HyFDCAClient:
    """Client-side steps of HyFDCA for one client.

    Args:
        client_id: name.
        data: its samples restricted to its blocks, with labels.
        positive: class indices labelled +1.
        he: its encryption backend (holds the shared secret key; from a :class:`KeyDealer`).
        seed: seeds its coordinate sampling (round ``t`` uses ``default_rng([seed, t])``).
        sparse: ``auto`` | ``dense`` | ``sparse`` feature storage.

    State kept between messages (plain NumPy arrays): ``alpha`` ``(n_k,)`` its copy of the dual
    variables, ``u`` ``(n_k,)`` the last decrypted inner products, ``q`` ``(n_k,)`` full squared
    norms, ``w`` ``(d_k,)`` the primal weights of its features, segment layout.
    """

    def __init__(self, client_id: str, data: HybridDataset, positive: Sequence[int], he: HEBackend, seed: int = 0,
                 sparse: str = "auto"):
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
        self.w = np.zeros(d)
        self.pending: np.ndarray | None = None  # block mode: new own duals awaiting the server's commit
        self.params: dict = {}
        self.seg_rows: list[np.ndarray] = []
        self.seg_colw: list[np.ndarray | None] = []
        self.seg_scale: list[float] = []

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
        t0, he0 = time.perf_counter(), self.he.seconds
        p = msg.payload
        if msg.kind == "hyfdca.hello":
            return self._reply(msg, t0, he0, ids=self.ids.tolist(), blocks=self.blocks, n_samples=int(self.ids.size))
        if msg.kind == "hyfdca.init":
            return self._reply(msg, t0, he0, norms=self.init(p))
        if msg.kind == "hyfdca.norms":
            self._decrypt_segments(p["norms"], self.q)
            return self._reply(msg, t0, he0)
        if msg.kind == "hyfdca.ip":
            return self._reply(msg, t0, he0, ip=self.inner_product_shares(p))
        if msg.kind == "hyfdca.dual":
            return self._reply(msg, t0, he0, dalpha=self.local_dual_method(p, msg.round))
        if msg.kind == "hyfdca.primal":
            return self._reply(msg, t0, he0, share=self.primal_share(p))
        raise ValueError(f"HyFDCA client got unknown message kind {msg.kind!r}")

    def get_state(self) -> dict[str, np.ndarray]:
        """What changes from round to round (checkpoints): ``alpha``, ``u`` ``(n_k,)``, ``w`` ``(d_k,)``.
        The rest (``q``, segment layout, constants) is rebuilt by the setup exchanges."""
        return {"alpha": self.alpha.copy(), "u": self.u.copy(), "w": self.w.copy()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned, after the setup exchanges."""
        self.alpha = np.asarray(state["alpha"], dtype=np.float64).copy()
        self.u = np.asarray(state["u"], dtype=np.float64).copy()
        self.w = np.asarray(state["w"], dtype=np.float64).copy()
        self.pending = None

    def init(self, p: dict) -> list[bytes]:
        """Store the problem constants and segment layout; return encrypted partial norms."""
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
        own = np.asarray(self.X.multiply(self.X).sum(axis=1)).ravel() if sp.issparse(self.X) else np.einsum("ij,ij->i", self.X, self.X)
        self.own_sq = own
        return out

    def inner_product_shares(self, p: dict) -> list[bytes]:
        """SecureInnerProduct, client part (Alg. 2 lines 2-6): ``enc(x_{k,i}^T w_k)`` per segment."""
        self.w = np.asarray(p["w"], dtype=np.float64)
        if "alpha" in p:  # fresh dual variables for a returning client (Alg. 1 lines 4-7)
            self._decrypt_segments(p["alpha"], self.alpha)
        out = []
        for s in range(len(self.seg_rows)):
            colw = self.seg_colw[s]
            ww = self.w if colw is None else self.w * colw
            out.append(self.he.encrypt(np.asarray(self._seg_matrix(s) @ ww).ravel()))
        return out

    def local_dual_method(self, p: dict, rnd: int) -> list[bytes]:
        """LocalDualMethod (Alg. 3/5): ``H`` SDCA steps on own samples; encrypted scaled ``dalpha``."""
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
        delta = self.rows.dot_and_add(order, alpha, self.y, self.u, self.q, str(prm["loss"]), lam_n, sigma, cross, dw)
        self.pending = alpha if prm["dual_mode"] == "block" else None
        return [self.he.encrypt(delta[rows] * self.seg_scale[s]) for s, rows in enumerate(self.seg_rows)]

    def primal_share(self, p: dict) -> np.ndarray:
        """PrimalAggregation, client part (Alg. 4 lines 2-4): ``sum_i alpha_i x_{k,i,f} / c``, ``(d_k,)``.

        Consensus mode first decrypts the new shared ``alpha``; block mode first commits its
        pending cell duals if the server says it received them (``commit``), else drops them."""
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


# ---------------------------------------------------------------------------------------------
class HyFDCAServer:
    """Server-side steps of HyFDCA. Holds only public material: ``w`` (plaintext, the model),
    ``enc(alpha)`` per segment, the clients' last encrypted inner-product shares and primal shares.

    Args:
        block_shapes: block name -> shape, all blocks in global order (public schema).
        config: settings.
        he: the server's backend built from public material (cannot decrypt).
        seed: seeds client sampling for partial participation.
    """

    def __init__(self, block_shapes: Mapping[str, tuple[int, ...]], config: HyFDCAConfig, he: HEBackend, seed: int = 0):
        self.config = config
        self.he = he
        self.offsets = block_offsets(block_shapes)
        self.d = sum(b - a for a, b in self.offsets.values())
        self.w = np.zeros(self.d)
        self.rng = np.random.default_rng([seed, 7])
        self.client_ids: list[str] = []
        self.feat: dict[str, np.ndarray] = {}
        self.client_segs: dict[str, list[int]] = {}
        self.seg_holders: list[list[str]] = []
        self.seg_ids: list[np.ndarray] = []
        self.enc_alpha: list[bytes] = []
        self.ip_cache: dict[tuple[str, int], bytes] = {}
        self.share_cache: dict[str, np.ndarray] = {}
        self.last_round: dict[str, int] = {}
        self.N = 0
        self.sigma = 1.0
        self.setup_stats: dict = {}

    # -- accounting
    def _exchange(self, transport: Transport, msgs: list[Message], stats: dict) -> list[Message]:
        replies = transport.send_and_receive(msgs)
        if replies:
            stats["client_max"] += max(float(r.payload.get("client_seconds", 0.0)) for r in replies)
            stats["client_max_no_he"] += max(float(r.payload.get("client_seconds", 0.0)) - float(r.payload.get("he_seconds", 0.0)) for r in replies)
            stats["client_he"] += sum(float(r.payload.get("he_seconds", 0.0)) for r in replies)
            stats["client_sum"] += sum(float(r.payload.get("client_seconds", 0.0)) for r in replies)
            stats["exchanges"] += 1
        return replies

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Learn who holds which samples and blocks, send the constants, securely sum ``q_i``."""
        cfg = self.config
        t0, he0 = time.perf_counter(), self.he.seconds
        stats: dict = defaultdict(float)
        self.client_ids = list(client_ids)
        hello = self._exchange(transport, [Message("hyfdca.hello", SERVER, c, 0) for c in self.client_ids], stats)
        holders: dict[str, list[str]] = defaultdict(list)
        client_ids_order: dict[str, list[str]] = {}
        blocks: dict[str, list[str]] = {}
        for r in hello:
            cid = r.sender
            ids = [str(s) for s in r.payload["ids"]]
            if not ids:
                raise PartitionError(f"client {cid!r} holds no samples.")
            bl = [str(b) for b in r.payload["blocks"]]
            unknown = [b for b in bl if b not in self.offsets]
            if unknown:
                raise PartitionError(f"client {cid!r} holds block {unknown[0]!r}, which is not in the schema.")
            if not bl:
                raise PartitionError(f"client {cid!r} holds no feature blocks.")
            blocks[cid] = bl
            client_ids_order[cid] = ids
            self.feat[cid] = feature_index(bl, self.offsets)
            for s in ids:
                holders[s].append(cid)
        # segments: samples with the same holder set
        seg_of_set: dict[tuple[str, ...], int] = {}
        seg_members: list[list[str]] = []
        sample_seg: dict[str, int] = {}
        for s, hs in holders.items():
            key = tuple(sorted(hs))
            j = seg_of_set.get(key)
            if j is None:
                j = seg_of_set[key] = len(seg_members)
                seg_members.append([])
                self.seg_holders.append(list(key))
            seg_members[j].append(s)
            sample_seg[s] = j
        self.seg_ids = [np.array(sorted(m)) for m in seg_members]
        self.N = len(holders)
        default_sigma = len(self.client_ids) if cfg.dual_mode == "block" else len(self.seg_ids)
        self.sigma = float(cfg.sigma) if cfg.sigma is not None else float(default_sigma)
        # per-client messages: local segment indices, holder counts, block weights 1/c(s, b)
        init_msgs = []
        for cid in self.client_ids:
            segs = sorted({sample_seg[s] for s in client_ids_order[cid]})
            self.client_segs[cid] = segs
            local = {g: j for j, g in enumerate(segs)}
            seg_arr = np.array([local[sample_seg[s]] for s in client_ids_order[cid]], dtype=np.int64)
            bw = np.ones((len(segs), len(blocks[cid])))
            for j, g in enumerate(segs):
                for bi, b in enumerate(blocks[cid]):
                    bw[j, bi] = 1.0 / sum(1 for h in self.seg_holders[g] if b in blocks[h])
            n_k = len(client_ids_order[cid])
            H = cfg.local_steps if cfg.local_steps is not None else max(1, math.ceil(cfg.local_fraction * n_k))
            init_msgs.append(Message("hyfdca.init", SERVER, cid, 0, {
                "N": self.N, "lam": cfg.lam, "loss": cfg.loss, "H": int(H), "sigma": self.sigma, "cross": cfg.cross, "nu": cfg.nu, "dual_mode": cfg.dual_mode, "epochs": cfg.local_epochs,
                "segment": seg_arr, "holders": np.array([len(self.seg_holders[g]) for g in segs], dtype=np.int64),
                "block_weight": bw.ravel(),
            }))
        replies = self._exchange(transport, init_msgs, stats)
        parts: dict[int, list[bytes]] = defaultdict(list)
        for r in replies:
            for j, c in enumerate(r.payload["norms"]):
                parts[self.client_segs[r.sender][j]].append(c)
        enc_q = {g: self.he.add(v) for g, v in parts.items()}
        self._exchange(transport, [Message("hyfdca.norms", SERVER, cid, 0, {"norms": [enc_q[g] for g in self.client_segs[cid]]})
                                   for cid in self.client_ids], stats)
        zeros = [self.he.encrypt(np.zeros(len(ids))) for ids in self.seg_ids]
        self.enc_alpha = zeros
        self.last_round = {c: -10 for c in self.client_ids}
        self.setup_stats = self._finish(stats, t0, he0)

    def _finish(self, stats: dict, t0: float, he0: float) -> dict:
        """Round timing: measured encryption time (clients + server), and a modelled round time
        with clients in parallel (per exchange the slowest client, as HyFDCA Sec. 5.1) plus the
        server's own time (wall minus the sequentially simulated clients) plus latency per
        exchange."""
        cfg = self.config
        wall = time.perf_counter() - t0
        server_he = self.he.seconds - he0
        server_s = max(0.0, wall - stats["client_sum"])
        ex = int(stats["exchanges"])
        latency = ex * cfg.latency
        return {
            "encryption_seconds": server_he + stats["client_he"],
            "client_encryption_seconds": stats["client_he"],
            "server_encryption_seconds": server_he,
            "server_seconds": server_s,
            "client_max_seconds": stats["client_max"],
            "exchanges": ex,
            "latency_seconds": latency,
            "model_seconds": server_s + stats["client_max"] + latency,
            "model_seconds_no_encryption": server_s - server_he + stats["client_max_no_he"] + latency,
        }

    # -- participation
    def select(self, rnd: int) -> list[str]:
        """Available clients ``K^t`` (HyFDCA Assumption 5 random subsets or Assumption 7 cyclic groups)."""
        cfg = self.config
        return select_participants(rnd, self.client_ids, cfg.participation, cfg.participation_mode, cfg.cyclic_groups, self.rng)

    # -- one round
    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        t0, he0 = time.perf_counter(), self.he.seconds
        stats: dict = defaultdict(float)
        K = selected = self.select(rnd)
        # 1. SecureInnerProduct (with fresh alpha for returning clients)
        msgs = []
        for cid in K:
            payload: dict = {"w": self.w[self.feat[cid]]}
            if self.last_round[cid] != rnd - 1 and self.config.dual_mode == "consensus":
                payload["alpha"] = [self.enc_alpha[g] for g in self.client_segs[cid]]
            msgs.append(Message("hyfdca.ip", SERVER, cid, rnd, payload))
        for r in self._exchange(transport, msgs, stats):
            for j, c in enumerate(r.payload["ip"]):
                self.ip_cache[(r.sender, self.client_segs[r.sender][j])] = c
        # a segment's inner products are complete once every holder has sent a share (its newest,
        # possibly stale); a client with an incomplete segment (a holder that has never answered:
        # absent or failed since the start) sits this round out rather than step on wrong ``x_i^T w``
        active = sorted({g for cid in K for g in self.client_segs[cid]})
        enc_ip = {}
        for g in active:
            if all((h, g) in self.ip_cache for h in self.seg_holders[g]):
                enc_ip[g] = self.he.add([self.ip_cache[(h, g)] for h in self.seg_holders[g]])
        K = [cid for cid in K if all(g in enc_ip for g in self.client_segs[cid])]
        # 2. LocalDualMethod at the clients; dual aggregation here
        msgs = [Message("hyfdca.dual", SERVER, cid, rnd, {"ip": [enc_ip[g] for g in self.client_segs[cid]]}) for cid in K]
        parts: dict[int, list[bytes]] = defaultdict(list)
        got_dual: set[str] = set()
        for r in self._exchange(transport, msgs, stats):
            got_dual.add(r.sender)
            for j, c in enumerate(r.payload["dalpha"]):
                parts[self.client_segs[r.sender][j]].append(c)
        for g, v in parts.items():
            self.enc_alpha[g] = self.he.add([self.enc_alpha[g], *v])
        # 3. PrimalAggregation (``commit``: whether the client's dual changes arrived; a client
        # whose reply was lost drops them, so its duals stay those the server aggregated)
        consensus = self.config.dual_mode == "consensus"
        msgs = [Message("hyfdca.primal", SERVER, cid, rnd,
                        {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]} if consensus else {"commit": cid in got_dual})
                for cid in K]
        answered: set[str] = set()
        for r in self._exchange(transport, msgs, stats):
            answered.add(r.sender)
            self.share_cache[r.sender] = np.asarray(r.payload["share"], dtype=np.float64)
        w = np.zeros(self.d)
        for cid, share in self.share_cache.items():
            w[self.feat[cid]] += share
        self.w = w / (self.config.lam * self.N)
        for cid in answered:  # a failed client counts as absent: it gets fresh alpha next time
            self.last_round[cid] = rnd
        out = self._finish(stats, t0, he0)
        out["participants"] = len(selected)
        out["failed"] = len(K) - len(answered)
        return out

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """What changes from round to round (checkpoints): ``(arrays, json_meta)`` with ``w``, the
        ``enc(alpha)`` and cached inner-product ciphertexts (as uint8 arrays), the clients' last
        primal shares, and in ``meta`` each client's last round and the participation RNG state.
        The segment layout is rebuilt by :meth:`setup`."""
        arrays: dict[str, np.ndarray] = {"w": self.w.copy()}
        for g, c in enumerate(self.enc_alpha):
            arrays[f"alpha.{g}"] = np.frombuffer(c, dtype=np.uint8).copy()
        ip_keys = sorted(self.ip_cache)
        for j, key in enumerate(ip_keys):
            arrays[f"ip.{j}"] = np.frombuffer(self.ip_cache[key], dtype=np.uint8).copy()
        share_keys = sorted(self.share_cache)
        for j, cid in enumerate(share_keys):
            arrays[f"share.{j}"] = self.share_cache[cid].copy()
        meta = {"ip_keys": [[c, int(g)] for c, g in ip_keys], "share_keys": share_keys, "last_round": self.last_round,
                "rng": self.rng.bit_generator.state, "segments": len(self.enc_alpha)}
        return arrays, meta

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned, after :meth:`setup` on the same clients.

        Raises:
            PartitionError: the checkpoint's segment layout differs from this federation's."""
        if int(meta["segments"]) != len(self.seg_ids):
            raise PartitionError(f"the checkpoint has {meta['segments']} sample segments, this federation {len(self.seg_ids)}.")
        self.w = np.asarray(arrays["w"], dtype=np.float64).copy()
        self.enc_alpha = [np.asarray(arrays[f"alpha.{g}"], dtype=np.uint8).tobytes() for g in range(len(self.seg_ids))]
        self.ip_cache = {(str(c), int(g)): np.asarray(arrays[f"ip.{j}"], dtype=np.uint8).tobytes() for j, (c, g) in enumerate(meta["ip_keys"])}
        self.share_cache = {str(c): np.asarray(arrays[f"share.{j}"], dtype=np.float64).copy() for j, c in enumerate(meta["share_keys"])}
        self.last_round = {str(c): int(r) for c, r in meta["last_round"].items()}
        self.rng.bit_generator.state = meta["rng"]

    def alpha_ciphertexts(self) -> list[tuple[np.ndarray, bytes]]:
        """(segment sample IDs, ``enc(alpha)``) per segment: for an outside monitor with the key."""
        return list(zip(self.seg_ids, self.enc_alpha))
