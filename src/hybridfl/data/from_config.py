"""Build the dataset split and the partition that a run config describes."""

from __future__ import annotations

from hybridfl.config import DatasetConfig, PartitionConfig
from hybridfl.data.dataset import DatasetSplit, HybridDataset, standardize
from hybridfl.data.encoding import default_encoding
from hybridfl.data.loaders import load_adult, load_credit_default, load_digits, load_mfeat, load_mnist, load_table
from hybridfl.data.partition import Partition
from hybridfl.data.partitioners import (
    ClassBlockPartitioner,
    ClassPartitioner,
    ClientSpec,
    DirichletPartitioner,
    GridPartitioner,
    IIDPartitioner,
    VerticalPartitioner,
)
from hybridfl.errors import ConfigError


def _need_dir(cfg: DatasetConfig) -> str:
    if not cfg.data_dir:
        raise ConfigError(f"dataset {cfg.name!r} needs 'dataset.data_dir' (the directory with its files).")
    return cfg.data_dir


def load_dataset(cfg: DatasetConfig, seed: int = 0) -> DatasetSplit:
    """Load the train/test split a :class:`DatasetConfig` names.

    Raises:
        ConfigError: a needed setting is missing; DataError: the files are missing or malformed.
    """
    if cfg.name == "digits":
        split = load_digits(
            cfg.layout, cfg.tiles, True if cfg.flatten is None else cfg.flatten, cfg.test_fraction, seed
        )
    elif cfg.name == "mnist":
        split = load_mnist(_need_dir(cfg), cfg.layout, cfg.tiles, bool(cfg.flatten), cfg.classes)
    elif cfg.name == "mfeat":
        split = load_mfeat(_need_dir(cfg), test_fraction=cfg.test_fraction, seed=seed)
    elif cfg.name == "credit_default":
        split = load_credit_default(_need_dir(cfg), cfg.test_fraction, seed)
    elif cfg.name == "adult":
        split = load_adult(_need_dir(cfg))
    else:
        if not cfg.path:
            raise ConfigError("dataset 'table' needs 'dataset.path' (a CSV or Parquet file).")
        if not cfg.label_column:
            raise ConfigError("dataset 'table' needs 'dataset.label_column'.")
        if not cfg.blocks:
            raise ConfigError("dataset 'table' needs 'dataset.blocks' (block name -> list of columns).")
        split = load_table(
            cfg.path,
            label_column=cfg.label_column,
            blocks=cfg.blocks,
            id_column=cfg.id_column,
            test_path=cfg.test_path,
            test_fraction=cfg.test_fraction,
            seed=seed,
            sep=cfg.sep,
            categorical=cfg.categorical,
        )
    if split.encoding is None:  # a dataset without named columns: <block>_<j>
        split.encoding = default_encoding(split.train.block_shapes, split.train.classes)
    return standardize(split) if cfg.standardize else split


def build_partition(cfg: PartitionConfig, train: HybridDataset, seed: int = 0) -> Partition:
    """The partition of ``train`` that a partition config (one model per kind) describes, validated.

    Raises:
        PartitionError: the settings do not fit ``train`` (e.g. more block groups than blocks) or
            the partition file is missing or malformed.
    """
    if cfg.kind == "file":
        part = Partition.load(cfg.path)
    elif cfg.kind == "class_block":
        clients = [ClientSpec(c.classes, c.blocks) for c in cfg.clients] if cfg.clients else None
        part = ClassBlockPartitioner(
            clients=clients,
            num_clients=cfg.num_clients,
            classes_per_client=cfg.classes_per_client,
            blocks_per_client=cfg.blocks_per_client,
            overlap=cfg.overlap,
            min_cell_coverage=cfg.min_cell_coverage,
            seed=seed,
        ).partition(train)
    elif cfg.kind == "grid":
        part = GridPartitioner(cfg.sample_groups, cfg.block_groups, cfg.replicas, seed).partition(train)
    elif cfg.kind == "iid":
        part = IIDPartitioner(cfg.num_clients, seed).partition(train)
    elif cfg.kind == "dirichlet":
        part = DirichletPartitioner(cfg.num_clients, cfg.alpha, seed).partition(train)
    elif cfg.kind == "by_class":
        part = ClassPartitioner(cfg.num_clients, cfg.classes_per_client, seed).partition(train)
    else:
        part = VerticalPartitioner(cfg.num_clients, cfg.parties, cfg.label_party).partition(train)
    part.validate(train)
    return part
