"""Data: datasets with stable sample IDs and named feature blocks, loaders, partitions."""

from hybridfl.data.dataset import DatasetSplit, HybridDataset, split_train_test, standardize
from hybridfl.data.loaders import (
    load_adult,
    load_credit_default,
    load_digits,
    load_mfeat,
    load_mnist,
    load_table,
    tile_images,
)
from hybridfl.data.partition import ClientShard, Coverage, CoverageWarning, Partition
from hybridfl.data.partitioners import (
    ClassBlockPartitioner,
    ClassPartitioner,
    ClientSpec,
    DirichletPartitioner,
    GridPartitioner,
    IIDPartitioner,
    VerticalPartitioner,
)

__all__ = [
    "ClassBlockPartitioner",
    "ClassPartitioner",
    "ClientShard",
    "ClientSpec",
    "Coverage",
    "CoverageWarning",
    "DatasetSplit",
    "DirichletPartitioner",
    "GridPartitioner",
    "HybridDataset",
    "IIDPartitioner",
    "Partition",
    "VerticalPartitioner",
    "load_adult",
    "load_credit_default",
    "load_digits",
    "load_mfeat",
    "load_mnist",
    "load_table",
    "split_train_test",
    "standardize",
    "tile_images",
]
