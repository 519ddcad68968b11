"""Turning a :class:`HybridDataset` into a binary linear problem: features, labels in {-1, +1}.

Features of a sample are its blocks flattened and concatenated in the global block order (the
public schema), so feature ``f`` of block ``b`` has the same global index at every client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hybridfl.data.dataset import HybridDataset
from hybridfl.errors import DataError


def block_offsets(block_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, int]]:
    """Block name -> ``(start, stop)`` of its features in the global feature vector."""
    out, pos = {}, 0
    for b, shape in block_shapes.items():
        n = int(np.prod(shape)) if len(shape) else 1
        out[b] = (pos, pos + n)
        pos += n
    return out


def feature_index(blocks: Sequence[str], offsets: Mapping[str, tuple[int, int]]) -> np.ndarray:
    """Global feature indices of the given blocks (in the given order), shape ``(d_k,)``."""
    if not blocks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(*offsets[b]) for b in blocks]).astype(np.int64)


def features(
    ds: HybridDataset, blocks: Sequence[str] | None = None, sparse: str | bool = "auto", density: float = 0.25
):
    """``(n, d)`` float64 matrix of the blocks (flattened, concatenated), dense or CSR.

    ``sparse``: ``"auto"`` gives CSR when the share of non-zeros is below ``density``.
    """
    names = ds.block_names if blocks is None else list(blocks)
    X = np.concatenate([ds.blocks[b].reshape(ds.n_samples, -1) for b in names], axis=1).astype(np.float64)
    if sparse == "auto":
        sparse = X.size > 0 and np.count_nonzero(X) / X.size < density
    return sp.csr_matrix(X) if sparse in (True, "sparse") else X


def positive_set(ds: HybridDataset, positive_classes: Sequence[int] | None, loss: str, where: str) -> list[int]:
    """Class indices mapped to +1 (the rest to -1).

    Raises:
        DataError: more than two classes and no ``positive_classes``, or a class index out of
            range, or a labelling that leaves one side empty (one sentence, names ``where``).
    """
    C = ds.n_classes
    if positive_classes is None:
        if C != 2:
            raise DataError(
                f"{loss} loss needs binary labels but dataset {ds.name!r} has {C} classes ({where}); "
                "set algorithm.positive_classes to the class indices that map to +1."
            )
        return [1]
    pos = sorted({int(c) for c in positive_classes})
    bad = [c for c in pos if c < 0 or c >= C]
    if bad:
        raise DataError(
            f"positive class {bad[0]} is outside the {C} classes [0, {C - 1}] of dataset {ds.name!r} ({where})."
        )
    if len(pos) == C:
        raise DataError(
            f"positive_classes lists every class of dataset {ds.name!r}, so no sample is labelled -1 ({where})."
        )
    return pos


def signed_labels(y: np.ndarray, positive: Sequence[int]) -> np.ndarray:
    """``(n,)`` float64 labels: +1 for classes in ``positive``, -1 otherwise."""
    return np.where(np.isin(y, list(positive)), 1.0, -1.0)
