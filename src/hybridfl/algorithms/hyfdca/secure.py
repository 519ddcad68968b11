"""Secure aggregation of HyFDCA's primal shares (``secure_aggregation: true``, the default; our
addition to the paper, which sends each client's share ``X_k^T alpha`` in the clear, HyFDCA
Alg. 4 lines 2-4).

Why: a share is a combination of the client's raw rows (measured: with CKKS and ``local_steps: 1``
the round-1 share is a scaled raw row, and consecutive shares differ by a raw row times a
label-signed scalar). With secure aggregation (:mod:`hybridfl.privacy.secagg`) the server learns,
per feature, only the sum of the changes of the shares of the clients in the exchange that hold
it: ``lambda N`` times the change of ``w`` it computes anyway, and nothing else.

Protocol (every ``hyfdca.primal`` exchange, PrimalAggregation, Alg. 1 lines 7 and 17; in segment
mode also a pass's closing ``hyfdca.sweep`` exchange, whose fields are named ``sa_tag``,
``sa_peers``, ``sa_acked``: :mod:`hybridfl.algorithms.hyfdca.segment`):

1. ``hyfdca.hello`` reply: ``secagg_public`` (the client's X25519 public key) and, with a roster,
   ``secagg_sig`` (its credential's signature over the key and its blocks for the hello's ``run``).
   ``hyfdca.init`` relays the others' keys, blocks and signatures (``secagg_peers``,
   ``secagg_keys``, ``secagg_blocks``, ``secagg_sigs``); a client with a roster keeps a key only if
   its signature verifies against its own roster.
2. ``hyfdca.primal`` carries ``tag`` (a fresh exchange number), ``peers`` (the other clients of the
   exchange) and ``acked`` (whether the server counted the client's previous change). The client
   keeps ``base``, the fixed-point share the server has counted for it; it sends
   ``masked = (fixed(share) - base) + masks`` (``uint64`` ``(d_k,)``).
   With it goes ``self_shares``: the encrypted Shamir shares of its self-mask seed, one per peer
   (double masking, :mod:`hybridfl.privacy.secagg`).
3. Segment mode's closing ``hyfdca.sweep`` is a *one-shot* exchange (pair masks of their own keys,
   no self-mask, no ``self_shares``, never unmasked: :mod:`hybridfl.privacy.secagg`): the server
   adds the shares only if every client of the pass replied, when the masks cancel
   (:meth:`SecureSharesServerMixin.finish_one_shot`), and otherwise drops them unread and falls
   back to ``hyfdca.primal``. Every other exchange: the server adds the masked changes per feature (the pair masks cancel), then ``hyfdca.unmask``
   asks every survivor once for its pair masks with the missing clients (``correction``) and the
   self-mask shares the other survivors sent it (``revealed``)
   (:func:`~hybridfl.runtime.secagg_messages.unmask_exchange`); if one of them fails too, or fewer
   than the clients' unmasking quorum replied (:func:`~hybridfl.privacy.secagg.unmask_quorum`:
   they would refuse), the whole exchange is dropped (no change counted; every client resends its
   change next time, ``acked`` false).

Each client checks the exchange itself (the server is not trusted): ``peers`` from its
roster, at least ``secagg_threshold`` clients (segment mode: at most the holders of its pass's
segments, :meth:`SecureSharesClientMixin.exchange_cap`), and an unmasking request only for the
exchange it just answered, once, never naming itself, with enough survivors.

So ``w = fixed-point sum / (2^32 lambda N)`` equals the plaintext ``w`` of the same shares to
``2^-33`` per share. A client holding an HE key pair refuses a run without secure aggregation
(its own policy, :func:`hybridfl.algorithms.hyfdca.spec.build_client`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from hybridfl.algorithms.hyfdca import kinds
from hybridfl.errors import ProtocolError
from hybridfl.privacy.secagg import SecAggClient, from_fixed, to_fixed, unmask_quorum
from hybridfl.runtime import secagg_messages as sm
from hybridfl.runtime.messages import Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError

log = logging.getLogger(__name__)


class SecureSharesClientMixin:
    """Client side (:class:`~hybridfl.algorithms.hyfdca.client.HyFDCAClient`): key pair, the
    counted ``base`` ``(d_k,)`` int64 and the ``pending`` fixed-point share awaiting ``acked``."""

    def _secure_init(self) -> None:
        self.secagg = SecAggClient(self.client_id, self.blocks, self.block_sizes, threshold=self.secagg_threshold)
        self.sa_base = np.zeros(self.X.shape[1], dtype=np.int64)
        self.sa_pending: np.ndarray | None = None
        self.sa_run = b""  # the hello's run label (its key's signature names it)

    def secure_hello_entries(self, msg: Message) -> dict:
        """The ``hyfdca.hello`` reply's ``secagg_public`` (its X25519 key, also the masked inner
        products' sealing key) and, with a roster (``peer_auth``), ``secagg_sig``: its credential's
        signature over the key and its blocks for the hello's ``run``.

        Raises:
            PayloadError: with a roster, no 32-byte ``run``.
        """
        auth = getattr(self, "peer_auth", None)
        self.sa_run = sm.run_label(msg, auth)
        return {"secagg_public": self.secagg.public_bytes(), **sm.sign_key(self.secagg, auth, self.sa_run)}

    def secure_setup(self, msg: Message) -> bool:
        """Take the peers' keys and blocks from ``hyfdca.init`` (if the run uses secure
        aggregation). Returns whether it does.

        Raises:
            PayloadError: the three lists are not of equal length, a key is not an X25519 public
                key, a blocks entry is not a JSON list of names, its own name or key among them.
            EncryptionPolicyError: the client requires secure aggregation and the run has none.
            PeerAuthError: with a roster, a peer outside it or a key without its valid signature.
        """
        p = msg.payload
        if "secagg_peers" not in p:
            if self.require_secagg:
                from hybridfl.errors import EncryptionPolicyError

                raise EncryptionPolicyError(
                    f"client {self.client_id!r} holds an HE key pair and refuses a run without secure aggregation "
                    f"of the primal shares."
                )
            return False
        sm.set_peers(self.secagg, msg, getattr(self, "peer_auth", None), self.sa_run)
        return True

    def exchange_cap(self) -> int | None:
        """The honest size of a PrimalAggregation exchange where the protocol fixes it below the
        threshold: segment mode, the most holders of a segment of its pass under way (every holder
        of an active segment takes part; a pass over a segment it alone holds is an exchange of
        one, whose change the server reads from ``w`` anyway); ``None`` in the other modes (the
        server selects at least ``t`` clients a round:
        :func:`~hybridfl.algorithms.participation.select_participants`)."""
        if self.params.get("dual_mode") != "segment" or not self.seg_scale:
            return None
        segs = list(self.sweep) or range(len(self.seg_scale))
        nu = float(self.params["nu"])
        return max(int(round(nu / self.seg_scale[s])) for s in segs)

    def check_secure(self, msg: Message, prefix: str = "") -> None:
        """Check a ``hyfdca.primal``'s ``acked``, ``tag`` and ``peers`` before anything changes
        (a closing ``hyfdca.sweep``'s ``sa_acked``, ``sa_tag``, ``sa_peers``: ``prefix`` ``"sa_"``).

        Raises:
            PayloadError: ``acked`` not a bool, ``tag`` not an integer above every earlier tag,
                ``peers`` not the names of known peers of its roster (itself excluded, no
                repeats), or fewer clients than its threshold ``t`` (:meth:`exchange_cap`).
        """
        if not isinstance(msg.payload.get(prefix + "acked"), (bool, np.bool_)):
            raise PayloadError(msg, prefix + "acked", "missing or not a bool")
        sm.check_exchange(self.secagg, msg, self.exchange_cap(), prefix)

    def masked_share(
        self,
        msg: Message,
        share: np.ndarray,
        extra: np.ndarray | None = None,
        prefix: str = "",
        one_shot: bool = False,
    ) -> np.ndarray:
        """Its masked change of share for this exchange (uint64 ``(d_k,)``), after taking the
        server's ``acked`` for the previous one; with ``extra`` ``(d_k,)`` (``output: step_average``'s
        :meth:`position_share`, sent whole, not as a change) the two masked as one ``(2 d_k,)``.
        The fields are named with ``prefix`` (:meth:`check_secure`); ``one_shot``: a one-shot
        exchange (pair masks only, never unmasked: :mod:`hybridfl.privacy.secagg`).

        Raises:
            PayloadError: ``acked`` not a bool, ``tag`` not a non-negative integer above every
                earlier tag, ``peers`` not the names of known peers (itself excluded).
            DataError: the share is too large for the fixed point.
        """
        p = msg.payload
        self.check_secure(msg, prefix)
        tag, peers = int(p[prefix + "tag"]), list(p[prefix + "peers"])
        fixed = to_fixed(share, f"the primal share of client {self.client_id!r}")
        more = None if extra is None else to_fixed(extra, f"the position share of client {self.client_id!r}")
        if bool(p[prefix + "acked"]) and self.sa_pending is not None:
            self.sa_base = self.sa_pending
        words = fixed - self.sa_base if more is None else np.concatenate([fixed - self.sa_base, more])
        try:
            masked = self.secagg.mask(words, tag, peers, self.exchange_cap(), one_shot)
        except ProtocolError as e:
            raise PayloadError(msg, prefix + ("tag" if "tag" in str(e) else "peers"), f"refused ({e})") from None
        self.sa_pending = fixed
        return masked

    def unmask(self, msg: Message) -> dict:
        """``hyfdca.unmask``: its masks with the ``dropped`` clients of its last exchange and the
        self-mask shares of the surviving ones (:func:`~hybridfl.runtime.secagg_messages.unmask_reply`).

        Raises:
            PayloadError: a bad field, or a request it refuses (not its last exchange, a second
                one, not a partition of that exchange, too few survivors, a foreign share).
        """
        return sm.unmask_reply(self.secagg, msg)

    def _secure_state(self) -> dict:
        st = dict(self.secagg.get_state())
        st["sa_base"] = self.sa_base.copy()
        st["sa_run"] = self.sa_run
        if self.sa_pending is not None:
            st["sa_pending"] = self.sa_pending.copy()
        return st

    def _set_secure_state(self, state: Mapping) -> None:
        self.secagg.set_state(state)
        if "sa_run" in state:
            self.sa_run = bytes(state["sa_run"])
        if "sa_base" in state:
            self.sa_base = np.asarray(state["sa_base"], dtype=np.int64).copy()
            self.sa_pending = np.asarray(state["sa_pending"], dtype=np.int64).copy() if "sa_pending" in state else None


class SecureSharesServerMixin:
    """Server side (:class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`): the fixed-point
    sum of the counted shares ``sa_sum`` ``(d,)`` uint64, the next tag, and per client whether its
    last change was counted."""

    def _secure_reset(self) -> None:
        self.sa_sum = np.zeros(self.d, dtype=np.uint64)
        self.sa_tag = 0
        self.sa_counted: dict[str, bool] = {}
        self.sa_publics: dict[str, bytes] = {}
        self.sa_sigs: dict[str, bytes] = {}  # the clients' roster signatures over their keys (relayed)
        self.sa_width = 1  # vectors per masked reply in the current exchange (2 with step_average)
        self.position_sum: np.ndarray | None = None

    def secure_hello(self, r: Message) -> None:
        """Check and keep a hello's ``secagg_public`` (with secure aggregation on).

        Raises:
            PayloadError: missing, not a 32-byte X25519 public key, or another client's key; a
                ``secagg_sig`` that is not 64 bytes.
        """
        self.sa_publics[r.sender] = sm.public_key(r, self.sa_publics)
        sig = sm.key_signature(r)
        if sig is not None:
            self.sa_sigs[r.sender] = sig

    def secure_init_payload(self, cid: str, blocks: Mapping[str, list[str]]) -> dict:
        """The ``hyfdca.init`` entries for ``cid``: the other clients' names, keys, blocks and key signatures."""
        return sm.peer_table({c: self.sa_publics[c] for c in self.client_ids}, blocks, cid, self.sa_sigs)

    def check_masked(self, peers: int, one_shot: bool = False):
        """The check of a masked reply in an exchange with ``peers`` other clients: ``masked``
        ``uint64`` ``(sa_width * d_k,)`` and ``self_shares`` (none in a one-shot exchange)."""

        def check(r: Message) -> None:
            sm.uint64_array(r, "masked", self.sa_width * len(self.feat[r.sender]))
            if one_shot:
                if "self_shares" in r.payload:
                    raise PayloadError(r, "self_shares", "sent in a one-shot exchange")
            else:
                sm.check_shares(r, peers)

        return check

    def next_secure_tag(self) -> int:
        """A fresh exchange number for a masked exchange."""
        self.sa_tag = self.sa_tag + 1
        return self.sa_tag

    def secure_fields(self, tag: int, names: list[str], cid: str, prefix: str = "") -> dict:
        """The entries that make ``cid``'s message part of masked exchange ``tag`` with the clients
        ``names``: ``tag``, ``peers`` (the others) and ``acked`` (whether its previous change was
        counted; from now on it is not), each name with ``prefix``."""
        extra = {
            prefix + "tag": tag,
            prefix + "peers": [c for c in names if c != cid],
            prefix + "acked": self.sa_counted.get(cid, False),
        }
        self.sa_counted[cid] = False
        return extra

    def collect_masked(self, transport: Transport, msgs: list[Message], stats: dict) -> set[str]:
        """PrimalAggregation with secure aggregation (module docstring): send ``msgs`` with
        ``tag``, ``peers`` and ``acked`` added, sum the masked changes, unmask the missing
        clients' pair masks, and set ``w`` from the counted sum (:meth:`finish_masked`). Returns
        the clients whose change was counted (none if the unmasking failed)."""
        tag = self.next_secure_tag()
        names = [m.receiver for m in msgs]
        sent = [
            Message(m.kind, m.sender, m.receiver, m.round, {**m.payload, **self.secure_fields(tag, names, m.receiver)})
            for m in msgs
        ]
        replies = {r.sender: r for r in self._exchange(transport, sent, stats, self.check_masked(len(names) - 1))}
        return self.finish_masked(transport, stats, msgs[0].round if msgs else 0, tag, names, replies)

    def finish_masked(
        self, transport: Transport, stats: dict, rnd: int, tag: int, names: list[str], replies: dict[str, Message]
    ) -> set[str]:
        """Add the masked changes of exchange ``tag`` (``replies``: the checked ones that arrived, of
        the clients ``names``), unmask them (:func:`~hybridfl.runtime.secagg_messages.unmask_exchange`)
        and set ``w`` from the counted sum. Returns the clients whose change was counted (none if
        the unmasking failed). With ``sa_width`` 2 (``output: step_average``, set by the caller)
        every reply masks two vectors, the change and the position share: the sum of the latter
        goes to ``position_sum`` ``(d,)`` (left ``None`` if the unmasking failed)."""
        total = self._masked_total(replies)
        got = set(replies)
        quorum = unmask_quorum(self.config.secagg_threshold, len(self.client_ids), len(names))
        if got and len(names) > 1 and len(got) < quorum:  # the clients would refuse to unmask (their own rule)
            log.warning(
                "HyFDCA: exchange %d has %d of %d replies, fewer than the %d its clients unmask for; nothing counted.",
                tag,
                len(got),
                len(names),
                quorum,
            )
            return set()
        ok = sm.unmask_exchange(
            lambda asks, check: self._exchange(transport, asks, stats, check),
            kinds.UNMASK,
            rnd,
            tag,
            names,
            replies,
            total,
            self.feat,
            len(self.client_ids),
            self.config.secagg_threshold,
            ("client_seconds", "he_seconds"),
        )
        if not ok:
            log.warning("HyFDCA: secure aggregation of exchange %d could not be unmasked; nothing counted.", tag)
            return set()
        return self._count(total, got)

    def finish_one_shot(self, tag: int, names: list[str], replies: Mapping[str, Message]) -> set[str]:
        """Add the masked changes of one-shot exchange ``tag`` (:mod:`hybridfl.privacy.secagg`: pair
        masks only, never unmasked) of the clients ``names`` and set ``w`` from the counted sum, if
        every one of them replied (the masks then cancel); otherwise count nothing and leave the
        replies unread (the caller falls back to a double-masked exchange). Returns the clients
        whose change was counted. ``sa_width`` as :meth:`finish_masked`."""
        if set(replies) != set(names):
            log.warning("HyFDCA: one-shot exchange %d misses a reply; nothing of it is counted.", tag)
            return set()
        total = self._masked_total(replies)
        return self._count(total, set(replies))

    def _masked_total(self, replies: Mapping[str, Message]) -> np.ndarray:
        """The checked masked replies added per feature, modulo ``2^64``: ``(sa_width, d)`` ``uint64``."""
        total = np.zeros((self.sa_width, self.d), dtype=np.uint64)
        for r in replies.values():
            total[:, self.feat[r.sender]] += r.payload["masked"].reshape(self.sa_width, -1)
        return total

    def _count(self, total: np.ndarray, got: set[str]) -> set[str]:
        """Count the unmasked sum ``total`` ``(sa_width, d)`` of the clients ``got``: ``w``, and
        ``position_sum`` with ``sa_width`` 2."""
        if self.sa_width == 2:
            self.position_sum = from_fixed(total[1])
        self.sa_sum += total[0]
        for c in got:
            self.sa_counted[c] = True
        self.w = from_fixed(self.sa_sum) / (self.config.lam * self.N)
        return got

    def clear_shares(self, replies: list[Message]) -> set[str]:
        """PrimalAggregation without secure aggregation (HyFDCA Alg. 4 lines 5-6): keep each checked
        reply's ``share`` ``(d_k,)`` as its sender's newest, add the ``position_share`` vectors into
        ``position_sum`` ``(d,)`` (``sa_width`` 2, ``output: step_average``) and set ``w_f = (1/(lambda
        N)) sum_k share_{k,f}`` over every client's newest share. Returns the senders."""
        position = np.zeros(self.d) if self.sa_width == 2 else None
        for r in replies:
            self.share_cache[r.sender] = np.asarray(r.payload["share"], dtype=np.float64)
            if position is not None:
                position[self.feat[r.sender]] += r.payload["position_share"]
        self.position_sum = position
        w = np.zeros(self.d)
        for cid, share in self.share_cache.items():
            w[self.feat[cid]] += share
        self.w = w / (self.config.lam * self.N)
        return {r.sender for r in replies}

    def _secure_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"sa_sum": self.sa_sum.copy()}, {"sa_tag": self.sa_tag, "sa_counted": self.sa_counted}

    def _set_secure_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        if "sa_sum" in arrays:
            self.sa_sum = np.asarray(arrays["sa_sum"]).astype(np.uint64).copy()
            self.sa_tag = int(meta.get("sa_tag", 0))
            self.sa_counted = {str(c): bool(v) for c, v in meta.get("sa_counted", {}).items()}
