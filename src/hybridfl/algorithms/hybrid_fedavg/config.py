"""Hybrid FedAvg settings: :class:`HybridFedAvgConfig` (``algorithm:`` section with ``name: hybrid_fedavg``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hybridfl.algorithms.convex.intercept import FIT_INTERCEPT_DESCRIPTION


class HybridFedAvgConfig(BaseModel):
    """Hybrid FedAvg settings (``algorithm:`` section with ``name: hybrid_fedavg``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    simulation_only: ClassVar[frozenset[str]] = frozenset(
        {"failure_rate", "latency", "eval_every", "reference", "reference_sdca_epochs"}
    )
    """Settings of the simulation and the server's schedule, never sent to a client
    (:func:`hybridfl.config.client_settings_json`)."""
    name: Literal["hybrid_fedavg"] = Field(
        "hybrid_fedavg", description="the algorithm (hybrid FedAvg on the convex problem)"
    )
    loss: Literal["hinge", "logistic", "squared"] = Field(
        "hinge",
        description="loss l of the L2-regularised linear problem on labels +-1: hinge (SVM), logistic or squared",
    )
    lam: float = Field(
        1e-4,
        gt=0,
        validation_alias=AliasChoices("lam", "lambda"),
        description="L2 regulariser lambda (> 0) of P(w) = (lambda/2)||w||^2 + (1/N) sum_i l(x_i^T w)",
    )
    fit_intercept: bool = Field(True, description=FIT_INTERCEPT_DESCRIPTION)
    rounds: int = Field(
        100, ge=1, description="communication rounds T (one fit exchange with the round's clients each)"
    )
    local_steps: int = Field(50, ge=1, description="local SGD steps per round")
    batch_size: int = Field(
        64, ge=1, description="samples per local SGD step, drawn without replacement (capped at the client's samples)"
    )
    lr: float = Field(0.05, gt=0, description="eta_t = lr / sqrt(t)")
    participation: float = Field(
        1.0, gt=0, le=1, description="share (fraction) or probability (probability) of clients per round (1: all)"
    )
    participation_mode: Literal["fraction", "probability", "cyclic"] = Field(
        "fraction",
        description="how the round's clients are chosen: fraction: a random subset of round(participation x clients); probability: each client independently with probability participation (both at least one client); cyclic: client i in rounds t with i mod cyclic_groups = (t - 1) mod cyclic_groups (participation unused)",
    )
    cyclic_groups: int = Field(2, ge=2, description="number of cyclic client groups (participation_mode: cyclic)")
    failure_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="probability that a selected client fails mid-round (its reply never arrives; the server averages the replies that did)",
    )
    positive_classes: list[int] | None = Field(
        None,
        description="class indices labelled +1, the others -1 (required with more than 2 classes; default with 2: class 1)",
    )
    latency: float = Field(
        0.2575, ge=0, description="modelled seconds per round trip (HyFDCA Sec. 5.1: its PAPER_LATENCY)"
    )
    eval_every: int = Field(1, ge=0, description="evaluate every k rounds and after the last (0: only after the last)")
    reference: bool = Field(
        True,
        description="compute (or load from the cache) the centralised reference optimum P* for relative_suboptimality",
    )
    reference_sdca_epochs: int = Field(
        200,
        ge=1,
        description="SDCA epochs of the reference solve (P* is the best of liblinear and this SDCA run; cached per problem)",
    )
