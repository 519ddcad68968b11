"""The exported model of the linear algorithms (HyFDCA, hybrid FedAvg): ``w`` cut per block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hybridfl.inference.modeldir import ModelParts

INTERCEPT_BLOCK = "intercept"
"""The name of the constant feature block whose weight is the intercept, when a run fits one."""


def linear_parts(
    w: np.ndarray,
    offsets: Mapping[str, tuple[int, int]],
    loss: str,
    positive_classes: Sequence[int] | None,
    intercept: float | None = None,
) -> ModelParts:
    """A linear model as :class:`~hybridfl.inference.modeldir.ModelParts`: ``w.<block>`` (the
    block's slice ``w[start:stop]`` of the global ``(d,)`` vector, float64) for every block of
    ``offsets`` (global order), and ``intercept`` ``(1,)``: the weight of the constant block
    :data:`INTERCEPT_BLOCK` if the schema has one, else ``intercept`` (0 without one).

    Settings: ``loss``, ``positive_classes`` (default ``[1]``: binary data).
    """
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    tensors = {f"w.{b}": w[a:z].copy() for b, (a, z) in offsets.items() if b != INTERCEPT_BLOCK}
    b0 = float(intercept) if intercept is not None else 0.0
    if INTERCEPT_BLOCK in offsets:
        a, z = offsets[INTERCEPT_BLOCK]
        b0 = float(w[a:z].sum())
    tensors["intercept"] = np.array([b0], dtype=np.float64)
    pos = sorted({int(c) for c in positive_classes}) if positive_classes else [1]
    return ModelParts("linear", tensors, {"loss": loss, "positive_classes": pos})
