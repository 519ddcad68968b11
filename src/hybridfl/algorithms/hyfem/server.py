"""HyFEM's server-side steps (HyFEM paper, Alg. 1; classifier matching Alg. 3).

Before round 1 (:meth:`HyFEMServer.setup`) the server asks every client once for its blocks,
sample count and class counts. Each round ``t`` (:meth:`HyFEMServer.run_round`) it sends every
client its view of the server model (Alg. 1 line 9), and from the replies that arrive

- averages each block's extractor over the clients holding it, weighted by sample counts
  (Alg. 1 line 7, the closed form of (10)), and
- matches the clients' classifiers' hidden neurons into the server classifier (Alg. 1 line 8,
  Alg. 3, :func:`hybridfl.matching.match_classifiers`), which may widen it.

A client whose reply is lost keeps its extractors' and classifier's server positions and takes part
again in the next round. A reply holding a non-finite weight or loss (training diverged, e.g. a far
too large ``lr``) stops the run with :class:`~hybridfl.errors.TrainingDiverged` before the server
uses any reply of that round (:meth:`HyFEMServer.check_finite`).

Every reply is checked before use (:mod:`hybridfl.runtime.validate`). At setup a malformed
``hyfem.properties`` reply (repeated or non-string block names, ``n_samples`` < 1, class counts of
another shape, negative or not summing to ``n_samples``) stops the run with a
:class:`~hybridfl.runtime.validate.PayloadError`. In a round, a ``hyfem.fit`` reply with an unexpected
or missing key, an array of another dtype or shape than the server sent, or another ``n_samples``
than at setup is rejected with a logged warning and treated as missing (the client is absent for the
round, exactly as for a failure); non-finite weights or loss in a well-formed reply still mean
divergence.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from hybridfl.algorithms.hyfem.batched import prefit
from hybridfl.algorithms.hyfem.client import model_payload
from hybridfl.algorithms.hyfem.config import HyFEMConfig
from hybridfl.algorithms.hyfem.kinds import FIT, PROPERTIES
from hybridfl.algorithms.hyfem.secure import SecureExtractorsServerMixin
from hybridfl.errors import TrainingDiverged, UnknownBlockError
from hybridfl.matching.classifier import ClientClassifier, ServerClassifier, match_classifiers
from hybridfl.models.device import resolve_device
from hybridfl.models.hybrid import ExtractorFactory, HybridModel, block_columns, default_extractor
from hybridfl.privacy.roster import RUN_BYTES
from hybridfl.privacy.secagg import mask_quorum
from hybridfl.runtime.exchange import answers
from hybridfl.runtime.messages import SERVER, Message, pack_arrays, unpack_arrays
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError, array, integer, only_keys, strings

log = logging.getLogger(__name__)

_CLF = ("W1", "b1", "W2", "b2")


class HyFEMServer(SecureExtractorsServerMixin):
    """Server-side steps of HyFEM.

    Args:
        block_shapes: block name -> per-sample shape, all ``d0`` blocks in global order (public
            schema).
        n_classes: the number of classes ``C``.
        config: HyFEM settings.
        seed: seeds the server model's initialisation (``torch.manual_seed``) and the matching
            order (a NumPy generator).
        extractor_factory: plug-in extractors (must be the clients').

    Attributes:
        model: the server model: every block's extractor and the server classifier (width ``H``).
        classifier: the server classifier as arrays ``W1 (H, e*d0)``, ``b1 (H,)``, ``W2 (C, H)``,
            ``b2 (C,)``.
        clients: client ID -> ``blocks``, ``n_samples``, ``class_counts (C,)``, ``columns`` (its
            input columns of ``W1``) and ``assignment`` (its hidden neurons' server indices).
        last_stats: the last matching's statistics.
        device: where :attr:`model` and the models it hands out live (``config.device``).
    """

    def __init__(
        self,
        block_shapes: Mapping[str, tuple[int, ...]],
        n_classes: int,
        config: HyFEMConfig,
        seed: int = 0,
        extractor_factory: ExtractorFactory | None = None,
    ):
        self.config = config
        self.block_names = list(block_shapes)
        self.block_shapes = dict(block_shapes)
        self.n_classes = n_classes
        self.factory = extractor_factory or default_extractor(config.extractor)
        torch.manual_seed(seed)
        self.device = resolve_device(config.device)
        self.model = HybridModel(
            self.block_names, block_shapes, n_classes, config.extractor_dim, config.hidden, self.factory
        ).to(self.device)  # initialised on the CPU: the same weights on any device
        arr = self.model.classifier_arrays()
        self.classifier = ServerClassifier(arr["fc1.weight"], arr["fc1.bias"], arr["fc2.weight"], arr["fc2.bias"])
        self.rng = np.random.default_rng(seed)
        self.seed = int(seed)
        self.clients: dict[str, dict] = {}
        self.matching = config.matching.to_config()
        self.last_stats: dict = {}
        self._secure_reset()

    # ------------------------------------------------------------------ protocol
    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Ask every client once for its blocks, sample count and class counts
        (``hyfem.properties``); every client starts from the first ``hidden`` server neurons.

        Raises:
            UnknownBlockError: a client reports a block that is not in the schema.
            PayloadError: a malformed reply (:meth:`check_properties`).
        """
        run = {"run": os.urandom(RUN_BYTES)} if self.config.secure_aggregation else {}  # the key signatures name it
        asked = [Message(PROPERTIES, SERVER, cid, 0, dict(run)) for cid in client_ids]
        replies = answers(asked, transport.send_and_receive(asked), "HyFEM setup")
        for r in replies:
            blocks, n_samples, class_counts = self.check_properties(r)
            self.clients[r.sender] = {
                "blocks": blocks,
                "n_samples": n_samples,
                "class_counts": class_counts,
                "columns": block_columns(blocks, self.block_names, self.config.extractor_dim),
                # round 0: every client starts from the first `hidden` server neurons
                "assignment": np.arange(self.config.hidden, dtype=np.int64),
            }
        if self.config.secure_aggregation:  # relay the clients' keys (:mod:`.secure`)
            self.secure_setup(transport, replies)

    def check_properties(self, r: Message) -> tuple[list[str], int, np.ndarray]:
        """The checked ``(blocks, n_samples, class_counts)`` of a ``hyfem.properties`` reply:
        ``blocks`` distinct known block names, ``n_samples`` an integer >= 1, ``class_counts`` an
        integer array ``(C,)``, non-negative, summing to ``n_samples``.

        Raises:
            UnknownBlockError: a block that is not in the schema.
            PayloadError: any other problem (names the client and the field).
        """
        only_keys(r, ("blocks", "n_samples", "class_counts", "secagg_public", "secagg_sig"))
        blocks = strings(r, "blocks")
        unknown = [b for b in blocks if b not in self.block_shapes]
        if unknown:
            raise UnknownBlockError(r.sender, unknown[0])
        n = integer(r, "n_samples", low=1)
        counts = array(r, "class_counts", (self.n_classes,), kinds="iu")
        if (counts < 0).any():
            raise PayloadError(r, "class_counts", "holding a negative count")
        if int(counts.sum()) != n:
            raise PayloadError(r, "class_counts", f"summing to {int(counts.sum())}, not to n_samples = {n}")
        return blocks, n, counts.astype(np.int64)

    def check_fit_reply(self, r: Message, sent: Message) -> None:
        """Check a ``hyfem.fit`` reply against the message ``sent`` to that client: exactly the keys
        ``n_samples``, ``loss`` and every model array sent, each a float array of exactly the shape
        sent (finiteness is :meth:`check_finite`'s: a non-finite weight means divergence),
        ``n_samples`` equal to the count the client reported at setup and ``loss`` a number.

        Raises:
            PayloadError: the first problem found (names the client and the field).
        """
        shapes = {k: v.shape for k, v in sent.payload.items() if isinstance(v, np.ndarray)}
        if self.config.secure_aggregation:  # the extractors arrive masked (:mod:`.secure`)
            shapes = {k: s for k, s in shapes.items() if not k.startswith("ext.")}
            self.check_masked(r, len(sent.payload.get("peers", [])))
        secure = ("ext_masked", "self_shares") if self.config.secure_aggregation else ()
        only_keys(r, ("n_samples", "loss", *shapes, *secure))
        n = self.clients[r.sender]["n_samples"]
        integer(r, "n_samples", low=n, high=n)
        loss = r.payload.get("loss")
        if loss is None:
            raise PayloadError(r, "loss", "missing")
        if isinstance(loss, bool) or not isinstance(loss, (int, float, np.integer, np.floating)):
            raise PayloadError(r, "loss", f"of type {type(loss).__name__}, not a number")
        for k, shape in shapes.items():
            array(r, k, shape, kinds="f", finite=False)

    def fit_message(self, cid: str, rnd: int, asked: Sequence[str] | None = None) -> Message:
        """The ``hyfem.fit`` message of round ``rnd`` to client ``cid`` (HyFEM Alg. 1 line 9 /
        Alg. 2 line 2): the server extractors of its blocks ``P_m Theta_0``, its view of the server
        classifier ``Pi_m w_0`` (``hidden`` neurons, its blocks' columns), and ``Q``, ``eta``,
        ``mu1``, ``mu2`` (``eta`` of round ``rnd``: :meth:`HyFEMConfig.lr_at`)."""
        info = self.clients[cid]
        payload: dict = {
            "local_steps": self.config.local_steps,
            "lr": self.config.lr_at(rnd),
            "mu1": self.config.mu1,
            "mu2": self.config.mu2,
        }
        for b in info["blocks"]:
            payload.update(model_payload(f"ext.{b}.", self.model.extractor_arrays(b)))
        payload.update(model_payload("clf.", self.classifier.client_view(info["assignment"], info["columns"])))
        if self.config.secure_aggregation:
            payload.update(self.secure_fit_fields(cid, rnd, list(self.clients) if asked is None else asked))
        return Message(FIT, SERVER, cid, rnd, payload)

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """One round of HyFEM Alg. 1 (lines 3-9): every client is asked (or the round's sample,
        ``fraction_fit`` < 1, :meth:`sampled`); the server aggregates the replies that arrive; a
        client not sampled counts as absent. A client that failed keeps its extractors' and classifier's
        server positions and takes part again in the next round.

        Returns:
            ``train_loss`` (the sample-weighted mean of the clients' mean mini-batch losses; NaN
            if no reply arrived), ``server_width`` ``H``, ``clients_answered`` and ``clients_sampled``.

        A malformed reply (:meth:`check_fit_reply`) is logged and treated as missing. With
        ``batched_clients`` and an in-process transport, the asked clients that share a model shape
        train as one batched model first (:func:`~hybridfl.algorithms.hyfem.batched.prefit`).

        Raises:
            TrainingDiverged: a reply holds a non-finite weight or loss (nothing of the round is used).
        """
        ids = self.sampled(rnd)
        sent = {cid: self.fit_message(cid, rnd, ids) for cid in ids}
        if self.config.batched_clients and isinstance(getattr(transport, "clients", None), Mapping):
            prefit(transport.clients, list(sent.values()))  # in process: train same-shape clients together
        arrived = transport.send_and_receive(list(sent.values()))
        replies = []
        for r in answers(list(sent.values()), arrived, f"HyFEM round {rnd}"):
            try:
                self.check_fit_reply(r, sent[r.sender])
            except PayloadError as e:
                log.warning("HyFEM round %d: %s The reply is treated as missing.", rnd, e)
                continue
            replies.append(r)
        seen = {r.sender for r in replies}
        absent = [cid for cid in self.clients if cid not in seen]  # unsampled clients too
        self.check_finite(replies, rnd)
        if replies:
            if self.config.secure_aggregation:
                self.aggregate_masked(rnd, transport, replies, ids)
            else:
                self.aggregate_extractors(replies)
            self.match(replies, absent)
        n = sum(int(r.payload["n_samples"]) for r in replies)
        loss = sum(float(r.payload["loss"]) * int(r.payload["n_samples"]) for r in replies) / n if n else float("nan")
        return {
            "train_loss": loss,
            "server_width": float(self.classifier.width),
            "clients_answered": float(len(replies)),
            "clients_sampled": float(len(ids)),
        }

    def sampled(self, rnd: int) -> list[str]:
        """The clients asked in round ``rnd``: all of them with ``fraction_fit: 1`` (HyFEM Alg. 1),
        else ``max(1, round(fraction_fit * M))`` (with secure aggregation at least
        ``secagg_threshold``: the clients' own threshold) drawn without replacement by
        ``default_rng([seed, 13, rnd])`` (no state: a resumed run draws the same), in client order."""
        ids = list(self.clients)
        frac = float(self.config.fraction_fit)
        if frac >= 1.0:
            return ids
        k = max(1, round(frac * len(ids)))
        if self.config.secure_aggregation:  # its clients mask only with at least t of them
            k = max(k, mask_quorum(self.config.secagg_threshold, len(ids)))
        pick = set(np.random.default_rng([self.seed, 13, rnd]).choice(len(ids), size=k, replace=False).tolist())
        return [c for j, c in enumerate(ids) if j in pick]

    def check_finite(self, replies: Sequence[Message], rnd: int) -> None:
        """Refuse replies of round ``rnd`` holding NaN or infinity in an extractor, the classifier or
        the loss, before any of them is aggregated (so neither the server model nor the matching ever
        sees them).

        Raises:
            TrainingDiverged: one sentence naming the round, the client, what was non-finite and
                the step size.
        """
        for r in replies:
            bad = None
            for b in self.clients[r.sender]["blocks"]:
                if not all(np.isfinite(a).all() for a in unpack_arrays(f"ext.{b}.", r.payload).values()):
                    bad = f"non-finite extractor weights for block {b!r}"
                    break
            if bad is None and not all(np.isfinite(a).all() for a in unpack_arrays("clf.", r.payload).values()):
                bad = "non-finite classifier weights"
            if bad is None and not np.isfinite(float(r.payload.get("loss", 0.0))):
                bad = "a non-finite training loss"
            if bad is not None:
                raise TrainingDiverged(
                    f"training diverged in round {rnd}: client {r.sender!r} sent {bad}; "
                    f"lower algorithm.lr (now {self.config.lr:g})."
                )

    # ------------------------------------------------------------------ server updates
    def aggregate_extractors(self, replies: Sequence[Message]) -> None:
        """``theta_0,b = sum_m p_m theta_m,b / sum_m p_m`` over the clients holding block ``b``
        (HyFEM Alg. 1 line 7, closed form of (10)), ``p_m`` the sample counts, computed in float64
        and stored as float32; a block no reply holds keeps its value."""
        for b in self.block_names:
            holders = [r for r in replies if b in self.clients[r.sender]["blocks"]]
            if not holders:
                continue
            weights = np.array([float(r.payload["n_samples"]) for r in holders])
            weights /= weights.sum()
            params = [unpack_arrays(f"ext.{b}.", r.payload) for r in holders]
            avg = {k: sum(w * p[k].astype(np.float64) for w, p in zip(weights, params)) for k in params[0]}
            self.model.load_extractor_arrays(b, {k: v.astype(np.float32) for k, v in avg.items()})

    def match(self, replies: Sequence[Message], absent: Sequence[str] = ()) -> None:
        """Classifier matching (HyFEM Alg. 1 line 8, Alg. 3) of the clients that replied; the
        server neurons of ``absent`` clients are reserved and their assignments remapped to the
        new server indices."""
        cc = []
        for r in replies:
            info = self.clients[r.sender]
            a = unpack_arrays("clf.", r.payload)
            cc.append(
                ClientClassifier(
                    W1=a["fc1.weight"].astype(np.float64),
                    b1=a["fc1.bias"].astype(np.float64),
                    W2=a["fc2.weight"].astype(np.float64),
                    b2=a["fc2.bias"].astype(np.float64),
                    columns=info["columns"],
                    weight=float(r.payload["n_samples"]),
                    assignment=info["assignment"],
                    class_counts=info["class_counts"],
                )
            )
        reserved = [self.clients[cid]["assignment"] for cid in absent]
        res = match_classifiers(cc, self.classifier, self.matching, self.rng, reserved=reserved)
        self.classifier = res.server
        for r, a in zip(replies, res.assignments):
            self.clients[r.sender]["assignment"] = a
        for cid in absent:
            self.clients[cid]["assignment"] = res.index[self.clients[cid]["assignment"]]
        self._load_classifier()
        self.last_stats = res.stats

    def _load_classifier(self) -> None:
        c = self.classifier
        self.model.load_classifier_arrays({"fc1.weight": c.W1, "fc1.bias": c.b1, "fc2.weight": c.W2, "fc2.bias": c.b2})

    # ------------------------------------------------------------------ checkpoints
    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything the server carries from round to round: ``(arrays, json_meta)``.

        ``arrays``: ``ext.<block>.<parameter>`` for every block's extractor and ``clf.W1``,
        ``clf.b1``, ``clf.W2``, ``clf.b2`` (the server classifier, width ``H``); ``json_meta``:
        each client's blocks, sample count, class counts and assignment ``(hidden,)``, and the
        matching order's random state.
        """
        arrays: dict[str, np.ndarray] = {}
        for b in self.block_names:
            arrays.update(pack_arrays(f"ext.{b}.", self.model.extractor_arrays(b)))
        for k in _CLF:
            arrays[f"clf.{k}"] = getattr(self.classifier, k)
        meta = {
            "clients": {
                cid: {
                    "blocks": i["blocks"],
                    "n_samples": i["n_samples"],
                    "class_counts": np.asarray(i["class_counts"]).tolist(),
                    "assignment": i["assignment"].tolist(),
                }
                for cid, i in self.clients.items()
            },
            "rng": self.rng.bit_generator.state,
        }
        return arrays, meta

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned, on a server built with the same config and
        schema. Called after :meth:`setup` (resume order build, setup, restore): it replaces
        whatever ``setup`` recorded about the clients.

        Raises:
            UnknownBlockError: the state names a block that is not in this server's schema.
        """
        for cid, i in meta["clients"].items():
            unknown = [b for b in i["blocks"] if b not in self.block_shapes]
            if unknown:
                raise UnknownBlockError(cid, unknown[0], "the server's schema")
        for b in self.block_names:
            self.model.load_extractor_arrays(b, unpack_arrays(f"ext.{b}.", dict(arrays)))
        self.classifier = ServerClassifier(*(np.asarray(arrays[f"clf.{k}"]) for k in _CLF))
        self._load_classifier()
        self.clients = {
            cid: {
                "blocks": list(i["blocks"]),
                "n_samples": int(i["n_samples"]),
                "class_counts": np.asarray(i["class_counts"]),
                "columns": block_columns(i["blocks"], self.block_names, self.config.extractor_dim),
                "assignment": np.asarray(i["assignment"], dtype=np.int64),
            }
            for cid, i in meta["clients"].items()
        }
        self.rng.bit_generator.state = meta["rng"]

    # ------------------------------------------------------------------ models for inference
    def client_model(self, cid: str) -> HybridModel:
        """The model client ``cid`` receives: ``P_m Theta_0`` and ``Pi_m w_0`` (local inference on
        its own blocks; ``hidden`` neurons).

        Raises:
            KeyError: ``cid`` is not a client of this server.
        """
        info = self.clients[cid]
        m = HybridModel(
            info["blocks"],
            self.block_shapes,
            self.n_classes,
            self.config.extractor_dim,
            self.config.hidden,
            self.factory,
        ).to(self.device)
        for b in info["blocks"]:
            m.load_extractor_arrays(b, self.model.extractor_arrays(b))
        m.load_classifier_arrays(self.classifier.client_view(info["assignment"], info["columns"]))
        return m

    def model_for_blocks(self, blocks: Sequence[str]) -> HybridModel:
        """A model for any subset of blocks cut from the server model (HyFEM Remark 2): the
        server extractors of those blocks (in global block order) and the whole server classifier
        (width ``H``) restricted to their columns."""
        order = [b for b in self.block_names if b in set(blocks)]
        cols = block_columns(order, self.block_names, self.config.extractor_dim)
        m = HybridModel(
            order, self.block_shapes, self.n_classes, self.config.extractor_dim, self.classifier.width, self.factory
        ).to(self.device)
        for b in order:
            m.load_extractor_arrays(b, self.model.extractor_arrays(b))
        m.load_classifier_arrays(self.classifier.client_view(np.arange(self.classifier.width), cols))
        return m
