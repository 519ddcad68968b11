"""Hybrid FedAvg, the baseline HyFDCA compares with (HyFDCA Sec. 2 and 5; SPEC.md "HyFDCA").

Each client runs local mini-batch SGD on its own block of ``w`` over its own samples, i.e. on
``(lambda/2)||w_k||^2 + (1/n_k) sum_{i in I_k} l_i(x_{k,i}^T w_k)`` (it sees only its features);
the server averages each feature's weight over the participating clients holding that feature,
weighted by their sample counts ("concatenating the model weights and averaging at the
overlaps"). Step size ``eta_t = lr / sqrt(t)`` in round ``t`` (the paper tunes ``a, b`` of a decaying
rate; our benchmark tunes ``lr`` on a grid).

Messages per round (one exchange): ``fedavg.fit`` server -> client ``w`` on its features, ``lr``,
steps; client -> server its local ``w_k`` and sample count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.problem import (
    block_offsets,
    feature_index,
    features,
    signed_labels,
)
from hybridfl.algorithms.participation import select_participants
from hybridfl.data.dataset import HybridDataset
from hybridfl.runtime.messages import Message
from hybridfl.runtime.transport import Transport

SERVER = "server"


class HybridFedAvgConfig(BaseModel):
    """Hybrid FedAvg settings (``algorithm:`` section with ``name: hybrid_fedavg``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Literal["hybrid_fedavg"] = "hybrid_fedavg"
    loss: Literal["hinge", "logistic", "squared"] = "hinge"
    lam: float = Field(1e-4, gt=0, validation_alias=AliasChoices("lam", "lambda"))
    rounds: int = Field(100, ge=1)
    local_steps: int = Field(50, ge=1, description="local SGD steps per round")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.05, gt=0, description="eta_t = lr / sqrt(t)")
    participation: float = Field(1.0, gt=0, le=1)
    participation_mode: Literal["fraction", "probability", "cyclic"] = "fraction"
    cyclic_groups: int = Field(2, ge=2)
    failure_rate: float = Field(0.0, ge=0, lt=1, description="probability that a selected client fails mid-round (its reply never arrives; the server averages the replies that did)")
    positive_classes: list[int] | None = None
    latency: float = Field(0.2575, ge=0)
    eval_every: int = Field(1, ge=0)
    reference: bool = True
    reference_sdca_epochs: int = Field(200, ge=1)


def loss_gradient_scale(z: np.ndarray, y: np.ndarray, loss: str) -> np.ndarray:
    """``dl/dz`` (a subgradient for hinge) at ``z``, shape like ``z``."""
    if loss == "hinge":
        return np.where(y * z < 1, -y, 0.0)
    if loss == "logistic":
        return -y / (1.0 + np.exp(np.clip(y * z, -50, 50)))
    return z - y


class HybridFedAvgClient:
    """Client: local SGD on its own features and samples (state: nothing but its data)."""

    def __init__(self, client_id: str, data: HybridDataset, positive: Sequence[int], seed: int = 0):
        self.client_id = client_id
        self.blocks = list(data.block_names)
        self.X = features(data, sparse="dense")
        self.y = signed_labels(data.y, positive)
        self.seed = seed

    def handle(self, msg: Message) -> Message:
        t0 = time.perf_counter()
        p = msg.payload
        if msg.kind == "fedavg.hello":
            return msg.reply(blocks=self.blocks, n_samples=int(self.y.size), client_seconds=time.perf_counter() - t0)
        if msg.kind != "fedavg.fit":
            raise ValueError(f"hybrid FedAvg client got unknown message kind {msg.kind!r}")
        w = np.asarray(p["w"], dtype=np.float64).copy()
        lam, loss = float(p["lam"]), str(p["loss"])
        eta = float(p["lr"]) / math.sqrt(msg.round)
        rng = np.random.default_rng([self.seed, msg.round])
        n = self.y.size
        B = min(int(p["batch_size"]), n)
        for _ in range(int(p["local_steps"])):
            idx = rng.choice(n, size=B, replace=False)
            Xb = self.X[idx]
            g = loss_gradient_scale(Xb @ w, self.y[idx], loss)
            w -= eta * (Xb.T @ g / B + lam * w)
        return msg.reply(w=w, n_samples=int(n), client_seconds=time.perf_counter() - t0)


class HybridFedAvgServer:
    """Server: per-feature sample-weighted average over the participating holders."""

    def __init__(self, block_shapes: Mapping[str, tuple[int, ...]], config: HybridFedAvgConfig, seed: int = 0):
        self.config = config
        self.offsets = block_offsets(block_shapes)
        self.d = sum(b - a for a, b in self.offsets.values())
        self.w = np.zeros(self.d)
        self.feat: dict[str, np.ndarray] = {}
        self.client_ids: list[str] = []
        self.rng = np.random.default_rng([seed, 7])

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        self.client_ids = list(client_ids)
        for r in transport.send_and_receive([Message("fedavg.hello", SERVER, c, 0) for c in self.client_ids]):
            self.feat[r.sender] = feature_index([str(b) for b in r.payload["blocks"]], self.offsets)

    def select(self, rnd: int) -> list[str]:
        cfg = self.config
        return select_participants(rnd, self.client_ids, cfg.participation, cfg.participation_mode, cfg.cyclic_groups, self.rng)

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        cfg = self.config
        K = self.select(rnd)
        msgs = [Message("fedavg.fit", SERVER, c, rnd, {"w": self.w[self.feat[c]], "lr": cfg.lr, "lam": cfg.lam, "loss": cfg.loss,
                                                        "local_steps": cfg.local_steps, "batch_size": cfg.batch_size}) for c in K]
        t0 = time.perf_counter()
        replies = transport.send_and_receive(msgs)
        acc = np.zeros(self.d)
        wsum = np.zeros(self.d)
        cmax = 0.0
        csum = 0.0
        for r in replies:
            n = float(r.payload["n_samples"])
            acc[self.feat[r.sender]] += n * np.asarray(r.payload["w"])
            wsum[self.feat[r.sender]] += n
            cs = float(r.payload.get("client_seconds", 0.0))
            cmax, csum = max(cmax, cs), csum + cs
        held = wsum > 0
        self.w[held] = acc[held] / wsum[held]
        server_s = max(0.0, time.perf_counter() - t0 - csum)
        return {"participants": len(K), "failed": len(K) - len(replies), "exchanges": 1, "latency_seconds": cfg.latency, "encryption_seconds": 0.0,
                "model_seconds": server_s + cmax + cfg.latency, "model_seconds_no_encryption": server_s + cmax + cfg.latency}
