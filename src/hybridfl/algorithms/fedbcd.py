"""Vertical FL: FedSGD, FedBCD-p, FedBCD-s and FedPBCD-p (FedBCD paper, Algorithms 1-3, eq. (15);
SPEC.md "FedBCD").

``K`` parties (2..8) hold different feature blocks of the same samples, aligned by sample ID;
one of them, the *label party*, also holds the labels. Party ``k`` has a bottom model producing
``H_k`` per sample (linear ``x_k theta_k`` or a neural tower, :mod:`hybridfl.models.towers`);
the label party combines all ``H_k`` with its top model into a logit and computes the logistic
loss. The *coordinator* (the ``server`` of the message runtime) holds no data: it aligns the
parties' sample IDs, draws the mini-batch IDs, relays ``H_k`` to the label party and the
gradients ``dL/dH_k`` back, and sends the step size ``eta_t = eta_0 / sqrt(t + 1)`` (paper Sec. 8;
``t`` = 0-based communication round).

Written once as party-side and coordinator-side steps exchanging :class:`Message` objects; every
byte is counted by the transport. Messages (``B`` = batch size, ``r_k`` = width of ``H_k``):

- setup: ``fedbcd.properties`` (each party: its sample IDs, blocks, ``r_k``, whether it has labels)
  and ``fedbcd.align`` (the coordinator's aligned ID order: the intersection of all parties' IDs);
- ``fedbcd.forward`` (passive party): batch positions ``(B,)`` -> ``h`` ``(B, r_k)``, only before
  the first round: later ``H_k`` of the next batch travel with the reply to ``fedbcd.party_step``;
- ``fedbcd.label`` (label party): batch positions, the ``H_k`` of the passive parties that changed,
  which gradients to return and how many local steps to take -> ``grad.<party>`` ``(B, r_k)``
  (``dL/dH_k`` at the current point, computed *before* the label party's local steps) and the loss;
- ``fedbcd.party_step`` (passive party): ``grad`` ``(B, r_k)``, ``Q``, ``eta_t``, ``mu``, the next
  batch -> ``h_next`` ``(B, r_k)`` on the next batch (and, for FedBCD-s, ``h`` on the current
  batch after its update).

No raw feature value and no label appears in any message (checked on the message log by
``tests/test_fedbcd.py``). Note that ``dL/dH_k`` itself is label-dependent (for the logistic loss
its sign is the label's): that is the information FedSGD/FedBCD exchange by design (paper Sec. 6).

Local steps (paper eq. (7), (10), (15)): during its ``Q`` local steps a party recomputes its own
``H_k`` from its own data and keeps everything from the other parties at the value of the last
exchange. The label party recomputes the loss exactly with the stale ``H_{-K}``; a passive party
has neither labels nor ``H_{-k}``, so it reuses the stale ``dL/dH_k`` it received (as the public
reference code ``yankang18/FedBCD`` does: ``vlr_demo/async_lr.py`` reuses ``d``; ``vfl.py``
backpropagates the received gradient through the recomputed tower). The local gradient of party
``k`` is ``g_k + lambda theta_k + mu (theta_k - theta_k^{r0})`` (L2 weight ``lambda``; the
proximal term of FedPBCD-p, eq. (15), with ``theta_k^{r0}`` the parameters at the exchange).

Variants (one communication round = one exchange on one mini-batch):

- ``sgd``  FedSGD (Alg. 1): one local step per exchange, all parties in parallel;
- ``p``    FedBCD-p (Alg. 2): ``Q`` local steps per exchange, all parties in parallel;
- ``prox`` FedPBCD-p: FedBCD-p with the proximal term ``mu`` (eq. (15));
- ``s``    FedBCD-s (Alg. 3): the passive parties in turn, then the label party, each doing ``Q``
  local steps right after an exchange with the label party (``Exchange({k, K})``), so each sees
  the updates of the parties before it in the same round.

With ``Q = 1`` FedBCD-p is exactly FedSGD, and FedSGD is exactly mini-batch SGD on the joint
model (tested against a centrally trained copy in ``tests/test_fedbcd.py``).

A missing party (``failure_rate`` > 0 in the simulation: a party receives the round's messages and
does its work, but its replies never arrive). Vertical FL cannot form the joint prediction, the
loss or any ``dL/dH_k`` without every party's ``H_k``, so a round in which any reply is missing --
the label party's or a passive party's -- cannot be completed, and ``on_missing_party`` decides:

- ``skip`` (default): the round makes no update for anybody. The coordinator stops the round at
  the first missing reply, keeps its own batch, ``H_k`` and batch sampler state from before the
  round, and sends
  ``fedbcd.undo`` to every party that received a message in the round; each party restores the
  snapshot of its state (parameters, current batch, stored ``H_j``) it took at its first message
  of the round. A party whose ``fedbcd.undo`` reply is lost too gets ``undo`` again in its next
  message (restoring the same snapshot twice is harmless). The round still counts towards
  ``rounds`` and the step-size schedule; its metrics row has ``skipped = 1`` and ``missing`` (the
  parties without a reply, space-separated), no ``train_loss``; a warning is logged; the run's
  summary counts ``skipped_rounds``. The next round works on the mini-batch the skipped one would
  have used. So the models after a run with skipped rounds are those of a run in which nobody
  received any message in those rounds (``tests/test_fedbcd_reliability.py``).
- ``error``: the run stops with :class:`PartyMissingError`, one sentence naming the round and the
  missing party (or parties).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from hybridfl.errors import HybridFLError
from hybridfl.runtime.messages import Message
from hybridfl.runtime.transport import Transport

SERVER = "server"
MIN_PARTIES, MAX_PARTIES = 2, 8
log = logging.getLogger(__name__)


class PartyMissingError(HybridFLError):
    """A party sent no reply in a round and ``on_missing_party`` is ``error``."""


class FedBCDConfig(BaseModel):
    """FedBCD hyperparameters (``algorithm:`` section of a run config with ``name: fedbcd``).

    ``variant``: ``sgd`` (FedSGD, ``local_steps`` must be 1), ``p`` (FedBCD-p), ``s``
    (FedBCD-s), ``prox`` (FedPBCD-p, ``mu`` > 0, default 0.1 as in paper Fig. 4b).
    ``local_steps`` defaults to 1 for ``sgd`` and 5 otherwise. ``failure_rate`` and
    ``on_missing_party``: see the module docstring ("A missing party").
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["fedbcd"] = "fedbcd"
    variant: Literal["sgd", "p", "s", "prox"] = "p"
    rounds: int = Field(100, ge=1, description="communication rounds (one exchange on one mini-batch each)")
    local_steps: int | None = Field(None, ge=1, description="Q local steps per exchange (default: 1 for sgd, 5 otherwise)")
    batch_size: int = Field(256, ge=1, description="mini-batch size |S| (samples per round)")
    lr: float = Field(0.1, gt=0, description="eta_0 of the step size eta_t = eta_0 / sqrt(t + 1)")
    lr_decay: Literal["sqrt", "none"] = Field("sqrt", description="sqrt: eta_0 / sqrt(t + 1) (paper Sec. 8); none: eta_0")
    mu: float | None = Field(None, ge=0, description="proximal weight (prox only; default 0.1)")
    l2: float = Field(0.0, ge=0, description="L2 weight lambda on every party's parameters (paper eq. (1))")
    model: Literal["linear", "cnn", "mlp"] = Field("linear", description="bottom models: linear (summed), cnn or mlp towers (+ linear top)")
    representation_dim: int = Field(256, ge=1, description="width of a tower's output H_k (cnn, mlp)")
    hidden: int = Field(128, ge=1, description="mlp tower hidden width")
    channels: int = Field(64, ge=1, description="cnn tower channels")
    target_auc: float | None = Field(None, gt=0, lt=1, description="report the first evaluated round with test AUC >= this")
    stop_at_target: bool = Field(False, description="stop once target_auc is reached")
    eval_every: int = Field(1, ge=1, description="evaluate every k rounds (and after the last)")
    eval_subset: int | None = Field(None, ge=10, description="evaluate on a fixed random subset of this many test samples")
    eval_dense_from: float | None = Field(None, gt=0, lt=1, description="evaluate every round once the test AUC has reached this")
    failure_rate: float = Field(0.0, ge=0, lt=1, description="simulated: probability that a party fails in a round (it works, but its replies never arrive)")
    on_missing_party: Literal["skip", "error"] = Field(
        "skip",
        description="a round with a missing reply (any party, the label party included) cannot be completed in vertical FL: "
        "skip = roll every party back to its state before the round, count the round as skipped and go on; "
        "error = stop with an error naming the party and the round",
    )

    @model_validator(mode="after")
    def _check(self) -> FedBCDConfig:
        if self.local_steps is None:
            self.local_steps = 1 if self.variant == "sgd" else 5
        if self.variant == "sgd" and self.local_steps != 1:
            raise ValueError(f"variant 'sgd' (FedSGD) takes one local step per exchange, got local_steps {self.local_steps}; use variant 'p'")
        if self.variant == "prox":
            if self.mu is None:
                self.mu = 0.1
            if self.mu <= 0:
                raise ValueError("variant 'prox' (FedPBCD-p) needs mu > 0")
        elif self.mu:
            raise ValueError(f"mu is the proximal weight of variant 'prox', but variant is {self.variant!r}")
        else:
            self.mu = 0.0
        if self.stop_at_target and self.target_auc is None:
            raise ValueError("stop_at_target needs target_auc")
        return self

    @property
    def Q(self) -> int:
        return int(self.local_steps or 1)

    def step_size(self, t: int) -> float:
        """``eta_t`` for 0-based round ``t``: ``eta_0 / sqrt(t + 1)`` (paper Sec. 8) or ``eta_0``."""
        return self.lr / np.sqrt(t + 1.0) if self.lr_decay == "sqrt" else self.lr

    def label(self) -> str:
        """Paper name of the variant: FedSGD, FedBCD-p, FedBCD-s, FedPBCD-p."""
        return {"sgd": "FedSGD", "p": "FedBCD-p", "s": "FedBCD-s", "prox": "FedPBCD-p"}[self.variant]


# ---------------------------------------------------------------------------------- parties


def _params(*modules: nn.Module) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


@torch.no_grad()
def _sgd_update(params: Sequence[nn.Parameter], lr: float, l2: float, mu: float, anchor: Sequence[torch.Tensor] | None) -> None:
    """``theta <- theta - lr (grad + l2 theta + mu (theta - theta^{r0}))`` (paper (9), (15))."""
    for i, p in enumerate(params):
        g = torch.zeros_like(p) if p.grad is None else p.grad
        if l2:
            g = g + l2 * p
        if mu and anchor is not None:
            g = g + mu * (p - anchor[i])
        p.sub_(lr * g)
        p.grad = None


class FedBCDParty:
    """Party-side steps of FedSGD / FedBCD for one party.

    Args:
        party_id: the party's name (its client ID in the transport).
        ids: ``(N_k,)`` its sample IDs.
        x: ``(N_k, *input_shape)`` float32: its blocks for those samples (one block as is, several
            blocks flattened and concatenated, see :func:`party_input`).
        bottom: its bottom model, ``(batch, *input_shape) -> (batch, r_k)``.
        blocks: names of its blocks (reported to the coordinator).
        labels: ``(N_k,)`` labels in {0, 1} (label party only).
        top: the top model (label party only): list of ``(batch, r_j)`` in party order -> ``(batch,)`` logits.
        party_order: all party IDs in the order the top model takes them (label party only).

    State (plain tensors/arrays, see :meth:`state_dict`): model parameters, the aligned positions,
    the current batch, and (label party) the last ``H_j`` received for it; plus a snapshot of that
    state (without the aligned positions) taken at the party's first message of each round, which
    ``undo`` restores when the coordinator skips the round (module docstring, "A missing party").
    """

    def __init__(
        self,
        party_id: str,
        ids: np.ndarray,
        x: np.ndarray,
        bottom: nn.Module,
        blocks: Sequence[str] = (),
        labels: np.ndarray | None = None,
        top: nn.Module | None = None,
        party_order: Sequence[str] | None = None,
    ):
        self.party_id = party_id
        self.ids = np.asarray(ids).astype(str)
        self.x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        self.bottom = bottom
        self.blocks = list(blocks)
        self.is_label = labels is not None
        if self.is_label:
            if top is None or party_order is None:
                raise ValueError(f"label party {party_id!r} needs a top model and the party order")
            self.y = torch.from_numpy(np.asarray(labels, dtype=np.float32))
            self.top = top
            self.party_order = list(party_order)
        self.rows: np.ndarray | None = None  # aligned position -> own row
        self.batch: np.ndarray | None = None  # aligned positions of the current batch
        self.others: dict[str, torch.Tensor] = {}  # label party: H_j of the current batch
        self._snap: dict[str, np.ndarray] | None = None  # state at the first message of round _snap_round
        self._snap_round: int | None = None
        self._snap_lost = False  # loaded from a state_dict without the snapshot
        with torch.no_grad():
            self.out_dim = int(self.bottom(self.x[:1]).shape[1])

    # ------------------------------------------------------------------ protocol
    def handle(self, msg: Message) -> Message:
        if msg.round >= 1:
            if "undo" in msg.payload:
                self.undo(int(msg.payload["undo"]))
            if msg.kind == "fedbcd.undo":
                self.undo(int(msg.payload["round"]))
                return msg.reply(undone=int(msg.payload["round"]))
            if self._snap_round != msg.round:
                self._snap, self._snap_round = self._core_state(), msg.round
        if msg.kind == "fedbcd.properties":
            return msg.reply(ids=[str(s) for s in self.ids], blocks=self.blocks, out_dim=self.out_dim, has_labels=self.is_label)
        if msg.kind == "fedbcd.align":
            return self.align(msg)
        if msg.kind == "fedbcd.forward":
            self.batch = np.asarray(msg.payload["batch"], dtype=np.int64)
            return msg.reply(h=self.forward(self.batch))
        if msg.kind == "fedbcd.party_step":
            return self.party_step(msg)
        if msg.kind == "fedbcd.label":
            return self.label_step(msg)
        raise ValueError(f"FedBCD party {self.party_id!r} got unknown message kind {msg.kind!r}")

    def align(self, msg: Message) -> Message:
        """Map the coordinator's aligned ID order to own rows (raises if an ID is unknown)."""
        index = {s: i for i, s in enumerate(self.ids)}
        order = [str(s) for s in msg.payload["ids"]]
        missing = [s for s in order if s not in index]
        if missing:
            raise ValueError(f"party {self.party_id!r} does not hold aligned sample {missing[0]!r}")
        self.rows = np.array([index[s] for s in order], dtype=np.int64)
        return msg.reply(n_aligned=len(order))

    def _x(self, batch: np.ndarray) -> torch.Tensor:
        assert self.rows is not None, "align before training"
        return self.x[torch.from_numpy(self.rows[batch])]

    @torch.no_grad()
    def forward(self, batch: np.ndarray) -> np.ndarray:
        """``H_k`` of the batch (aligned positions ``(B,)``): ``(B, r_k)`` float32."""
        return self.bottom(self._x(batch)).numpy().astype(np.float32)

    def party_step(self, msg: Message) -> Message:
        """Passive party: ``Q`` local steps with the stale ``dL/dH_k`` (Alg. 1 line 6 for Q = 1,
        Alg. 2 lines 5-8, Alg. 3 lines 5-7, eq. (15)), then ``H_k`` of the next batch."""
        p = msg.payload
        assert self.batch is not None, "no current batch"
        grad = torch.from_numpy(np.asarray(p["grad"], dtype=np.float32))
        x = self._x(self.batch)
        params = _params(self.bottom)
        mu = float(p["mu"])
        anchor = [t.detach().clone() for t in params] if mu else None
        for _ in range(int(p["local_steps"])):
            h = self.bottom(x)
            # d/dtheta sum_i <H_k,i(theta), dL/dH_k,i> = grad of the loss w.r.t. theta_k at the stale dL/dH_k
            (h * grad).sum().backward()
            _sgd_update(params, float(p["lr"]), float(p["l2"]), mu, anchor)
        out: dict = {}
        if p.get("return_current"):
            out["h"] = self.forward(self.batch)
        if "next_batch" in p:
            self.batch = np.asarray(p["next_batch"], dtype=np.int64)
            out["h_next"] = self.forward(self.batch)
        return msg.reply(**out)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        hs = [self.others[j] if j != self.party_id else self.bottom(x) for j in self.party_order]
        return self.top(hs)

    def label_step(self, msg: Message) -> Message:
        """Label party: take the new ``H_j`` of the batch; return ``dL/dH_j`` for the parties in
        ``grads_for`` at the current point; then ``Q`` local steps on its bottom and top models
        with the others' ``H_j`` fixed (Alg. 2 lines 5-8 with exact local loss, eq. (15))."""
        p = msg.payload
        if "batch" in p:
            self.batch = np.asarray(p["batch"], dtype=np.int64)
            self.others = {}
        assert self.batch is not None, "no current batch"
        for j in self.party_order:
            if f"h.{j}" in p:
                self.others[j] = torch.from_numpy(np.asarray(p[f"h.{j}"], dtype=np.float32))
        x = self._x(self.batch)
        y = self.y[torch.from_numpy(self.rows[self.batch])]  # type: ignore[index]
        want = [str(j) for j in p.get("grads_for", [])]
        out: dict = {}
        for j in want:
            self.others[j].requires_grad_(True)
        logits = self._logits(x)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
        out["loss"] = float(loss.detach())
        Q = int(p.get("local_steps", 0))
        params = _params(self.bottom, self.top)
        if want:
            grads = torch.autograd.grad(loss, [self.others[j] for j in want] + (params if Q else []), allow_unused=True)
            for j, g in zip(want, grads[: len(want)]):
                out[f"grad.{j}"] = g.numpy().astype(np.float32)
                self.others[j] = self.others[j].detach()
            own = grads[len(want):]
        else:
            own = torch.autograd.grad(loss, params, allow_unused=True) if Q else ()
        if Q:
            mu, lr, l2 = float(p["mu"]), float(p["lr"]), float(p["l2"])
            anchor = [t.detach().clone() for t in params] if mu else None
            for q in range(Q):
                if q > 0:
                    loss_q = nn.functional.binary_cross_entropy_with_logits(self._logits(x), y)
                    own = torch.autograd.grad(loss_q, params, allow_unused=True)
                for prm, g in zip(params, own):
                    prm.grad = g
                _sgd_update(params, lr, l2, mu, anchor)
        return msg.reply(**out)

    # ------------------------------------------------------------------ inference and state
    @torch.no_grad()
    def embed(self, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """``H_k`` of arbitrary inputs ``(n, *input_shape)`` -> ``(n, r_k)`` (for evaluation)."""
        self.bottom.eval()
        out = [self.bottom(torch.from_numpy(np.ascontiguousarray(x[s : s + batch_size], dtype=np.float32))).numpy()
               for s in range(0, len(x), batch_size)]
        self.bottom.train()
        return np.concatenate(out) if out else np.zeros((0, self.out_dim), np.float32)

    @torch.no_grad()
    def top_logits(self, hs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Label party: logits ``(n,)`` from every party's ``H_j`` ``(n, r_j)`` (for evaluation)."""
        return self.top([torch.from_numpy(np.asarray(hs[j], dtype=np.float32)) for j in self.party_order]).numpy()

    def undo(self, rnd: int) -> None:
        """Discard round ``rnd`` and everything after it (the coordinator skipped it): restore the
        snapshot if it was taken in round ``rnd`` or later. A snapshot of a later round was taken
        after this same ``undo`` had been applied (the coordinator repeats it in every message
        until a reply confirms it), so it holds the state before round ``rnd``; restoring it
        again is harmless. Nothing to do if the party received no message since round ``rnd``
        (its snapshot is older, or it has none because it never received a message of a round).

        Raises:
            RuntimeError: the party was loaded from a :meth:`state_dict` without its snapshot.
        """
        if self._snap is None or self._snap_round is None:
            if self._snap_lost:
                raise RuntimeError(f"FedBCD party {self.party_id!r} cannot undo round {rnd}: it was loaded without the snapshot of its state.")
            return
        if self._snap_round >= rnd:
            self._load_core({k: np.array(v, copy=True) for k, v in self._snap.items()})

    def _core_state(self) -> dict[str, np.ndarray]:
        sd = {f"bottom.{k}": v.detach().numpy().copy() for k, v in self.bottom.state_dict().items()}
        if self.is_label:
            sd.update({f"top.{k}": v.detach().numpy().copy() for k, v in self.top.state_dict().items()})
            sd.update({f"h.{j}": v.detach().numpy().copy() for j, v in self.others.items()})
        if self.batch is not None:
            sd["batch"] = self.batch.copy()
        return sd

    def _load_core(self, sd: Mapping[str, np.ndarray]) -> None:
        self.bottom.load_state_dict({k[7:]: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith("bottom.")})
        if self.is_label:
            self.top.load_state_dict({k[4:]: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith("top.")})
            self.others = {k[2:]: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith("h.")}
        self.batch = np.asarray(sd["batch"]) if "batch" in sd else None

    def state_dict(self, snapshot: bool = False) -> dict[str, np.ndarray]:
        """All state needed between messages as arrays: parameters (``bottom.*``, ``top.*``),
        the aligned rows, the current batch, and (label party) the stored ``H_j`` (``h.*``).
        With ``snapshot`` (for checkpoints), also the round snapshot that ``undo`` restores
        (``snap.*``, ``snap_round``; -1: none taken yet)."""
        sd = self._core_state()
        if self.rows is not None:
            sd["rows"] = self.rows.copy()
        if snapshot:
            sd.update({f"snap.{k}": v.copy() for k, v in (self._snap or {}).items()})
            sd["snap_round"] = np.array([-1 if self._snap_round is None else self._snap_round], dtype=np.int64)
        return sd

    def load_state_dict(self, sd: Mapping[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`."""
        self._load_core({k: v for k, v in sd.items() if not k.startswith("snap")})
        self.rows = np.asarray(sd["rows"]) if "rows" in sd else None
        if "snap_round" in sd:
            r = int(np.asarray(sd["snap_round"]).reshape(-1)[0])
            self._snap = {k[5:]: np.asarray(v) for k, v in sd.items() if k.startswith("snap.")} if r >= 0 else None
            self._snap_round = r if r >= 0 else None
            self._snap_lost = False
        else:
            self._snap, self._snap_round, self._snap_lost = None, None, True


# ---------------------------------------------------------------------------------- coordinator


class _Missing(Exception):
    """Internal: replies missing in the current round (the round cannot be completed)."""

    def __init__(self, parties: list[str]):
        super().__init__(", ".join(parties))
        self.parties = parties


def _names(parties: Sequence[str]) -> str:
    quoted = [repr(p) for p in parties]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


class FedBCDCoordinator:
    """Coordinator-side steps (the ``server`` of the message runtime; holds no data).

    Args:
        config: FedBCD settings.
        seed: seeds the mini-batch sampling (IDs only).

    A round with a missing reply is handled as ``config.on_missing_party`` says (module docstring,
    "A missing party"); ``skipped`` lists ``(round, missing parties)`` of every skipped round.
    """

    def __init__(self, config: FedBCDConfig, seed: int = 0):
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.parties: list[str] = []
        self.label_party: str = ""
        self.passive: list[str] = []
        self.n = 0
        self.batch: np.ndarray | None = None
        self.h: dict[str, np.ndarray] = {}  # H_k of the current batch (passive parties)
        self.undo: dict[str, int] = {}  # party -> skipped round it has not yet confirmed undoing
        self.skipped: list[tuple[int, list[str]]] = []
        self._touched: set[str] = set()  # parties that received a message in the current round

    # ------------------------------------------------------------------ state (checkpoints)
    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything carried from round to round: ``(arrays, json_meta)`` with the current batch,
        the stored ``H_k``, the roles, the aligned sample count, the batch sampler's random state,
        the pending ``undo`` per party and the skipped rounds."""
        arrays = {f"h.{k}": np.asarray(v) for k, v in self.h.items()}
        if self.batch is not None:
            arrays["batch"] = np.asarray(self.batch)
        meta = {
            "parties": self.parties,
            "label_party": self.label_party,
            "passive": self.passive,
            "n": self.n,
            "rng": self.rng.bit_generator.state,
            "undo": self.undo,
            "skipped": [[r, list(m)] for r, m in self.skipped],
        }
        return arrays, meta

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned (on a coordinator built with the same config)."""
        self.parties = [str(p) for p in meta["parties"]]
        self.label_party = str(meta["label_party"])
        self.passive = [str(p) for p in meta["passive"]]
        self.n = int(meta["n"])
        self.rng.bit_generator.state = meta["rng"]
        self.undo = {str(k): int(v) for k, v in meta["undo"].items()}
        self.skipped = [(int(r), [str(x) for x in m]) for r, m in meta["skipped"]]
        self.batch = np.asarray(arrays["batch"], dtype=np.int64) if "batch" in arrays else None
        self.h = {k[2:]: np.asarray(v) for k, v in arrays.items() if k.startswith("h.")}

    # ------------------------------------------------------------------ exchanges
    def _exchange(self, transport: Transport, messages: list[Message]) -> list[Message]:
        """Send; every reply must arrive. A party with a pending ``undo`` gets it in its message
        (its reply confirms it). Raises :class:`_Missing` with the parties whose reply is missing."""
        for m in messages:
            if m.receiver in self.undo:
                m.payload["undo"] = self.undo[m.receiver]
            self._touched.add(m.receiver)
        replies = transport.send_and_receive(messages)
        arrived = {r.sender for r in replies}
        for m in messages:
            if m.receiver in arrived:
                self.undo.pop(m.receiver, None)
        missing = [m.receiver for m in messages if m.receiver not in arrived]
        if missing:
            raise _Missing(missing)
        return replies

    def setup(self, transport: Transport, client_ids: Sequence[str]) -> None:
        """Ask every party for its sample IDs and role; send the aligned ID order (intersection
        of all parties' IDs, in the label party's order).

        Raises:
            ValueError: not exactly one label party, or no common sample.
        """
        replies = transport.send_and_receive([Message("fedbcd.properties", SERVER, cid, 0) for cid in client_ids])
        self.parties = [r.sender for r in replies]
        labels = [r.sender for r in replies if r.payload["has_labels"]]
        if len(labels) != 1:
            raise ValueError(f"FedBCD needs exactly one label party, found {len(labels)}")
        self.label_party = labels[0]
        self.passive = [p for p in self.parties if p != self.label_party]
        ids = {r.sender: [str(s) for s in r.payload["ids"]] for r in replies}
        common = set.intersection(*(set(v) for v in ids.values()))
        order = [s for s in ids[self.label_party] if s in common]
        if not order:
            raise ValueError("the parties share no sample ID")
        self.n = len(order)
        transport.send_and_receive([Message("fedbcd.align", SERVER, cid, 0, {"ids": order}) for cid in self.parties])

    def sample_batch(self) -> np.ndarray:
        """``(B,)`` aligned positions drawn uniformly without replacement (paper A2 / Alg. 1 line 4)."""
        b = min(self.config.batch_size, self.n)
        return np.sort(self.rng.choice(self.n, size=b, replace=False)).astype(np.int64)

    def _common(self, rnd: int) -> dict:
        c = self.config
        return {"local_steps": c.Q, "lr": float(c.step_size(rnd - 1)), "mu": float(c.mu or 0.0), "l2": float(c.l2)}

    def run_round(self, rnd: int, transport: Transport) -> dict[str, float]:
        """One communication round: one exchange on a fresh mini-batch and the local steps.

        Returns ``train_loss`` and ``lr``; for a skipped round ``skipped`` (1), ``missing`` and
        ``lr``.

        Raises:
            PartyMissingError: a reply is missing and ``on_missing_party`` is ``error``.
        """
        lr = float(self.config.step_size(rnd - 1))
        before = (self.batch, self.h, self.rng.bit_generator.state)
        self._touched = set()
        try:
            if self.batch is None:  # first round: H_k of the first batch
                self.batch = self.sample_batch()
                replies = self._exchange(transport, [Message("fedbcd.forward", SERVER, k, rnd, {"batch": self.batch}) for k in self.passive])
                self.h = {r.sender: r.payload["h"] for r in replies}
            if self.config.variant == "s":
                loss = self._sequential(rnd, transport)
            else:
                loss = self._parallel(rnd, transport)
        except _Missing as e:  # the round never happened for the coordinator either
            self.batch, self.h, self.rng.bit_generator.state = before
            return self._skip(rnd, e.parties, lr, transport)
        return {"train_loss": loss, "lr": lr}

    def _skip(self, rnd: int, missing: list[str], lr: float, transport: Transport) -> dict:
        """A reply of round ``rnd`` is missing: raise (``error``) or undo the round everywhere (``skip``)."""
        who = ("party " if len(missing) == 1 else "parties ") + _names(missing) + (" (the label party)" if self.label_party in missing else "")
        if self.config.on_missing_party == "error":
            raise PartyMissingError(
                f"FedBCD {who} sent no reply in round {rnd}, and a vertical FL round needs every party "
                "(set algorithm.on_missing_party: skip to skip such rounds)."
            )
        touched = [p for p in self.parties if p in self._touched]
        for p in touched:  # the earliest unconfirmed skipped round: its undo also undoes the later ones
            self.undo[p] = min(self.undo.get(p, rnd), rnd)
        replies = transport.send_and_receive([Message("fedbcd.undo", SERVER, p, rnd, {"round": self.undo[p]}) for p in touched])
        for r in replies:
            self.undo.pop(r.sender, None)
        self.skipped.append((rnd, list(missing)))
        log.warning("FedBCD round %d skipped: no reply from %s; the round's updates are undone at every party.", rnd, who)
        return {"skipped": 1, "missing": " ".join(missing), "lr": lr}

    def _parallel(self, rnd: int, transport: Transport) -> float:
        """FedSGD / FedBCD-p / FedPBCD-p round (Alg. 1, Alg. 2): the label party returns every
        ``dL/dH_k`` and takes its ``Q`` steps; all passive parties take theirs with it."""
        common = self._common(rnd)
        assert self.batch is not None
        payload = {"batch": self.batch, "grads_for": list(self.passive), **common}
        payload.update({f"h.{k}": self.h[k] for k in self.passive})
        (lab,) = self._exchange(transport, [Message("fedbcd.label", SERVER, self.label_party, rnd, payload)])
        nxt = self.sample_batch()
        replies = self._exchange(
            transport,
            [Message("fedbcd.party_step", SERVER, k, rnd, {"grad": lab.payload[f"grad.{k}"], "next_batch": nxt, **common}) for k in self.passive],
        )
        self.batch = nxt
        self.h = {r.sender: r.payload["h_next"] for r in replies}
        return float(lab.payload["loss"])

    def _sequential(self, rnd: int, transport: Transport) -> float:
        """FedBCD-s round (Alg. 3): for each passive party ``k`` in turn, ``Exchange({k, K})``
        (the label party returns ``dL/dH_k`` with every update made so far this round) and ``Q``
        local steps of ``k``; then the label party's ``Q`` steps with all fresh ``H_k``."""
        common = self._common(rnd)
        assert self.batch is not None
        nxt = self.sample_batch()
        first_loss = None
        new_h: dict[str, np.ndarray] = {}
        fresh: dict[str, np.ndarray] = dict(self.h)  # H_k to send to the label party
        for i, k in enumerate(self.passive):
            payload: dict = {"grads_for": [k], "local_steps": 0}
            if i == 0:
                payload["batch"] = self.batch
            payload.update({f"h.{j}": v for j, v in fresh.items()})
            (lab,) = self._exchange(transport, [Message("fedbcd.label", SERVER, self.label_party, rnd, payload)])
            if first_loss is None:
                first_loss = float(lab.payload["loss"])
            (rep,) = self._exchange(
                transport, [Message("fedbcd.party_step", SERVER, k, rnd, {"grad": lab.payload[f"grad.{k}"], "next_batch": nxt, "return_current": True, **common})]
            )
            fresh = {k: rep.payload["h"]}
            new_h[k] = rep.payload["h_next"]
        payload = {"grads_for": [], **common}
        payload.update({f"h.{j}": v for j, v in fresh.items()})
        self._exchange(transport, [Message("fedbcd.label", SERVER, self.label_party, rnd, payload)])
        self.batch = nxt
        self.h = new_h
        return float(first_loss if first_loss is not None else 0.0)
