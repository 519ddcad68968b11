"""Named presets of an algorithm's settings: ``algorithm: {name: hyfdca, preset: paper}``.

The defaults of every algorithm config are the best settings measured here (docs/results.md);
a preset restores another coherent set in one line, above all ``paper``: the protocol of the
algorithm's paper. A preset fills only the fields the config does not give: an explicit field
always wins (``{preset: paper, encryption: none}`` is the paper's protocol without encryption).
``hybridfl algorithms --describe NAME`` lists each preset's values (:func:`describe_presets`).

HyFDCA ``paper`` (Nguyen et al., HyFDCA): the hinge loss without intercept (Sec. 2's problem,
Sec. 5 "We use the hinge loss"), the dual kept per client cell (``dual_mode: block``, this
implementation's reading of Alg. 1 with Alg. 5's LocalDualMethod), the last iterate as the
output (Alg. 1 returns ``w^T``), Paillier encryption of ``alpha`` and the inner-product shares
(Sec. 3.1 names Paillier and its timings; the experiments added published timings instead of
encrypting, Sec. 5.1), the inner products under that encryption (Alg. 2 SecureInnerProduct),
the primal shares in the clear (Alg. 4 PrimalAggregation), and sample IDs known to the server
(``alignment: plaintext``; the paper assumes the holder sets ``B_n`` known).

HyFEM ``paper`` (Zhang et al., HyFEM, workshop version Sec. 4): HyFEM-Avg, ``T = 32`` rounds of
``Q = 32`` local steps of plain SGD on mini-batches of 32, ``eta = 0.005`` decayed by 0.2 every 8
rounds, the extractors averaged in the clear; the matching keeps its defaults, which are the
paper's (PFNM, TMLR Appendix A).

FedBCD ``paper`` (Liu et al., FedBCD, Sec. 8, the MNIST-CNN task of Table 1, the one reproduced
here): FedBCD-p (Alg. 2; Table 1's fastest, "the running time of FedBCD-s doubles that of
FedBCD-p") with ``Q = 5`` local steps (Table 1, MNIST-CNN: 8 rounds to AUC 99.7 %, the fewest),
mini-batches of 256 ("We fix the batch size to 64 and 256 for MIMIC-LR and MNIST-CNN"), plain
SGD steps ``theta_k <- theta_k - eta g_k`` (Alg. 2) with the received ``H_{-k}`` kept for all
``Q`` steps (eq. (7), "staled information"), ``eta_t = eta_0 / sqrt(t + 1)`` ("For all
experiments, we adopt a decay learning rate strategy"), CNN towers of 64 channels and 256 units
("two 3x3 convolution layers that each has 64 channels and are followed by a fully connected
layer with 256 units"; the kernels are the reference code's 2x2,
:class:`hybridfl.models.towers.PaperCNNTower`), each party's slice of the logistic top layer
("a single value per sample", Sec. 1; "the logistic regression model with 512 parameters",
Sec. 8) with its intercept (eq. (2)), no L2 term. Not in the preset: ``eta_0`` (the paper gives
none: "eta_0 is optimized for each experiment"; the default or an explicit ``lr`` applies), the
two parties (Sec. 8 splits each image into two 28x14 halves; the ``partition:`` section says
so), and ``mu`` (FedPBCD-p's 0.1 of Sec. 8 "Proximal Gradient Descent" / Fig. 4b is already the
default of ``variant: prox``). The paper's other tasks: MIMIC-LR is the same protocol with
``model: linear`` and ``batch_size: 64`` (Sec. 8); NUS-FTL uses one-hidden-layer towers of 64
units (``model: mlp``, ``representation_dim: 64``) and Q up to 100 (Fig. 3, 4); Credit-FTL runs
FedBCD-p with Q = 5 and 10 under homomorphic encryption (Table 2), no batch size given.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "hyfdca": {
        "paper": {
            "loss": "hinge",
            "fit_intercept": False,
            "dual_mode": "block",
            "output": "last",
            "encryption": "paillier",
            "segment_inner_products": "encrypted",
            "secure_aggregation": False,
            "alignment": "plaintext",
        },
    },
    "hyfem": {
        "paper": {
            "variant": "avg",
            "rounds": 32,
            "local_steps": 32,
            "batch_size": 32,
            "lr": 0.005,
            "lr_decay": 0.2,
            "lr_decay_every": 8,
            "momentum": 0.0,
            "secure_aggregation": False,
        },
    },
    "fedbcd": {
        "paper": {
            "variant": "p",
            "local_steps": 5,
            "batch_size": 256,
            "optimizer": "sgd",
            "local_gradient": "fixed",
            "lr_decay": "sqrt",
            "model": "cnn",
            "channels": 64,
            "representation_dim": 256,
            "top": "party_slice",
            "fit_intercept": True,
            "l2": 0.0,
        },
    },
}
"""algorithm name -> preset name -> the settings it fills (field -> value)."""


def with_preset(algorithm: str, data: Any) -> Any:
    """``data`` (an algorithm section, before validation) with its ``preset`` key replaced by the
    preset's settings; the section's own fields override them. Anything but a mapping with a
    ``preset`` key is returned unchanged.

    Raises:
        PydanticCustomError: the preset is not a string or not one of ``algorithm``'s presets
            (one sentence listing them).
    """
    if not isinstance(data, dict) or "preset" not in data:
        return data
    name = data["preset"]
    known = PRESETS.get(algorithm, {})
    if not isinstance(name, str) or name not in known:
        names = ", ".join(sorted(known)) or "none"
        raise PydanticCustomError(
            "unknown_preset",
            "preset {name} is not a preset of {algorithm} (presets: {names})",
            {"name": repr(name), "algorithm": algorithm, "names": names},
        )
    return {**known[name], **{k: v for k, v in data.items() if k != "preset"}}


def describe_presets(algorithm: str) -> list[str]:
    """Lines for ``hybridfl algorithms --describe``: each preset of ``algorithm`` and the values
    it sets (none when it has no preset)."""
    lines = []
    for name, values in PRESETS.get(algorithm, {}).items():
        body = ", ".join(f"{k}: {_text(v)}" for k, v in values.items())
        lines.append(f"preset: {name} (explicit options override it): {body}")
    return lines


def _text(v: Any) -> str:
    """A preset value as YAML writes it (booleans lower case)."""
    return str(v).lower() if isinstance(v, bool) else str(v)
