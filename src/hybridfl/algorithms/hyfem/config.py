"""HyFEM's settings: the ``algorithm:`` section of a run config with ``name: hyfem``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridfl.algorithms.presets import with_preset
from hybridfl.errors import ConfigError
from hybridfl.matching.classifier import MatchingConfig
from hybridfl.models.device import check_device


class MatchingSettings(BaseModel):
    """Classifier matching settings (HyFEM Alg. 3; see :class:`hybridfl.matching.MatchingConfig`).

    Attributes:
        cost: ``pfnm`` (the PFNM posterior cost), ``euclidean``, or ``index`` (no matching: plain
            index-wise averaging, a baseline to show what matching buys).
        sweeps: matching sweeps ``P`` over the clients.
        sigma, sigma0, gamma: the PFNM prior's variances and the new-neuron rate (> 0).
        new_penalty: optional fixed cost of opening a new server neuron (> 0).
        max_width: cap on the server hidden width (>= ``hidden``).
        output_weighting: weight the output layer's average by sample counts or per class.
        uncovered: a server classifier entry no client covers is ``zero`` (default: HyFEM Appendix
            A's zero padding ``P_m^T v_m``, Alg. 3 line 9 with a pseudo-inverse) or keeps its
            ``previous`` value (its random initialisation if nobody ever covered it).
    """

    model_config = ConfigDict(extra="forbid")
    cost: Literal["pfnm", "euclidean", "index"] = Field(
        "pfnm",
        description="pfnm: the PFNM posterior cost; euclidean: squared distance over shared coordinates; index: no matching (index-wise averaging, a baseline)",
    )
    sweeps: int = Field(3, ge=0, description="matching sweeps P over the clients")
    sigma: float = Field(
        1.0, gt=0, description="PFNM: variance of the client neurons' weights around their server neuron"
    )
    sigma0: float = Field(1.0, gt=0, description="PFNM: prior variance of a server neuron's weights")
    gamma: float = Field(
        1.0, gt=0, description="PFNM: mass of the Indian buffet process prior (larger: new server neurons are cheaper)"
    )
    new_penalty: float | None = Field(
        None,
        gt=0,
        description="euclidean: cost of opening a new server neuron (default: median squared norm of the client's neuron vectors)",
    )
    max_width: int | None = Field(None, ge=1, description="cap on the server hidden width")
    output_weighting: Literal["samples", "class"] = Field(
        "samples",
        description="output layer average weights: samples: each client's sample count; class: row c by the client's samples of class c",
    )
    uncovered: Literal["zero", "previous"] = Field(
        "zero", description="server classifier entries no client covers: zero (paper) or previous value"
    )

    def to_config(self) -> MatchingConfig:
        """The same settings as the :class:`~hybridfl.matching.MatchingConfig` the matcher takes."""
        return MatchingConfig(**self.model_dump())


class HyFEMConfig(BaseModel):
    """HyFEM hyperparameters (``algorithm:`` section of a run config with ``name: hyfem``).

    ``variant: avg`` (HyFEM-Avg) forces ``mu1 = mu2 = 0``; ``variant: prox`` (HyFEM-Prox) uses the
    given proximal weights ``mu1`` (extractors) and ``mu2`` (classifier) in the local steps.

    ``device`` (``auto`` default: ``cuda`` when torch sees a GPU, else ``cpu``; ``cpu``; ``cuda``):
    where the server's, the clients' and the baselines' models and every tensor made from client
    data live (:func:`hybridfl.models.device.resolve_device`; the run's summary records the device
    under ``device``); messages stay NumPy arrays.

    Raises:
        pydantic.ValidationError: ``variant: avg`` with a proximal weight, ``matching.max_width``
            below ``hidden``, or ``device: cuda`` on a machine without a CUDA GPU.
    """

    model_config = ConfigDict(extra="forbid")
    simulation_only: ClassVar[frozenset[str]] = frozenset(
        {"eval_every", "test_subsample", "failure_rate", "baselines", "batched_clients", "device"}
    )
    """Settings of the simulation and the server's schedule, never sent to a client
    (:func:`hybridfl.config.client_settings_json`)."""
    name: Literal["hyfem"] = Field("hyfem", description="the algorithm (HyFEM, hybrid federated matching)")
    variant: Literal["avg", "prox"] = Field(
        "avg",
        description="avg: HyFEM-Avg (mu1 = mu2 = 0); prox: HyFEM-Prox (proximal weights mu1, mu2 in the local steps)",
    )
    rounds: int = Field(30, ge=1, description="communication rounds T")
    local_steps: int = Field(20, ge=1, description="local SGD steps Q per round")
    batch_size: int = Field(
        32, ge=1, description="samples per local SGD step, drawn with replacement (capped at the client's samples)"
    )
    lr: float = Field(0.05, gt=0, description="SGD step size eta")
    lr_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="multiply lr by this every lr_decay_every rounds (1: constant, TMLR Sec. 4; the workshop version's Sec. 4 uses 0.2 every 8)",
    )
    lr_decay_every: int = Field(0, ge=0, description="rounds between lr decays (0: never)")
    momentum: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="SGD momentum of the local steps (0: plain SGD, HyFEM Alg. 2); its buffer restarts every round",
    )
    mu1: float = Field(0.0, ge=0, description="proximal weight on the extractors (HyFEM-Prox)")
    mu2: float = Field(0.0, ge=0, description="proximal weight on the classifier (HyFEM-Prox)")
    extractor: Literal["auto", "mlp", "cnn"] = Field(
        "auto",
        description="feature extractor per block: auto: CNN for image blocks, MLP otherwise; mlp: MLP on the flattened block; cnn: CNN",
    )
    extractor_dim: int = Field(32, ge=1, description="output width e of every extractor")
    hidden: int = Field(64, ge=1, description="client classifier hidden width")
    matching: MatchingSettings = Field(
        default_factory=MatchingSettings, description="classifier matching settings (HyFEM Alg. 3)"
    )
    eval_every: int = Field(
        1,
        ge=0,
        description="evaluate after every k-th round and after the last (0: after the last only): the server model "
        "(all test samples) and every client's received model (test_subsample samples before the last round); the "
        "clients' own models after their Q local steps (simulation only) after the last round only, on all test "
        "samples (a whole model each: with many clients the costliest part of the evaluation)",
    )
    fraction_fit: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of the clients sampled each round, at least one (Flower's fraction_fit; 1: all, the paper's setting)",
    )
    test_subsample: int = Field(
        0,
        ge=0,
        description="the received models' accuracies on a fixed random subset of k test samples in the evaluated "
        "rounds before the last (0: all); the server model and the last round always use all test samples",
    )
    failure_rate: float = Field(0.0, ge=0, lt=1, description="simulated: probability that a client fails mid-round")
    secure_aggregation: bool = Field(
        False,
        description="mask the clients' extractors pairwise so the server learns only each block's weighted sum (our addition; the paper averages in the clear): hybridfl.algorithms.hyfem.secure",
    )
    secagg_threshold: int = Field(
        0,
        ge=0,
        description="secure aggregation threshold t (each client's own rule, against a malicious server): a client masks only in an exchange of at least t clients of its roster, itself included (at most the run's clients; HyFDCA segment mode: at most the holders of its pass's segments), and unmasks a dropped peer only if at least t of the exchange's clients survive (never itself, once per exchange); 0 (default): a majority and at least 2 (max(2, floor(m/2)+1) of the run's m clients to mask, of the exchange's m clients to unmask; HyFDCA cyclic participation: 2, a group being the round); 1 is refused; the server selects at least t clients a round and drops an exchange it could not unmask: hybridfl.privacy.secagg",
    )
    baselines: bool = Field(
        False,
        description="also train the centralised and stand-alone baselines with the same T*Q budget (each client alone: about the federation's training time again)",
    )
    batched_clients: bool = Field(
        False,
        description="simulation only: the clients of a round train as one batched model (each block's extractors and each classifier shape vmap-ed; hybridfl.algorithms.hyfem.batched); equal to the sequential run up to float rounding",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto",
        description="where the torch models and the tensors made from client data live: auto (cuda when torch sees a GPU, else cpu), cpu or cuda (hybridfl.models.device)",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return with_preset("hyfem", data)  # preset: paper (hybridfl.algorithms.presets)

    @model_validator(mode="after")
    def _check(self) -> HyFEMConfig:
        if self.variant == "avg" and (self.mu1 or self.mu2):
            raise ValueError("variant 'avg' has mu1 = mu2 = 0; use variant 'prox' for proximal terms")
        if self.matching.max_width is not None and self.matching.max_width < self.hidden:
            raise ValueError(f"matching.max_width {self.matching.max_width} is smaller than hidden {self.hidden}")
        if self.lr_decay < 1 and not self.lr_decay_every:
            raise ValueError(f"lr_decay {self.lr_decay:g} needs lr_decay_every >= 1 (the rounds between decays)")
        if self.secagg_threshold == 1:
            raise ValueError(
                "secagg_threshold 1 would let a client send its extractors unmasked: use 0 (a majority) or >= 2"
            )
        try:
            check_device(self.device)
        except ConfigError as e:
            raise ValueError(str(e).rstrip(".")) from None
        return self

    def lr_at(self, rnd: int) -> float:
        """The SGD step size of round ``rnd`` (1-based): ``lr * lr_decay ** floor((rnd - 1) /
        lr_decay_every)``, the step schedule of the HyFEM workshop version's Sec. 4 (``lr`` without
        decay, as TMLR Sec. 4, when ``lr_decay_every`` is 0)."""
        if not self.lr_decays:
            return float(self.lr)
        return float(self.lr * self.lr_decay ** ((int(rnd) - 1) // self.lr_decay_every))

    @property
    def lr_decays(self) -> bool:
        """Whether the step size changes over the rounds (``lr_decay < 1`` every ``lr_decay_every``
        rounds) rather than staying ``lr``."""
        return bool(self.lr_decay_every) and self.lr_decay < 1
