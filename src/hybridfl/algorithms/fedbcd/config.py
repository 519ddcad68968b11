"""FedBCD settings (:class:`FedBCDConfig`), the party-count limits and the missing-party error."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridfl.algorithms.presets import with_preset
from hybridfl.errors import ConfigError, HybridFLError
from hybridfl.models.device import check_device

MIN_PARTIES, MAX_PARTIES = 2, 8
"""The number of parties ``K`` FedBCD accepts: at least 2 (FedBCD Theorem 1 assumes ``K >= 2``), at most 8
(ours, not the paper's: its experiments go up to 17 parties, Sec. 8)."""


class PartyMissingError(HybridFLError):
    """A party sent no reply in a round and ``on_missing_party`` is ``error``."""


class FedBCDConfig(BaseModel):
    """FedBCD hyperparameters (``algorithm:`` section of a run config with ``name: fedbcd``).

    ``variant``: ``sgd`` (FedSGD, ``local_steps`` must be 1), ``p`` (FedBCD-p), ``s``
    (FedBCD-s), ``prox`` (FedPBCD-p, ``mu`` > 0, default 0.1 as in paper Fig. 4b).
    ``local_steps`` defaults to 1 for ``sgd`` and 5 otherwise. ``failure_rate`` and
    ``on_missing_party``: see :mod:`hybridfl.algorithms.fedbcd` ("A missing party").

    ``top`` (``cnn``/``mlp`` towers; ``linear`` always sums one value per party): where the final
    logistic layer lives. ``party_slice`` (default, the paper's layout: eq. (2) with each party's
    tower output in place of ``x_k``, Sec. 6 / Fig. 1a "connect at the final prediction layer",
    "a single value per sample" in Sec. 1; the reference code's per-party ``W``): every party owns
    its slice ``w_k`` of that layer, sends ``H_k = w_k^T G_k(x_k)`` of width 1 and receives a
    ``dL/dH_k`` of width 1; the label party sums them and adds the bias. ``concat``: the towers'
    ``representation_dim``-wide outputs go to a :class:`~hybridfl.models.towers.LinearTop` at the
    label party (``representation_dim`` times the bytes of ``H_k`` and of ``dL/dH_k``).

    ``local_gradient``: what a passive party uses for ``dL/dH_k`` during its ``Q`` local steps.
    ``fixed`` (default, paper Alg. 2/3 and eq. (7) with the stale ``H_{-k}``): the gradient it
    received, for all ``Q`` steps. ``taylor`` (the reference code ``yankang18/FedBCD``,
    ``vfl.py``, ``VFLHostModel._compute_common_gradient``, which refreshes the gradient with the
    party's fresh output through a Taylor-approximated loss): the label party also sends the
    curvature ``c_i = sigmoid'(z_i) / B`` and the party uses ``g_i + c_i (H'_k,i - H_k,i)`` with its
    fresh ``H'_k`` (first-order Taylor expansion of ``dL/dH_k`` around the exchanged point, the
    others' ``H_j`` stale). Needs ``H_k`` of width 1 (``linear`` or ``top: party_slice``).

    ``optimizer``: how a party applies its local gradient ``g_k`` (L2 and proximal terms included)
    at each of its ``Q`` local steps. ``sgd`` (default, paper Alg. 1-3 and eq. (9):
    ``theta_k <- theta_k - eta_t g_k``). ``adam``: :class:`torch.optim.Adam` (betas 0.9 / 0.999,
    eps 1e-8) with step size ``eta_t`` over the party's own parameters (the label party's top model
    included); its moments and step count are the party's state, kept across rounds (and in its
    round snapshot). This is the reference code's choice for the MNIST-CNN experiment
    (``yankang18/FedBCD``, ``vnn_demo/run_vfl_cnn_two_party_demo.py``: ``optimizer="adam"``,
    ``lr_list = [1e-04]``, no step-size decay; ``models/cnn.py`` ``SimpleCNN`` trains the towers with
    ``tf.train.AdamOptimizer``), there for the towers only: its per-party logistic slice ``W``
    takes plain SGD steps (``vfl.py`` ``_update_federated_layer_model``), here Adam updates every
    parameter. With ``adam`` the coordinator adds ``optimizer`` to the step settings it sends.

    ``preset: paper`` fills the paper's MNIST-CNN setting (FedBCD-p, Q = 5, batch 256, SGD with
    ``eta_0 / sqrt(t + 1)``, CNN towers; :mod:`hybridfl.algorithms.presets`); explicit fields win.

    ``device``: where the torch models and the tensors made from a party's data live
    (:mod:`hybridfl.models.device`; ``auto`` default: ``cuda`` when torch sees a GPU, else ``cpu``;
    ``cpu``; ``cuda``). The run's summary records the device under ``device``.

    Raises:
        pydantic.ValidationError: ``sgd`` with ``local_steps`` != 1, ``prox`` with ``mu`` = 0,
            ``mu`` for another variant, ``stop_at_target`` without ``target_auc``, ``taylor`` with
            ``top: concat`` towers, or a ``device`` that is unknown or absent.
    """

    model_config = ConfigDict(extra="forbid")
    simulation_only: ClassVar[frozenset[str]] = frozenset(
        {"failure_rate", "device", "target_auc", "stop_at_target", "eval_every", "eval_subset", "eval_dense_from"}
    )
    """Settings of the simulation and the server's schedule, never sent to a client
    (:func:`hybridfl.config.client_settings_json`)."""
    name: Literal["fedbcd"] = Field("fedbcd", description="the algorithm (FedBCD, vertical FL)")
    variant: Literal["sgd", "p", "s", "prox"] = Field(
        "p",
        description="sgd: FedSGD (Alg. 1, one local step per exchange); p: FedBCD-p (Alg. 2, Q local steps, all parties in parallel); s: FedBCD-s (Alg. 3, the passive parties in turn, then the label party); prox: FedPBCD-p (FedBCD-p with the proximal term mu, eq. (15))",
    )
    rounds: int = Field(100, ge=1, description="communication rounds (one exchange on one mini-batch each)")
    local_steps: int | None = Field(
        None, ge=1, description="Q local steps per exchange (default: 1 for sgd, 5 otherwise)"
    )
    batch_size: int = Field(256, ge=1, description="mini-batch size |S| (samples per round)")
    lr: float = Field(0.1, gt=0, description="eta_0 of the step size eta_t = eta_0 / sqrt(t + 1)")
    lr_decay: Literal["sqrt", "none"] = Field(
        "sqrt", description="sqrt: eta_0 / sqrt(t + 1) (paper Sec. 8); none: eta_0"
    )
    mu: float | None = Field(None, ge=0, description="proximal weight (prox only; default 0.1)")
    l2: float = Field(0.0, ge=0, description="L2 weight lambda on every party's parameters (paper eq. (1))")
    fit_intercept: bool = Field(
        True,
        description="learn the intercept b of the label party's top model (linear: H = sum_k H_k + b, paper eq. (2); "
        "cnn/mlp: the bias of the top layer), held by the label party only, never a feature block; regularised "
        "by l2 like every other parameter (l2/2 * b^2, paper eq. (1)). The paper's model has it, so it is on in the "
        "paper settings too; false: no b (the logit is sum_k H_k)",
    )
    model: Literal["linear", "cnn", "mlp"] = Field(
        "linear", description="bottom models: linear (summed), cnn or mlp towers (+ linear top)"
    )
    representation_dim: int = Field(256, ge=1, description="width of a tower's output G_k(x_k) (cnn, mlp)")
    top: Literal["party_slice", "concat"] = Field(
        "party_slice",
        description="cnn/mlp: party_slice = each party owns its slice of the top layer and sends one value per "
        "sample (paper eq. (2), Fig. 1a); concat = representation_dim-wide H_k to a linear top at the label party",
    )
    local_gradient: Literal["fixed", "taylor"] = Field(
        "fixed",
        description="a passive party's dL/dH_k in its local steps: fixed = the received one (paper Alg. 2); "
        "taylor = refreshed with its fresh H_k, g + c (H' - H) (reference code's VFLHostModel)",
    )
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="each party's local update: sgd = theta - eta_t g (paper Alg. 1-3); adam = torch.optim.Adam with "
        "step size eta_t, its moments kept by the party across rounds (the reference code's MNIST-CNN towers)",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto", description="where the torch models run: auto (cuda when torch sees a GPU, else cpu), cpu or cuda"
    )
    hidden: int = Field(128, ge=1, description="mlp tower hidden width")
    channels: int = Field(64, ge=1, description="cnn tower channels")
    target_auc: float | None = Field(
        None, gt=0, lt=1, description="report the first evaluated round with test AUC >= this"
    )
    stop_at_target: bool = Field(False, description="stop once target_auc is reached")
    eval_every: int = Field(1, ge=1, description="evaluate every k rounds (and after the last)")
    eval_subset: int | None = Field(
        None, ge=10, description="evaluate on a fixed random subset of this many test samples"
    )
    eval_dense_from: float | None = Field(
        None, gt=0, lt=1, description="evaluate every round once the test AUC has reached this"
    )
    failure_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="simulated: probability that a party fails in a round (it works, but its replies never arrive)",
    )
    on_missing_party: Literal["skip", "error"] = Field(
        "skip",
        description="a round with a missing reply (any party, the label party included) cannot be completed in vertical FL: "
        "skip = roll every party back to its state before the round, count the round as skipped and go on; "
        "error = stop with an error naming the party and the round",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return with_preset("fedbcd", data)  # preset: paper (hybridfl.algorithms.presets)

    @model_validator(mode="after")
    def _check(self) -> FedBCDConfig:
        if self.local_steps is None:
            self.local_steps = 1 if self.variant == "sgd" else 5
        if self.variant == "sgd" and self.local_steps != 1:
            raise ValueError(
                f"variant 'sgd' (FedSGD) takes one local step per exchange, got local_steps {self.local_steps}; use variant 'p'"
            )
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
        if self.local_gradient == "taylor" and self.model != "linear" and self.top != "party_slice":
            raise ValueError(
                "local_gradient 'taylor' needs H_k of width 1 (model 'linear' or top 'party_slice'), not top 'concat'"
            )
        try:
            check_device(self.device)
        except ConfigError as e:
            raise ValueError(str(e).rstrip(".")) from None
        return self

    @property
    def Q(self) -> int:
        """``Q``: the number of local steps per exchange (paper Alg. 2; 1 for FedSGD)."""
        return int(self.local_steps or 1)

    def step_size(self, t: int) -> float:
        """``eta_t`` for 0-based round ``t``: ``eta_0 / sqrt(t + 1)`` (paper Sec. 8) or ``eta_0``."""
        return self.lr / np.sqrt(t + 1.0) if self.lr_decay == "sqrt" else self.lr

    def label(self) -> str:
        """Paper name of the variant: FedSGD, FedBCD-p, FedBCD-s, FedPBCD-p."""
        return {"sgd": "FedSGD", "p": "FedBCD-p", "s": "FedBCD-s", "prox": "FedPBCD-p"}[self.variant]
