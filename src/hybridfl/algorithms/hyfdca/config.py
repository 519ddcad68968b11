"""HyFDCA settings: :class:`HyFDCAConfig` (the ``algorithm:`` section with ``name: hyfdca``).

The fields choose the LocalDualMethod variant (``dual_mode``, see :mod:`.client` and
:mod:`.segment`), partial participation (HyFDCA Assumptions 5 and 7), simulated failures, the
encryption scheme and its parameters (:mod:`hybridfl.privacy.he`), the modelled network
(``latency`` per exchange, ``bandwidth_mbps``), suffix averaging of the output model and the
evaluation (centralised reference optimum).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from hybridfl.algorithms.convex.intercept import FIT_INTERCEPT_DESCRIPTION

PAPER_LATENCY = 0.2575
"""Seconds per round trip that HyFDCA's experiments model (HyFDCA Sec. 5.1, Fig. 3/5)."""


class HyFDCAConfig(BaseModel):
    """HyFDCA settings (``algorithm:`` section with ``name: hyfdca``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    simulation_only: ClassVar[frozenset[str]] = frozenset(
        {"failure_rate", "latency", "bandwidth_mbps", "eval_every", "reference", "reference_sdca_epochs"}
    )
    """Settings of the simulation and the server's schedule, never sent to a client
    (:func:`hybridfl.config.client_settings_json`)."""
    name: Literal["hyfdca"] = Field(
        "hyfdca", description="the algorithm (HyFDCA, hybrid federated dual coordinate ascent)"
    )
    loss: Literal["hinge", "logistic", "squared"] = Field(
        "hinge",
        description="loss l of the L2-regularised linear problem on labels +-1: hinge (SVM), logistic or squared",
    )
    lam: float = Field(
        1e-4, gt=0, validation_alias=AliasChoices("lam", "lambda"), description="L2 regulariser lambda (> 0)"
    )
    fit_intercept: bool = Field(True, description=FIT_INTERCEPT_DESCRIPTION)
    rounds: int = Field(100, ge=1, description="outer iterations T")
    local_steps: int | None = Field(
        None, ge=1, description="H: SDCA steps per client per round (default: local_fraction of its samples)"
    )
    local_fraction: float = Field(
        1.0, gt=0, le=1, description="H as a share of the client's samples when local_steps is not set"
    )
    local_epochs: int = Field(
        1, ge=1, description="passes over the H chosen samples per round (each in a fresh random order)"
    )
    dual_mode: Literal["block", "consensus", "segment"] = Field(
        "block",
        description="block: each client keeps the dual variables of its own cell; consensus: one alpha per sample, averaged over its holders (paper Alg. 1); segment: one alpha per sample, the holders of a segment step together with exact inner products (mini-batch exchanges and batch Gram matrices)",
    )
    batch_size: int = Field(
        512,
        ge=1,
        description="segment mode: samples per mini-batch (one inner-product exchange per batch and round; the batch Gram is summed once at setup). Larger batches mean fewer exchanges (a faster round, above all under CKKS: benchmarks/results/hyfdca_speed_batches.md), a setup growing with the batch, and holders that learn the inner products of more pairs of their own samples",
    )
    segment_inner_products: Literal["encrypted", "masked"] = Field(
        "encrypted",
        description="segment mode: how the holders' shares of each mini-batch's inner products (and the batch Gram matrices at setup) cross the server: encrypted: under the run's encryption (the paper's SecureInnerProduct); masked: one-time pads from keys only the segment's holders share, so an honest-but-curious server sees uniform words (our addition; needs secure_aggregation, whose keys seal the pads' keys; the duals stay under the run's encryption): hybridfl.privacy.segmask",
    )
    segment_schedule: Literal["sequential", "parallel"] = Field(
        "sequential",
        description="segment mode: sequential: the active segments take their passes one after another, each from the w the previous one left (exact SDCA over the union, sigma' = 1); parallel: all at once (CoCoA+ over segments, sigma' = number of active segments)",
    )
    sigma: float | None = Field(
        None,
        gt=0,
        description="CoCoA+ safety factor sigma' (default: clients (block), segments (consensus), segments stepping together (segment))",
    )
    cross: Literal["own", "energy", "none"] = Field(
        "own", description="how a client's own dual changes enter its inner-product estimate"
    )
    nu: float = Field(1.0, gt=0, description="dual aggregation weight nu (1 averages over the clients of a sample)")
    smoothing: float = Field(
        0.0,
        ge=0,
        description="hinge only: gamma of the smoothed hinge the local steps solve in round 1 (0: the plain hinge)",
    )
    smoothing_decay: float = Field(
        1.0, gt=0, le=1, description="hinge smoothing: gamma is multiplied by this every round (1: constant)"
    )
    smoothing_min: float = Field(
        0.0,
        ge=0,
        description="hinge smoothing: the floor below which gamma does not decay (gamma of round t = max(smoothing_min, smoothing * smoothing_decay^(t-1)))",
    )
    participation: float = Field(1.0, gt=0, le=1, description="share (or probability) of clients per round")
    participation_mode: Literal["fraction", "probability", "cyclic"] = Field(
        "fraction",
        description="how the round's clients are chosen: fraction: a random subset of round(participation x clients); probability: each client independently with probability participation (both at least one client); cyclic: client i in rounds t with i mod cyclic_groups = (t - 1) mod cyclic_groups (participation unused)",
    )
    cyclic_groups: int = Field(2, ge=2, description="number of cyclic client groups (participation_mode: cyclic)")
    failure_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="probability that a selected client fails mid-round (does its work, its replies never arrive)",
    )
    positive_classes: list[int] | None = Field(
        None, description="class indices labelled +1 (required with more than 2 classes)"
    )
    sparse: Literal["auto", "dense", "sparse"] = Field(
        "auto", description="client feature storage (auto: CSR below 25 % non-zeros)"
    )
    alignment: Literal["psi", "plaintext"] = Field(
        "psi",
        description="how the holder sets of the samples are found: psi: pairwise private set intersection between the clients, relayed by the server as opaque blobs (the server learns holder sets and sizes, never an ID; our addition); plaintext: every client sends its sample IDs to the server (the paper's setting; faster): hybridfl.algorithms.hyfdca.align",
    )
    encryption: Literal["none", "paillier", "ckks"] = Field(
        "none",
        description="homomorphic encryption of what the clients send for the server to add (enc(alpha), squared norms, inner-product shares): none (plaintext), paillier (exact fixed point, precision_bits), ckks (approximate, about 1e-8 per value); the server holds only the public key: hybridfl.privacy.he",
    )
    secure_aggregation: bool = Field(
        True,
        description="mask the primal shares pairwise so the server learns only their sum per feature (our addition; the paper sends them in the clear): hybridfl.algorithms.hyfdca.secure",
    )
    secagg_threshold: int = Field(
        2,
        ge=2,
        description="secure aggregation threshold t (each client's own rule, against a malicious server): a client masks only in an exchange of at least t clients of its roster, itself included (at most the run's clients; HyFDCA segment mode: at most the holders of its pass's segments), and unmasks a dropped peer only if at least t of the exchange's clients survive (never itself, once per exchange); the server selects at least t clients a round and drops an exchange it could not unmask: hybridfl.privacy.secagg",
    )
    paillier_bits: int = Field(
        2048,
        ge=256,
        description="Paillier modulus bits; clients refuse keys below 2048 unless HYBRIDFL_ALLOW_WEAK_KEYS=1 (tests only)",
    )
    precision_bits: int = Field(40, ge=16, le=60, description="Paillier fixed-point fraction bits")
    ckks_degree: Literal[4096, 8192, 16384] = Field(
        8192,
        description="CKKS polynomial modulus degree (degree / 2 values per ciphertext); 4096 is refused (too small for the 120-bit coefficient modulus), and clients refuse keys below 8192 unless HYBRIDFL_ALLOW_WEAK_KEYS=1",
    )
    ckks_scale_bits: int = Field(
        40,
        ge=20,
        le=50,
        description="CKKS scale 2**ckks_scale_bits: each bit less halves the precision and doubles the largest encodable value (2**18 at 40)",
    )
    ckks_secret_key_encryption: bool = Field(
        False,
        description="CKKS: the clients encrypt with their shared secret key (SEAL's symmetric encryption, 2.4x less CPU per ciphertext; the same ciphertexts for the server, which still only adds; our addition) instead of the public key: hybridfl.privacy.he.CKKSBackend.with_secret_key_encryption",
    )
    latency: float = Field(PAPER_LATENCY, ge=0, description="modelled seconds per round trip (paper: 0.2575)")
    bandwidth_mbps: float | None = Field(None, gt=0, description="modelled link bandwidth; None: bytes cost no time")
    average_last: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the final rounds whose iterates are averaged into the output model (suffix averaging of w and alpha, SDCA's averaged output for non-smooth losses; 0.5: the second half; 0: the last iterate)",
    )
    step_average: bool = Field(
        False,
        description="segment mode: each round's output model is the mean of the iterates after every SDCA step of the round (SDCA's averaged output, Shalev-Shwartz & Zhang 2013 Thm. 2, taken over one round) instead of the round's last iterate (the default, HyFDCA Alg. 1); the algorithm still steps from the last iterate. Costs one more vector per client in each PrimalAggregation; the server learns this averaged model too (our addition): hybridfl.algorithms.hyfdca.output",
    )
    eval_every: int = Field(1, ge=0, description="evaluate every k rounds and after the last (0: only after the last)")
    reference: bool = Field(True, description="compute (or load from the cache) the centralised reference optimum")
    reference_sdca_epochs: int = Field(
        200,
        ge=1,
        description="SDCA epochs of the reference solve (P* is the best of liblinear and this SDCA run; cached per problem)",
    )

    @model_validator(mode="after")
    def _check(self) -> HyFDCAConfig:
        if self.segment_inner_products == "masked" and self.dual_mode != "segment":
            raise ValueError("segment_inner_products 'masked' needs dual_mode 'segment'")
        if self.segment_inner_products == "masked" and not self.secure_aggregation:
            raise ValueError(
                "segment_inner_products 'masked' needs secure_aggregation (its keys seal the segment keys)"
            )
        if self.step_average and self.dual_mode != "segment":
            raise ValueError("step_average needs dual_mode 'segment' (its exact steps give the iterates to average)")
        return self
