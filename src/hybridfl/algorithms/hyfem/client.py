"""HyFEM's client-side steps (HyFEM paper, Alg. 2 "ClientUpdate").

A client answers two kinds of message from the server:

- ``hyfem.properties`` (once, before round 1): its block names, sample count and class counts
  ``(C,)``; no feature value or label leaves the client;
- ``hyfem.fit`` (every round ``t``): it loads the extractors of its blocks ``P_m Theta_0^t`` and its
  matched classifier ``Pi_m^t w_0^t`` from the message, takes ``Q`` local SGD steps (HyFEM-Prox:
  with proximal terms ``mu1``, ``mu2``) and replies with ``Theta_m^{t,Q}``, ``w_m^{t,Q}``, its sample
  count and its mean mini-batch loss.

Payload names: ``ext.<block>.<parameter>`` for an extractor, ``clf.fc1.weight`` ``(h, e*d_m)``,
``clf.fc1.bias`` ``(h,)``, ``clf.fc2.weight`` ``(C, h)``, ``clf.fc2.bias`` ``(C,)`` for the
classifier; all float32.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from hybridfl.algorithms.hyfem.config import HyFEMConfig
from hybridfl.algorithms.training import LocalTrainer
from hybridfl.data.dataset import HybridDataset
from hybridfl.errors import ProtocolError
from hybridfl.models.hybrid import ExtractorFactory, HybridModel, default_extractor
from hybridfl.runtime.messages import Message, pack_arrays, unpack_arrays


def model_payload(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: a}`` -> ``{prefix + name: float32 a}``: model weights as message payload entries
    (the wire format of every HyFEM model array, both directions)."""
    return pack_arrays(prefix, {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})


class HyFEMClient:
    """Client-side steps of HyFEM for one client.

    Args:
        client_id: the client's name.
        data: its samples restricted to its blocks, with labels (``y`` of shape ``(n_m,)``).
        block_shapes: per-sample shapes of all blocks (public schema).
        n_classes: the number of classes ``C``.
        config: HyFEM settings (extractor and classifier sizes, batch size, momentum).
        seed: seeds its mini-batch sampling (:func:`hybridfl.algorithms.spec.client_seed`).
        extractor_factory: plug-in extractors (default :func:`default_extractor` of
            ``config.extractor``); must be the server's.
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
            self.blocks,
            block_shapes,
            n_classes,
            config.extractor_dim,
            config.hidden,
            extractor_factory or default_extractor(config.extractor),
        )
        self.trainer = LocalTrainer(self.model, data, config.batch_size, config.lr, config.momentum, seed)

    def handle(self, msg: Message) -> Message:
        """Answer one message from the server (``hyfem.properties`` or ``hyfem.fit``).

        Raises:
            ProtocolError: any other message kind.
        """
        if msg.kind == "hyfem.properties":
            return msg.reply(
                blocks=list(self.blocks),
                n_samples=self.data.n_samples,
                class_counts=np.bincount(self.data.y, minlength=self.n_classes).astype(np.int64),
            )
        if msg.kind == "hyfem.fit":
            return self.fit(msg)
        raise ProtocolError(f"HyFEM client {self.client_id!r} got a message of unknown kind {msg.kind!r}.")

    # ------------------------------------------------------------------ state between messages
    def get_state(self) -> dict[str, np.ndarray]:
        """What must survive between two messages when the client object is rebuilt for each one
        (Flower starts a new ClientApp process per message): the mini-batch generator state
        ``(5056,)`` uint8. Model weights need not be kept: every ``hyfem.fit`` message carries them.
        """
        return {"trainer.gen": self.trainer.gen.get_state().numpy().copy()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned (a freshly built client continues exactly); an
        empty ``state`` (a client's first message) keeps the freshly seeded generator."""
        if "trainer.gen" in state:
            self.trainer.gen.set_state(torch.from_numpy(np.ascontiguousarray(state["trainer.gen"], dtype=np.uint8)))

    def fit(self, msg: Message) -> Message:
        """ClientUpdate (HyFEM Alg. 2 lines 1-7): load ``P_m Theta_0^t`` and ``Pi_m^t w_0^t`` from
        ``msg``, take ``Q = local_steps`` SGD steps with step size ``lr`` (plus the proximal terms
        ``mu1/2 ||Theta - Theta_0||^2`` and ``mu2/2 ||w - w_0||^2`` of HyFEM-Prox) and reply with
        the trained extractors and classifier, ``n_samples`` and the mean mini-batch ``loss``.

        Raises:
            ProtocolError: the message lacks the extractor of one of the client's blocks or the
                classifier.
        """
        p = msg.payload
        for b in self.blocks:
            ext = unpack_arrays(f"ext.{b}.", p)
            if not ext:
                raise ProtocolError(f"HyFEM fit message to {self.client_id!r} carries no extractor for block {b!r}.")
            self.model.load_extractor_arrays(b, ext)
        clf = unpack_arrays("clf.", p)
        if not clf:
            raise ProtocolError(f"HyFEM fit message to {self.client_id!r} carries no classifier.")
        self.model.load_classifier_arrays(clf)
        mu1, mu2 = float(p["mu1"]), float(p["mu2"])
        prox = []
        if mu1:
            ext_params = list(self.model.extractors.parameters())
            prox.append((ext_params, [t.detach().clone() for t in ext_params], mu1))
        if mu2:
            clf_params = list(self.model.classifier.parameters())
            prox.append((clf_params, [t.detach().clone() for t in clf_params], mu2))
        self.trainer.lr = float(p["lr"])
        loss = self.trainer.steps(int(p["local_steps"]), prox)
        out: dict = {"n_samples": self.data.n_samples, "loss": loss}
        for b in self.blocks:
            out.update(model_payload(f"ext.{b}.", self.model.extractor_arrays(b)))
        out.update(model_payload("clf.", self.model.classifier_arrays()))
        return msg.reply(**out)
