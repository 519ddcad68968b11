"""The intercept of the linear models (``fit_intercept``): the weight of a synthetic constant
feature block named :data:`INTERCEPT` (our addition; the HyFDCA paper fits no intercept).

With ``fit_intercept`` on, HyFDCA, hybrid FedAvg and the centralised solver fit
``min_{w, b} (lambda/2)(||w||^2 + b^2) + (1/N) sum_i l_i(x_i^T w + b)``: the intercept ``b`` is the
weight of one more feature whose value is 1.0 for every sample, so it is **regularised like every
other weight** (``lambda/2 * b^2``; liblinear regularises its intercept the same way when it
appends a constant column, scikit-learn's ``intercept_scaling``). The block is added after the
dataset's standardisation (which would turn a constant column into zeros), is never standardised,
is the last block of the schema and is held, for their own samples, by the clients that hold
labels. Several clients may then hold it for the same sample (a grid partition, where every
holder of a sample holds its labels): HyFDCA weights replicated cells by ``1 / c(s, b)`` and hybrid
FedAvg averages overlapping features, so the problem stays the centralised one with a constant
column.

Because it is just another block, every protocol path (encryption, secure aggregation, segment
mode, ``output: step_average``, PSI alignment, Flower, checkpoints, ``hybridfl run --federation``) carries
it unchanged. It is added in one place for both runtimes: each linear spec's ``build_client`` and
``build_server`` apply :func:`client_with_intercept` and :func:`server_with_intercept` to the
:class:`~hybridfl.data.export.ClientData` and :class:`~hybridfl.data.export.ServerData` they
receive (from memory in the simulation, from directories over Flower and ``run --federation``),
and the simulation's monitor and the centralised solver use :func:`split_with_intercept`. Nothing
is ever written to a client directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from hybridfl.data.dataset import DatasetSplit, HybridDataset, RowBlocks
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.errors import DataError

INTERCEPT = "intercept"
"""The name of the constant feature block whose weight is the intercept (also the name of the
``intercept`` array of a linear spec's ``final_arrays``)."""

FIT_INTERCEPT_DESCRIPTION = (
    "fit an intercept b: the weight of a constant feature block named 'intercept' (value 1.0, never standardised, "
    "held by the clients holding labels), regularised like every other weight (lambda/2 * b^2, as liblinear's "
    "intercept_scaling column); our addition, the HyFDCA paper (Sec. 2) fits none: "
    "hybridfl.algorithms.convex.intercept. The examples and benchmarks that reproduce the paper set it to false so "
    "their committed numbers stay valid"
)
"""The ``description`` of the ``fit_intercept`` field of HyFDCA, hybrid FedAvg and the centralised solver."""


def check_no_intercept_block(block_names, where: str) -> None:
    """The dataset must not already have a block named :data:`INTERCEPT`.

    Raises:
        DataError: it has one (one sentence naming ``where``).
    """
    if INTERCEPT in block_names:
        raise DataError(
            f"the dataset already has a block named {INTERCEPT!r}, which fit_intercept adds ({where}); "
            "rename that block or set algorithm.fit_intercept: false."
        )


def _ones(n: int) -> np.ndarray:
    return np.ones((n, 1), dtype=np.float32)


def dataset_with_intercept(ds: HybridDataset) -> HybridDataset:
    """``ds`` with the block :data:`INTERCEPT` (``(n, 1)``, all 1.0) appended last; a
    :meth:`~hybridfl.data.dataset.HybridDataset.view` stays a view (no feature is copied).

    Raises:
        DataError: ``ds`` already has a block of that name.
    """
    check_no_intercept_block(ds.block_names, f"dataset {ds.name!r}")
    if isinstance(ds.blocks, RowBlocks):
        base = dict(ds.blocks._base)
        rows = ds.blocks.rows
        n_base = len(next(iter(base.values()))) if base else ds.n_samples
        base[INTERCEPT] = _ones(n_base)
        blocks: Mapping[str, np.ndarray] = RowBlocks(base, [*ds.block_names, INTERCEPT], rows)
    else:
        blocks = {**ds.blocks, INTERCEPT: _ones(ds.n_samples)}
    return HybridDataset._trusted(ds.name, ds.ids, ds.y, blocks, ds.classes)


def schema_with_intercept(block_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The public block schema with :data:`INTERCEPT` ``(1,)`` appended last.

    Raises:
        DataError: the schema already has a block of that name.
    """
    check_no_intercept_block(block_shapes, "the block schema")
    return {**dict(block_shapes), INTERCEPT: (1,)}


def client_with_intercept(cd: ClientData) -> ClientData:
    """A client's data as a linear algorithm with ``fit_intercept`` sees it: the schema gains
    :data:`INTERCEPT`, and a client holding labels also holds that block for its samples (and, if
    it holds them, for its test samples). A client without labels is unchanged apart from the schema.

    Raises:
        DataError: the client's schema already has a block named :data:`INTERCEPT`.
    """
    schema = schema_with_intercept(cd.block_shapes)
    data, test = cd.data, cd.test
    if cd.has_labels:
        data = dataset_with_intercept(data)
        test = dataset_with_intercept(test) if test is not None else None
    return dataclasses.replace(cd, data=data, block_shapes=schema, test=test)


def server_with_intercept(sd: ServerData) -> ServerData:
    """The server's data as a linear algorithm with ``fit_intercept`` sees it: the schema gains
    :data:`INTERCEPT` (last), every client holding labels holds it in the public layout, and the
    test set (if any) has the constant block.

    Raises:
        DataError: the schema already has a block named :data:`INTERCEPT`.
    """
    schema = schema_with_intercept(sd.block_shapes)
    meta = dict(sd.meta)
    labels = meta.get("client_labels", {})
    if "client_blocks" in meta:
        meta["client_blocks"] = {
            c: [*bs, INTERCEPT] if bool(labels.get(c, True)) else list(bs) for c, bs in meta["client_blocks"].items()
        }
    test = dataset_with_intercept(sd.test) if sd.test is not None else None
    return dataclasses.replace(sd, block_shapes=schema, test=test, meta=meta)


def split_with_intercept(split: DatasetSplit, partition: Partition) -> tuple[DatasetSplit, Partition]:
    """The split (train and test with the constant block) and the partition (every client holding
    labels also holds :data:`INTERCEPT`) of the problem ``fit_intercept`` solves: for the
    simulation's monitor and the centralised reference.

    Raises:
        DataError: the dataset already has a block named :data:`INTERCEPT`.
    """
    out = DatasetSplit(dataset_with_intercept(split.train), dataset_with_intercept(split.test))
    clients = [dataclasses.replace(c, blocks=(*c.blocks, INTERCEPT)) if c.has_labels else c for c in partition.clients]
    return out, dataclasses.replace(partition, clients=clients)


def intercept_array(w: np.ndarray, offsets: Mapping[str, tuple[int, int]]) -> np.ndarray:
    """The ``intercept`` array of ``final_arrays``: a 1-element float64 array holding the weight of
    the :data:`INTERCEPT` block of ``w`` (``offsets``: block name -> ``(start, stop)`` in ``w``), or
    ``[0.0]`` when the model has no such block (``fit_intercept`` off)."""
    if INTERCEPT not in offsets:
        return np.zeros(1, dtype=np.float64)
    a, _ = offsets[INTERCEPT]
    return np.asarray(w, dtype=np.float64)[a : a + 1].copy()
