"""HyFDCA server steps (:class:`HyFDCAServer`): setup, the round (HyFDCA Alg. 1), the secure sums,
partial participation, failures, suffix averaging, and the server's checkpoint state.

Failures (``failure_rate``; a client that does its work but whose replies never arrive): the
server adds only the dual changes that arrived and tells each client in PrimalAggregation whether
its changes arrived (``commit``); a block-mode client keeps its new duals only then. A client that
did not answer PrimalAggregation counts as absent (fresh ``alpha`` next time in consensus mode),
and a selected client whose segment lacks an inner-product share from some holder (one that has
never answered) sits the round out. The setup exchanges need every client.

Partial participation, consensus mode (HyFDCA Alg. 1 lines 5-7, Alg. 4). A client of ``K^t``
that did not answer PrimalAggregation in round ``t-1`` is *returning* (line 5); before
SecureInnerProduct the server sends it ``enc(alpha)`` of its segments (line 6) and runs
PrimalAggregation over the returning clients (line 7), one extra exchange in a round that has any
(never in round 1: setup leaves every client at ``alpha^0 = 0``, share 0, line 1). What Alg. 1
then guarantees, and what it does not: client ``k``'s part of ``w`` is its share
``C_k^T a_k / (lambda N)`` (``C_k`` its cells, ``1/c`` on replicated ones) from the ``a_k`` of
the last PrimalAggregation it answered, and Alg. 4 builds ``w`` "from available local" shares, so

    w = w(alpha) + (1/(lambda N)) sum_k C_k^T (a_k - alpha).

From line 7 on, ``a_k = alpha`` for every client of ``K^t`` (before it, a returning client's part
of ``w`` was the one from its last round, and the whole round computed on it); after line 17
every client that answered holds the new ``alpha``. A client *absent* from round ``t`` cannot
refresh its part: once present holders change the ``alpha`` of a sample it also holds, its part is
stale until it returns, and ``w != w(alpha)`` by exactly those stale parts. The paper states this
(Sec. 4.3: "If one of these clients cannot provide its contribution to w_0, then these primal
weights will be stale"). So ``w = w(alpha)`` after a round if no absent client holds a sample
whose ``alpha`` changed since its last PrimalAggregation: always with full participation and in
horizontal partitions (one holder per sample, Thm. 3); in a hybrid grid with random subsets it
fails once a sample's holders are split between present and absent (credit, 3 x 3 grid, 50 %:
``||w - w(alpha)|| / ||w(alpha)||`` about 0.2 after every round, with or without line 7, which
only changes the ``w`` the round computes on). ``tests/test_hyfdca_participation.py`` checks the
identity above to 1e-9 after every round and at every SecureInnerProduct.
``dual_mode: segment`` keeps ``w = w(alpha)`` by stepping a segment only when all its holders are
present (:mod:`hybridfl.algorithms.hyfdca.segment`); block mode has no shared ``alpha``.

Untrusted replies: :mod:`.checks`. Output model (``output: average_last``, ``output: step_average``): :mod:`.output`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridfl.algorithms.convex.problem import block_offsets, feature_index
from hybridfl.algorithms.hyfdca import kinds
from hybridfl.algorithms.hyfdca.align import AlignServerMixin, check_psi_hello, plaintext_segments
from hybridfl.algorithms.hyfdca.checks import ReplyChecksMixin, check_hello
from hybridfl.algorithms.hyfdca.config import PAPER_LATENCY, HyFDCAConfig
from hybridfl.algorithms.hyfdca.idlists import shared_lists, unpack_ids
from hybridfl.algorithms.hyfdca.output import OutputModelMixin
from hybridfl.algorithms.hyfdca.secure import SecureSharesServerMixin
from hybridfl.algorithms.hyfdca.segment import SegmentServerMixin
from hybridfl.algorithms.hyfdca.segment_pass import run_segment_round
from hybridfl.algorithms.participation import select_participants
from hybridfl.errors import ConfigError, PartitionError, ProtocolError, UnknownBlockError
from hybridfl.privacy.he import HEBackend
from hybridfl.privacy.roster import RUN_BYTES
from hybridfl.privacy.secagg import mask_quorum
from hybridfl.runtime import validate
from hybridfl.runtime.exchange import answers
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError

log = logging.getLogger(__name__)

LOCAL_WORK_FLOOR = 10
"""Fewest local steps per client and round below which setup warns that the public ``w`` changes
by a combination of very few raw rows (docs/privacy.md, "Known leakage that remains")."""
FEW_STEPS = "HyFDCA client %r takes %d local steps per round: each round's change of w (public) combines at most %d of its raw rows; raise local_fraction (docs/privacy.md)."

Check = Callable[[Message], None]
"""A reply check: raises :class:`PayloadError` for a malformed reply."""


class HyFDCAServer(ReplyChecksMixin, SegmentServerMixin, OutputModelMixin, SecureSharesServerMixin, AlignServerMixin):
    """Server-side steps of HyFDCA. Holds only public material: ``w`` (plaintext, the model),
    ``enc(alpha)`` per segment, the clients' last encrypted inner-product shares and primal shares.

    Args:
        block_shapes: block name -> shape, all blocks in global order (public schema).
        config: settings.
        he: the server's backend built from public material (cannot decrypt).
        seed: seeds client sampling for partial participation (``default_rng([seed, 7])``) and the
            segment-mode mini-batches (``default_rng([seed, 11])``).

    Attributes (after :meth:`setup`): ``N`` the number of samples, ``d`` of features, ``sigma``
    the CoCoA+ factor ``sigma'``, ``local_steps`` client -> ``H``, ``setup_stats`` the setup's
    timing (as a round's), ``seg_holders`` and ``seg_n`` each segment's holder set and size
    (:mod:`.align`; the server holds no sample ID).
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
        self.seg_n: list[int] = []  # samples per segment (the server never holds sample IDs under psi)
        self.seg_batch_counts: list[int] = []
        self.seg_tag = 0  # segment mode, masked inner products: the last exchange tag
        self.enc_alpha: list[bytes] = []
        self.ip_cache: dict[tuple[str, int], bytes] = {}
        self.share_cache: dict[str, np.ndarray] = {}
        self.last_round: dict[str, int] = {}
        self.local_steps: dict[str, int] = {}
        self.N = 0
        self.sigma = 1.0
        self.setup_stats: dict = {}
        self._output_reset()  # the averaged output models (:mod:`.output`)
        self.bad: set[str] = set()  # clients whose reply failed its check this round (treated as failed)
        self._secure_reset()  # secure aggregation of the primal shares (:mod:`.secure`)

    # -- accounting
    def _exchange(
        self, transport: Transport, msgs: list[Message], stats: dict, check: Check | None = None, strict: bool = False
    ) -> list[Message]:
        """Send ``msgs`` and return the good replies that arrived: each checked (its timings and
        ``check``); a bad one is logged and dropped, and its sender's later replies this round are
        dropped too (:attr:`bad`), as a client that failed there. A reply from a client not asked,
        of another kind than its message, or a second one is not an answer
        (:func:`~hybridfl.runtime.exchange.answers`).

        Raises:
            PayloadError: with ``strict`` (setup), the first bad reply.
        """
        replies = []
        for r in answers(msgs, transport.send_and_receive(msgs), "HyFDCA"):
            if r.sender in self.bad:
                continue  # its reply failed a check earlier this round
            try:
                validate.number(r, "client_seconds", low=0.0)
                validate.number(r, "he_seconds", low=0.0)
                if check is not None:
                    check(r)
            except PayloadError as e:
                if strict:
                    raise
                log.warning("HyFDCA: the reply of %r is treated as missing: %s", r.sender, e)
                self.bad.add(r.sender)
                continue
            replies.append(r)
        if replies:
            stats["client_max"] += max(float(r.payload.get("client_seconds", 0.0)) for r in replies)
            stats["client_max_no_he"] += max(
                float(r.payload.get("client_seconds", 0.0)) - float(r.payload.get("he_seconds", 0.0)) for r in replies
            )
            stats["client_he"] += sum(float(r.payload.get("he_seconds", 0.0)) for r in replies)
            stats["client_sum"] += sum(float(r.payload.get("client_seconds", 0.0)) for r in replies)
            stats["exchanges"] += 1
        return replies

    def _setup_exchange(
        self, transport: Transport, msgs: list[Message], stats: dict, check: Check | None = None
    ) -> list[Message]:
        """A setup exchange, which needs every client's reply, each passing ``check``.

        Raises:
            ProtocolError: a client did not answer, or a reply failed its check (PayloadError)."""
        replies = self._exchange(transport, msgs, stats, check, strict=True)
        missing = [m.receiver for m in msgs if m.receiver not in {r.sender for r in replies}]
        if missing:
            raise ProtocolError(
                f"client {missing[0]!r} did not answer {msgs[0].kind!r}: HyFDCA's setup needs every client."
            )
        return replies

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Learn the clients' blocks (``hyfdca.hello``) and the samples' holder sets (``alignment:
        psi``: pairwise PSI between the clients, ``hyfdca.psi_*``, :mod:`.align`; ``plaintext``: the
        IDs in the hello), send the constants and segment layout (``hyfdca.init``), securely sum
        the squared norms ``q_i`` (segment mode: the batch Gram matrices instead, whose diagonals
        they are) and return the sums (``hyfdca.norms``); ``enc(alpha) = 0``.

        Raises:
            PartitionError: a client holds no samples or no blocks.
            UnknownBlockError: a client holds a block that is not in the schema.
            ProtocolError: a client did not answer a setup exchange; the alignment's counts disagree.
        """
        t0, he0 = time.perf_counter(), self.he.seconds
        stats: dict = defaultdict(float)
        self.client_ids = list(client_ids)
        self.seg_holders = []
        self.bad = set()
        self._secure_reset()
        hello, blocks, ids_of = self._hello(transport, stats)
        sample_seg = self._layout(transport, stats, hello, ids_of)
        init_msgs = self._init_messages(blocks, ids_of, sample_seg)
        segment = self.config.dual_mode == "segment"

        def check_init(r: Message) -> None:  # segment mode sends no squared norms (the Gram diagonals)
            if segment:
                return self._check_segment_init(r)
            self.check_ciphertexts(r, "norms", self.seg_sizes(r.sender))

        replies = self._setup_exchange(transport, init_msgs, stats, check_init)
        enc_q = {} if segment else self._norm_sums(replies)
        seg_entries = self._segment_norms_payloads(replies) if segment else {}
        del replies  # the holders' Gram shares (378 MB on MNIST at b = 512): freed before the sums go out
        self.seg_tag = 0  # masked segment passes: the exchange counter (the Gram used tag 0)
        norms_msgs = []
        for cid in self.client_ids:
            payload = seg_entries.get(cid, {}) if segment else {"norms": [enc_q[g] for g in self.client_segs[cid]]}
            norms_msgs.append(Message(kinds.NORMS, SERVER, cid, 0, payload))
        self._setup_exchange(transport, norms_msgs, stats)
        self.enc_alpha = [self.he.encrypt(np.zeros(n)) for n in self.seg_n]
        self.last_round = {c: -10 for c in self.client_ids}
        self.setup_stats = self._finish(stats, t0, he0)

    def _norm_sums(self, replies: list[Message]) -> dict[int, bytes]:
        """Setup: ``enc(q)`` of each segment, the sum of its holders' encrypted squared norms
        (the ``norms`` of the ``hyfdca.init`` replies, one per segment of the sender)."""
        parts: dict[int, list[bytes]] = defaultdict(list)
        for r in replies:
            for j, c in enumerate(r.payload["norms"]):
                parts[self.client_segs[r.sender][j]].append(c)
        return {g: self.he.add(v) for g, v in parts.items()}

    def _hello(
        self, transport: Transport, stats: dict
    ) -> tuple[list[Message], dict[str, list[str]], dict[str, list[str]]]:
        """The ``hyfdca.hello`` exchange (with PSI's first message under ``alignment: psi``).
        Returns the replies, each client's blocks and (``plaintext``) its sample IDs in order.

        Raises:
            PartitionError, UnknownBlockError, ProtocolError: see :meth:`setup`."""
        psi_mode = self.config.alignment == "psi"
        secure = self.config.secure_aggregation
        names = sorted(self.client_ids)

        def check_reply(r: Message) -> None:
            if psi_mode:
                i = names.index(r.sender)
                check_psi_hello(r, lower=i > 0, higher=i < len(names) - 1)
            else:
                check_hello(r)
            if secure:
                self.secure_hello(r)

        # a fresh run label: the clients' roster signatures (PSI blobs, secure-aggregation keys) name it
        hello_payload = self.psi_hello_payload() if psi_mode else {"run": os.urandom(RUN_BYTES)}
        hello = self._setup_exchange(
            transport,
            [Message(kinds.HELLO, SERVER, c, 0, dict(hello_payload)) for c in self.client_ids],
            stats,
            check_reply,
        )
        ids_of, blocks = {}, {}  # client -> its IDs, its blocks
        for r in hello:
            cid = r.sender
            if not psi_mode:
                ids_of[cid] = unpack_ids(r, "ids")
            if (int(r.payload["n_samples"]) if psi_mode else len(ids_of[cid])) == 0:
                raise PartitionError(f"client {cid!r} holds no samples.")
            bl = list(r.payload["blocks"])
            unknown = [b for b in bl if b not in self.offsets]
            if unknown:
                raise UnknownBlockError(cid, unknown[0])
            if not bl:
                raise PartitionError(f"client {cid!r} holds no feature blocks.")
            blocks[cid] = bl
            self.feat[cid] = feature_index(bl, self.offsets)
        return hello, blocks, dict(shared_lists(ids_of))  # equal ID lists as one object (the layout's passes)

    def _layout(
        self, transport: Transport, stats: dict, hello: list[Message], ids_of: dict[str, list[str]]
    ) -> dict[str, int]:
        """The segments: samples with the same holder set, in ``align.segment_order`` (the server
        learns only the sets and sizes under psi; under plaintext it groups the IDs itself). Sets
        ``seg_holders``, ``seg_n``, ``N``, ``seg_batch_counts`` and ``sigma``; returns sample ID ->
        segment under plaintext (empty under psi)."""
        cfg = self.config
        if cfg.alignment == "psi":
            segments = self.psi_align(transport, stats, hello)
            sample_seg: dict[str, int] = {}
        else:
            plain = plaintext_segments(ids_of, self.client_ids)
            segments = [(key, len(ids)) for key, ids in plain]
            sample_seg = {v: g for g, (_, ids) in enumerate(plain) for v in ids.tolist()}
        self.seg_holders = [list(key) for key, _ in segments]
        self.seg_n = [int(n) for _, n in segments]
        self.N = sum(self.seg_n)
        default_sigma = len(self.client_ids) if cfg.dual_mode == "block" else len(self.seg_n)
        if cfg.dual_mode == "segment" and cfg.segment_schedule == "sequential":
            default_sigma = 1  # one segment at a time (each pass sends its own sigma')
        self.seg_batch_counts = [math.ceil(n / cfg.batch_size) for n in self.seg_n]
        self.sigma = float(cfg.sigma) if cfg.sigma is not None else float(default_sigma)
        return sample_seg

    def _init_messages(
        self, blocks: dict[str, list[str]], ids_of: dict[str, list[str]], sample_seg: dict[str, int]
    ) -> list[Message]:
        """Each client's ``hyfdca.init``: the constants, its segments (as holder sets under psi,
        as a segment per sample under plaintext), holder counts, block weights ``1/c(s, b)`` and
        the segment-mode and secure-aggregation entries. Sets ``client_segs`` and ``local_steps``."""
        cfg = self.config
        batch_seed = int(np.random.default_rng([self.seed, 11]).integers(2**31))
        msgs = []
        seg_arrays: dict[int, np.ndarray] = {}  # plaintext: per distinct ID list (equal lists, equal segments)
        for cid in self.client_ids:
            segs = [g for g, hs in enumerate(self.seg_holders) if cid in hs]
            self.client_segs[cid] = segs
            if (
                cfg.alignment == "psi"
            ):  # its segments as holder sets (0/1 rows over client_ids): it finds its rows' segments
                where = {
                    "segment_sets": np.array(
                        [[c in self.seg_holders[g] for c in self.client_ids] for g in segs], dtype=np.uint8
                    )
                }
            else:
                ids, local = ids_of[cid], {g: j for j, g in enumerate(segs)}
                if id(ids) not in seg_arrays:
                    seg_of = map(local.__getitem__, map(sample_seg.__getitem__, ids))
                    seg_arrays[id(ids)] = np.fromiter(seg_of, dtype=np.int64, count=len(ids))
                where = {"segment": seg_arrays[id(ids)].copy()}
            bw = np.ones((len(segs), len(blocks[cid])))
            for j, g in enumerate(segs):
                for bi, b in enumerate(blocks[cid]):
                    bw[j, bi] = 1.0 / sum(1 for h in self.seg_holders[g] if b in blocks[h])
            n_k = sum(self.seg_n[g] for g in segs)
            H = max(1, math.ceil(cfg.local_fraction * n_k))
            self.local_steps[cid] = int(H)
            if H < LOCAL_WORK_FLOOR:  # docs/privacy.md, "Known leakage that remains"
                log.warning(FEW_STEPS, cid, H, H)
            payload = {
                "N": self.N,
                "lam": cfg.lam,
                "loss": cfg.loss,
                "H": int(H),
                "sigma": self.sigma,
                "nu": cfg.nu,
                "dual_mode": cfg.dual_mode,
                "epochs": cfg.local_epochs,
                **where,
                "holders": np.array([len(self.seg_holders[g]) for g in segs], dtype=np.int64),
                "block_weight": bw.ravel(),
                **(self._segment_init_payload(segs, batch_seed) if cfg.dual_mode == "segment" else {}),
                **(self.secure_init_payload(cid, blocks) if cfg.secure_aggregation else {}),
            }
            msgs.append(Message(kinds.INIT, SERVER, cid, 0, payload))
        return msgs

    def _finish(self, stats: dict, t0: float, he0: float) -> dict:
        """Round timing: measured encryption time (clients + server), and a modelled round time
        with clients in parallel (per exchange the slowest client, as HyFDCA Sec. 5.1) plus the
        server's own time (wall minus the sequentially simulated clients) plus latency per
        exchange."""
        wall = time.perf_counter() - t0
        server_he = self.he.seconds - he0
        server_s = max(0.0, wall - stats["client_sum"])
        ex = int(stats["exchanges"])
        latency = ex * PAPER_LATENCY
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
        """Available clients ``K^t`` of round ``rnd`` (HyFDCA Assumption 5 random subsets or
        Assumption 7 cyclic groups), drawn from the server's RNG."""
        cfg = self.config
        minimum = mask_quorum(cfg.secagg_threshold, len(self.client_ids)) if cfg.secure_aggregation else 1  # clients' t
        return select_participants(
            rnd, self.client_ids, cfg.participation, cfg.participation_mode, cfg.cyclic_groups, self.rng, minimum
        )

    # -- one round
    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """Round ``rnd`` (HyFDCA Alg. 1; the practical variant of Sec. 5 without the second
        SecureInnerProduct, line 18): in consensus mode, fresh ``enc(alpha)`` and
        PrimalAggregation for the returning clients (HyFDCA Alg. 1 lines 6-7; see the module
        docstring), then SecureInnerProduct, LocalDualMethod with the dual aggregation
        (lines 9-15), PrimalAggregation (lines 16-17); segment mode: the segment passes
        (:mod:`hybridfl.algorithms.hyfdca.segment`). Returns the round's metrics: timing (see
        :meth:`_finish`; seconds), ``participants``, ``failed`` (clients that took part but missed
        a reply) and, in segment mode, ``segments_updated``, ``segments_active`` and ``sigma``."""
        t0, he0 = time.perf_counter(), self.he.seconds
        stats: dict = defaultdict(float)
        self.bad = set()
        K = selected = self.select(rnd)
        if self.config.dual_mode == "segment":
            return run_segment_round(self, rnd, transport, selected, stats, t0, he0)
        consensus = self.config.dual_mode == "consensus"
        # 0. consensus mode, HyFDCA Alg. 1 lines 5-7: the returning clients K^t \ K^(t-1) get fresh
        # enc(alpha) (line 6) and PrimalAggregation(returning) runs (line 7), so w holds every
        # client of K^t's share of the current alpha before SecureInnerProduct; a returning client
        # whose reply is missing sits the round out (its alpha and share may be stale)
        K, line7, line7_failed = self._refresh_returning(rnd, transport, K, stats) if consensus else (K, [], 0)
        # 1. SecureInnerProduct (Alg. 2; lines 8 and 18 of Alg. 1 as one exchange at the round start)
        msgs = [Message(kinds.IP, SERVER, cid, rnd, {"w": self.w[self.feat[cid]]}) for cid in K]
        for r in self._exchange(transport, msgs, stats, self._check_ip):
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
        msgs = [Message(kinds.DUAL, SERVER, cid, rnd, {"ip": [enc_ip[g] for g in self.client_segs[cid]]}) for cid in K]
        parts: dict[int, list[bytes]] = defaultdict(list)
        got_dual: set[str] = set()
        for r in self._exchange(transport, msgs, stats, self._check_dalpha):
            got_dual.add(r.sender)
            for j, c in enumerate(r.payload["dalpha"]):
                parts[self.client_segs[r.sender][j]].append(c)
        for g, v in parts.items():
            self.enc_alpha[g] = self.he.add([self.enc_alpha[g], *v])
        # 3. PrimalAggregation (Alg. 1 lines 16-17; ``commit``: whether the client's dual changes
        # arrived; a client whose reply was lost drops them, so its duals stay those the server aggregated).
        # Secure aggregation: fewer than t clients would refuse the exchange, so selected clients
        # that sat the round out join it (no dual change: commit false; consensus: a fresh alpha, Alg. 1 line 6)
        if self.config.secure_aggregation:  # not those sent line 7 this round: a request is answered once
            K = self._closing_quorum(rnd, selected, K, line7)
        msgs = []
        for cid in K:
            payload = (
                {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]}
                if consensus
                else {"commit": cid in got_dual}
            )
            msgs.append(Message(kinds.PRIMAL, SERVER, cid, rnd, payload))
        answered = self._primal_aggregation(rnd, transport, msgs, stats)
        self._accumulate_average(rnd)
        out = self._finish(stats, t0, he0)
        out["participants"] = len(selected)
        out["failed"] = line7_failed + len(K) - len(answered)
        return out

    def _refresh_returning(
        self, rnd: int, transport: Transport, K: list[str], stats: dict
    ) -> tuple[list[str], list[str], int]:
        """Consensus mode, HyFDCA Alg. 1 lines 5-7: the returning clients ``K^t \\ K^(t-1)`` get
        fresh ``enc(alpha)`` (line 6) and PrimalAggregation over them runs (line 7), so ``w`` holds
        every client of ``K^t``'s share of the current ``alpha`` before SecureInnerProduct. Under
        secure aggregation present clients of ``K`` join so the exchange has ``t`` clients (their
        share unchanged since counted: a zero change). Returns ``K`` without the returning clients
        whose reply is missing (they sit the round out: their alpha and share may be stale), the
        clients sent line 7's PrimalAggregation, and how many returning clients failed."""
        returning = [cid for cid in K if self._returning(cid, rnd)]
        if not returning:
            return K, [], 0
        cfg = self.config
        need = mask_quorum(cfg.secagg_threshold, len(self.client_ids)) if cfg.secure_aggregation else 0
        extra = [cid for cid in K if cid not in returning][: max(0, need - len(returning))]
        msgs = [
            Message(kinds.PRIMAL, SERVER, cid, rnd, {"alpha": [self.enc_alpha[g] for g in self.client_segs[cid]]})
            for cid in [c for c in K if c in returning or c in extra]
        ]
        fresh = self._collect_shares(transport, msgs, stats)
        failed = len([c for c in returning if c not in fresh])
        return [cid for cid in K if cid in fresh or cid not in returning], [m.receiver for m in msgs], failed

    def _closing_quorum(self, rnd: int, selected: list[str], K: list[str], line7: list[str]) -> list[str]:
        """Secure aggregation, the closing PrimalAggregation's clients: fewer than ``t`` would refuse
        the exchange, so selected clients that sat the round out join (no dual change: commit
        false; consensus: a fresh alpha, Alg. 1 line 6), except those sent line 7 this round (a
        request is answered once); still fewer than ``t``: none (the exchange is skipped)."""
        need = mask_quorum(self.config.secagg_threshold, len(self.client_ids))
        extra = [c for c in selected if c not in K and c not in line7][: max(0, need - len(K))]
        K = [c for c in selected if c in K or c in extra]
        if len(K) < need:
            log.warning("HyFDCA round %d: %d clients for PrimalAggregation, fewer than %d; skipped.", rnd, len(K), need)
            return []
        return K

    def _returning(self, cid: str, rnd: int) -> bool:
        """Whether ``cid`` is in ``K^t \\ K^(t-1)`` (HyFDCA Alg. 1 line 5): it did not answer
        PrimalAggregation in round ``rnd - 1`` (absent, or failed: its share may be stale). Nobody
        returns in round 1: setup left every client at ``alpha^0 = 0`` with share ``w_k = 0``
        (Alg. 1 line 1)."""
        return rnd > 1 and self.last_round[cid] != rnd - 1

    def _collect_shares(self, transport: Transport, msgs: list[Message], stats: dict) -> set[str]:
        """PrimalAggregation, server part (Alg. 4 lines 5-6): send ``msgs`` (``hyfdca.primal``),
        keep each answering client's new share, and set ``w_f = (1/(lambda N)) sum_k share_{k,f}``
        over every client's newest share (an absent client's is its last one: Alg. 4 updates ``w``
        "from available local" shares). Returns the clients that answered. With
        ``secure_aggregation`` the server sees only masked changes (:meth:`collect_masked`). With
        ``avg_segs`` in the messages (``output: step_average``) the replies' ``position_share`` vectors are
        added into ``position_sum`` ``(d,)``."""
        # step_average: every reply carries a position share beside the share (width 2)
        self.sa_width = 2 if msgs and "avg_segs" in msgs[0].payload else 1
        self.position_sum = None
        if self.config.secure_aggregation:
            return self.collect_masked(transport, msgs, stats)
        return self.clear_shares(self._exchange(transport, msgs, stats, self._check_share))

    def _primal_aggregation(self, rnd: int, transport: Transport, msgs: list[Message], stats: dict) -> set[str]:
        """The round's closing PrimalAggregation (Alg. 1 line 17; :meth:`_collect_shares`). Returns
        the clients that answered; they count as having taken part in round ``rnd`` (a failed
        client counts as absent: it returns next time)."""
        return self.took_part(rnd, self._collect_shares(transport, msgs, stats))

    def took_part(self, rnd: int, answered: set[str]) -> set[str]:
        """Record the clients whose PrimalAggregation share was counted as having taken part in
        round ``rnd`` (the others count as absent and get ``alpha`` when they return); returns them."""
        for cid in answered:
            self.last_round[cid] = rnd
        return answered

    # -- checkpoints
    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """What changes from round to round (checkpoints): ``(arrays, json_meta)`` with ``w`` ``(d,)``,
        the ``enc(alpha)`` and cached inner-product ciphertexts (as uint8 arrays), the clients'
        last primal shares, the averaging sums (``output: average_last``), the step averages of the
        output's rounds (``output: step_average``: :meth:`output_state`), and in ``meta`` each client's last
        round, the participation RNG state, the number of averaged rounds and the encryption scheme.
        The segment layout is rebuilt by :meth:`setup`."""
        arrays: dict[str, np.ndarray] = {"w": self.w.copy()}
        for g, c in enumerate(self.enc_alpha):
            arrays[f"alpha.{g}"] = np.frombuffer(c, dtype=np.uint8).copy()
        ip_keys = sorted(self.ip_cache)
        for j, key in enumerate(ip_keys):
            arrays[f"ip.{j}"] = np.frombuffer(self.ip_cache[key], dtype=np.uint8).copy()
        share_keys = list(self.share_cache)  # insertion order: the order w sums the shares in
        for j, cid in enumerate(share_keys):
            arrays[f"share.{j}"] = self.share_cache[cid].copy()
        out_arrays, out_meta = self.output_state()
        arrays.update(out_arrays)
        if self.avg_count:
            arrays["w_sum"] = self.w_sum.copy()
            for g, c in enumerate(self.alpha_sum):
                arrays[f"alpha_sum.{g}"] = np.frombuffer(c, dtype=np.uint8).copy()
        meta = {
            "ip_keys": [[c, int(g)] for c, g in ip_keys],
            "share_keys": share_keys,
            "last_round": self.last_round,
            "rng": self.rng.bit_generator.state,
            "segments": len(self.enc_alpha),
            "avg_count": self.avg_count,
            "encryption": self.config.encryption,
            "seg_tag": int(self.seg_tag),
            **out_meta,
        }
        sa_arrays, sa_meta = self._secure_state()
        return {**arrays, **sa_arrays}, {**meta, **sa_meta}

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned, after :meth:`setup` on the same clients.

        Raises:
            ConfigError: the checkpoint was written with another encryption scheme.
            PartitionError: the checkpoint's segment layout differs from this federation's."""
        held = meta.get("encryption", self.config.encryption)
        if held != self.config.encryption:
            raise ConfigError(
                f"the checkpoint was written with encryption {held!r}, the config says {self.config.encryption!r}."
            )
        if int(meta["segments"]) != len(self.seg_n):
            raise PartitionError(
                f"the checkpoint has {meta['segments']} sample segments, this federation {len(self.seg_n)}."
            )
        self.w = np.asarray(arrays["w"], dtype=np.float64).copy()
        self.set_output_state(arrays, meta)
        self.enc_alpha = [np.asarray(arrays[f"alpha.{g}"], dtype=np.uint8).tobytes() for g in range(len(self.seg_n))]
        self.ip_cache = {
            (str(c), int(g)): np.asarray(arrays[f"ip.{j}"], dtype=np.uint8).tobytes()
            for j, (c, g) in enumerate(meta["ip_keys"])
        }
        self.share_cache = {
            str(c): np.asarray(arrays[f"share.{j}"], dtype=np.float64).copy() for j, c in enumerate(meta["share_keys"])
        }
        self.last_round = {str(c): int(r) for c, r in meta["last_round"].items()}
        self.seg_tag = int(meta.get("seg_tag", 0))
        self.rng.bit_generator.state = meta["rng"]
        self._set_secure_state(arrays, meta)
        self.avg_count = int(meta.get("avg_count", 0))
        if self.avg_count:
            self.w_sum = np.asarray(arrays["w_sum"], dtype=np.float64).copy()
            self.alpha_sum = [
                np.asarray(arrays[f"alpha_sum.{g}"], dtype=np.uint8).tobytes() for g in range(len(self.seg_n))
            ]
