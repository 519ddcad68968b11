"""Hybrid FedAvg settings: :class:`HybridFedAvgConfig` (``algorithm:`` section with ``name: hybrid_fedavg``)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.intercept import FIT_INTERCEPT_DESCRIPTION


class HybridFedAvgConfig(BaseModel):
    """Hybrid FedAvg settings (``algorithm:`` section with ``name: hybrid_fedavg``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Literal["hybrid_fedavg"] = "hybrid_fedavg"
    loss: Literal["hinge", "logistic", "squared"] = "hinge"
    lam: float = Field(1e-4, gt=0, validation_alias=AliasChoices("lam", "lambda"))
    fit_intercept: bool = Field(True, description=FIT_INTERCEPT_DESCRIPTION)
    rounds: int = Field(100, ge=1)
    local_steps: int = Field(50, ge=1, description="local SGD steps per round")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.05, gt=0, description="eta_t = lr / sqrt(t)")
    participation: float = Field(1.0, gt=0, le=1)
    participation_mode: Literal["fraction", "probability", "cyclic"] = "fraction"
    cyclic_groups: int = Field(2, ge=2)
    failure_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="probability that a selected client fails mid-round (its reply never arrives; the server averages the replies that did)",
    )
    positive_classes: list[int] | None = None
    latency: float = Field(
        0.2575, ge=0, description="modelled seconds per round trip (HyFDCA Sec. 5.1: its PAPER_LATENCY)"
    )
    eval_every: int = Field(1, ge=0)
    reference: bool = True
    reference_sdca_epochs: int = Field(200, ge=1)
