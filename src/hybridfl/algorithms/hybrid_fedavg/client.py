"""Hybrid FedAvg client steps (:class:`HybridFedAvgClient`): local mini-batch SGD on the client's own
block of ``w`` over its own samples (HyFDCA Sec. 2 and 5, the baseline HyFDCA compares with).

A ``fedavg.fit`` message is checked before use (:meth:`HybridFedAvgClient.check_fit`) and refused
with a :class:`~hybridfl.runtime.validate.PayloadError` when malformed."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hybridfl.algorithms.convex.problem import features, signed_labels
from hybridfl.algorithms.hybrid_fedavg.kinds import FIT, HELLO
from hybridfl.data.dataset import HybridDataset
from hybridfl.runtime.failclosed import OrderedProtocol
from hybridfl.runtime.handlers import Handler, handler
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError, array, integer, number, only_keys

LOSSES = ("hinge", "logistic", "squared")
"""The loss names a ``fedavg.fit`` message may carry (any other name is the squared loss in
:func:`loss_gradient_scale`)."""


def loss_gradient_scale(z: np.ndarray, y: np.ndarray, loss: str) -> np.ndarray:
    """``dl/dz`` (a subgradient for hinge) at ``z`` for labels ``y`` in {-1, +1}, shape like ``z``."""
    if loss == "hinge":
        return np.where(y * z < 1, -y, 0.0)
    if loss == "logistic":
        return -y / (1.0 + np.exp(np.clip(y * z, -50, 50)))
    return z - y


class HybridFedAvgClient:
    """Client: local SGD on its own features and samples (between messages it keeps only its
    protocol state, :meth:`get_state`: round ``t`` samples its mini-batches from
    ``default_rng([seed, t])``).

    Args:
        client_id: name.
        data: its samples restricted to its blocks, with labels.
        positive: class indices labelled +1.
        seed: seeds its mini-batch sampling.
    """

    def __init__(self, client_id: str, data: HybridDataset, positive: Sequence[int], seed: int = 0):
        self.client_id = client_id
        # its own view of the protocol: fedavg.hello once in round 0, then one fedavg.fit a round (fail closed)
        self.protocol = OrderedProtocol(f"hybrid FedAvg client {client_id!r}", (HELLO,), (FIT,), {FIT: ()})
        self.blocks = list(data.block_names)
        self.X = features(data, sparse="dense")
        self.y = signed_labels(data.y, positive)
        self.seed = seed

    def handle(self, msg: Message) -> Message:
        """Answer ``fedavg.hello`` (its block names and sample count) or ``fedavg.fit``: from the
        server's ``w`` ``(d_k,)`` on its features, ``local_steps`` SGD steps with step size
        ``lr / sqrt(t)`` on ``(lambda/2)||w_k||^2 + (1/n_k) sum_i l(x_{k,i}^T w_k)``; replies its
        ``w`` ``(d_k,)``, ``n_samples`` and ``client_seconds``.

        Its protocol (:class:`~hybridfl.runtime.failclosed.OrderedProtocol`): ``fedavg.hello``
        once in round 0, then at most one ``fedavg.fit`` a round, round numbers never going back;
        any refusal stops it for the run (every later message refused with one sentence).

        Raises:
            ProtocolError: an unknown message kind, a message out of place, or any message
                after a refusal.
            PayloadError: a malformed ``fedavg.fit`` message (:meth:`check_fit`).
        """
        return self.protocol.answer(msg, lambda: self._answer(msg))

    def _answer(self, msg: Message) -> Message:
        """:meth:`handle` inside the fail-closed rule: the kind, its place in the protocol, the step."""
        step = handler(self.handlers(), msg, f"hybrid FedAvg client {self.client_id!r}", "unknown message kind")
        self.protocol.admit(msg)
        return step(msg)

    def failed_state(self) -> dict[str, Any]:
        """The state entries to keep after a refused message (the fail-closed stop; Flower's node
        saves them although the message failed: :func:`hybridfl.runtime.flower.node.client_step`)."""
        return self.protocol.get_state()

    def handlers(self) -> dict[str, Handler]:
        """Message kind (:mod:`.kinds`) -> the step that answers it."""
        return {HELLO: self.hello, FIT: self.fit}

    def hello(self, msg: Message) -> Message:
        """``fedavg.hello``: reply its ``blocks``, ``n_samples`` and ``client_seconds``."""
        t0 = time.perf_counter()
        return msg.reply(blocks=self.blocks, n_samples=int(self.y.size), client_seconds=time.perf_counter() - t0)

    def fit(self, msg: Message) -> Message:
        """``fedavg.fit``: the local SGD steps of :meth:`handle` from the server's ``w`` ``(d_k,)``;
        reply ``w`` ``(d_k,)``, ``n_samples`` and ``client_seconds``.

        Raises:
            PayloadError: a malformed message (:meth:`check_fit`).
        """
        t0 = time.perf_counter()
        p = msg.payload
        self.check_fit(msg)
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

    def check_fit(self, msg: Message) -> None:
        """Check a ``fedavg.fit`` message: only the keys ``w``, ``lr``, ``lam``, ``loss``,
        ``local_steps``, ``batch_size``; ``w`` a finite float array of the client's ``(d_k,)``;
        ``lr`` finite > 0, ``lam`` finite >= 0, ``loss`` a known loss name, ``local_steps`` and
        ``batch_size`` integers >= 1; the round >= 1 (the step size is ``lr / sqrt(round)``).

        Raises:
            PayloadError: the first problem found (names the sender, the kind and the field).
        """
        only_keys(msg, ("w", "lr", "lam", "loss", "local_steps", "batch_size"))
        array(msg, "w", (int(self.X.shape[1]),), kinds="f")
        if number(msg, "lr") <= 0:
            raise PayloadError(msg, "lr", "not positive")
        number(msg, "lam", low=0.0)
        if msg.payload.get("loss") not in LOSSES:
            raise PayloadError(msg, "loss", f"not one of {', '.join(LOSSES)}")
        integer(msg, "local_steps", low=1)
        integer(msg, "batch_size", low=1)
        if msg.round < 1:
            raise PayloadError(msg, "round", f"= {msg.round}, not a training round")

    def get_state(self) -> dict[str, Any]:
        """Only its protocol state (``protocol``: the order and the fail-closed stop); nothing of
        the model is kept between messages."""
        return self.protocol.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state` (``{}`` restores nothing)."""
        self.protocol.set_state(state)
