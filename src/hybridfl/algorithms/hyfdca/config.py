"""HyFDCA settings: :class:`HyFDCAConfig` (the ``algorithm:`` section with ``name: hyfdca``).

The fields choose the LocalDualMethod variant (``dual_mode``, see :mod:`.client` and
:mod:`.segment`), partial participation (HyFDCA Assumptions 5 and 7), simulated failures, the
encryption and secure aggregation, the output model (:mod:`.output`) and the evaluation
(centralised reference optimum). The defaults are the best settings measured (segment mode,
each round's step average, CKKS with masked inner products); ``preset: paper`` restores the
paper's protocol (:mod:`hybridfl.algorithms.presets`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from hybridfl.algorithms.convex.intercept import FIT_INTERCEPT_DESCRIPTION
from hybridfl.algorithms.presets import with_preset

PAPER_LATENCY = 0.2575
"""Seconds per round trip that HyFDCA's experiments model (HyFDCA Sec. 5.1, Fig. 3/5): each
exchange adds this to a round's modelled time."""

AVERAGE_LAST_SHARE = 0.5
"""``output: average_last`` averages the iterates of this share of the final rounds (the second
half, as SDCA's averaged output: Shalev-Shwartz & Zhang 2013, Thm. 2)."""

REMOVED = {
    "average_last": "output: average_last (the mean of the second half of the rounds' iterates)",
    "step_average": "output: step_average",
    "cross": "nothing (a client's own dual changes always enter its inner-product estimate)",
    "smoothing": "nothing (the local steps solve the plain hinge)",
    "smoothing_decay": "nothing (the local steps solve the plain hinge)",
    "smoothing_min": "nothing (the local steps solve the plain hinge)",
    "bandwidth_mbps": "nothing (results.json counts each round's bytes)",
    "latency": f"nothing (the modelled time uses the paper's {PAPER_LATENCY} s per exchange; results.json counts the exchanges)",
    "sparse": "nothing (a client stores its features as CSR below 50 % non-zeros)",
    "local_steps": "local_fraction (H as a share of the client's samples)",
    "cyclic_groups": "participation (cyclic mode forms round(1 / participation) groups)",
    "precision_bits": "the key's own setting (hybridfl he-keys --precision-bits; simulation: 40)",
    "ckks_degree": "the key's own setting (hybridfl he-keys --ckks-degree; simulation: 4096)",
    "ckks_scale_bits": "the key's own setting (hybridfl he-keys --ckks-scale-bits; simulation: 40)",
    "ckks_secret_key_encryption": "nothing (CKKS clients always encrypt with their shared secret key)",
}
"""Settings that are gone, and what replaced each (named when a config still gives one)."""


class HyFDCAConfig(BaseModel):
    """HyFDCA settings (``algorithm:`` section with ``name: hyfdca``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    simulation_only: ClassVar[frozenset[str]] = frozenset(
        {"failure_rate", "eval_every", "reference", "reference_sdca_epochs"}
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
    local_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="H, the SDCA steps per client and round, as a share of the client's samples (segment mode: of its segments' mini-batches)",
    )
    local_epochs: int = Field(
        1, ge=1, description="passes over the H chosen samples per round (each in a fresh random order)"
    )
    dual_mode: Literal["block", "consensus", "segment"] = Field(
        "segment",
        description="block: each client keeps the dual variables of its own cell (the paper's protocol as implemented here); consensus: one alpha per sample, averaged over its holders (paper Alg. 1); segment: one alpha per sample, the holders of a segment step together with exact inner products (mini-batch exchanges and batch Gram matrices; our variant)",
    )
    batch_size: int = Field(
        1024,
        ge=1,
        description="segment mode: samples per mini-batch (one inner-product exchange per batch and round; the batch Gram is summed once at setup). Larger batches mean fewer exchanges (a sequential round has segments x (1 + batches per segment), one more per segment with secure aggregation), a setup growing with the batch, and holders that learn the inner products of more pairs of their own samples: docs/results.md",
    )
    segment_inner_products: Literal["encrypted", "masked"] = Field(
        "masked",
        description="segment mode: how the holders' shares of each mini-batch's inner products (and the batch Gram matrices at setup) cross the server: encrypted: under the run's encryption (the paper's SecureInnerProduct); masked: one-time pads from keys only the segment's holders share, so an honest-but-curious server sees uniform words (our addition; needs secure_aggregation, whose keys seal the pads' keys; the duals stay under the run's encryption): hybridfl.privacy.segmask. The default masked applies in segment mode with secure aggregation, encrypted otherwise",
    )
    segment_schedule: Literal["sequential", "parallel"] = Field(
        "sequential",
        description="segment mode: sequential: the active segments take their passes one after another, each from the w the previous one left (exact SDCA over the union, sigma' = 1); parallel: all at once (CoCoA+ over segments, sigma' = number of active segments; fewer exchanges)",
    )
    sigma: float | None = Field(
        None,
        gt=0,
        description="CoCoA+ safety factor sigma' (default: clients (block), segments (consensus), segments stepping together (segment))",
    )
    nu: float = Field(
        1.0,
        gt=0,
        description="dual aggregation weight nu (HyFDCA Alg. 1 line 13; 1 averages over the clients of a sample)",
    )
    output: Literal["last", "average_last", "step_average"] = Field(
        "step_average",
        description="the output model: last: each round's last iterate (HyFDCA Alg. 1); average_last: the mean of the iterates of the second half of the rounds (suffix averaging, SDCA's averaged output for non-smooth losses; w and alpha both averaged, so the duality gap still certifies it); step_average: segment mode, each round's output is the mean of the iterates after every SDCA step of the round and the round before (Shalev-Shwartz & Zhang 2013 Thm. 2 over two rounds; one more vector per client in each PrimalAggregation; the server learns this model too; our addition: hybridfl.algorithms.hyfdca.output). The default step_average applies in segment mode, last otherwise",
    )
    participation: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share (or probability) of clients per round; cyclic mode: 1 / the number of groups",
    )
    participation_mode: Literal["fraction", "probability", "cyclic"] = Field(
        "fraction",
        description="how the round's clients are chosen: fraction: a random subset of round(participation x clients); probability: each client independently with probability participation (both at least one client); cyclic: round(1 / participation) groups, client i in rounds t with i mod groups = (t - 1) mod groups (HyFDCA Assumption 7)",
    )
    failure_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="probability that a selected client fails mid-round (does its work, its replies never arrive)",
    )
    positive_classes: list[int] | None = Field(
        None, description="class indices labelled +1 (required with more than 2 classes)"
    )
    alignment: Literal["psi", "plaintext"] = Field(
        "psi",
        description="how the holder sets of the samples are found: psi: pairwise private set intersection between the clients, relayed by the server as opaque blobs (the server learns holder sets and sizes, never an ID; our addition); plaintext: every client sends its sample IDs to the server (the paper's setting; faster): hybridfl.algorithms.hyfdca.align",
    )
    encryption: Literal["none", "paillier", "ckks"] = Field(
        "ckks",
        description="homomorphic encryption of what the clients send for the server to add (enc(alpha), squared norms, inner-product shares): none (plaintext), paillier (exact fixed point, the paper's scheme), ckks (approximate, about 1e-8 per value; the clients encrypt with their shared secret key, SEAL's symmetric encryption); the server holds only the public key: hybridfl.privacy.he",
    )
    secure_aggregation: bool = Field(
        True,
        description="mask the primal shares pairwise so the server learns only their sum per feature (our addition; the paper sends them in the clear): hybridfl.algorithms.hyfdca.secure",
    )
    secagg_threshold: int = Field(
        0,
        ge=0,
        description="secure aggregation threshold t (each client's own rule, against a malicious server): a client masks only in an exchange of at least t clients of its roster, itself included (at most the run's clients; HyFDCA segment mode: at most the holders of its pass's segments), and unmasks a dropped peer only if at least t of the exchange's clients survive (never itself, once per exchange); 0 (default): a majority and at least 2 (max(2, floor(m/2)+1) of the run's m clients to mask, of the exchange's m clients to unmask; HyFDCA cyclic participation: 2, a group being the round); 1 is refused; the server selects at least t clients a round and drops an exchange it could not unmask: hybridfl.privacy.secagg",
    )
    paillier_bits: int = Field(
        2048,
        ge=256,
        description="Paillier modulus bits of the simulation's key; clients refuse keys below 2048 unless HYBRIDFL_ALLOW_WEAK_KEYS=1 (tests only)",
    )
    eval_every: int = Field(1, ge=0, description="evaluate every k rounds and after the last (0: only after the last)")
    reference: bool = Field(True, description="compute (or load from the cache) the centralised reference optimum")
    reference_sdca_epochs: int = Field(
        200,
        ge=1,
        description="SDCA epochs of the reference solve (P* is the best of liblinear and this SDCA run; cached per problem)",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_and_removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, now in REMOVED.items():
                if key in data:
                    raise PydanticCustomError(
                        "removed_setting", "setting {key} was removed; use {now}", {"key": repr(key), "now": now}
                    )
        return with_preset("hyfdca", data)

    @model_validator(mode="after")
    def _check(self) -> HyFDCAConfig:
        given = self.model_fields_set
        segment = self.dual_mode == "segment"
        if self.segment_inner_products == "masked" and not (segment and self.secure_aggregation):
            if "segment_inner_products" not in given:  # the default fits segment mode with secure aggregation
                object.__setattr__(self, "segment_inner_products", "encrypted")
            elif not segment:
                raise ValueError("segment_inner_products 'masked' needs dual_mode 'segment'")
            else:
                raise ValueError(
                    "segment_inner_products 'masked' needs secure_aggregation (its keys seal the segment keys)"
                )
        if self.output == "step_average" and not segment:
            if "output" in given:
                raise ValueError("output 'step_average' needs dual_mode 'segment' (its exact steps give the iterates)")
            object.__setattr__(self, "output", "last")  # the default fits segment mode
        if self.participation_mode == "cyclic" and self.participation > 0.5:
            raise ValueError("participation_mode 'cyclic' needs participation <= 0.5 (round(1 / participation) groups)")
        if self.secagg_threshold == 1:
            raise ValueError(
                "secagg_threshold 1 would let a client send its share unmasked: use 0 (a majority) or >= 2"
            )
        if self.participation_mode == "cyclic" and self.secagg_threshold == 0:  # a group (the round) is no majority
            object.__setattr__(self, "secagg_threshold", 2)
        return self

    @property
    def cyclic_groups(self) -> int:
        """The number of cyclic client groups: ``round(1 / participation)`` (HyFDCA Assumption 7)."""
        return max(2, round(1 / self.participation))

    @property
    def average_last(self) -> float:
        """The share of the final rounds averaged into the output model (0: no suffix averaging)."""
        return AVERAGE_LAST_SHARE if self.output == "average_last" else 0.0

    @property
    def step_average(self) -> bool:
        """Whether each round's output is the mean of its SDCA steps' iterates (``output: step_average``)."""
        return self.output == "step_average"
