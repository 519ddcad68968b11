"""Secure aggregation of HyFEM's extractors (``secure_aggregation: true``; our addition, off by
default: the paper's server averages the clients' extractors in the clear, HyFEM Alg. 1 line 7).

With it the server learns, per block, only ``sum_m p_m theta_m,b`` over the clients of the round
that hold block ``b`` (``p_m`` their sample counts, which it knows), which is exactly what the
average needs (:mod:`hybridfl.privacy.secagg`: pairwise X25519/HKDF/ChaCha20 masks on fixed-point
values). The classifiers still cross in the clear: the neuron matching (Alg. 3) needs each one.

Protocol: ``hyfem.properties`` carries a fresh ``run`` label and its reply ``secagg_public``
(and, with a roster, ``secagg_sig``: the client's credential signature over its key and blocks for
that run); a setup exchange ``hyfem.keys`` relays the other clients' keys, blocks and signatures,
and a client with a roster keeps a key only if its signature verifies against its own roster; each ``hyfem.fit`` carries a fresh
``tag`` and the round's other clients (``peers``); the reply carries ``ext_masked`` (``uint64``,
the client's blocks' extractor parameters times ``p_m``, flattened in its block order) instead of
the ``ext.*`` arrays, and ``self_shares`` (its self-mask seed's encrypted Shamir shares, one per
peer: double masking). After every masked round ``hyfem.unmask`` asks each survivor once for its
masks with the missing clients and the self-mask shares of the others
(:func:`~hybridfl.runtime.secagg_messages.unmask_exchange`); if one of them fails, the round keeps
its extractors (the classifiers are still matched).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridfl.algorithms.hyfem.kinds import KEYS, UNMASK
from hybridfl.errors import ProtocolError, TrainingDiverged
from hybridfl.privacy.secagg import SecAggClient, from_fixed, to_fixed, unmask_quorum
from hybridfl.runtime import secagg_messages as sm
from hybridfl.runtime import validate
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError

log = logging.getLogger(__name__)

SECURE_FIT_KEYS = ("tag", "peers")
"""The keys a ``hyfem.fit`` carries with secure aggregation."""


def _flat(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays.values()])


def _unflat(v: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for k, a in like.items():
        out[k] = v[i : i + a.size].reshape(a.shape)
        i += a.size
    return out


class SecureExtractorsClientMixin:
    """Client side (:class:`~hybridfl.algorithms.hyfem.client.HyFEMClient`)."""

    def _secure_init(self) -> None:
        sizes = [_flat(self.model.extractor_arrays(b)).size for b in self.blocks]
        self.secagg = SecAggClient(self.client_id, self.blocks, sizes, threshold=self.secagg_threshold)
        self.sa_run = b""  # the properties message's run label (its key's signature names it)

    def secure_hello_entries(self, msg: Message) -> dict:
        """``secagg_public`` and, with a roster (``peer_auth``), ``secagg_sig``: its credential's
        signature over its key and blocks for the message's ``run``
        (:func:`~hybridfl.runtime.secagg_messages.sign_key`).

        Raises:
            PayloadError: with a roster and secure aggregation configured, no 32-byte ``run``.
        """
        auth = self.peer_auth if self.require_secagg or "run" in msg.payload else None
        self.sa_run = sm.run_label(msg, auth)
        return {"secagg_public": self.secagg.public_bytes(), **sm.sign_key(self.secagg, auth, self.sa_run)}

    def secure_keys(self, msg: Message) -> Message:
        """``hyfem.keys``: keep the other clients' public keys and blocks, each key checked
        against its roster when it has one (:func:`~hybridfl.runtime.secagg_messages.set_peers`).

        Raises:
            PayloadError: lists of other lengths, a key that is not an X25519 public key, a blocks
                entry that is not a list of names, its own name or key among them.
            PeerAuthError: with a roster, a peer not in it or a key without its valid signature.
        """
        validate.only_keys(msg, sm.PEER_TABLE_KEYS)
        sm.set_peers(self.secagg, msg, self.peer_auth, self.sa_run)
        return msg.reply()

    def check_secure_fit(self, msg: Message) -> None:
        """Check a secure ``hyfem.fit``'s ``tag`` (above every earlier one) and ``peers``.

        Raises:
            PayloadError: a bad or reused tag, unknown or repeated peers, or fewer clients (itself
                included) than its threshold (:func:`~hybridfl.privacy.secagg.mask_quorum`).
        """
        sm.check_exchange(self.secagg, msg)

    def masked_extractors(self, msg: Message) -> np.ndarray:
        """``p_m`` times its trained extractors' parameters (its blocks in order), masked:
        ``uint64`` ``(sum of its blocks' parameter counts,)``.

        Raises:
            TrainingDiverged: a non-finite weight (training diverged; nothing is sent).
        """
        v = np.concatenate([_flat(self.model.extractor_arrays(b)) for b in self.blocks]) * float(self.data.n_samples)
        if not np.isfinite(v).all():
            raise TrainingDiverged(
                f"training diverged in round {msg.round}: client {self.client_id!r} has non-finite extractor "
                f"weights; lower algorithm.lr."
            )
        return self.secagg.mask(
            to_fixed(v, f"the extractors of client {self.client_id!r}"),
            int(msg.payload["tag"]),
            list(msg.payload["peers"]),
        )

    def unmask(self, msg: Message) -> Message:
        """``hyfem.unmask``: its masks with the ``dropped`` clients of its last exchange and the
        self-mask shares of the surviving ones (:func:`~hybridfl.runtime.secagg_messages.unmask_reply`).

        Raises:
            PayloadError: a bad field, or a request it refuses (not its last exchange, a second
                one, not a partition of that exchange, too few survivors, a foreign share).
        """
        return msg.reply(**sm.unmask_reply(self.secagg, msg))


class SecureExtractorsServerMixin:
    """Server side (:class:`~hybridfl.algorithms.hyfem.server.HyFEMServer`)."""

    def _secure_reset(self) -> None:
        self.sa_tag = 0
        self.sa_publics: dict[str, bytes] = {}

    def secure_setup(self, transport: Transport, replies: Sequence[Message]) -> None:
        """Check every ``secagg_public`` of the properties replies and relay the keys
        (``hyfem.keys``).

        Raises:
            PayloadError: a missing, malformed or repeated key.
            ProtocolError: a client that does not answer ``hyfem.keys``.
        """
        self._secure_reset()
        sigs = {}
        for r in replies:
            self.sa_publics[r.sender] = sm.public_key(r, self.sa_publics)
            sig = sm.key_signature(r)
            if sig is not None:
                sigs[r.sender] = sig
        ids = list(self.clients)
        blocks = {c: self.clients[c]["blocks"] for c in ids}
        publics = {c: self.sa_publics[c] for c in ids}
        msgs = [Message(KEYS, SERVER, cid, 0, sm.peer_table(publics, blocks, cid, sigs)) for cid in ids]
        got = {r.sender for r in transport.send_and_receive(msgs) if r.kind == KEYS}
        missing = [c for c in ids if c not in got]
        if missing:
            raise ProtocolError(f"client {missing[0]!r} did not answer 'hyfem.keys': HyFEM's setup needs every client.")

    def secure_fit_fields(self, cid: str, rnd: int, asked: Sequence[str]) -> dict:
        """The ``tag`` and ``peers`` (the round's other ``asked`` clients) of round ``rnd``'s
        ``hyfem.fit`` to ``cid``."""
        return {"tag": rnd, "peers": [c for c in asked if c != cid]}

    def _param_count(self, b: str) -> int:
        return _flat(self.model.extractor_arrays(b)).size

    def check_masked(self, r: Message, peers: int) -> None:
        """``ext_masked``: a ``uint64`` array of exactly the sender's blocks' parameter count, and
        ``self_shares``: one encrypted self-mask share per other client of the round (``peers``).

        Raises:
            PayloadError: another dtype or shape, or shares missing or malformed.
        """
        sm.uint64_array(r, "ext_masked", sum(self._param_count(b) for b in self.clients[r.sender]["blocks"]))
        sm.check_shares(r, peers)

    def _positions(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
        """Every block's and every client's positions in one flat vector of all blocks' extractor
        parameters (block order): ``(block -> positions, client -> positions, length)``."""
        blocks, i = {}, 0
        for b in self.block_names:
            n = self._param_count(b)
            blocks[b] = np.arange(i, i + n)
            i += n
        clients = {c: np.concatenate([blocks[b] for b in self.clients[c]["blocks"]]) for c in self.clients}
        return blocks, clients, i

    def _exchange_checked(self, rnd: int, transport: Transport) -> Callable:
        def exchange(msgs: list[Message], check: Callable[[Message], None]) -> list[Message]:
            asked = {m.receiver for m in msgs}
            out, seen = [], set()
            for f in transport.send_and_receive(msgs):
                if f.kind != msgs[0].kind or f.sender not in asked or f.sender in seen:
                    continue  # not an answer to this request, or a second one: never subtracted twice
                try:
                    check(f)
                except PayloadError as e:
                    log.warning("HyFEM round %d: %s", rnd, e)
                    continue
                seen.add(f.sender)
                out.append(f)
            return out

        return exchange

    def aggregate_masked(
        self, rnd: int, transport: Transport, replies: Sequence[Message], asked: Sequence[str]
    ) -> None:
        """HyFEM Alg. 1 line 7 from masked replies: per block, the sum of ``p_m theta_m,b`` over
        the holders that replied (masks cancel; a missing client's pair masks are unmasked by the
        others) divided by their ``sum p_m``; stored as float32. A block no reply holds, or a
        round whose unmasking fails, keeps its extractors."""
        got = [r.sender for r in replies]
        blocks, where, length = self._positions()
        total = np.zeros((1, length), dtype=np.uint64)
        for r in replies:
            total[0, where[r.sender]] += r.payload["ext_masked"]
        quorum = unmask_quorum(self.config.secagg_threshold, len(self.clients), len(asked))
        if got and len(asked) > 1 and len(got) < quorum:  # the clients would refuse to unmask (their own rule)
            log.warning(
                "HyFEM round %d: %d of %d replies, fewer than the %d to unmask; the extractors stay.",
                rnd,
                len(got),
                len(asked),
                quorum,
            )
            return
        ok = sm.unmask_exchange(
            self._exchange_checked(rnd, transport),
            UNMASK,
            rnd,
            rnd,
            list(asked),
            {r.sender: r for r in replies},
            total,
            where,
            len(self.clients),
            self.config.secagg_threshold,
        )
        if not ok:
            log.warning("HyFEM round %d: secure aggregation could not be unmasked; the extractors stay.", rnd)
            return
        totals = {b: total[0, pos] for b, pos in blocks.items()}
        for b in self.block_names:
            weight = sum(float(self.clients[c]["n_samples"]) for c in got if b in self.clients[c]["blocks"])
            if weight == 0:
                continue
            avg = from_fixed(totals[b]) / weight
            like = self.model.extractor_arrays(b)
            self.model.load_extractor_arrays(b, {k: a.astype(np.float32) for k, a in _unflat(avg, like).items()})
