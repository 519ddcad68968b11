"""FedBCD settings (:class:`FedBCDConfig`), the party-count limits and the missing-party error."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridfl.errors import HybridFLError

MIN_PARTIES, MAX_PARTIES = 2, 8
"""The number of parties ``K`` FedBCD accepts (SPEC.md "FedBCD": 2 to 8)."""


class PartyMissingError(HybridFLError):
    """A party sent no reply in a round and ``on_missing_party`` is ``error``."""


class FedBCDConfig(BaseModel):
    """FedBCD hyperparameters (``algorithm:`` section of a run config with ``name: fedbcd``).

    ``variant``: ``sgd`` (FedSGD, ``local_steps`` must be 1), ``p`` (FedBCD-p), ``s``
    (FedBCD-s), ``prox`` (FedPBCD-p, ``mu`` > 0, default 0.1 as in paper Fig. 4b).
    ``local_steps`` defaults to 1 for ``sgd`` and 5 otherwise. ``failure_rate`` and
    ``on_missing_party``: see :mod:`hybridfl.algorithms.fedbcd` ("A missing party").

    Raises:
        pydantic.ValidationError: ``sgd`` with ``local_steps`` != 1, ``prox`` with ``mu`` = 0,
            ``mu`` for another variant, or ``stop_at_target`` without ``target_auc``.
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["fedbcd"] = "fedbcd"
    variant: Literal["sgd", "p", "s", "prox"] = "p"
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
    model: Literal["linear", "cnn", "mlp"] = Field(
        "linear", description="bottom models: linear (summed), cnn or mlp towers (+ linear top)"
    )
    representation_dim: int = Field(256, ge=1, description="width of a tower's output H_k (cnn, mlp)")
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
