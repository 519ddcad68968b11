"""FedBCD's server side: :class:`FedBCDCoordinator` (holds no data; aligns, samples, relays).

See :mod:`hybridfl.algorithms.fedbcd` for the protocol and its messages.

Every reply is checked before use (:mod:`hybridfl.runtime.validate`): at setup the parties'
properties (``out_dim`` >= 1, ...), the PSI blobs it relays (bytes within the size caps of
:mod:`hybridfl.privacy.psi`; their content is opaque to it and checked by the parties), the tags'
length and ``n_aligned`` (the aligned count, the same from every party), a bad one stopping the
setup with a :class:`~hybridfl.runtime.validate.PayloadError`; in a round every
``h``/``h_next``/``grad.<party>``/``curv.<party>`` must be a float array ``(B, r_k)`` (``B`` the batch size sent,
``r_k`` the party's reported ``out_dim``) and ``loss`` a number. A malformed reply in a round is
logged and counts as a missing reply (the round is skipped and undone, or the run stops, as
``on_missing_party`` says). Non-finite values are not refused here: they are what a diverging run
produces, and the evaluation reports them (``diverged``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridfl.algorithms.fedbcd.config import FedBCDConfig, PartyMissingError
from hybridfl.algorithms.fedbcd.kinds import (
    ALIGN,
    EVALUATE,
    FORWARD,
    LABEL,
    PARTY_STEP,
    PROPERTIES,
    PSI_REQUEST,
    PSI_RESULT,
    PSI_SERVE,
    UNDO,
)
from hybridfl.errors import ProtocolError
from hybridfl.privacy import psi
from hybridfl.privacy.credentials import SIGNATURE_BYTES
from hybridfl.privacy.roster import RUN_BYTES
from hybridfl.runtime.exchange import answers
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError, array, integer, number, only_keys, strings

MAX_BLOB_BYTES = 16 + psi.MAX_IDS * (psi.POINT_BYTES + 2)
"""The largest PSI request, setup or response the coordinator relays (:data:`hybridfl.privacy.psi.MAX_IDS` IDs)."""

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 12345
"""The evaluation subset is drawn with ``numpy.random.default_rng(seed + EVAL_SEED_OFFSET)``."""


class _Missing(Exception):
    """Internal: replies missing in the current round (the round cannot be completed)."""

    def __init__(self, parties: list[str], invalid: bool = False):
        super().__init__(", ".join(parties))
        self.parties = parties
        self.invalid = invalid  # some reply arrived but was malformed


def _names(parties: Sequence[str]) -> str:
    quoted = [repr(p) for p in parties]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


class FedBCDCoordinator:
    """Coordinator-side steps (the ``server`` of the message runtime; holds no data).

    Args:
        config: FedBCD settings.
        seed: the run seed; seeds the mini-batch sampling (IDs only) and, with
            :data:`EVAL_SEED_OFFSET`, the evaluation subset.

    A round with a missing reply is handled as ``config.on_missing_party`` says
    (:mod:`hybridfl.algorithms.fedbcd`, "A missing party"); ``skipped`` lists ``(round, missing
    parties)`` of every skipped round.
    """

    def __init__(self, config: FedBCDConfig, seed: int = 0):
        self.config = config
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)
        self.parties: list[str] = []
        self.label_party: str = ""
        self.passive: list[str] = []
        self.n = 0
        self.n_test = 0  # test samples every party holds (0: none, no evaluation)
        self.out_dim: dict[str, int] = {}  # party -> r_k, the width of its H_k (from its properties)
        self.batch: np.ndarray | None = None
        self.h: dict[str, np.ndarray] = {}  # H_k of the current batch (passive parties)
        self.undo: dict[str, int] = {}  # party -> skipped round it has not yet confirmed undoing
        self.skipped: list[tuple[int, list[str]]] = []
        self._touched: set[str] = set()  # parties that received a message in the current round

    # ------------------------------------------------------------------ state (checkpoints)
    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything carried from round to round: ``(arrays, json_meta)`` with the current batch,
        the stored ``H_k``, the roles, the aligned and test sample counts, the batch sampler's
        random state, the pending ``undo`` per party and the skipped rounds."""
        arrays = {f"h.{k}": np.asarray(v) for k, v in self.h.items()}
        if self.batch is not None:
            arrays["batch"] = np.asarray(self.batch)
        meta = {
            "parties": self.parties,
            "label_party": self.label_party,
            "passive": self.passive,
            "n": self.n,
            "n_test": self.n_test,
            "rng": self.rng.bit_generator.state,
            "undo": self.undo,
            "skipped": [[r, list(m)] for r, m in self.skipped],
        }
        return arrays, meta

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned (on a coordinator built with the same config,
        after its ``setup``)."""
        self.parties = [str(p) for p in meta["parties"]]
        self.label_party = str(meta["label_party"])
        self.passive = [str(p) for p in meta["passive"]]
        self.n = int(meta["n"])
        self.n_test = int(meta.get("n_test", self.n_test))
        self.rng.bit_generator.state = meta["rng"]
        self.undo = {str(k): int(v) for k, v in meta["undo"].items()}
        self.skipped = [(int(r), [str(x) for x in m]) for r, m in meta["skipped"]]
        self.batch = np.asarray(arrays["batch"], dtype=np.int64) if "batch" in arrays else None
        self.h = {k[2:]: np.asarray(v) for k, v in arrays.items() if k.startswith("h.")}

    # ------------------------------------------------------------------ exchanges
    def _exchange(
        self, transport: Transport, messages: list[Message], expect: Mapping[str, tuple[int, ...]] | None = None
    ) -> list[Message]:
        """Send; every reply must arrive and pass :meth:`check_reply` (``expect``: array key ->
        shape, the same for every reply). A party with a pending ``undo`` gets it in its message
        (its valid reply confirms it). Raises :class:`_Missing` with the parties whose reply is
        missing or malformed (a malformed one is logged)."""
        for m in messages:
            if m.receiver in self.undo:
                m.payload["undo"] = self.undo[m.receiver]
            self._touched.add(m.receiver)
        replies, invalid = [], False
        for r in answers(messages, transport.send_and_receive(messages), "FedBCD"):
            try:
                self.check_reply(r, expect or {})
            except PayloadError as e:
                log.warning("FedBCD round %d: %s The reply counts as missing.", r.round, e)
                invalid = True
                continue
            replies.append(r)
        arrived = {r.sender for r in replies}
        for m in messages:
            if m.receiver in arrived:
                self.undo.pop(m.receiver, None)
        missing = [m.receiver for m in messages if m.receiver not in arrived]
        if missing:
            raise _Missing(missing, invalid)
        return replies

    def check_reply(self, r: Message, expect: Mapping[str, tuple[int, ...]]) -> None:
        """Check a round's reply: exactly the array keys of ``expect`` (``<key>`` -> shape; ``-1`` in
        a shape stands for the sender's ``out_dim``), each a float array of that shape, plus
        ``loss`` (a number) when ``expect`` says so with ``"loss": ()``.

        Raises:
            PayloadError: the first problem found (names the party and the field).
        """
        only_keys(r, tuple(expect))
        for k, shape in expect.items():
            if k == "loss":
                v = r.payload.get("loss")
                if v is None:
                    raise PayloadError(r, "loss", "missing")
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise PayloadError(r, "loss", f"of type {type(v).__name__}, not a number")
                continue
            owner = k.split(".", 1)[1] if k.startswith(("grad.", "curv.")) else r.sender  # whose H_k this is
            array(r, k, [self.out_dim.get(owner) if d == -1 else d for d in shape], kinds="f", finite=False)

    def check_properties(self, r: Message) -> None:
        """Check a ``fedbcd.properties`` reply: ``blocks`` distinct strings, ``out_dim`` an
        integer >= 1, ``has_labels`` a bool, ``n_test`` (if any) an integer >= 0.

        Raises:
            PayloadError: the first problem found (names the party and the field).
        """
        only_keys(r, ("blocks", "out_dim", "has_labels", "n_test"))
        strings(r, "blocks")
        integer(r, "out_dim", low=1)
        if not isinstance(r.payload.get("has_labels"), (bool, np.bool_)):
            raise PayloadError(r, "has_labels", "not a bool")
        if "n_test" in r.payload:
            integer(r, "n_test", low=0)

    @staticmethod
    def check_blob(r: Message, key: str, max_bytes: int = MAX_BLOB_BYTES, size: int | None = None) -> bytes:
        """The opaque blob ``r.payload[key]``: bytes, at most ``max_bytes`` long (exactly ``size``
        if given). The coordinator never parses it.

        Raises:
            PayloadError: missing, not bytes, or of a wrong size.
        """
        v = r.payload.get(key)
        if v is None:
            raise PayloadError(r, key, "missing")
        if not isinstance(v, (bytes, bytearray)):
            raise PayloadError(r, key, f"of type {type(v).__name__}, not bytes")
        if len(v) > max_bytes or (size is not None and len(v) != size):
            raise PayloadError(
                r, key, f"of {len(v)} bytes, expected {size if size is not None else f'at most {max_bytes}'}"
            )
        return bytes(v)

    def _setup_exchange(self, transport: Transport, messages: list[Message]) -> dict[str, Message]:
        """Send setup messages; every party must answer (:func:`~hybridfl.runtime.exchange.answers`),
        else :class:`ProtocolError`."""
        sent = {m.receiver: m for m in messages}
        got = {r.sender: r for r in answers(messages, transport.send_and_receive(messages), "FedBCD setup")}
        missing = [p for p in sent if p not in got]
        if missing:
            raise ProtocolError(
                f"FedBCD party {missing[0]!r} sent no reply to {messages[0].kind!r} during the setup, and alignment needs every party."
            )
        return got

    def align(self, transport: Transport) -> int:
        """Align the parties' samples by private set intersection, relaying opaque blobs
        (:mod:`hybridfl.algorithms.fedbcd`, "Sample alignment"): ``fedbcd.psi_request`` to the
        label party (its blinded IDs, its X25519 key), ``fedbcd.psi_serve`` to every passive party
        (its PSI setup and response, its X25519 key), ``fedbcd.psi_result`` to the label party
        (the aligned count and every passive party's order tags), ``fedbcd.align`` to every
        passive party (its tags). The coordinator learns the aligned count (and, from the blobs'
        lengths, the parties' set sizes), never an ID.

        Returns:
            The aligned count ``n`` (>= 1).

        Raises:
            ProtocolError: a missing reply, or no common sample.
            PayloadError: a malformed reply (a blob that is not bytes or over the cap, tags of a
                wrong length, an ``n_aligned`` other than the label party's).
        """
        L = self.label_party
        run = os.urandom(RUN_BYTES)  # the run label the parties' signatures name
        req = self._setup_exchange(transport, [Message(PSI_REQUEST, SERVER, L, 0, {"run": run})])[L]
        only_keys(req, ("request", "dh", "n", "sig"))
        ask = {"request": self.check_blob(req, "request"), "dh": self.check_blob(req, "dh", size=psi.DH_BYTES)}
        ask.update(run=run, n=integer(req, "n", low=1, high=psi.MAX_IDS))
        if "sig" in req.payload:  # the label party's signature (the passive parties check it)
            ask["sig"] = self.check_blob(req, "sig", size=SIGNATURE_BYTES)
        served = self._setup_exchange(transport, [Message(PSI_SERVE, SERVER, k, 0, ask) for k in self.passive])
        relay: dict = {}
        for k, r in served.items():
            only_keys(r, ("setup", "response", "dh", "sig"))
            relay[f"setup.{k}"] = self.check_blob(r, "setup")
            relay[f"response.{k}"] = self.check_blob(r, "response")
            relay[f"dh.{k}"] = self.check_blob(r, "dh", size=psi.DH_BYTES)
            if "sig" in r.payload:
                relay[f"sig.{k}"] = self.check_blob(r, "sig", size=SIGNATURE_BYTES)
        res = self._setup_exchange(transport, [Message(PSI_RESULT, SERVER, L, 0, relay)])[L]
        n = integer(res, "n_aligned", low=0, high=psi.MAX_IDS)
        if n == 0:
            only_keys(res, ("n_aligned",))
            raise ProtocolError("the FedBCD parties share no sample ID.")
        only_keys(res, ("n_aligned", *(f"tags.{k}" for k in self.passive)))
        tags = {k: self.check_blob(res, f"tags.{k}", size=n * psi.TAG_BYTES) for k in self.passive}
        aligned = self._setup_exchange(
            transport, [Message(ALIGN, SERVER, k, 0, {"tags": tags[k]}) for k in self.passive]
        )
        for r in aligned.values():
            only_keys(r, ("n_aligned",))
            integer(r, "n_aligned", low=n, high=n)
        return n

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Ask every party for its role, blocks and test set size (``fedbcd.properties``), then
        align their samples by private set intersection (:meth:`align`): the aligned order is the
        intersection of all parties' IDs in the label party's order, which only the parties know.

        Raises:
            ProtocolError: not exactly one label party, no common sample, parties holding test
                sets of different sizes, a missing reply, or a reply from a party that was not
                asked.
            PayloadError: a malformed reply (:meth:`check_properties`, :meth:`align`).
        """
        asked = [Message(PROPERTIES, SERVER, cid, 0) for cid in client_ids]
        replies = answers(asked, transport.send_and_receive(asked), "FedBCD setup")
        for r in replies:
            self.check_properties(r)
        self.out_dim = {r.sender: int(r.payload["out_dim"]) for r in replies}
        self.parties = [r.sender for r in replies]
        labels = [r.sender for r in replies if r.payload["has_labels"]]
        if len(labels) != 1:
            raise ProtocolError(f"FedBCD needs exactly one label party, {len(labels)} parties said they hold labels.")
        self.label_party = labels[0]
        self.passive = [p for p in self.parties if p != self.label_party]
        sizes = {r.sender: int(r.payload.get("n_test", 0)) for r in replies}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{p!r} {n}" for p, n in sizes.items())
            raise ProtocolError(f"the FedBCD parties hold test sets of different sizes ({listed}).")
        self.n_test = next(iter(sizes.values()), 0)
        self.n = self.align(transport)

    def sample_batch(self) -> np.ndarray:
        """``(B,)`` aligned positions drawn uniformly without replacement (paper A2 / Alg. 1 line 4)."""
        b = min(self.config.batch_size, self.n)
        return np.sort(self.rng.choice(self.n, size=b, replace=False)).astype(np.int64)

    def _common(self, rnd: int) -> dict:
        c = self.config
        out = {"local_steps": c.Q, "lr": float(c.step_size(rnd - 1)), "mu": float(c.mu or 0.0), "l2": float(c.l2)}
        if c.optimizer != "sgd":  # sgd: the messages (and their bytes) as without the option
            out["optimizer"] = c.optimizer
        return out

    @property
    def taylor(self) -> bool:
        """``local_gradient: taylor``: the label party also returns ``curv.<k>`` and each passive
        party gets ``curv`` with its ``grad``."""
        return self.config.local_gradient == "taylor"

    def _grad_payload(self, lab: Message, k: str) -> dict:
        """``grad`` (and, with :attr:`taylor`, ``curv``) of passive party ``k`` from the label
        party's reply."""
        out = {"grad": lab.payload[f"grad.{k}"]}
        if self.taylor:
            out["curv"] = lab.payload[f"curv.{k}"]
        return out

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """One communication round: one exchange on a fresh mini-batch and the local steps
        (FedSGD Alg. 1, FedBCD-p Alg. 2, FedBCD-s Alg. 3, FedPBCD-p eq. (15)).

        Returns ``train_loss`` and ``lr``; for a skipped round ``skipped`` (1), ``missing`` and
        ``lr``.

        Raises:
            PartyMissingError: a reply is missing and ``on_missing_party`` is ``error``.
            ProtocolError: a round before ``setup``.
        """
        if not self.parties:
            raise ProtocolError("the FedBCD coordinator was asked for a round before its setup.")
        lr = float(self.config.step_size(rnd - 1))
        before = (self.batch, self.h, self.rng.bit_generator.state)
        self._touched = set()
        try:
            if self.batch is None:  # first round: H_k of the first batch
                self.batch = self.sample_batch()
                replies = self._exchange(
                    transport,
                    [Message(FORWARD, SERVER, k, rnd, {"batch": self.batch}) for k in self.passive],
                    {"h": (len(self.batch), -1)},
                )
                self.h = {r.sender: r.payload["h"] for r in replies}
            if self.config.variant == "s":
                loss = self._sequential(rnd, transport, self.batch)
            else:
                loss = self._parallel(rnd, transport, self.batch)
        except _Missing as e:  # the round never happened for the coordinator either
            self.batch, self.h, self.rng.bit_generator.state = before
            return self._skip(rnd, e.parties, lr, transport, e.invalid)
        return {"train_loss": loss, "lr": lr}

    def _skip(self, rnd: int, missing: list[str], lr: float, transport: Transport, invalid: bool = False) -> dict:
        """A reply of round ``rnd`` is missing (or, ``invalid``, malformed): raise (``error``) or
        undo the round everywhere (``skip``)."""
        who = (
            ("party " if len(missing) == 1 else "parties ")
            + _names(missing)
            + (" (the label party)" if self.label_party in missing else "")
        )
        if self.config.on_missing_party == "error":
            raise PartyMissingError(
                f"FedBCD {who} sent no {'valid ' if invalid else ''}reply in round {rnd}, and a vertical FL round needs every party "
                "(set algorithm.on_missing_party: skip to skip such rounds)."
            )
        touched = [p for p in self.parties if p in self._touched]
        for p in touched:  # the earliest unconfirmed skipped round: its undo also undoes the later ones
            self.undo[p] = min(self.undo.get(p, rnd), rnd)
        replies = transport.send_and_receive([Message(UNDO, SERVER, p, rnd, {"round": self.undo[p]}) for p in touched])
        for r in replies:
            self.undo.pop(r.sender, None)
        self.skipped.append((rnd, list(missing)))
        log.warning(
            "FedBCD round %d skipped: no %sreply from %s; the round's updates are undone at every party.",
            rnd,
            "valid " if invalid else "",
            who,
        )
        return {"skipped": 1, "missing": " ".join(missing), "lr": lr}

    def _parallel(self, rnd: int, transport: Transport, batch: np.ndarray) -> float:
        """FedSGD / FedBCD-p / FedPBCD-p round (Alg. 1, Alg. 2): the label party returns every
        ``dL/dH_k`` and takes its ``Q`` steps; all passive parties take theirs with it."""
        common = self._common(rnd)
        payload = {"batch": batch, "grads_for": list(self.passive), **common}
        payload.update({f"h.{k}": self.h[k] for k in self.passive})
        B = len(batch)
        expect: dict = {"loss": (), **{f"grad.{k}": (B, -1) for k in self.passive}}
        if self.taylor:
            payload["curvature"] = True
            expect.update({f"curv.{k}": (B, -1) for k in self.passive})
        (lab,) = self._exchange(transport, [Message(LABEL, SERVER, self.label_party, rnd, payload)], expect)
        nxt = self.sample_batch()
        replies = self._exchange(
            transport,
            [
                Message(PARTY_STEP, SERVER, k, rnd, {**self._grad_payload(lab, k), "next_batch": nxt, **common})
                for k in self.passive
            ],
            {"h_next": (len(nxt), -1)},
        )
        self.batch = nxt
        self.h = {r.sender: r.payload["h_next"] for r in replies}
        return float(lab.payload["loss"])

    def _sequential(self, rnd: int, transport: Transport, batch: np.ndarray) -> float:
        """FedBCD-s round (Alg. 3): for each passive party ``k`` in turn, ``Exchange({k, K})``
        (the label party returns ``dL/dH_k`` with every update made so far this round) and ``Q``
        local steps of ``k``; then the label party's ``Q`` steps with all fresh ``H_k``."""
        common = self._common(rnd)
        nxt = self.sample_batch()
        first_loss = None
        new_h: dict[str, np.ndarray] = {}
        fresh: dict[str, np.ndarray] = dict(self.h)  # H_k to send to the label party
        for i, k in enumerate(self.passive):
            payload: dict = {"grads_for": [k], "local_steps": 0}
            if i == 0:
                payload["batch"] = batch
            payload.update({f"h.{j}": v for j, v in fresh.items()})
            expect: dict = {"loss": (), f"grad.{k}": (len(batch), -1)}
            if self.taylor:
                payload["curvature"] = True
                expect[f"curv.{k}"] = (len(batch), -1)
            (lab,) = self._exchange(transport, [Message(LABEL, SERVER, self.label_party, rnd, payload)], expect)
            if first_loss is None:
                first_loss = float(lab.payload["loss"])
            (rep,) = self._exchange(
                transport,
                [
                    Message(
                        PARTY_STEP,
                        SERVER,
                        k,
                        rnd,
                        {**self._grad_payload(lab, k), "next_batch": nxt, "return_current": True, **common},
                    )
                ],
                {"h": (len(batch), -1), "h_next": (len(nxt), -1)},
            )
            fresh = {k: rep.payload["h"]}
            new_h[k] = rep.payload["h_next"]
        payload = {"grads_for": [], **common}
        payload.update({f"h.{j}": v for j, v in fresh.items()})
        self._exchange(transport, [Message(LABEL, SERVER, self.label_party, rnd, payload)], {"loss": ()})
        self.batch = nxt
        self.h = new_h
        return float(first_loss if first_loss is not None else 0.0)

    # ------------------------------------------------------------------ evaluation
    def eval_rows(self) -> np.ndarray:
        """``(n,)`` sorted test positions to evaluate on: a fixed random subset of
        ``eval_subset`` positions (drawn with ``seed + EVAL_SEED_OFFSET``) when that is smaller
        than the test set, else all ``n_test`` of them."""
        k = self.config.eval_subset
        if k is not None and k < self.n_test:
            rng = np.random.default_rng(self.seed + EVAL_SEED_OFFSET)
            return np.sort(rng.choice(self.n_test, k, replace=False)).astype(np.int64)
        return np.arange(self.n_test, dtype=np.int64)

    def evaluate(self, rnd: int, exchange: Callable[[list[Message]], list[Message]]) -> dict[str, float]:
        """The test metrics of the joint model after round ``rnd``, through ``fedbcd.evaluate``
        messages: the rows :meth:`eval_rows` to every passive party, which replies ``h``
        ``(n, r_k)``; then the rows and every ``h.<k>`` to the label party, which replies ``auc``
        and ``accuracy`` (or ``diverged`` = 1 and NaNs). Returns ``{}`` when the parties hold no
        test set, or a reply is missing or malformed (logged; no metrics this round, as for a
        passive party's bad ``h``): ``auc`` and ``accuracy`` must be numbers in ``[0, 1]``, or NaN
        with ``diverged`` = 1.
        """
        if self.n_test == 0:
            return {}
        rows = self.eval_rows()
        replies = exchange([Message(EVALUATE, SERVER, k, rnd, {"rows": rows}) for k in self.passive])
        hs = {}
        for r in replies:
            if r.sender in self.passive:
                try:
                    self.check_reply(r, {"h": (len(rows), -1)})
                except PayloadError as e:  # like a missing reply: no metrics this round
                    log.warning("FedBCD evaluation after round %d: %s The reply counts as missing.", rnd, e)
                    continue
                hs[r.sender] = r.payload["h"]
        if len(hs) != len(self.passive):
            return {}
        payload: dict = {"rows": rows, **{f"h.{k}": hs[k] for k in self.passive}}
        replies = exchange([Message(EVALUATE, SERVER, self.label_party, rnd, payload)])
        if not replies:
            return {}
        try:
            return self.check_metrics(replies[0])
        except PayloadError as e:
            log.warning("FedBCD evaluation after round %d: %s The reply counts as missing.", rnd, e)
            return {}

    @staticmethod
    def check_metrics(r: Message) -> dict[str, float]:
        """The label party's ``fedbcd.evaluate`` reply as metrics: ``auc`` and ``accuracy`` numbers
        in ``[0, 1]``; with ``diverged`` = 1 both NaN.

        Raises:
            PayloadError: another key, a missing or non-numeric value, a value outside ``[0, 1]``,
                or NaN without ``diverged``.
        """
        only_keys(r, ("auc", "accuracy", "diverged"))
        if "diverged" in r.payload:
            number(r, "diverged", 1.0, 1.0)
            for k in ("auc", "accuracy"):
                v = r.payload.get(k)
                if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not np.isnan(v):
                    raise PayloadError(r, k, "not NaN although the reply says diverged")
            return {"auc": float("nan"), "accuracy": float("nan"), "diverged": 1.0}
        return {"auc": number(r, "auc", 0.0, 1.0), "accuracy": number(r, "accuracy", 0.0, 1.0)}
