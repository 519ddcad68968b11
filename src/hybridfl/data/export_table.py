"""A dataset's rows as the raw table a model of it reads (``hybridfl export-table``)."""

from __future__ import annotations

import numpy as np

from hybridfl.config import DatasetConfig
from hybridfl.data.dataset import HybridDataset
from hybridfl.data.encoding import Encoding


def encoding_frame(ds: HybridDataset, encoding: Encoding):
    """The raw table of ``ds`` (not standardised) in ``encoding``'s columns: the ID column, every
    block's columns (a categorical column's level from its one-hot features) and the label column.

    Returns:
        a pandas DataFrame, one row per sample, in ``ds`` order.
    """
    import pandas as pd

    n = ds.n_samples
    cols: dict[str, np.ndarray] = {encoding.id_column or "id": ds.ids}
    for b in encoding.blocks:
        x = np.asarray(ds.blocks[b.name]).reshape(n, -1)
        j = 0
        for c in b.columns:
            if c.kind == "categorical":
                k = len(c.levels or [])
                cols[c.name] = np.asarray(c.levels, dtype=object)[x[:, j : j + k].argmax(axis=1)]
                j += k
            else:
                cols[c.name] = x[:, j].astype(np.float64)
                j += 1
    cols[encoding.label_column or "label"] = np.asarray(encoding.classes, dtype=object)[ds.y]
    return pd.DataFrame(cols)


def raw_table(cfg: DatasetConfig, seed: int, part: str = "test"):
    """The ``part`` (``test`` or ``train``) rows of the dataset ``cfg`` names, as loaded for a run
    with ``seed`` but not standardised (a model standardises them itself), in the columns of the
    dataset's encoding (:func:`encoding_frame`).

    Raises:
        HybridFLError: the dataset cannot be loaded (one sentence).
    """
    from hybridfl.data.from_config import load_dataset

    split = load_dataset(cfg.model_copy(update={"standardize": False}), seed)
    return encoding_frame(split.test if part == "test" else split.train, split.encoding)
