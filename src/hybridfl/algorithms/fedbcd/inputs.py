"""A party's model input from its feature blocks, and every check of FedBCD's inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hybridfl.algorithms.fedbcd.config import MAX_PARTIES, MIN_PARTIES, FedBCDConfig
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import Partition
from hybridfl.errors import ConfigError, DataError, PartitionError


def party_input(ds: HybridDataset, blocks: Sequence[str]) -> np.ndarray:
    """A party's model input from its blocks, float32: one block as is ``(N, *shape)``; several
    blocks flattened and concatenated in the given order ``(N, sum_b d_b)``.

    Raises:
        KeyError: a block that ``ds`` does not hold.
    """
    if len(blocks) == 1:
        return np.ascontiguousarray(ds.blocks[blocks[0]], dtype=np.float32)
    return np.concatenate([ds.blocks[b].reshape(ds.n_samples, -1) for b in blocks], axis=1).astype(np.float32)


def party_shape(schema: Mapping[str, Sequence[int]], blocks: Sequence[str]) -> tuple[int, ...]:
    """The per-sample shape :func:`party_input` gives for ``blocks``, from the public block
    ``schema`` (name -> per-sample shape) alone: one block as is, several flattened and summed.

    Raises:
        KeyError: a block that is not in ``schema``.
    """
    if len(blocks) == 1:
        return tuple(int(s) for s in schema[blocks[0]])
    return (int(sum(int(np.prod(schema[b])) for b in blocks)),)


def check_inputs(split: DatasetSplit, partition: Partition, cfg: FedBCDConfig) -> None:
    """Everything that can be wrong with the data and the partition, before any training.

    Raises:
        PartitionError: K outside 2..8, not exactly one label party, a party without blocks or
            without samples, or no sample held by every party.
        DataError: labels that are not binary (FedBCD here trains a logistic model), or a test
            set with one class only (AUC undefined).
        ConfigError: ``model: cnn`` for a party whose input is not one image block.
    """
    K = partition.n_clients
    if not MIN_PARTIES <= K <= MAX_PARTIES:
        raise PartitionError(f"FedBCD needs {MIN_PARTIES} to {MAX_PARTIES} parties, the partition has {K}.")
    labels = [c.client_id for c in partition.clients if c.has_labels]
    if len(labels) != 1:
        raise PartitionError(
            f"FedBCD needs exactly one label party, the partition has {len(labels)} ({', '.join(labels) or 'none'}); use a vertical partition with label_party."
        )
    for c in partition.clients:
        if not c.blocks:
            raise PartitionError(f"party {c.client_id!r} holds no feature block.")
        if c.n_samples == 0:
            raise PartitionError(f"party {c.client_id!r} holds no sample.")
    common = set(partition.clients[0].sample_ids.astype(str))
    for c in partition.clients[1:]:
        common &= set(c.sample_ids.astype(str))
    if not common:
        raise PartitionError("no sample ID is held by every party, so the parties cannot be aligned.")
    if split.train.n_classes != 2:
        raise DataError(
            f"FedBCD trains a binary logistic model, but dataset {split.name!r} has {split.train.n_classes} classes "
            "(for MNIST select two digits with dataset.classes, e.g. [3, 8])."
        )
    if len(np.unique(split.test.y)) < 2:
        raise DataError(f"the test set of dataset {split.name!r} holds only one class, so its AUC is undefined.")
    if cfg.model == "cnn":
        shapes = split.train.block_shapes
        for c in partition.clients:
            if len(c.blocks) != 1 or len(shapes[c.blocks[0]]) != 3:
                raise ConfigError(
                    f"algorithm.model 'cnn' needs every party to hold one image block, but party {c.client_id!r} holds {', '.join(c.blocks)}."
                )
