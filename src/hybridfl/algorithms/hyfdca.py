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

- ``dual_mode: segment``: one ``alpha`` per sample, like consensus, but the holders of a segment
  make the **same exact** SDCA steps, so averaging them changes nothing and no client ever acts on
  a wrong inner product. The segment is cut once into fixed mini-batches of ``batch_size`` samples
  (the same random split at every holder); at setup the holders' partial Gram matrices
  ``X_{k,B} X_{k,B}^T`` of each batch are added under encryption and returned, so every holder
  knows the batch's full Gram ``X_B X_B^T`` (all blocks; a leak the other modes do not have: the
  holders learn the inner products between pairs of their own samples in a batch). Each round
  (``hyfdca.segstart``, then one ``hyfdca.sweep`` per batch, then ``hyfdca.primal``) the holders
  walk the batches in a common random order; before each batch the server adds their encrypted
  shares ``x_{k,i}^T (w_k + sigma' dw_k)`` (their block with the segment's changes so far) and
  every holder decrypts the exact inner products; inside the batch the Gram matrix supplies the
  changes (:func:`~hybridfl.algorithms.convex.losses.gram_steps`). A segment steps only when all
  its holders are selected and answer (a failed holder costs the segment its pass; nothing partial
  is added). ``segment_schedule`` says how the active segments share a round:

  * ``sequential`` (default): one pass per segment, one segment after another (random order),
    each followed by PrimalAggregation, so the next segment starts from the ``w`` the previous one
    left. The round is then *exactly* one epoch of centralised SDCA over the active segments'
    samples (``sigma' = 1``), whatever the number of segments. Cost: ``2 + n_s / b`` exchanges
    per segment, the segments one after another.
  * ``parallel``: all active segments at once, aggregated once: CoCoA+ over segments with an exact
    local solver, ``sigma'`` = number of active segments. ``2 + max n_s / b`` exchanges per round,
    but the safe ``sigma'`` slows every segment down (measured on MNIST binary after 300 rounds:
    3.6e-4 with batch 512, against 7.9e-5 with a certified gap of 4.3e-5 for ``sequential`` with
    batch 128).

  Either way the dual ascends every round (tested) and ``w = w(alpha)``.

``cross = "energy"`` (experimental) scales the own-block correction by
``sum_i q_i / sum_i ||x_{k,i}||^2``; ``cross = "none"`` drops it (paper Alg. 5: fixed ``u``).

Output model (``average_last``): the last iterate ``w`` (default), or the mean of the iterates of
the final ``average_last`` share of the rounds (suffix averaging, as SDCA's averaged output for
Lipschitz losses). The server keeps the running sums of the public ``w`` and of ``enc(alpha)`` (one
ciphertext addition per segment and round, never decrypted); the protocol itself keeps stepping
from the last iterate. The hinge's last iterate wanders around the optimum (measured on credit:
relative suboptimality 1.6e-3 at round 300 under 50 % participation, 1.6e-4 for the average of
rounds 151-300).

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

from hybridfl.algorithms.convex.losses import RowData, gram_steps
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
    dual_mode: Literal["block", "consensus", "segment"] = Field("block", description="block: each client keeps the dual variables of its own cell; consensus: one alpha per sample, averaged over its holders (paper Alg. 1); segment: one alpha per sample, the holders of a segment step together with exact inner products (mini-batch exchanges and batch Gram matrices)")
    batch_size: int = Field(512, ge=1, description="segment mode: samples per mini-batch (one inner-product exchange per batch and round; the batch Gram is summed once at setup)")
    segment_schedule: Literal["sequential", "parallel"] = Field("sequential", description="segment mode: sequential: the active segments take their passes one after another, each from the w the previous one left (exact SDCA over the union, sigma' = 1); parallel: all at once (CoCoA+ over segments, sigma' = number of active segments)")
    sigma: float | None = Field(None, gt=0, description="CoCoA+ safety factor sigma' (default: clients (block), segments (consensus), segments stepping together (segment))")
    cross: Literal["own", "energy", "none"] = Field("own", description="how a client's own dual changes enter its inner-product estimate")
    nu: float = Field(1.0, gt=0, description="dual aggregation weight nu (1 averages over the clients of a sample)")
    smoothing: float = Field(0.0, ge=0, description="hinge only: gamma of the smoothed hinge the local steps solve in round 1 (0: the plain hinge)")
    smoothing_decay: float = Field(1.0, gt=0, le=1, description="gamma is multiplied by this every round ...")
    smoothing_min: float = Field(0.0, ge=0, description="... down to this floor")
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
    average_last: float = Field(0.0, ge=0, lt=1, description="share of the final rounds whose iterates are averaged into the output model (suffix averaging of w and alpha, SDCA's averaged output for non-smooth losses; 0.5: the second half; 0: the last iterate)")
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
        t0, he0 = time.perf_counter(), self.he.seconds
        p = msg.payload
        if msg.kind == "hyfdca.hello":
            return self._reply(msg, t0, he0, ids=self.ids.tolist(), blocks=self.blocks, n_samples=int(self.ids.size))
        if msg.kind == "hyfdca.init":
            norms, gram = self.init(p)
            return self._reply(msg, t0, he0, norms=norms, **({"gram": gram} if gram else {}))
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

    def init(self, p: dict) -> tuple[list[bytes], list[bytes]]:
        """Store the problem constants and segment layout; return the encrypted partial norms per
        segment and (segment mode) the encrypted partial Gram matrix of each mini-batch (upper
        triangles, segment by segment); the client keeps neither."""
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
        gram: list[bytes] = []
        if self.params["dual_mode"] == "segment":
            b = int(p["batch_size"])
            self.seg_global = [int(g) for g in p["seg_global"]]
            # fixed mini-batches: a random split of the segment, the same at every holder (the
            # permutation is drawn from the global segment id and a seed the server sends)
            self.seg_batches = []
            for g, rows in zip(self.seg_global, self.seg_rows):
                perm = rows[np.random.default_rng([int(p["batch_seed"]), g]).permutation(rows.size)]
                self.seg_batches.append([perm[m:m + b] for m in range(0, rows.size, b)])
            for s in range(holders.size):
                colw = self.seg_colw[s]
                for rows in self.seg_batches[s]:
                    Xb = self.X[rows]
                    Xw = Xb if colw is None else (Xb.multiply(colw[None, :]).tocsr() if sp.issparse(Xb) else Xb * colw)
                    G = Xb @ Xw.T
                    G = G.toarray() if sp.issparse(G) else np.asarray(G)
                    gram.append(self.he.encrypt(G[np.triu_indices(rows.size)]))
        return out, gram

    def _store_gram(self, cts: list[bytes]) -> None:
        """Segment mode: decrypt the holders' summed batch Gram matrices (upper triangles)."""
        it = iter(cts)
        self.gram = []
        for batches in self.seg_batches:
            mats = []
            for rows in batches:
                b = rows.size
                G = np.zeros((b, b))
                iu = np.triu_indices(b)
                G[iu] = self.he.decrypt(next(it))
                G = G + np.triu(G, 1).T
                mats.append(G)
            self.gram.append(mats)

    def _batch_share(self, s: int, rows: np.ndarray) -> bytes:
        """``enc(x_{k,i}^T (w_k + sigma' dw_k))`` for one mini-batch of segment ``s`` (its own
        block's part of the exact inner products, with the segment's changes this round)."""
        colw = self.seg_colw[s]
        ww = self.w + self.sweep[s]["sigma"] * self.sweep[s]["dw"]
        if colw is not None:
            ww = ww * colw
        return self.he.encrypt(np.asarray(self.X[rows] @ ww).ravel())

    def segment_start(self, p: dict) -> dict:
        """Segment mode, round start: take ``w`` (and fresh ``alpha`` if returning); for each
        active segment (every holder present) set up this round's batch order and return the
        share of the first batch's inner products."""
        self.w = np.asarray(p["w"], dtype=np.float64)
        if "alpha" in p:
            self._decrypt_segments(p["alpha"], self.alpha)
        segs = [int(v) for v in p["segs"]]
        counts = [int(v) for v in p["count"]]
        flat = [int(v) for v in p["order"]]
        self.sweep = {}
        out, pos = [], 0
        for s, c in zip(segs, counts):
            self.sweep[s] = {"order": flat[pos:pos + c], "j": 0, "dw": np.zeros(self.X.shape[1]), "delta": np.zeros(self.ids.size),
                             "seed": int(p["seed"]), "sigma": float(p.get("sigma", self.params["sigma"]))}
            pos += c
            out.append(self._batch_share(s, self.seg_batches[s][self.sweep[s]["order"][0]]))
        return {"ip": out}

    def segment_sweep(self, p: dict) -> dict:
        """Segment mode: exact SDCA steps on the current mini-batch of each listed segment (the
        decrypted inner products ``u`` are exact: every holder's block with the segment's changes
        so far; the batch Gram gives the changes within the batch). Every holder of a segment
        makes the same steps. Returns the next batch's shares, or ``enc((nu/|B|) dalpha)`` of the
        segment once its pass is done."""
        prm = self.params
        lam_n = float(prm["lam"]) * float(prm["N"])
        nxt, nxt_segs, dal, dal_segs = [], [], [], []
        for s, ct in zip([int(v) for v in p["segs"]], p["u"]):
            st = self.sweep[s]
            m = st["order"][st["j"]]
            rows = self.seg_batches[s][m]
            u0 = self.he.decrypt(ct)
            a = self.alpha[rows] + st["delta"][rows]
            rng = np.random.default_rng([st["seed"], self.seg_global[s], st["j"]])
            d = gram_steps(rng.permutation(rows.size), a, self.y[rows], u0, self.gram[s][m], str(prm["loss"]), lam_n, st["sigma"],
                           float(p.get("gamma", 0.0)))
            st["delta"][rows] += d
            st["dw"] += np.asarray(self.X[rows].T @ d).ravel() / lam_n
            st["j"] += 1
            if st["j"] < len(st["order"]):
                nxt.append(self._batch_share(s, self.seg_batches[s][st["order"][st["j"]]]))
                nxt_segs.append(s)
            else:
                dal.append(self.he.encrypt(st["delta"][self.seg_rows[s]] * self.seg_scale[s]))
                dal_segs.append(s)
        return {"ip": nxt, "ip_segs": nxt_segs, "dalpha": dal, "dalpha_segs": dal_segs}

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
        delta = self.rows.dot_and_add(order, alpha, self.y, self.u, self.q, str(prm["loss"]), lam_n, sigma, cross, dw,
                                      float(p.get("gamma", 0.0)))
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
        self.seed = seed
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
        # suffix averaging (``average_last``): running sums of w and enc(alpha) since avg_start
        self.w_sum = np.zeros(self.d)
        self.alpha_sum: list[bytes] = []
        self.avg_count = 0

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
        segment = cfg.dual_mode == "segment"
        default_sigma = len(self.client_ids) if cfg.dual_mode == "block" else len(self.seg_ids)
        if segment and cfg.segment_schedule == "sequential":
            default_sigma = 1  # one segment at a time (each pass sends its own sigma')
        self.seg_batch_counts = [math.ceil(len(ids) / cfg.batch_size) for ids in self.seg_ids]
        batch_seed = int(np.random.default_rng([self.seed, 11]).integers(2**31))
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
                **({"batch_size": cfg.batch_size, "seg_global": list(segs), "batch_seed": batch_seed} if segment else {}),
            }))
        replies = self._exchange(transport, init_msgs, stats)
        parts: dict[int, list[bytes]] = defaultdict(list)
        for r in replies:
            for j, c in enumerate(r.payload["norms"]):
                parts[self.client_segs[r.sender][j]].append(c)
        enc_q = {g: self.he.add(v) for g, v in parts.items()}
        gram: dict[tuple[int, int], bytes] = {}
        if segment:  # batch Gram matrices: the holders' partial (own-block) Grams added per batch
            gparts: dict[tuple[int, int], list[bytes]] = defaultdict(list)
            for r in replies:
                it = iter(r.payload["gram"])
                for g in self.client_segs[r.sender]:
                    for m in range(self.seg_batch_counts[g]):
                        gparts[(g, m)].append(next(it))
            gram = {key: self.he.add(v) for key, v in gparts.items()}
        self._exchange(transport, [Message("hyfdca.norms", SERVER, cid, 0, {
            "norms": [enc_q[g] for g in self.client_segs[cid]],
            **({"gram": [gram[(g, m)] for g in self.client_segs[cid] for m in range(self.seg_batch_counts[g])]} if segment else {})})
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

    def smoothing(self, rnd: int) -> float:
        """``gamma`` of the smoothed hinge for round ``rnd`` (1-based): ``max(smoothing_min,
        smoothing * smoothing_decay^(rnd-1))``; 0 for other losses or without smoothing."""
        cfg = self.config
        if cfg.loss != "hinge" or cfg.smoothing <= 0:
            return 0.0
        return float(max(cfg.smoothing_min, cfg.smoothing * cfg.smoothing_decay ** (rnd - 1)))

    # -- one round
    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        t0, he0 = time.perf_counter(), self.he.seconds
        stats: dict = defaultdict(float)
        K = selected = self.select(rnd)
        if self.config.dual_mode == "segment":
            return self._run_round_segment(rnd, transport, selected, stats, t0, he0)
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
        gamma = self.smoothing(rnd)
        msgs = [Message("hyfdca.dual", SERVER, cid, rnd, {"ip": [enc_ip[g] for g in self.client_segs[cid]], **({"gamma": gamma} if gamma else {})})
                for cid in K]
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
        answered = self._primal_aggregation(rnd, transport, msgs, stats)
        self._accumulate_average(rnd)
        out = self._finish(stats, t0, he0)
        out["participants"] = len(selected)
        out["failed"] = len(K) - len(answered)
        return out

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

    def output_alpha_ciphertexts(self) -> tuple[list[tuple[np.ndarray, bytes]], int]:
        """The dual of the output model for an outside monitor with the key: ((segment sample IDs,
        ciphertext) per segment, divisor): the encrypted sums of ``alpha`` over the averaged rounds
        and their count, or ``enc(alpha)`` and 1 before averaging starts."""
        if self.avg_count:
            return list(zip(self.seg_ids, self.alpha_sum)), self.avg_count
        return self.alpha_ciphertexts(), 1

    def _primal_aggregation(self, rnd: int, transport: Transport, msgs: list[Message], stats: dict) -> set[str]:
        """PrimalAggregation, server part (Alg. 4 lines 5-6): ``w_f = (1/(lambda N)) sum_k share_{k,f}``
        (an absent client's share is its last one). Returns the clients that answered; they count
        as having taken part in round ``rnd`` (a failed client counts as absent: fresh ``alpha``
        next time)."""
        answered: set[str] = set()
        for r in self._exchange(transport, msgs, stats):
            answered.add(r.sender)
            self.share_cache[r.sender] = np.asarray(r.payload["share"], dtype=np.float64)
        w = np.zeros(self.d)
        for cid, share in self.share_cache.items():
            w[self.feat[cid]] += share
        self.w = w / (self.config.lam * self.N)
        for cid in answered:
            self.last_round[cid] = rnd
        return answered

    def _run_round_segment(self, rnd: int, transport: Transport, selected: list[str], stats: dict, t0: float, he0: float) -> dict[str, float]:
        """One round of ``dual_mode: segment``. A segment is active when all its holders are
        selected. ``segment_schedule: sequential`` (default) gives the active segments one pass
        each, one after another in a random order, each pass followed by PrimalAggregation so the
        next one starts from the ``w`` the last one left: together exactly centralised SDCA over
        the active segments' samples (``sigma' = 1``). ``parallel`` runs all active segments' passes
        at once (CoCoA+ over segments, ``sigma'`` = number of active segments) and aggregates once.
        See :meth:`_segment_pass` for one pass."""
        cfg = self.config
        chosen = set(selected)
        active = [g for g in range(len(self.seg_ids)) if all(h in chosen for h in self.seg_holders[g])]
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

    def _segment_pass(self, rnd: int, transport: Transport, selected: list[str], group: list[int], sigma: float, gamma: float,
                      stats: dict) -> tuple[set[int], set[str], set[str]]:
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
            payload: dict = {"w": self.w[self.feat[cid]], "segs": [local[cid][g] for g in gs], "count": [len(orders[g]) for g in gs],
                             "order": [m for g in gs for m in orders[g]], "seed": seed, "sigma": sigma}
            if self.last_round[cid] < rnd - 1:  # absent (or failed) last round: fresh alpha
                payload["alpha"] = [self.enc_alpha[g] for g in self.client_segs[cid]]
            msgs.append(Message("hyfdca.segstart", SERVER, cid, rnd, payload))
        shares: dict[int, list[bytes]] = defaultdict(list)
        for r in self._exchange(transport, msgs, stats):
            gs = [g for g in self.client_segs[r.sender] if g in orders]
            for g, c in zip(gs, r.payload["ip"]):
                shares[g].append(c)
        running = {g: self.he.add(shares[g]) for g in orders if len(shares[g]) == len(self.seg_holders[g])}
        done: set[int] = set()
        while running:
            msgs = []
            for cid in K:
                gs = [g for g in self.client_segs[cid] if g in running]
                if gs:
                    msgs.append(Message("hyfdca.sweep", SERVER, cid, rnd, {"segs": [local[cid][g] for g in gs], "u": [running[g] for g in gs],
                                                                            **({"gamma": gamma} if gamma else {})}))
            nxt: dict[int, list[bytes]] = defaultdict(list)
            dal: dict[int, list[bytes]] = defaultdict(list)
            for r in self._exchange(transport, msgs, stats):
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
        # PrimalAggregation with the new alpha (every client that was sent the pass)
        msgs = [Message("hyfdca.primal", SERVER, cid, rnd, {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]}) for cid in K]
        answered = self._primal_aggregation(rnd, transport, msgs, stats)
        return done, set(K), answered

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """What changes from round to round (checkpoints): ``(arrays, json_meta)`` with ``w``, the
        ``enc(alpha)`` and cached inner-product ciphertexts (as uint8 arrays), the clients' last
        primal shares, the averaging sums (``average_last``), and in ``meta`` each client's last
        round, the participation RNG state and the number of averaged rounds.
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
        if self.avg_count:
            arrays["w_sum"] = self.w_sum.copy()
            for g, c in enumerate(self.alpha_sum):
                arrays[f"alpha_sum.{g}"] = np.frombuffer(c, dtype=np.uint8).copy()
        meta = {"ip_keys": [[c, int(g)] for c, g in ip_keys], "share_keys": share_keys, "last_round": self.last_round,
                "rng": self.rng.bit_generator.state, "segments": len(self.enc_alpha), "avg_count": self.avg_count}
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
        self.avg_count = int(meta.get("avg_count", 0))
        if self.avg_count:
            self.w_sum = np.asarray(arrays["w_sum"], dtype=np.float64).copy()
            self.alpha_sum = [np.asarray(arrays[f"alpha_sum.{g}"], dtype=np.uint8).tobytes() for g in range(len(self.seg_ids))]

    def alpha_ciphertexts(self) -> list[tuple[np.ndarray, bytes]]:
        """(segment sample IDs, ``enc(alpha)``) per segment: for an outside monitor with the key."""
        return list(zip(self.seg_ids, self.enc_alpha))
