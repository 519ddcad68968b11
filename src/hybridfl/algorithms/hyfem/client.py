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

A ``hyfem.fit`` message is checked before use (:meth:`HyFEMClient.check_fit`): exactly the model
arrays of the client's blocks and classifier, of exactly its model's shapes, float and finite, and
sane ``local_steps``, ``lr``, ``mu1``, ``mu2``; otherwise the client refuses it with a
:class:`~hybridfl.runtime.validate.PayloadError`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from hybridfl.algorithms.hyfem.batched import fit_digest
from hybridfl.algorithms.hyfem.config import HyFEMConfig
from hybridfl.algorithms.hyfem.kinds import FIT, KEYS, PROPERTIES, UNMASK
from hybridfl.algorithms.hyfem.secure import SECURE_FIT_KEYS, SecureExtractorsClientMixin
from hybridfl.algorithms.training import LocalTrainer
from hybridfl.data.dataset import HybridDataset
from hybridfl.models.device import resolve_device
from hybridfl.models.hybrid import ExtractorFactory, HybridModel, default_extractor
from hybridfl.privacy.roster import PeerAuth
from hybridfl.runtime.failclosed import OrderedProtocol
from hybridfl.runtime.handlers import Handler, dispatch
from hybridfl.runtime.messages import Message, pack_arrays, unpack_arrays
from hybridfl.runtime.validate import PayloadError, array, integer, number, only_keys


def model_payload(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: a}`` -> ``{prefix + name: float32 a}``: model weights as message payload entries
    (the wire format of every HyFEM model array, both directions)."""
    return pack_arrays(prefix, {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})


class HyFEMClient(SecureExtractorsClientMixin):
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

    Its model and data tensors live on ``config.device``; messages carry NumPy arrays.
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
        peer_auth: PeerAuth | None = None,
    ):
        self.client_id = client_id
        self.peer_auth = peer_auth
        # its own view of the protocol (fail closed: a refusal stops it for the run): properties, then
        # keys (secure aggregation only), once each in round 0; each round a fit, then at most one unmask
        self.protocol = OrderedProtocol(f"HyFEM client {client_id!r}", (PROPERTIES, KEYS), (FIT,), {FIT: (UNMASK,)})
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
        ).to(resolve_device(config.device))  # initialised on the CPU: the same weights on any device
        self.trainer = LocalTrainer(self.model, data, config.batch_size, config.lr, config.momentum, seed)
        self._prefit: tuple[bytes, float] | None = None  # set by :func:`.batched.prefit` (simulation only)
        self.require_secagg = bool(config.secure_aggregation)  # its own policy: no unmasked round
        self.secagg_threshold = int(config.secagg_threshold)
        self._secure_init()  # secure aggregation of its extractors (:mod:`.secure`)

    def handle(self, msg: Message) -> Message:
        """Answer one message from the server with the step its kind names (:mod:`.kinds`:
        ``hyfem.properties``, ``hyfem.fit``, ``hyfem.keys``, ``hyfem.unmask``).

        Any refusal stops the client for the run (fail closed,
        :class:`~hybridfl.runtime.failclosed.FailClosed`): every later message is refused with one
        sentence naming the first.

        Raises:
            ProtocolError: any other message kind (one sentence naming it), any message after a
                refusal, or what the step raises.
        """

        def step() -> Message:
            table = self.handlers()
            if msg.kind in table:  # an unknown kind is refused by name (dispatch)
                self.protocol.admit(msg)  # in its place in the protocol, before anything is read
            return dispatch(table, msg, f"HyFEM client {self.client_id!r}")

        return self.protocol.answer(msg, step)

    def failed_state(self) -> dict[str, np.ndarray]:
        """The state entries to keep after a refused message (the fail-closed stop; Flower's node
        saves them although the message failed: :func:`hybridfl.runtime.flower.node.client_step`)."""
        return self.protocol.array_state()

    def handlers(self) -> dict[str, Handler]:
        """Message kind (:mod:`.kinds`) -> the step that answers it."""
        return {PROPERTIES: self.properties, FIT: self.fit, KEYS: self.secure_keys, UNMASK: self.unmask}

    def properties(self, msg: Message) -> Message:
        """``hyfem.properties``: reply its ``blocks``, ``n_samples``, ``class_counts`` ``(C,)``
        int64, ``secagg_public`` (its secure-aggregation public key) and, with a roster,
        ``secagg_sig`` (:meth:`~hybridfl.algorithms.hyfem.secure.SecureExtractorsClientMixin.secure_hello_entries`);
        no feature value or label.

        Raises:
            PayloadError: a key other than ``run``; with a roster and secure aggregation, no 32-byte ``run``.
        """
        only_keys(msg, ("run",))
        return msg.reply(
            blocks=list(self.blocks),
            n_samples=self.data.n_samples,
            class_counts=np.bincount(self.data.y, minlength=self.n_classes).astype(np.int64),
            **self.secure_hello_entries(msg),
        )

    # ------------------------------------------------------------------ state between messages
    def get_state(self) -> dict[str, np.ndarray]:
        """What must survive between two messages when the client object is rebuilt for each one
        (Flower starts a new ClientApp process per message): the mini-batch generator state
        ``(5056,)`` uint8, the secure-aggregation state and the fail-closed stop (``protocol``).
        Model weights need not be kept: every ``hyfem.fit`` message carries them.
        """
        gen = self.trainer.gen.get_state().numpy().copy()
        return {"trainer.gen": gen, **self.secagg.get_state(), "sa_run": self.sa_run, **self.protocol.array_state()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned (a freshly built client continues exactly); an
        empty ``state`` (a client's first message) keeps the freshly seeded generator."""
        if "trainer.gen" in state:
            self.trainer.gen.set_state(torch.from_numpy(np.ascontiguousarray(state["trainer.gen"], dtype=np.uint8)))
        self.secagg.set_state(state)
        if "sa_run" in state:
            self.sa_run = bytes(state["sa_run"])
        self.protocol.set_array_state(state)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Payload key -> shape of every model array a ``hyfem.fit`` message must carry: the
        extractors of the client's blocks (``ext.<block>.<parameter>``) and its classifier
        (``clf.<parameter>``, ``hidden`` neurons), as its own model has them."""
        out: dict[str, tuple[int, ...]] = {}
        for b in self.blocks:
            out.update({k: v.shape for k, v in model_payload(f"ext.{b}.", self.model.extractor_arrays(b)).items()})
        out.update({k: v.shape for k, v in model_payload("clf.", self.model.classifier_arrays()).items()})
        return out

    def check_fit(self, msg: Message) -> None:
        """Check a ``hyfem.fit`` message before using it: exactly the keys ``local_steps``, ``lr``,
        ``mu1``, ``mu2`` and :meth:`expected_shapes`; every model array float, of exactly that shape
        and finite; ``local_steps`` an integer >= 1, ``lr`` finite > 0, ``mu1`` and ``mu2`` finite
        >= 0. A client configured with secure aggregation (or given a peer table, ``hyfem.keys``)
        refuses a ``hyfem.fit`` without its ``tag`` and ``peers`` (its own policy, never the server's), and
        the exchange must have at least ``secagg_threshold`` clients of its roster
        (:meth:`~hybridfl.algorithms.hyfem.secure.SecureExtractorsClientMixin.check_secure_fit`).

        Raises:
            PayloadError: the first problem found (names the sender, the kind and the field).
        """
        shapes = self.expected_shapes()
        secure = "tag" in msg.payload
        if not secure and (self.require_secagg or self.secagg.peers):
            raise PayloadError(
                msg,
                "tag",
                f"missing: client {self.client_id!r} runs with secure aggregation and never sends its extractors "
                f"in the clear",
            )
        only_keys(msg, ("local_steps", "lr", "mu1", "mu2", *shapes, *(SECURE_FIT_KEYS if secure else ())))
        if secure:
            self.check_secure_fit(msg)
        for k, shape in shapes.items():
            array(msg, k, shape, kinds="f")
        integer(msg, "local_steps", low=1)
        if number(msg, "lr") <= 0:
            raise PayloadError(msg, "lr", "not positive")
        number(msg, "mu1", low=0.0)
        number(msg, "mu2", low=0.0)

    def fit(self, msg: Message) -> Message:
        """ClientUpdate (HyFEM Alg. 2 lines 1-7): load ``P_m Theta_0^t`` and ``Pi_m^t w_0^t`` from
        ``msg``, take ``Q = local_steps`` SGD steps with step size ``lr`` (plus the proximal terms
        ``mu1/2 ||Theta - Theta_0||^2`` and ``mu2/2 ||w - w_0||^2`` of HyFEM-Prox) and reply with
        the trained extractors and classifier, ``n_samples`` and the mean mini-batch ``loss``.
        If :func:`~hybridfl.algorithms.hyfem.batched.prefit` already trained this client on this
        very message (``batched_clients``, simulation only), that model and loss are the reply.

        Raises:
            PayloadError: a malformed message (:meth:`check_fit`); nothing is loaded.
        """
        p = msg.payload
        self.check_fit(msg)
        pre, self._prefit = self._prefit, None
        if pre is not None and pre[0] == fit_digest(msg):  # trained in a batch on this very message
            loss = pre[1]
        else:
            for b in self.blocks:
                self.model.load_extractor_arrays(b, unpack_arrays(f"ext.{b}.", p))
            self.model.load_classifier_arrays(unpack_arrays("clf.", p))
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
        if "tag" in p:  # secure aggregation: only the masked, weighted extractors
            out["ext_masked"] = self.masked_extractors(msg)
            if self.secagg.last_shares:  # its self-mask's shares, one per peer (double masking)
                out["self_shares"] = self.secagg.last_shares
        else:
            for b in self.blocks:
                out.update(model_payload(f"ext.{b}.", self.model.extractor_arrays(b)))
        out.update(model_payload("clf.", self.model.classifier_arrays()))
        return msg.reply(**out)
