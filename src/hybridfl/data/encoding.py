"""How raw table columns become a model's feature blocks: the encoding a model carries with it.

A trained model scores *new* rows only if they are encoded exactly as its training rows were. An
:class:`Encoding` records that, per feature block in global block order:

- the block's columns in order: ``numeric`` (one feature) or ``categorical`` with its levels
  (one-hot, one feature per level in that order; an unseen level is an error, never a silent
  zero row);
- the block's per-sample shape (``(width,)`` for table blocks; an image block ``(c, h, w)`` is read
  from ``width = c * h * w`` columns named ``<block>_<j>`` in C order);
- its standardisation, if any: ``(x - mean) / std`` per feature with the training (or federated)
  statistics, computed in the dtype the training data was (``float32`` for a simulated split,
  :func:`hybridfl.data.dataset.standardize`; ``float64`` for a prepared client,
  :func:`hybridfl.data.prepare.prepare_client`), then stored as ``float32``, so that the training
  rows encode to the same bits as in training.

Plus the ID and label columns and the class labels (class index = position). Built-in datasets
without named columns (digits, MNIST, mfeat) get generated numeric column names ``<block>_<j>``
(:func:`default_encoding`); ``hybridfl export-table`` writes their rows in that form.

:func:`encode_frame` turns a pandas DataFrame into the blocks, checking every value first; a
problem is one :class:`~hybridfl.errors.DataError` sentence naming the column and row, never a
value of another row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridfl.errors import DataError


class ColumnSpec(BaseModel):
    """One input column: ``numeric`` (one feature) or ``categorical`` (one feature per level)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    kind: Literal["numeric", "categorical"] = "numeric"
    levels: list[str] | None = None

    @model_validator(mode="after")
    def _levels(self) -> ColumnSpec:
        if self.kind == "categorical":
            if not self.levels:
                raise ValueError(f"categorical column {self.name!r} has no levels")
            if len(set(self.levels)) != len(self.levels):
                raise ValueError(f"categorical column {self.name!r} repeats a level")
        elif self.levels is not None:
            raise ValueError(f"numeric column {self.name!r} has levels")
        return self

    @property
    def width(self) -> int:
        """Features this column gives: 1, or its number of levels."""
        return len(self.levels) if self.kind == "categorical" and self.levels else 1


class BlockEncoding(BaseModel):
    """One feature block: its columns in order, per-sample ``shape`` and standardisation dtype.

    ``scale`` is ``"none"`` (used as read), or ``"float32"``/``"float64"``: the dtype in which
    ``(x - mean) / std`` was computed in training (the statistics themselves live beside the
    weights, ``scale.<block>.mean`` / ``.std``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    shape: list[int] = Field(min_length=1)
    columns: list[ColumnSpec] = Field(min_length=1)
    scale: Literal["none", "float32", "float64"] = "none"

    @model_validator(mode="after")
    def _width(self) -> BlockEncoding:
        if any(s < 1 for s in self.shape):
            raise ValueError(f"block {self.name!r} has a shape {self.shape} with a zero or negative size")
        if sum(c.width for c in self.columns) != self.width:
            raise ValueError(
                f"block {self.name!r}: its columns give {sum(c.width for c in self.columns)} features, "
                f"its shape {self.shape} needs {self.width}"
            )
        return self

    @property
    def width(self) -> int:
        """Features of the block (``prod(shape)``)."""
        return int(np.prod(self.shape))


class Encoding(BaseModel):
    """Everything needed to turn a raw table into a model's blocks (see the module docs).

    Attributes:
        id_column: the column of sample IDs (``None``: rows are numbered).
        label_column: the column of labels (optional in a table to score; with it, metrics).
        classes: the label values as strings, class index = position.
        blocks: the feature blocks in global block order.
        sep: the CSV delimiter the training tables used (``None``: ``,``).
    """

    model_config = ConfigDict(extra="forbid")
    id_column: str | None = None
    label_column: str | None = None
    classes: list[str] = Field(min_length=1)
    blocks: list[BlockEncoding] = Field(min_length=1)
    sep: str | None = None

    @model_validator(mode="after")
    def _distinct(self) -> Encoding:
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError("two blocks have the same name")
        seen: dict[str, str] = {}
        for b in self.blocks:
            for c in b.columns:
                if c.name in seen:
                    raise ValueError(f"column {c.name!r} is in both block {seen[c.name]!r} and block {b.name!r}")
                if c.name in (self.id_column, self.label_column):
                    raise ValueError(f"column {c.name!r} of block {b.name!r} is the ID or label column")
                seen[c.name] = b.name
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("classes repeat a value")
        return self

    def block(self, name: str) -> BlockEncoding:
        """The block called ``name``.

        Raises:
            DataError: no such block.
        """
        for b in self.blocks:
            if b.name == name:
                return b
        raise DataError(f"the model has no block {name!r} (blocks: {', '.join(self.block_names)}).")

    @property
    def block_names(self) -> list[str]:
        """Block names in global block order."""
        return [b.name for b in self.blocks]

    @property
    def block_shapes(self) -> dict[str, tuple[int, ...]]:
        """Block name -> per-sample shape, in global block order."""
        return {b.name: tuple(b.shape) for b in self.blocks}


def default_encoding(
    block_shapes: Mapping[str, Sequence[int]],
    classes: Sequence[str],
    id_column: str = "id",
    label_column: str = "label",
) -> Encoding:
    """The encoding of a dataset without named columns: block ``b`` of shape ``s`` is read from
    ``prod(s)`` numeric columns ``b_0 .. b_{prod(s)-1}`` (C order), IDs from ``id``, labels from
    ``label``."""
    blocks = [
        BlockEncoding(
            name=b,
            shape=[int(v) for v in s],
            columns=[ColumnSpec(name=f"{b}_{j}") for j in range(int(np.prod(s)))],
        )
        for b, s in block_shapes.items()
    ]
    return Encoding(id_column=id_column, label_column=label_column, classes=[str(c) for c in classes], blocks=blocks)


def scaled(x: np.ndarray, mean: np.ndarray, std: np.ndarray, dtype: str) -> np.ndarray:
    """``(x - mean) / std`` computed in ``dtype`` (``"float32"`` or ``"float64"``), as ``float32``:
    the training data's standardisation (the same bits for the same inputs)."""
    t = np.float32 if dtype == "float32" else np.float64
    x = np.asarray(x, dtype=t)
    return ((x - np.asarray(mean, dtype=t)) / np.asarray(std, dtype=t)).astype(np.float32, copy=False)


def _numeric(frame: Any, c: str, where: str) -> np.ndarray:
    import pandas as pd

    col = frame[c]
    if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
        parsed = pd.to_numeric(col.astype(str).str.strip(), errors="coerce")
        bad = parsed.isna().to_numpy() & col.notna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"column {c!r} of {where} is numeric in the model but holds a non-number at row {row + 1}.")
        col = parsed
    v = col.to_numpy(np.float64, na_value=np.nan)
    if not np.isfinite(v).all():
        row = int(np.flatnonzero(~np.isfinite(v))[0])
        what = "a missing (NaN) value" if np.isnan(v[row]) else "an infinite value"
        raise DataError(f"column {c!r} of {where} has {what} at row {row + 1}.")
    return v


def _categorical(frame: Any, spec: ColumnSpec, where: str) -> np.ndarray:
    col = frame[spec.name]
    if col.isna().any():
        row = int(np.flatnonzero(col.isna().to_numpy())[0])
        raise DataError(f"column {spec.name!r} of {where} has a missing value at row {row + 1}.")
    values = col.astype(str).str.strip().to_numpy()
    levels = list(spec.levels or [])
    known = np.isin(values, levels)
    if not known.all():
        row = int(np.flatnonzero(~known)[0])
        raise DataError(
            f"column {spec.name!r} of {where} has a category at row {row + 1} that the model never saw "
            f"(its levels: {len(levels)} from training)."
        )
    return np.stack([(values == lv) for lv in levels], axis=1).astype(np.float64)


def held_blocks(frame: Any, encoding: Encoding, where: str) -> list[str]:
    """The blocks whose every column is in ``frame``, in global block order.

    Raises:
        DataError: a block with only some of its columns (names one present and one missing
            column), or no block at all.
    """
    present = {str(c) for c in frame.columns}
    held = []
    for b in encoding.blocks:
        have = [c.name for c in b.columns if c.name in present]
        if have and len(have) < len(b.columns):
            missing = next(c.name for c in b.columns if c.name not in present)
            raise DataError(
                f"{where} holds column {have[0]!r} of block {b.name!r} but not its column {missing!r} "
                "(a block is scored with all its columns or not at all)."
            )
        if have:
            held.append(b.name)
    if not held:
        first = encoding.blocks[0].columns[0].name
        raise DataError(
            f"{where} holds none of the model's blocks ({', '.join(encoding.block_names)}; block "
            f"{encoding.blocks[0].name!r} starts with column {first!r}): check its column names."
        )
    return held


def encode_frame(
    frame: Any,
    encoding: Encoding,
    scale: Mapping[str, tuple[np.ndarray, np.ndarray]],
    blocks: Sequence[str] | None = None,
    where: str = "table",
) -> dict[str, np.ndarray]:
    """The model's blocks of every row of ``frame``: block -> ``(n, *shape)`` float32, encoded and
    standardised as in training.

    Args:
        frame: a pandas DataFrame, one row per sample.
        encoding: the model's encoding.
        scale: block -> ``(mean, std)`` arrays ``(width,)`` for every block whose ``scale`` is not
            ``"none"``.
        blocks: the blocks to encode (default: every block of the encoding); each must be in the
            table with all its columns.
        where: the table's name in error messages.

    Raises:
        DataError: an empty table, a missing column, a non-number in a numeric column, a missing
            or infinite value, or a category the model never saw (column and row named).
    """
    if len(frame) == 0:
        raise DataError(f"{where} has no data rows.")
    frame = frame.set_axis([str(c) for c in frame.columns], axis=1)
    present = set(frame.columns)
    names = encoding.block_names if blocks is None else list(blocks)
    out: dict[str, np.ndarray] = {}
    n = len(frame)
    for name in names:
        b = encoding.block(name)
        for c in b.columns:
            if c.name not in present:
                raise DataError(f"column {c.name!r} of block {b.name!r} is not in {where}.")
        parts = [
            _categorical(frame, c, where) if c.kind == "categorical" else _numeric(frame, c.name, where)[:, None]
            for c in b.columns
        ]
        x = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        if b.scale != "none":
            mean, std = scale[b.name]
            x = scaled(x, mean, std, b.scale)
        else:
            x = x.astype(np.float32)
        out[b.name] = np.ascontiguousarray(x.reshape(n, *b.shape))
    return out


def frame_ids(frame: Any, encoding: Encoding, where: str = "table") -> tuple[str, np.ndarray]:
    """``(column name, (n,) str IDs)``: the table's ID column when it has the model's one, else
    row numbers ``1..n`` under the name ``row``.

    Raises:
        DataError: an empty or repeated ID.
    """
    col = encoding.id_column
    if col is None or col not in {str(c) for c in frame.columns}:
        return "row", np.arange(1, len(frame) + 1).astype(str)
    s = frame[col]
    if s.isna().any():
        row = int(np.flatnonzero(s.isna().to_numpy())[0])
        raise DataError(f"ID column {col!r} of {where} is empty at row {row + 1}.")
    ids = s.astype(str).str.strip().to_numpy()
    if (ids == "").any():
        row = int(np.flatnonzero(ids == "")[0])
        raise DataError(f"ID column {col!r} of {where} is empty at row {row + 1}.")
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise DataError(
            f"ID column {col!r} of {where} repeats an ID ({int((counts > 1).sum())} IDs occur twice or more)."
        )
    return col, ids.astype(str)


def frame_labels(frame: Any, encoding: Encoding, where: str = "table") -> np.ndarray | None:
    """``(n,)`` int64 class indices from the label column, ``-1`` where a label is empty; ``None``
    when the table has no label column.

    Raises:
        DataError: a label that is not one of the model's classes.
    """
    col = encoding.label_column
    if col is None or col not in {str(c) for c in frame.columns}:
        return None
    s = frame[col]
    empty = s.isna().to_numpy()
    lab = s.astype(str).str.strip().to_numpy()
    lookup = {c: i for i, c in enumerate(encoding.classes)}
    y = np.full(len(lab), -1, dtype=np.int64)
    for i, v in enumerate(lab):
        if empty[i] or v == "":
            continue
        if v not in lookup:
            raise DataError(f"label at row {i + 1} of {where} is not one of the model's {len(lookup)} classes.")
        y[i] = lookup[v]
    return y


def schema_encoding(schema: Any) -> tuple[Encoding, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The encoding of a federation schema (:class:`~hybridfl.data.federation.FederationSchema`)
    and its standardisation: ``(encoding, block -> (mean, std))`` as ``client prepare`` applies
    them (float64, a std below ``1e-12`` counts as 1)."""
    blocks, scale = [], {}
    for b, cols in schema.blocks.items():
        specs = [
            ColumnSpec(name=c, kind="categorical", levels=list(schema.categorical[c]))
            if c in schema.categorical
            else ColumnSpec(name=c)
            for c in cols
        ]
        blocks.append(BlockEncoding(name=b, shape=[sum(s.width for s in specs)], columns=specs))
        if b in schema.means:
            sd = np.asarray(schema.stds[b], dtype=np.float64)
            sd[sd < 1e-12] = 1.0
            scale[b] = (np.asarray(schema.means[b], dtype=np.float64), sd)
    enc = Encoding(
        id_column=schema.id_column,
        label_column=schema.label_column,
        classes=list(schema.classes),
        blocks=blocks,
        sep=getattr(schema, "sep", None),
    )
    return enc, scale


def encoding_meta(encoding: Encoding, scale: Mapping[str, tuple[np.ndarray, np.ndarray]], dtype: str) -> dict[str, Any]:
    """The JSON form of an encoding and its standardisation (``server.json``'s ``encoding``), so a
    server that never sees a row can still write a model directory users score tables with."""
    return {
        "encoding": encoding.model_dump(mode="json", exclude_none=True),
        "scale": {b: {"mean": np.asarray(m).tolist(), "std": np.asarray(s).tolist()} for b, (m, s) in scale.items()},
        "scale_dtype": dtype,
    }


def encoding_from_meta(
    meta: Mapping[str, Any],
) -> tuple[Encoding, dict[str, tuple[np.ndarray, np.ndarray]], str] | None:
    """Inverse of :func:`encoding_meta` (``None`` when ``meta`` has no encoding: an older export).

    Raises:
        DataError: an encoding that does not validate.
    """
    from pydantic import ValidationError

    raw = meta.get("encoding")
    if not isinstance(raw, Mapping):
        return None
    try:
        enc = Encoding.model_validate(raw["encoding"])
        dtype = str(raw.get("scale_dtype", "float32"))
        t = np.float32 if dtype == "float32" else np.float64
        scale = {
            str(b): (np.asarray(v["mean"], dtype=t), np.asarray(v["std"], dtype=t)) for b, v in raw["scale"].items()
        }
    except (ValidationError, KeyError, TypeError, ValueError):
        raise DataError("the server directory's encoding is not valid: export or assemble it again.") from None
    return enc, scale, dtype
