"""HyFEM: Hybrid Federated Matching (HyFEM paper, Algorithms 1-3; SPEC.md "HyFEM").

Written once as client-side and server-side steps that exchange :class:`Message` objects, so the
in-process simulation and the Flower runtime run the same code.

Messages per round ``t`` (one exchange per participating client):

- server -> client ``hyfem.fit``: the extractors of the client's blocks ``P_m Theta_0^t`` and its
  matched classifier ``Pi_m^t w_0^t`` (Alg. 1 line 9 / Alg. 2 line 2), plus ``Q``, ``eta``,
  ``mu1``, ``mu2``, batch size;
- client -> server ``hyfem.fit``: ``Theta_m^{t,Q}``, ``w_m^{t,Q}`` after ``Q`` local SGD steps (Alg.
  2 lines 3-6), its sample count and mean loss.

Before the first round the server asks each client once for its properties (``hyfem.properties``:
block names, sample count, class counts); no feature value or label crosses.

Server step (Alg. 1 lines 7-8): block-wise extractor averaging (closed form of (10)) and
classifier matching (Alg. 3, :func:`hybridfl.matching.match_classifiers`).

HyFEM-Avg is ``mu1 = mu2 = 0``; HyFEM-Prox uses ``mu1``, ``mu2`` > 0 in the local steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridfl.algorithms.training import LocalTrainer
from hybridfl.data.dataset import HybridDataset
from hybridfl.matching.classifier import ClientClassifier, MatchingConfig, ServerClassifier, match_classifiers
from hybridfl.models.hybrid import ExtractorFactory, HybridModel, block_columns, default_extractor
from hybridfl.runtime.messages import Message, pack_arrays, unpack_arrays
from hybridfl.runtime.transport import Transport

SERVER = "server"


class MatchingSettings(BaseModel):
    """Classifier matching settings (see :class:`hybridfl.matching.MatchingConfig`)."""

    model_config = ConfigDict(extra="forbid")
    cost: Literal["pfnm", "euclidean"] = "pfnm"
    sweeps: int = Field(3, ge=0, description="matching sweeps P over the clients")
    sigma: float = Field(1.0, gt=0)
    sigma0: float = Field(1.0, gt=0)
    gamma: float = Field(1.0, gt=0)
    new_penalty: float | None = Field(None, gt=0)
    max_width: int | None = Field(None, ge=1, description="cap on the server hidden width")
    output_weighting: Literal["samples", "class"] = "samples"

    def to_config(self) -> MatchingConfig:
        return MatchingConfig(**self.model_dump())


class HyFEMConfig(BaseModel):
    """HyFEM hyperparameters (``algorithm:`` section of a run config with ``name: hyfem``).

    ``variant: avg`` forces ``mu1 = mu2 = 0``; ``variant: prox`` uses the given ``mu1``, ``mu2``.
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["hyfem"] = "hyfem"
    variant: Literal["avg", "prox"] = "avg"
    rounds: int = Field(30, ge=1, description="communication rounds T")
    local_steps: int = Field(20, ge=1, description="local SGD steps Q per round")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0, description="SGD step size eta")
    momentum: float = Field(0.0, ge=0, lt=1)
    mu1: float = Field(0.0, ge=0, description="proximal weight on the extractors (HyFEM-Prox)")
    mu2: float = Field(0.0, ge=0, description="proximal weight on the classifier (HyFEM-Prox)")
    extractor: Literal["auto", "mlp", "cnn"] = "auto"
    extractor_dim: int = Field(32, ge=1, description="output width e of every extractor")
    hidden: int = Field(64, ge=1, description="client classifier hidden width")
    matching: MatchingSettings = Field(default_factory=MatchingSettings)
    eval_every: int = Field(1, ge=0, description="evaluate every k rounds (0: only at the end)")
    failure_rate: float = Field(0.0, ge=0, lt=1, description="simulated: probability that a client fails mid-round")
    baselines: bool = Field(True, description="also train centralised and stand-alone baselines")

    @model_validator(mode="after")
    def _check(self) -> HyFEMConfig:
        if self.variant == "avg" and (self.mu1 or self.mu2):
            raise ValueError("variant 'avg' has mu1 = mu2 = 0; use variant 'prox' for proximal terms")
        if self.matching.max_width is not None and self.matching.max_width < self.hidden:
            raise ValueError(f"matching.max_width {self.matching.max_width} is smaller than hidden {self.hidden}")
        return self


def _model_arrays(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return pack_arrays(prefix, {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})


class HyFEMClient:
    """Client-side steps of HyFEM for one client.

    Args:
        client_id: the client's name.
        data: its samples restricted to its blocks (with labels).
        block_shapes: shapes of all blocks (public schema).
        n_classes: ``C``.
        config: HyFEM settings (extractor and classifier sizes).
        seed: seeds its mini-batch sampling.
        extractor_factory: plug-in extractors (default :func:`default_extractor`).
    """

    def __init__(
        self,
        client_id: str,
        data: HybridDataset,
        block_shapes: Mapping[str, tuple[int, ...]],
        n_classes: int,
        config: HyFEMConfig,
        seed: int = 0,
        extractor_factory: ExtractorFactory | None = None,
    ):
        self.client_id = client_id
        self.data = data
        self.blocks = tuple(data.block_names)
        self.n_classes = n_classes
        self.model = HybridModel(
            self.blocks, block_shapes, n_classes, config.extractor_dim, config.hidden,
            extractor_factory or default_extractor(config.extractor),
        )
        self.trainer = LocalTrainer(self.model, data, config.batch_size, config.lr, config.momentum, seed)

    def handle(self, msg: Message) -> Message:
        if msg.kind == "hyfem.properties":
            return msg.reply(
                blocks=list(self.blocks),
                n_samples=self.data.n_samples,
                class_counts=np.bincount(self.data.y, minlength=self.n_classes).astype(np.int64),
            )
        if msg.kind == "hyfem.fit":
            return self.fit(msg)
        raise ValueError(f"HyFEM client got unknown message kind {msg.kind!r}")

    # ------------------------------------------------------------------ state between messages
    def get_state(self) -> dict[str, np.ndarray]:
        """What must survive between two messages when the client object is rebuilt for each one
        (Flower starts a new ClientApp process per message): the mini-batch generator state
        ``(5056,)`` uint8. Model weights need not be kept: every ``hyfem.fit`` message carries them.
        """
        return {"trainer.gen": self.trainer.gen.get_state().numpy().copy()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned (a freshly built client continues exactly)."""
        if "trainer.gen" in state:
            self.trainer.gen.set_state(torch.from_numpy(np.ascontiguousarray(state["trainer.gen"], dtype=np.uint8)))

    def fit(self, msg: Message) -> Message:
        """ClientUpdate (HyFEM Alg. 2 lines 1-7)."""
        p = msg.payload
        for b in self.blocks:
            self.model.load_extractor_arrays(b, unpack_arrays(f"ext.{b}.", p))
        self.model.load_classifier_arrays(unpack_arrays("clf.", p))
        mu1, mu2 = float(p["mu1"]), float(p["mu2"])
        prox = []
        if mu1:
            ext = list(self.model.extractors.parameters())
            prox.append((ext, [t.detach().clone() for t in ext], mu1))
        if mu2:
            clf = list(self.model.classifier.parameters())
            prox.append((clf, [t.detach().clone() for t in clf], mu2))
        self.trainer.lr = float(p["lr"])
        loss = self.trainer.steps(int(p["local_steps"]), prox)
        out: dict = {"n_samples": self.data.n_samples, "loss": loss}
        for b in self.blocks:
            out.update(_model_arrays(f"ext.{b}.", self.model.extractor_arrays(b)))
        out.update(_model_arrays("clf.", self.model.classifier_arrays()))
        return msg.reply(**out)


class HyFEMServer:
    """Server-side steps of HyFEM.

    Args:
        block_shapes: block name -> shape, all ``d0`` blocks in global order (public schema).
        n_classes: ``C``.
        config: HyFEM settings.
        seed: seeds the server model's initialisation and the matching order.
        extractor_factory: plug-in extractors (must match the clients').
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
        self.model = HybridModel(self.block_names, block_shapes, n_classes, config.extractor_dim, config.hidden, self.factory)
        arr = self.model.classifier_arrays()
        self.classifier = ServerClassifier(arr["fc1.weight"], arr["fc1.bias"], arr["fc2.weight"], arr["fc2.bias"])
        self.rng = np.random.default_rng(seed)
        self.clients: dict[str, dict] = {}
        self.matching = config.matching.to_config()
        self.last_stats: dict = {}

    # ------------------------------------------------------------------ protocol
    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Ask every client for its blocks, sample count and class counts (once)."""
        replies = transport.send_and_receive([Message("hyfem.properties", SERVER, cid, 0) for cid in client_ids])
        for r in replies:
            blocks = [str(b) for b in r.payload["blocks"]]
            unknown = [b for b in blocks if b not in self.block_shapes]
            if unknown:
                raise ValueError(f"client {r.sender!r} reports unknown block {unknown[0]!r}")
            self.clients[r.sender] = {
                "blocks": blocks,
                "n_samples": int(r.payload["n_samples"]),
                "class_counts": np.asarray(r.payload["class_counts"]),
                "columns": block_columns(blocks, self.block_names, self.config.extractor_dim),
                # round 0: every client starts from the first `hidden` server neurons
                "assignment": np.arange(self.config.hidden, dtype=np.int64),
            }

    def fit_message(self, cid: str, rnd: int) -> Message:
        info = self.clients[cid]
        payload: dict = {
            "local_steps": self.config.local_steps,
            "lr": self.config.lr,
            "mu1": self.config.mu1,
            "mu2": self.config.mu2,
        }
        for b in info["blocks"]:
            payload.update(_model_arrays(f"ext.{b}.", self.model.extractor_arrays(b)))
        payload.update(_model_arrays("clf.", self.classifier.client_view(info["assignment"], info["columns"])))
        return Message("hyfem.fit", SERVER, cid, rnd, payload)

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """One round of HyFEM Alg. 1 (lines 3-9): every client is asked; the server aggregates
        the replies that arrive. A client that failed keeps its extractors' and classifier's
        server positions and takes part again in the next round."""
        ids = list(self.clients)
        replies = transport.send_and_receive([self.fit_message(cid, rnd) for cid in ids])
        answered = {r.sender for r in replies}
        absent = [cid for cid in ids if cid not in answered]
        if replies:
            self.aggregate_extractors(replies)
            self.match(replies, absent)
        n = sum(int(r.payload["n_samples"]) for r in replies)
        loss = sum(float(r.payload["loss"]) * int(r.payload["n_samples"]) for r in replies) / n if n else float("nan")
        return {"train_loss": loss, "server_width": float(self.classifier.width), "clients_answered": float(len(replies))}

    # ------------------------------------------------------------------ server updates
    def aggregate_extractors(self, replies: Sequence[Message]) -> None:
        """``theta_0,b = sum_m p_m theta_m,b / sum_m p_m`` over the clients holding block ``b``
        (HyFEM Alg. 1 line 7, closed form of (10)); a block no reply holds keeps its value."""
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
        neurons of ``absent`` clients are kept and their assignments remapped."""
        cc = []
        for r in replies:
            info = self.clients[r.sender]
            a = unpack_arrays("clf.", r.payload)
            cc.append(
                ClientClassifier(
                    W1=a["fc1.weight"].astype(np.float64), b1=a["fc1.bias"].astype(np.float64),
                    W2=a["fc2.weight"].astype(np.float64), b2=a["fc2.bias"].astype(np.float64),
                    columns=info["columns"], weight=float(r.payload["n_samples"]),
                    assignment=info["assignment"], class_counts=info["class_counts"],
                )
            )
        reserved = [self.clients[cid]["assignment"] for cid in absent]
        res = match_classifiers(cc, self.classifier, self.matching, self.rng, reserved=reserved)
        self.classifier = res.server
        for r, a in zip(replies, res.assignments):
            self.clients[r.sender]["assignment"] = a
        for cid in absent:
            self.clients[cid]["assignment"] = res.index[self.clients[cid]["assignment"]]
        self.model.load_classifier_arrays(
            {"fc1.weight": res.server.W1, "fc1.bias": res.server.b1, "fc2.weight": res.server.W2, "fc2.bias": res.server.b2}
        )
        self.last_stats = res.stats

    # ------------------------------------------------------------------ checkpoints
    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything the server carries from round to round: ``(arrays, json_meta)`` with the
        extractors of all blocks, the server classifier, each client's assignment and the
        matching order's random state."""
        arrays: dict[str, np.ndarray] = {}
        for b in self.block_names:
            arrays.update(pack_arrays(f"ext.{b}.", self.model.extractor_arrays(b)))
        for k in ("W1", "b1", "W2", "b2"):
            arrays[f"clf.{k}"] = getattr(self.classifier, k)
        meta = {
            "clients": {
                cid: {"blocks": i["blocks"], "n_samples": i["n_samples"], "class_counts": np.asarray(i["class_counts"]).tolist(), "assignment": i["assignment"].tolist()}
                for cid, i in self.clients.items()
            },
            "rng": self.rng.bit_generator.state,
        }
        return arrays, meta

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned (on a server built with the same config)."""
        for b in self.block_names:
            self.model.load_extractor_arrays(b, unpack_arrays(f"ext.{b}.", dict(arrays)))
        self.classifier = ServerClassifier(*(np.asarray(arrays[f"clf.{k}"]) for k in ("W1", "b1", "W2", "b2")))
        c = self.classifier
        self.model.load_classifier_arrays({"fc1.weight": c.W1, "fc1.bias": c.b1, "fc2.weight": c.W2, "fc2.bias": c.b2})
        self.clients = {
            cid: {
                "blocks": i["blocks"],
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
        """The model client ``cid`` receives: ``P_m Theta_0`` and ``Pi_m w_0`` (local inference)."""
        info = self.clients[cid]
        m = HybridModel(info["blocks"], self.block_shapes, self.n_classes, self.config.extractor_dim, self.config.hidden, self.factory)
        for b in info["blocks"]:
            m.load_extractor_arrays(b, self.model.extractor_arrays(b))
        m.load_classifier_arrays(self.classifier.client_view(info["assignment"], info["columns"]))
        return m

    def model_for_blocks(self, blocks: Sequence[str]) -> HybridModel:
        """A model for any subset of blocks cut from the server model (HyFEM Remark 2): the
        server extractors of those blocks and the server classifier restricted to their columns."""
        order = [b for b in self.block_names if b in set(blocks)]
        cols = block_columns(order, self.block_names, self.config.extractor_dim)
        m = HybridModel(order, self.block_shapes, self.n_classes, self.config.extractor_dim, self.classifier.width, self.factory)
        for b in order:
            m.load_extractor_arrays(b, self.model.extractor_arrays(b))
        m.load_classifier_arrays(self.classifier.client_view(np.arange(self.classifier.width), cols))
        return m
