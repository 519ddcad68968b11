"""A dataset for hybrid FL: samples with stable IDs, labels and named feature blocks.

The full feature space is split into ``d0`` named feature blocks (an image region, a view, a group
of table columns; HyFEM Sec. 2, "Data description"). A :class:`HybridDataset` stores, for ``N``
samples:

- ``ids``: shape ``(N,)``, unique sample IDs (strings), stable across train/test splits and
  partitions, so that clients can align samples by ID;
- ``y``: shape ``(N,)``, ``int64`` class indices in ``[0, C)``;
- ``blocks``: ordered mapping block name -> array of shape ``(N, *block_shape)`` (``float32``);
  vector blocks have ``block_shape = (d_b,)``, image blocks ``(channels, height, width)``.

The block order of the mapping is the global block order: a model concatenates extractor outputs
in that order.

:meth:`HybridDataset.view` selects samples and blocks without copying any feature: the view's
``blocks`` is a :class:`RowBlocks` mapping that gathers a block's rows from the shared array only
when it is read (once, then kept), and :meth:`HybridDataset.row_source` gives code that samples
mini-batches the shared array and the row indices, so that it can gather each batch itself.
Clients that hold the same rows then hold them once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridfl.errors import DataError


class RowBlocks(Mapping[str, np.ndarray]):
    """Block name -> the rows ``rows`` of a shared array, read lazily.

    Reading a block (``blocks[b]``) gathers its rows once and keeps the result; :meth:`source`
    gives the shared array and the row indices without gathering anything.

    Args:
        base: block name -> shared ``(N, *shape)`` array.
        names: the blocks of the view, in global block order.
        rows: ``(n,)`` int64 row indices into the shared arrays, or ``None`` for all rows in order
            (then a block is the shared array itself).
    """

    def __init__(self, base: Mapping[str, np.ndarray], names: Sequence[str], rows: np.ndarray | None):
        self._base = {b: base[b] for b in names}
        self.rows = rows
        self._gathered: dict[str, np.ndarray] = {}

    def __getitem__(self, b: str) -> np.ndarray:
        if self.rows is None:
            return self._base[b]
        if b not in self._gathered:
            self._gathered[b] = self._base[b][self.rows]
        return self._gathered[b]

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def source(self, b: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``(shared array, row indices or None)`` of block ``b``, without gathering."""
        return self._base[b], self.rows

    def shape(self, b: str) -> tuple[int, ...]:
        """The per-sample shape of block ``b``."""
        return tuple(int(s) for s in self._base[b].shape[1:])


@dataclass
class HybridDataset:
    """Samples with stable IDs, labels and named feature blocks.

    Args:
        name: dataset name used in reports.
        ids: ``(N,)`` unique sample IDs (converted to ``str``).
        y: ``(N,)`` integer class indices in ``[0, len(classes))``.
        blocks: block name -> ``(N, *shape)`` array, in global block order.
        classes: class names (``str``), index = class index.

    Raises:
        DataError: if IDs repeat, shapes disagree, labels are out of range or a block holds
            NaN or infinite values (one sentence naming the block or row).
    """

    name: str
    ids: np.ndarray
    y: np.ndarray
    blocks: dict[str, np.ndarray]
    classes: list[str]

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids).astype(str)
        self.y = np.asarray(self.y)
        self.classes = [str(c) for c in self.classes]
        n = self.ids.shape[0]
        if self.ids.ndim != 1:
            raise DataError(f"dataset {self.name!r}: sample IDs must be one-dimensional, got shape {self.ids.shape}.")
        if n == 0:
            raise DataError(f"dataset {self.name!r} has no samples.")
        if self.y.shape != (n,):
            raise DataError(f"dataset {self.name!r}: {self.y.shape[0] if self.y.ndim else 0} labels for {n} samples.")
        if not np.issubdtype(self.y.dtype, np.integer):
            raise DataError(f"dataset {self.name!r}: labels must be integer class indices, got dtype {self.y.dtype}.")
        self.y = self.y.astype(np.int64)
        if len(self.classes) == 0:
            raise DataError(f"dataset {self.name!r} has no classes.")
        bad = np.flatnonzero((self.y < 0) | (self.y >= len(self.classes)))
        if bad.size:
            raise DataError(
                f"dataset {self.name!r}: label {int(self.y[bad[0]])} of sample {str(self.ids[bad[0]])!r} is outside "
                f"the {len(self.classes)} classes [0, {len(self.classes) - 1}]."
            )
        order = np.argsort(self.ids, kind="stable")
        srt = self.ids[order]
        dup = np.flatnonzero(srt[1:] == srt[:-1])
        if dup.size:
            raise DataError(f"dataset {self.name!r}: sample ID {str(srt[dup[0]])!r} occurs more than once.")
        self._sorted = (order.astype(np.int64), srt)  # for :meth:`find`
        if not self.blocks:
            raise DataError(f"dataset {self.name!r} has no feature blocks.")
        clean: dict[str, np.ndarray] = {}
        for b, x in self.blocks.items():
            x = np.asarray(x)
            if x.shape[0] != n:
                raise DataError(f"dataset {self.name!r}: block {b!r} has {x.shape[0]} rows for {n} samples.")
            if x.ndim < 2:
                raise DataError(f"dataset {self.name!r}: block {b!r} must have shape (N, ...), got {x.shape}.")
            if not np.issubdtype(x.dtype, np.number):
                raise DataError(f"dataset {self.name!r}: block {b!r} is not numeric (dtype {x.dtype}).")
            x = x.astype(np.float32, copy=False)
            finite = np.isfinite(x.reshape(n, -1)).all(axis=1)
            if not finite.all():
                row = int(np.flatnonzero(~finite)[0])
                raise DataError(
                    f"dataset {self.name!r}: block {b!r} holds NaN or infinite values (first at sample {str(self.ids[row])!r})."
                )
            clean[str(b)] = x
        self.blocks = clean

    @classmethod
    def _trusted(
        cls, name: str, ids: np.ndarray, y: np.ndarray, blocks: Mapping[str, np.ndarray], classes: list[str]
    ) -> HybridDataset:
        """A dataset from parts that come from a validated one (no checks, no copies; the sorted
        IDs of :meth:`find` are computed when first needed)."""
        ds = object.__new__(cls)
        ds.name, ds.ids, ds.y, ds.blocks, ds.classes = name, ids, y, blocks, classes  # type: ignore[assignment]
        return ds

    def _sorted_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, ids[order])``: the IDs sorted, computed once (the dataset is not mutated)."""
        cached = self.__dict__.get("_sorted")
        if cached is None:
            order = np.argsort(self.ids, kind="stable")
            cached = self._sorted = (order.astype(np.int64), self.ids[order])
        return cached

    def sorted_ids(self, rows: np.ndarray) -> np.ndarray:
        """The IDs of the rows ``rows`` ``(n,)`` in string order, ``np.sort(ids[rows])``, through
        the IDs sorted once (an integer sort of their ranks instead of a string sort per call)."""
        order, _ = self._sorted_ids()
        rank = self.__dict__.get("_rank")
        if rank is None:
            rank = self._rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
        rows = np.asarray(rows, dtype=np.int64)
        return self.ids[rows[np.argsort(rank[rows], kind="stable")]]

    def find(self, ids: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """Row positions of the given sample IDs, vectorised (a binary search in the sorted IDs,
        no Python loop over the samples).

        Returns:
            ``(rows, found)``: ``(n,)`` int64 positions (0 where not found) and ``(n,)`` bool,
            whether each ID is in the dataset.
        """
        q = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids))
        if q.dtype.kind != "U":
            q = q.astype(str)
        q = q.reshape(-1)
        order, srt = self._sorted_ids()
        if not q.size or not srt.size:
            return np.zeros(q.size, dtype=np.int64), np.zeros(q.size, dtype=bool)
        j = np.minimum(np.searchsorted(srt, q), srt.size - 1)
        found = srt[j] == q
        return np.where(found, order[j], 0).astype(np.int64, copy=False), found

    # ------------------------------------------------------------------ properties
    @property
    def n_samples(self) -> int:
        """Number of samples ``N``."""
        return int(self.ids.shape[0])

    @property
    def n_classes(self) -> int:
        """Number of classes ``C``."""
        return len(self.classes)

    @property
    def block_names(self) -> list[str]:
        """Block names in global block order."""
        return list(self.blocks)

    @property
    def block_shapes(self) -> dict[str, tuple[int, ...]]:
        """Block name -> per-sample shape (without the sample axis)."""
        if isinstance(self.blocks, RowBlocks):
            return {b: self.blocks.shape(b) for b in self.blocks}
        return {b: tuple(int(s) for s in x.shape[1:]) for b, x in self.blocks.items()}

    def __len__(self) -> int:
        return self.n_samples

    # ------------------------------------------------------------------ selection
    def positions(self, ids: Iterable[str], *, where: str = "") -> np.ndarray:
        """Row positions ``(n,)`` int64 of the given sample IDs (vectorised: :meth:`find`).

        Raises:
            DataError: if an ID is not in the dataset (names the first unknown ID and ``where``).
        """
        q = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids))
        rows, found = self.find(q)
        if not found.all():
            place = f" ({where})" if where else ""
            bad = q.reshape(-1)[int(np.flatnonzero(~found)[0])]
            raise DataError(f"sample ID {str(bad)!r}{place} is not in dataset {self.name!r}.")
        return rows

    def subset(
        self, ids: Sequence[str] | np.ndarray | None = None, blocks: Sequence[str] | None = None
    ) -> HybridDataset:
        """The samples ``ids`` (all if ``None``) restricted to ``blocks`` (all if ``None``), in the given order."""
        rows = np.arange(self.n_samples) if ids is None else self.positions(ids)
        names = self.block_names if blocks is None else list(blocks)
        for b in names:
            if b not in self.blocks:
                raise DataError(f"block {b!r} is not in dataset {self.name!r} (blocks: {', '.join(self.blocks)}).")
        return HybridDataset(
            name=self.name,
            ids=self.ids[rows],
            y=self.y[rows],
            blocks={b: self.blocks[b][rows] for b in names},
            classes=self.classes,
        )

    def view(
        self,
        ids: Sequence[str] | np.ndarray | None = None,
        blocks: Sequence[str] | None = None,
        y: np.ndarray | None = None,
    ) -> HybridDataset:
        """Like :meth:`subset`, but sharing the features: the view's blocks are a
        :class:`RowBlocks` over this dataset's arrays (nothing is copied until a block is read).

        Args:
            y: the view's labels instead of the selected ones (e.g. zeros for a party without labels).

        Raises:
            DataError: an unknown sample ID or block.
        """
        base, rows = (
            (self.blocks._base, self.blocks.rows) if isinstance(self.blocks, RowBlocks) else (self.blocks, None)
        )
        sel = None if ids is None else self.positions(ids)
        if sel is not None:
            rows = sel if rows is None else rows[sel]
            if rows.size == len(next(iter(base.values()))) and np.array_equal(rows, np.arange(rows.size)):
                rows = None  # all rows in order: the shared arrays themselves
        names = self.block_names if blocks is None else list(blocks)
        for b in names:
            if b not in self.blocks:
                raise DataError(f"block {b!r} is not in dataset {self.name!r} (blocks: {', '.join(self.blocks)}).")
        labels = (self.y if sel is None else self.y[sel]) if y is None else np.asarray(y, dtype=np.int64)
        return HybridDataset._trusted(
            self.name,
            self.ids if sel is None else self.ids[sel],
            labels,
            RowBlocks(base, names, rows),
            self.classes,
        )

    def row_source(self, block: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``(array, rows)``: block ``block`` of sample ``i`` is ``array[rows[i]]`` (``array[i]`` when
        ``rows`` is ``None``). For a :meth:`view` the array is the shared one and nothing is copied,
        so a trainer can gather each mini-batch from it.

        Raises:
            KeyError: no block of that name.
        """
        if isinstance(self.blocks, RowBlocks):
            return self.blocks.source(block)
        return self.blocks[block], None

    def take(self, rows: np.ndarray) -> HybridDataset:
        """The samples at row positions ``rows`` (all blocks)."""
        return HybridDataset(
            self.name, self.ids[rows], self.y[rows], {b: x[rows] for b, x in self.blocks.items()}, self.classes
        )

    def class_counts(self) -> np.ndarray:
        """``(C,)`` number of samples per class."""
        return np.bincount(self.y, minlength=self.n_classes)


@dataclass
class DatasetSplit:
    """A train and a test :class:`HybridDataset` with the same blocks and classes.

    Attributes:
        train, test: the two parts.
        encoding: how raw table columns become the blocks (a
            :class:`~hybridfl.data.encoding.Encoding`; ``None``: not known, e.g. a split built
            in code), kept so that a trained model can score new rows.
        scale: block -> ``(mean, std)`` ``(width,)`` float32 arrays of the standardisation
            :func:`standardize` applied (empty: none).
    """

    train: HybridDataset
    test: HybridDataset
    encoding: Any = None
    scale: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train.block_shapes != self.test.block_shapes:
            raise DataError(f"dataset {self.train.name!r}: train and test blocks differ.")
        if self.train.classes != self.test.classes:
            raise DataError(f"dataset {self.train.name!r}: train and test classes differ.")
        both = np.intersect1d(self.train.ids, self.test.ids)
        if both.size:
            raise DataError(f"dataset {self.train.name!r}: sample ID {str(both[0])!r} is in both train and test.")

    @property
    def name(self) -> str:
        """The dataset's name (that of the train part)."""
        return self.train.name


def split_train_test(ds: HybridDataset, test_fraction: float, seed: int) -> DatasetSplit:
    """Stratified random split of one dataset into train and test (reproducible with ``seed``)."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be in (0, 1), got {test_fraction}.")
    from sklearn.model_selection import train_test_split

    counts = np.bincount(ds.y, minlength=ds.n_classes)
    present = counts[counts > 0]
    if present.min() < 2:
        k = int(np.flatnonzero(counts == present.min())[0])
        raise DataError(
            f"dataset {ds.name!r}: class {ds.classes[k]!r} has only 1 sample; a stratified train/test split needs at least 2 per class."
        )
    n_test = int(np.ceil(test_fraction * ds.n_samples))
    if n_test < present.size or ds.n_samples - n_test < present.size:
        raise DataError(
            f"dataset {ds.name!r}: {ds.n_samples} samples cannot be split with test fraction {test_fraction} so that both parts hold all {present.size} classes."
        )
    rows = np.arange(ds.n_samples)
    tr, te = train_test_split(rows, test_size=test_fraction, random_state=seed, stratify=ds.y)
    return DatasetSplit(ds.take(np.sort(tr)), ds.take(np.sort(te)))


def standardize(split: DatasetSplit, blocks: Mapping[str, bool] | None = None) -> DatasetSplit:
    """Scale each vector block to zero mean and unit variance with train statistics.

    Image blocks (``ndim > 2``) are left as they are. Constant columns keep scale 1. The
    statistics (float32) are recorded in the result's ``scale`` (block -> ``(mean, std)``), so a
    model can standardise new rows the same way (:mod:`hybridfl.data.encoding`).
    """
    tr, te = {}, {}
    scale = dict(split.scale)
    for b, x in split.train.blocks.items():
        if (blocks is not None and not blocks.get(b, False)) or x.ndim > 2:
            tr[b], te[b] = x, split.test.blocks[b]
            continue
        mu = x.mean(axis=0)
        sd = x.std(axis=0)
        sd[sd < 1e-12] = 1.0
        tr[b] = (x - mu) / sd
        te[b] = (split.test.blocks[b] - mu) / sd
        scale[b] = (np.asarray(mu, dtype=np.float32), np.asarray(sd, dtype=np.float32))
    return DatasetSplit(
        HybridDataset(split.train.name, split.train.ids, split.train.y, tr, split.train.classes),
        HybridDataset(split.test.name, split.test.ids, split.test.y, te, split.test.classes),
        encoding=split.encoding,
        scale=scale,
    )
