"""Hybrid FedAvg server steps (:class:`HybridFedAvgServer`): per-feature sample-weighted averaging of
the participating holders' local weights ("concatenating the model weights and averaging at the
overlaps", HyFDCA Sec. 2). A reply with a non-finite weight (training diverged) stops the run with
:class:`~hybridfl.errors.TrainingDiverged` before any reply of the round is averaged.

Every reply is checked before use (:mod:`hybridfl.runtime.validate`): a malformed ``fedavg.hello``
(repeated or unknown blocks, ``n_samples`` < 1) stops the setup; a ``fedavg.fit`` reply whose ``w``
is not a float array of the client's ``(d_k,)``, whose ``n_samples`` differs from its hello, or with
an unexpected key is logged and treated as missing (as a failure)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from hybridfl.algorithms.convex.problem import block_offsets, feature_index
from hybridfl.algorithms.hybrid_fedavg.config import HybridFedAvgConfig
from hybridfl.algorithms.hybrid_fedavg.kinds import FIT, HELLO
from hybridfl.algorithms.participation import select_participants
from hybridfl.errors import ProtocolError, TrainingDiverged, UnknownBlockError
from hybridfl.runtime.exchange import answers
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import Transport
from hybridfl.runtime.validate import PayloadError, array, integer, number, only_keys, strings

log = logging.getLogger(__name__)


class HybridFedAvgServer:
    """Server: per-feature sample-weighted average over the participating holders.

    Args:
        block_shapes: block name -> shape, all blocks in global order (public schema).
        config: settings.
        seed: seeds client sampling for partial participation (``default_rng([seed, 7])``).

    State (:meth:`get_state`): the model ``w`` ``(d,)`` and the sampling RNG.
    """

    def __init__(self, block_shapes: Mapping[str, tuple[int, ...]], config: HybridFedAvgConfig, seed: int = 0):
        self.config = config
        self.offsets = block_offsets(block_shapes)
        self.d = sum(b - a for a, b in self.offsets.values())
        self.w = np.zeros(self.d)
        self.feat: dict[str, np.ndarray] = {}
        self.n_samples: dict[str, int] = {}
        self.client_ids: list[str] = []
        self.rng = np.random.default_rng([seed, 7])

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Learn each client's blocks (``fedavg.hello``).

        Raises:
            UnknownBlockError: a client holds a block that is not in the schema.
            ProtocolError: a client did not answer (a stray reply is not an answer:
                :func:`~hybridfl.runtime.exchange.answers`).
            PayloadError: a malformed reply (repeated block names, ``n_samples`` not an integer >= 1).
        """
        self.client_ids = list(client_ids)
        hello = [Message(HELLO, SERVER, c, 0) for c in self.client_ids]
        for r in answers(hello, transport.send_and_receive(hello), "hybrid FedAvg setup"):
            only_keys(r, ("blocks", "n_samples", "client_seconds"))
            blocks = strings(r, "blocks")
            unknown = [b for b in blocks if b not in self.offsets]
            if unknown:
                raise UnknownBlockError(r.sender, unknown[0])
            self.n_samples[r.sender] = integer(r, "n_samples", low=1)
            self.feat[r.sender] = feature_index(blocks, self.offsets)
        missing = [c for c in self.client_ids if c not in self.feat]
        if missing:
            raise ProtocolError(f"client {missing[0]!r} did not answer 'fedavg.hello': the setup needs every client.")

    def select(self, rnd: int) -> list[str]:
        """The clients of round ``rnd`` (HyFDCA Assumption 5 or 7), drawn from the server's RNG."""
        cfg = self.config
        return select_participants(
            rnd, self.client_ids, cfg.participation, cfg.participation_mode, cfg.cyclic_groups, self.rng
        )

    def check_fit_reply(self, r: Message) -> None:
        """Check a ``fedavg.fit`` reply: only ``w``, ``n_samples`` and ``client_seconds``; ``w`` a
        float array of the client's ``(d_k,)`` (finiteness is checked as divergence), ``n_samples``
        as in its hello, ``client_seconds`` (if any) a finite number >= 0.

        Raises:
            PayloadError: the first problem found (names the client and the field).
        """
        only_keys(r, ("w", "n_samples", "client_seconds"))
        array(r, "w", (int(self.feat[r.sender].size),), kinds="f", finite=False)
        n = self.n_samples.get(r.sender)
        integer(r, "n_samples", low=n if n is not None else 1, high=n)
        if "client_seconds" in r.payload:
            number(r, "client_seconds", low=0.0)

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """One round (one ``fedavg.fit`` exchange): send each selected client ``w`` on its features,
        average the replies per feature weighted by sample counts (a feature no reply covers keeps
        its value). Returns ``participants``, ``failed``, ``exchanges`` and the modelled seconds
        (slowest client + server + ``latency``). A malformed reply (:meth:`check_fit_reply`) is
        logged and treated as missing (counted in ``failed``).

        Raises:
            TrainingDiverged: a reply's ``w`` holds NaN or infinity (nothing of the round is used).
        """
        cfg = self.config
        K = self.select(rnd)
        msgs = [
            Message(
                FIT,
                SERVER,
                c,
                rnd,
                {
                    "w": self.w[self.feat[c]],
                    "lr": cfg.lr,
                    "lam": cfg.lam,
                    "loss": cfg.loss,
                    "local_steps": cfg.local_steps,
                    "batch_size": cfg.batch_size,
                },
            )
            for c in K
        ]
        t0 = time.perf_counter()
        replies = []
        for r in answers(msgs, transport.send_and_receive(msgs), f"hybrid FedAvg round {rnd}"):
            try:
                self.check_fit_reply(r)
            except PayloadError as e:
                log.warning("hybrid FedAvg round %d: %s The reply is treated as missing.", rnd, e)
                continue
            replies.append(r)
        for r in replies:
            if not np.isfinite(np.asarray(r.payload["w"], dtype=np.float64)).all():
                raise TrainingDiverged(
                    f"training diverged in round {rnd}: client {r.sender!r} sent non-finite model weights; "
                    f"lower algorithm.lr (now {cfg.lr:g})."
                )
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
        return {
            "participants": len(K),
            "failed": len(K) - len(replies),
            "exchanges": 1,
            "latency_seconds": cfg.latency,
            "encryption_seconds": 0.0,
            "model_seconds": server_s + cmax + cfg.latency,
            "model_seconds_no_encryption": server_s + cmax + cfg.latency,
        }

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """``({"w": w}, {"rng": sampling RNG state})`` for checkpoints."""
        return {"w": self.w.copy()}, {"rng": self.rng.bit_generator.state}

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned (after :meth:`setup`)."""
        self.w = np.asarray(arrays["w"], dtype=np.float64).copy()
        self.rng.bit_generator.state = meta["rng"]
