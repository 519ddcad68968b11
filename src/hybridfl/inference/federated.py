"""Federated prediction: organisations score new samples together without showing each other, or
the server, their rows, their partial scores or the IDs they do not share.

Every organisation holds some new rows (its own table, its own IDs) with some blocks, and only its
own part of the trained model (:func:`~hybridfl.inference.parts.org_part`): the weights of the blocks it holds (a linear
model's ``w_b``; HyFEM's extractors ``h_b`` and the server classifier's columns ``W1[:, cols_b]``
of them; FedBCD's bottom model of the party whose blocks it holds). One organisation, the
*receiver* (``to``; by default the label holder), asks for predictions of its rows and alone
receives them; it also holds the model's shared head (the intercept; HyFEM's ``b1``, ``W2``,
``b2``; FedBCD's top bias).

The scores are sums over blocks before the model's non-linear head, so the protocol computes
``S(i) = sum_units part_unit(x_unit(i))`` with a secure sum and the receiver applies the head:

- linear (HyFDCA, hybrid FedAvg): unit = block, ``part = x_b^T w_b``; ``z = S + b``;
- HyFEM: unit = block, ``part = W1[:, cols_b] h_b(x_b)`` (width ``H``); logits ``= W2 relu(S +
  b1) + b2`` (HyFEM eq. (2)-(3); with some blocks missing this is local inference, the server
  model cut to the blocks present, HyFEM Remark 2);
- FedBCD: unit = party (its blocks together), ``part = H_k``; ``logit = S + b`` (FedBCD eq. (2);
  ``top: party_slice`` or ``model: linear``).

Messages (every one through the server, which relays and orchestrates; each counted):

1. ``predict.hello`` -> every organisation: its fresh X25519 public key, its blocks (public
   structure); the receiver also the number of its rows ``n`` and the output width.
2. ``predict.keys`` -> every organisation: the others' public keys (pairwise keys for masks,
   tags and the plans' encryption).
3. ``predict.psi_request`` -> receiver: its ECDH-PSI request over its IDs (openmined-psi).
4. ``predict.psi_serve`` -> every other organisation ``k``: the request; ``k`` answers with its
   PSI setup and response (it learns only the request's size).
5. ``predict.plan`` -> receiver: every setup and response; the receiver learns which of its IDs
   each organisation holds, decides per row and unit who contributes (the first organisation in
   order holding the row and the unit; itself first), and returns one plan per organisation,
   encrypted (ChaCha20-Poly1305) under their pair key: the positions of the rows, their order
   tags (HMAC of the ID under the pair key) and the units to contribute.
6. ``predict.score`` -> every other organisation: its plan; it matches the tags to its own IDs,
   computes its part on those rows, and replies the ``(n, width)`` vector of its parts (zeros
   elsewhere) in fixed point plus its pairwise masks with every other organisation
   (:class:`~hybridfl.privacy.secagg.SecAggClient`).
7. ``predict.combine`` -> receiver: the masked vectors; it adds its own masked vector, the masks
   cancel, and it applies the head. Its reply holds counts only.

**Signed keys** (adversary: an active server that replaces, appends to or replays what it relays).
An organisation with a roster in its client directory (:mod:`hybridfl.privacy.roster`) signs, with
its credential, its X25519 key with the receiver's row count and the width (``pk_sig``), the
receiver its PSI request with its row count (``request_sig``), every other organisation its PSI
setup and response (``response_sig``), each bound to the request's fresh ``run`` label; a peer
refuses (and stops) what its roster does not verify. So the server cannot put its own key in the
place of an organisation's (it would read the plans and unmask the partial scores), inflate the row
count that bounds a PSI response, add its own points to the receiver's request, or answer a request
in an organisation's place. Without a roster nothing is signed (a client made in memory).

What each party learns (adversary: an honest-but-curious server, or honest-but-curious
organisations; no collusion): the server, ``n``, the organisations' blocks, the sizes of the PSI
blobs and of the plans (so the size of each intersection) and masked vectors (uniformly random);
organisation ``k``, which of its IDs the receiver asked about (the intersection; none outside it)
and nothing else; the receiver, which of its IDs each organisation holds (PSI's output) and the
sums ``S`` (with two organisations the other's part is ``S`` minus its own: secure summation
cannot hide it). For a linear model that is ``x_k(i)^T w_k``: one number per shared row about
organisation ``k``'s features, whatever the number of requests (asking again about the same rows
gives the same numbers). A missing or malformed reply stops the request with one sentence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridfl.errors import PredictionError, ProtocolError
from hybridfl.inference.parts import OrgPart, model_units, org_part
from hybridfl.inference.relay import run_prediction
from hybridfl.privacy.psi import MAX_IDS
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.secagg_messages import run_label

PLAN_CONTEXT = "predict plan v1"
"""The HKDF purpose of the key that encrypts a plan (receiver -> organisation)."""
TAG_CONTEXT = "predict tags v1"
"""The HKDF purpose of the key of the order tags in a plan."""
MASK_TAG = 1
"""The secure-aggregation exchange tag (keys are fresh for every request, so one tag suffices)."""
KEY_PURPOSE = "prediction key"
"""The signed purpose of an organisation's X25519 key (with the receiver's row count and the width)."""
REQUEST_PURPOSE = "prediction PSI request"
"""The signed purpose of the receiver's PSI request (with its row count)."""
RESPONSE_PURPOSE = "prediction PSI response"
"""The signed purpose of an organisation's PSI setup and response."""
STEPS = {
    True: ("predict.hello", "predict.keys", "predict.psi_request", "predict.plan", "predict.combine"),
    False: ("predict.hello", "predict.keys", "predict.psi_serve", "predict.score"),
}
"""The messages an organisation answers, in order, as the receiver (``True``) or not."""


# ------------------------------------------------------------------------------------ organisation


def _names(msg: Message, key: str, org: str) -> list[str]:
    """``msg.payload[key]`` as a list of names (missing: none).

    Raises:
        ProtocolError: not a list of strings.
    """
    v = msg.payload.get(key, [])
    if not isinstance(v, list) or not all(isinstance(u, str) for u in v):
        raise ProtocolError(f"organisation {org!r} got {key!r} that is not a list of names.")
    return list(v)


def _seal(key: bytes, data: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    nonce = os.urandom(12)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, data, None)


def _open(key: bytes, blob: bytes, what: str) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 28:
        raise ProtocolError(f"{what} is not an encrypted plan.")
    try:
        return ChaCha20Poly1305(key).decrypt(bytes(blob[:12]), bytes(blob[12:]), None)
    except InvalidTag:
        raise ProtocolError(f"{what} does not decrypt under the pair key: it was changed or is foreign.") from None


def _key_fields(pk: object, n: int, width: object) -> list[bytes]:
    """What a prediction key signature covers: the X25519 key, the receiver's row count (0 for
    the other organisations) and the output width."""
    if not isinstance(pk, (bytes, bytearray)) or not isinstance(width, int) or isinstance(width, bool):
        raise ProtocolError("a prediction key or width is not one.")
    return [bytes(pk), int(n).to_bytes(8, "big"), int(width).to_bytes(8, "big")]


def _digest_of(blob: object) -> bytes:
    """SHA-256 of a relayed blob (:func:`~hybridfl.privacy.roster.digest`).

    Raises:
        ProtocolError: not bytes.
    """
    from hybridfl.privacy.roster import digest

    if not isinstance(blob, (bytes, bytearray)):
        raise ProtocolError("a PSI blob of the prediction is not bytes.")
    return digest(blob)


@dataclass
class PredictOrg:
    """One organisation's steps of a federated prediction (``handle(msg) -> msg``).

    Args:
        org_id: its name.
        ids: ``(n_k,)`` the IDs of its new rows.
        xs: its encoded blocks of those rows (block -> ``(n_k, *shape)`` float32).
        part: its part of the model (:func:`~hybridfl.inference.parts.org_part`).
        receiver: the receiver's name.
        auth: its :class:`~hybridfl.privacy.roster.PeerAuth` (credential and roster, from its own
            client directory) or ``None``: with one it signs its X25519 key, its PSI blobs and
            (receiver) its row count, and refuses any peer's that its roster does not verify
            (module docs, "Signed keys").
        labels: the receiver's class indices of its rows (``(n,)``, ``-1`` unlabelled) for an
            evaluation: then ``metrics_of(raw, labels)`` (the model's ``metrics``) is computed by
            the receiver and only the metrics go into its ``predict.combine`` reply.

    After ``predict.combine`` the receiver holds :attr:`raw` (``(n, ...)`` the model's raw output
    of its rows) and :attr:`scored` (``(n,)`` bool: rows with every needed unit).
    """

    org_id: str
    ids: np.ndarray
    xs: dict[str, np.ndarray]
    part: OrgPart
    receiver: str
    labels: np.ndarray | None = None
    metrics_of: Any = None
    secagg: Any = None
    auth: Any = None
    n: int = 0
    width: int = 1
    peers: list[str] = field(default_factory=list)
    _psi: Any = None
    _sk: bytes = b""
    _run: bytes = b""
    _own_masked: np.ndarray | None = None
    raw: np.ndarray | None = None
    scored: np.ndarray | None = None
    done: list = field(default_factory=list)
    stopped: str = ""

    @property
    def is_receiver(self) -> bool:
        """Whether this organisation asked for the predictions."""
        return self.org_id == self.receiver

    def handle(self, msg: Message) -> Message:
        """Answer one server message of the protocol (module docs): each kind only in its role's
        place (:data:`STEPS`), once. A refusal stops the organisation for this request (it fails
        closed: every later message is refused), so a refusal tells the server one bit.

        Raises:
            ProtocolError: a message from another party, out of order, twice, or malformed, or
                any message after a refusal (one sentence).
        """
        if self.stopped:
            raise ProtocolError(
                f"organisation {self.org_id!r} has stopped taking part in this request after refusing {self.stopped}."
            )
        try:
            steps = STEPS[self.is_receiver]
            if msg.sender != SERVER or msg.receiver != self.org_id:
                raise ProtocolError(f"organisation {self.org_id!r} got a message not from the server to it.")
            if len(self.done) >= len(steps) or msg.kind != steps[len(self.done)]:
                raise ProtocolError(
                    f"organisation {self.org_id!r} does not answer {msg.kind!r} here: its next step is "
                    f"{steps[len(self.done)] if len(self.done) < len(steps) else 'none'!r} (each is answered once)."
                )
            self.done.append(msg.kind)
            return self._step(msg)
        except ProtocolError:
            self.stopped = repr(msg.kind)
            raise

    def _step(self, msg: Message) -> Message:
        from hybridfl.privacy.secagg import SecAggClient

        if msg.kind == "predict.hello":
            from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

            self._run = run_label(msg, self.auth) if self.auth is not None else b""  # binds its signatures
            self._sk = X25519PrivateKey.generate().private_bytes_raw()  # fresh for this request
            self.secagg = SecAggClient(self.org_id, ["scores"], [1], private=self._sk, double_masking=False)
            pk = self.secagg.public_bytes()
            out: dict[str, Any] = {"pk": pk, "units": list(self.part.units)}
            if self.is_receiver:
                out.update(n=len(self.ids), width=self.part.width)
            if self.auth is not None:
                n = len(self.ids) if self.is_receiver else 0
                out["pk_sig"] = self.auth.sign(self._run, KEY_PURPOSE, _key_fields(pk, n, self.part.width))
            return msg.reply(**out)
        if msg.kind == "predict.keys":
            return self._keys(msg)
        if msg.kind == "predict.psi_request":
            from hybridfl.privacy.psi import PSIClient

            self._psi = PSIClient(list(self.ids), workers=1)
            request = self._psi.request()
            if self.auth is None:
                return msg.reply(request=request)
            fields = [_digest_of(request), self.n.to_bytes(8, "big")]
            return msg.reply(request=request, request_sig=self.auth.sign(self._run, REQUEST_PURPOSE, fields))
        if msg.kind == "predict.psi_serve":
            from hybridfl.privacy.psi import PSIServer

            req = msg.payload.get("request")
            if self.auth is not None:  # the receiver's own request, of at most its signed row count
                fields = [_digest_of(req), self.n.to_bytes(8, "big")]
                self.auth.verify(self._run, self.receiver, REQUEST_PURPOSE, fields, msg.payload.get("request_sig"))
            server = PSIServer(list(self.ids), workers=1)
            setup, response = server.setup(), server.respond(req, max_ids=max(self.n, 1))
            if self.auth is None:
                return msg.reply(setup=setup, response=response)
            sig = self.auth.sign(self._run, RESPONSE_PURPOSE, [_digest_of(setup), _digest_of(response)])
            return msg.reply(setup=setup, response=response, response_sig=sig)
        if msg.kind == "predict.plan":
            return self._plan(msg)
        if msg.kind == "predict.score":
            return self._score(msg)
        return self._combine(msg)

    def _keys(self, msg: Message) -> Message:
        from hybridfl.privacy.secagg import SecAggClient

        peers = [str(p) for p in msg.payload.get("peers", [])]
        n, width = msg.payload.get("n"), msg.payload.get("width")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_IDS:
            raise ProtocolError(f"organisation {self.org_id!r} got predict.keys without a row count in [1, {MAX_IDS}].")
        if width != self.part.width or (self.is_receiver and n != len(self.ids)):
            raise ProtocolError(f"organisation {self.org_id!r} got another size than the request's.")
        if self.org_id in peers or len(set(peers)) != len(peers) or self.receiver not in peers + [self.org_id]:
            raise ProtocolError(f"organisation {self.org_id!r} got a peer list that is not the request's.")
        if self.auth is not None:  # every peer's key is its own, and the receiver signed the row count
            for p in peers:
                pk = msg.payload.get(f"pk.{p}")
                fields = _key_fields(pk, n if p == self.receiver else 0, width)
                self.auth.verify(self._run, p, KEY_PURPOSE, fields, msg.payload.get(f"sig.{p}"))
        self.n, self.width, self.peers = n, width, peers
        self.secagg = SecAggClient(self.org_id, ["scores"], [n * width], private=self._sk, double_masking=False)
        self.secagg.set_peers({p: (msg.payload.get(f"pk.{p}"), ["scores"]) for p in peers})
        return msg.reply()

    def _plan(self, msg: Message) -> Message:
        from hybridfl.privacy.psi import order_tags

        others = self.peers
        holds = {self.org_id: np.ones(self.n, dtype=bool)}
        for k in others:
            setup, response = msg.payload.get(f"setup.{k}"), msg.payload.get(f"response.{k}")
            if self.auth is not None:
                fields = [_digest_of(setup), _digest_of(response)]
                self.auth.verify(self._run, k, RESPONSE_PURPOSE, fields, msg.payload.get(f"response_sig.{k}"))
            rows = self._psi.intersect(setup, response)
            h = np.zeros(self.n, dtype=bool)
            h[rows] = True
            holds[k] = h
        units = _names(msg, "all_units", self.org_id)
        org_units = {k: set(_names(msg, f"units.{k}", self.org_id)) for k in others}
        if len(set(units)) != len(units):
            raise ProtocolError(f"organisation {self.org_id!r} got a plan request repeating a unit.")
        if any(not u <= set(units) for u in org_units.values()) or not set(self.part.units) <= set(units):
            raise ProtocolError(f"organisation {self.org_id!r} got a plan request naming units outside the model's.")
        org_units[self.org_id] = set(self.part.units)
        order = [self.org_id, *others]
        chosen = {k: np.zeros((self.n, len(units)), dtype=bool) for k in order}
        covered = np.zeros((self.n, len(units)), dtype=bool)
        for j, u in enumerate(units):
            for k in order:
                if u not in org_units[k]:
                    continue
                take = holds[k] & ~covered[:, j]
                chosen[k][take, j] = True
                covered[:, j] |= take
        need_all = self.part.kind in ("linear", "fedbcd")
        self.scored = covered.all(axis=1) if need_all else covered.any(axis=1)
        for k in order:
            chosen[k][~self.scored] = False
        self._own = chosen[self.org_id]
        out = {}
        for k in others:
            rows = np.flatnonzero(chosen[k].any(axis=1))
            mine = [j for j, u in enumerate(units) if u in org_units[k]]
            sel = chosen[k][rows][:, mine].astype(np.uint8)
            tags = (
                order_tags(self.secagg.pair_key(k, TAG_CONTEXT), [str(i) for i in self.ids[rows]]) if rows.size else b""
            )
            plan = encode(
                Message("predict.plan", self.org_id, k, 0, {"rows": rows.astype(np.int64), "tags": tags, "units": sel})
            )
            out[f"plan.{k}"] = _seal(self.secagg.pair_key(k, PLAN_CONTEXT), plan)
        self._own_masked = self._masked(self._own, units, np.arange(self.n))
        return msg.reply(**out)

    def _masked(self, sel: np.ndarray, units: Sequence[str], own_rows: np.ndarray) -> np.ndarray:
        """Its parts on the selected (row, unit) cells, ``(n, width)`` in fixed point plus masks.
        ``sel``: ``(m, len(units))`` bool for the positions ``positions`` (here all rows ``n``)."""
        from hybridfl.privacy.secagg import to_fixed

        vec = np.zeros((self.n, self.width), dtype=np.float64)
        for j, u in enumerate(units):
            take = np.flatnonzero(sel[:, j])
            if take.size:
                vec[take] += self.part.contributions(self.xs, u, own_rows[take])
        fixed = to_fixed(vec.ravel(), f"the partial scores of organisation {self.org_id!r}")
        return self.secagg.mask(fixed, MASK_TAG, self.peers)

    def _score(self, msg: Message) -> Message:
        from hybridfl.privacy.psi import PSIError, match_tags

        raw = _open(self.secagg.pair_key(self.receiver, PLAN_CONTEXT), msg.payload.get("plan"), "the plan")
        plan = decode(raw)
        if plan.kind != "predict.plan" or plan.sender != self.receiver or plan.receiver != self.org_id:
            raise ProtocolError(f"organisation {self.org_id!r} got a plan that is not the receiver's to it.")
        rows = np.asarray(plan.payload.get("rows", np.zeros(0, np.int64)))
        sel = np.asarray(plan.payload.get("units", np.zeros((0, 0), np.uint8)))
        units = list(self.part.units)
        if rows.dtype.kind not in "iu" or rows.ndim != 1 or sel.shape != (rows.size, len(units)):
            raise ProtocolError(f"organisation {self.org_id!r} got a plan of the wrong shape.")
        if rows.size and (rows.min() < 0 or rows.max() >= self.n or np.unique(rows).size != rows.size):
            raise ProtocolError(f"organisation {self.org_id!r} got a plan with a position outside the request.")
        full = np.zeros((self.n, len(units)), dtype=bool)
        own = np.zeros(self.n, dtype=np.int64)
        if rows.size:
            try:
                mine = match_tags(
                    self.secagg.pair_key(self.receiver, TAG_CONTEXT),
                    [str(i) for i in self.ids],
                    plan.payload.get("tags"),
                )
            except PSIError as e:
                raise ProtocolError(f"organisation {self.org_id!r} refused the plan's tags ({e}).") from None
            if mine.size != rows.size:
                raise ProtocolError(f"organisation {self.org_id!r} got a plan whose tags and rows differ in number.")
            full[rows] = sel.astype(bool)
            own[rows] = mine
        return msg.reply(masked=self._masked(full, units, own))

    def _combine(self, msg: Message) -> Message:
        from hybridfl.privacy.secagg import from_fixed

        total = self._own_masked.copy()
        for k in self.peers:
            v = msg.payload.get(f"masked.{k}")
            if not isinstance(v, np.ndarray) or v.dtype != np.uint64 or v.shape != total.shape:
                raise ProtocolError(f"the masked scores of organisation {k!r} are missing or of the wrong shape.")
            total = total + v
        s = from_fixed(total).reshape(self.n, self.width)
        self.raw = self.part.apply_head(s)
        out: dict[str, Any] = {"scored": int(self.scored.sum()), "unscored": int((~self.scored).sum())}
        if self.labels is not None and self.metrics_of is not None and self.scored.any():
            m = self.metrics_of(self.raw[self.scored], np.asarray(self.labels)[self.scored])
            out.update({f"metric.{k}": float(v) for k, v in m.items()})  # the receiver's own evaluation
        return msg.reply(**out)


def federated_predict(
    model: Any,
    tables: Mapping[str, Any],
    receiver: str,
    recorder: Any = None,
    parts: Mapping[str, Any] | None = None,
    auths: Mapping[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Score the receiver's rows with the organisations' tables, in process, over an
    :class:`~hybridfl.runtime.transport.InProcessTransport` (every message encoded and counted).

    Args:
        model: a loaded model (:func:`~hybridfl.inference.load_model`); each organisation keeps
            only its part (:func:`~hybridfl.inference.parts.org_part`).
        tables: organisation -> its new rows (a pandas DataFrame with the model's ID column and
            the columns of the blocks it holds), in organisation order.
        receiver: the organisation that asks and receives.
        recorder: receives the raw bytes of every message (audits).
        parts: instead of ``model`` (``None``), each organisation's own part
            (:func:`hybridfl.inference.parts.load_org_part` of its ``<client>/model/``).
        auths: organisation -> its :class:`~hybridfl.privacy.roster.PeerAuth` or ``None``
            (:func:`~hybridfl.privacy.roster.peer_auth_of` its client directory): signed keys.

    Returns:
        ``(predictions, stats)``: a DataFrame of the receiver's rows (ID column, ``prediction``,
        score columns; empty prediction for an unscored row) and ``{"scored", "unscored",
        "messages", "bytes", "seconds"}``.

    Raises:
        HybridFLError: bad input (one sentence) or a failed exchange.
    """
    import time

    from hybridfl.runtime.transport import InProcessTransport

    t0 = time.perf_counter()
    orgs, id_names = build_orgs(model, tables, receiver, parts, auths)
    all_units = list(parts[receiver].all_units) if parts is not None else list(model_units(model))
    transport = InProcessTransport(orgs, recorder)  # type: ignore[arg-type]
    counts = run_prediction(transport, list(orgs), receiver, all_units)
    out = prediction_frame(orgs[receiver], id_names[receiver], parts[receiver] if parts is not None else model)
    stats = {
        **counts,
        "messages": transport.log.messages_total,
        "bytes": transport.log.bytes_total,
        "seconds": time.perf_counter() - t0,
    }
    return out, stats


def prediction_frame(org: PredictOrg, id_name: str, head: Any) -> Any:
    """The receiver's predictions after ``predict.combine``: a DataFrame of its rows (``id_name``,
    ``prediction`` (empty for an unscored row), the score columns of ``head.outputs``)."""
    import pandas as pd

    pred, scores = head.outputs(org.raw[org.scored])
    out = pd.DataFrame({id_name: org.ids})
    out["prediction"] = ""
    out.loc[org.scored, "prediction"] = pred
    for k, v in scores.items():
        col = np.full(org.n, np.nan)
        col[org.scored] = v
        out[k] = col
    return out


def held_part(loaded: Any, blocks: Sequence[str], receiver: bool) -> OrgPart:
    """An organisation's own part (:func:`~hybridfl.inference.parts.load_org_part`) cut to the
    units all of whose blocks its new rows hold.

    Raises:
        PredictionError: the receiver keeps no head of the model.
    """
    own = loaded.part
    units = [u for u in own.units if set(own.unit_blocks[u]) <= set(blocks)]
    if receiver and own.head is None:
        raise PredictionError(
            f"organisation {loaded.organisation!r} keeps no head of the model (it holds no labels): it cannot "
            "receive predictions; name a label holder with --to."
        )
    return OrgPart(own.kind, units, {u: own.unit_blocks[u] for u in units}, own.width, own.weights, own.head)


def build_orgs(
    model: Any,
    tables: Mapping[str, Any],
    receiver: str,
    parts: Mapping[str, Any] | None = None,
    auths: Mapping[str, Any] | None = None,
) -> tuple[dict[str, PredictOrg], dict[str, str]]:
    """Every organisation's steps from its table (encoded with the model's encoding, checked) and
    its part of the model (cut from ``model``, or its own from ``parts``) and its
    :class:`~hybridfl.privacy.roster.PeerAuth` from ``auths`` (signed keys; none if absent):
    ``(organisation -> PredictOrg, organisation -> its ID column name)``.

    Raises:
        HybridFLError: a receiver that is not an organisation, fewer than two organisations, a
            table without the ID column, a receiver without the model's head, or any table
            problem (one sentence).
    """
    from hybridfl.data.encoding import encode_frame, frame_ids, held_blocks

    if receiver not in tables:
        raise PredictionError(f"the receiver {receiver!r} is not one of the organisations ({', '.join(tables)}).")
    if len(tables) < 2:
        raise PredictionError("a federated prediction needs at least two organisations.")
    orgs: dict[str, PredictOrg] = {}
    id_names: dict[str, str] = {}
    for name, frame in tables.items():
        where = f"the table of {name!r}"
        if parts is not None and name not in parts:
            raise PredictionError(f"organisation {name!r} has no part of the model.")
        view = parts[name] if parts is not None else model
        blocks = held_blocks(frame, view.encoding, where)
        id_name, ids = frame_ids(frame, view.encoding, where)
        if id_name == "row":
            raise PredictionError(f"{where} has no ID column {view.encoding.id_column!r}: rows are matched by ID.")
        xs = encode_frame(frame, view.encoding, view.scale, blocks, where)
        part = org_part(model, blocks, name == receiver) if parts is None else held_part(view, blocks, name == receiver)
        orgs[name] = PredictOrg(name, ids, xs, part, receiver, auth=(auths or {}).get(name))
        id_names[name] = id_name
    if not any(orgs[o].part.units for o in orgs):
        raise PredictionError("no organisation holds a whole unit of the model's blocks.")
    return orgs, id_names
