"""Loaders: canonical file formats from any directory into a :class:`DatasetSplit`.

Every loader reads files only from the directory it is given (no downloads), returns a train and a
test :class:`HybridDataset` with stable sample IDs and named feature blocks, and raises
:class:`DataError` with one sentence (what and where) for a missing file or malformed content.

=================  ===========================================================  ====================
name               files                                                        blocks
=================  ===========================================================  ====================
``digits``         none: scikit-learn's bundled 8x8 digits (the default)        4 quadrants of 4x4
``mnist``          ``train-images-idx3-ubyte[.gz]`` and the 3 other IDX files   halves, quadrants,
                                                                                 k x k tiles
``mfeat``          ``mfeat-fou``, ``-fac``, ``-kar``, ``-pix``, ``-zer``, ``-mor``  the 6 files
``table``          one CSV/Parquet (or a train and a test file)                 a name -> columns map
``credit_default`` ``UCI_Credit_Card.csv``                                      4 column groups
``adult``          ``adult.data``, ``adult.test``                               3 column groups
=================  ===========================================================  ====================
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from hybridfl.data.dataset import DatasetSplit, HybridDataset, split_train_test
from hybridfl.data.encoding import BlockEncoding, ColumnSpec, Encoding
from hybridfl.errors import DataError

# ---------------------------------------------------------------------------------------- images


def tile_images(
    images: np.ndarray, layout: str = "quadrants", tiles: int = 2, flatten: bool = False
) -> dict[str, np.ndarray]:
    """Split ``(N, H, W)`` images into named image blocks.

    Args:
        images: ``(N, H, W)`` array.
        layout: ``"halves"`` (left/right), ``"quadrants"`` (top_left, top_right, bottom_left,
            bottom_right) or ``"tiles"`` (``tiles x tiles`` blocks named ``r{i}c{j}``).
        tiles: number of tiles per side for ``layout="tiles"``; must divide H and W.
        flatten: return vector blocks ``(N, h*w)`` instead of image blocks ``(N, 1, h, w)``.

    Raises:
        DataError: unknown layout or a tile count that does not divide the image size.
    """
    n, h, w = images.shape
    if layout == "halves":
        if w % 2:
            raise DataError(f"image width {w} cannot be split into halves.")
        parts = {"left": images[:, :, : w // 2], "right": images[:, :, w // 2 :]}
    elif layout in ("quadrants", "tiles"):
        k = 2 if layout == "quadrants" else int(tiles)
        if k < 1 or h % k or w % k:
            raise DataError(f"{k} x {k} tiles do not divide {h} x {w} images.")
        th, tw = h // k, w // k
        names = (
            ["top_left", "top_right", "bottom_left", "bottom_right"]
            if layout == "quadrants"
            else [f"r{i}c{j}" for i in range(k) for j in range(k)]
        )
        parts = {}
        for idx, name in enumerate(names):
            i, j = divmod(idx, k)
            parts[name] = images[:, i * th : (i + 1) * th, j * tw : (j + 1) * tw]
    else:
        raise DataError(f"unknown image block layout {layout!r} (use halves, quadrants or tiles).")
    if flatten:
        return {b: np.ascontiguousarray(x.reshape(n, -1)) for b, x in parts.items()}
    return {b: np.ascontiguousarray(x[:, None, :, :]) for b, x in parts.items()}


def load_digits(
    layout: str = "quadrants", tiles: int = 2, flatten: bool = True, test_fraction: float = 0.25, seed: int = 0
) -> DatasetSplit:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 samples, 10 classes), no file needed.

    Pixels are scaled from [0, 16] to [0, 1]; the default blocks are the four 4x4 quadrants as
    16-dimensional vectors. The split is stratified with ``seed``.
    """
    from sklearn.datasets import load_digits as _sk_digits

    d = _sk_digits()
    images = (d.images / 16.0).astype(np.float32)
    ids = np.array([f"digits-{i:04d}" for i in range(images.shape[0])])
    ds = HybridDataset(
        "digits",
        ids,
        d.target.astype(np.int64),
        tile_images(images, layout, tiles, flatten),
        [str(c) for c in range(10)],
    )
    return split_train_test(ds, test_fraction, seed)


def _require_dir(data_dir: str | Path, what: str) -> Path:
    p = Path(data_dir).expanduser()
    if not p.is_dir():
        raise DataError(f"{what} data directory {str(p)!r} does not exist.")
    return p


def _find(directory: Path, stem: str) -> Path:
    for cand in (directory / stem, directory / f"{stem}.gz"):
        if cand.is_file():
            return cand
    raise DataError(f"file {stem!r} (or {stem}.gz) is missing in {str(directory)!r}.")


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed) into an array of its stored shape.

    Raises:
        DataError: if the magic number or the size does not match the IDX format.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read IDX file {str(path)!r}: {e}.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{str(path)!r} is not an IDX file (bad magic number).")
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if raw[2] not in dtypes:
        raise DataError(f"{str(path)!r}: unknown IDX data type 0x{raw[2]:02x}.")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"{str(path)!r} is truncated: its IDX header announces {ndim} dimensions.")
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    dt = np.dtype(dtypes[raw[2]])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(dims)) * dt.itemsize:
        raise DataError(f"{str(path)!r}: size does not match its IDX header {dims}.")
    return np.frombuffer(body, dtype=dt).reshape(dims)


def load_mnist(
    data_dir: str | Path,
    layout: str = "quadrants",
    tiles: int = 2,
    flatten: bool = False,
    classes: Sequence[int] | None = None,
) -> DatasetSplit:
    """MNIST from the 4 canonical IDX files (gzip or raw) in ``data_dir``.

    Args:
        data_dir: directory with ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
            ``t10k-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte[.gz]``.
        layout, tiles, flatten: block layout, see :func:`tile_images`.
        classes: keep only these digits (relabelled 0..len-1 in the given order), e.g. ``[3, 8]``.

    Returns:
        60,000 train / 10,000 test samples, pixels in [0, 1], IDs ``train-00000`` / ``test-00000``.
    """
    d = _require_dir(data_dir, "MNIST")
    out = []
    for part, prefix in (("train", "train"), ("test", "t10k")):
        x = read_idx(_find(d, f"{prefix}-images-idx3-ubyte"))
        y = read_idx(_find(d, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        if x.ndim != 3 or y.shape != (x.shape[0],):
            raise DataError(f"MNIST {part} files in {str(d)!r} have inconsistent shapes {x.shape} and {y.shape}.")
        ids = np.array([f"{part}-{i:05d}" for i in range(x.shape[0])])
        names = [str(c) for c in range(10)]
        if classes is not None:
            keep = np.isin(y, classes)
            remap = {c: i for i, c in enumerate(classes)}
            x, y, ids = x[keep], np.array([remap[int(v)] for v in y[keep]], dtype=np.int64), ids[keep]
            names = [str(c) for c in classes]
        images = x.astype(np.float32) / 255.0
        out.append(HybridDataset("mnist", ids, y, tile_images(images, layout, tiles, flatten), names))
    return DatasetSplit(out[0], out[1])


MFEAT_VIEWS = ("fou", "fac", "kar", "pix", "zer", "mor")


def load_mfeat(
    data_dir: str | Path, views: Sequence[str] = MFEAT_VIEWS, test_fraction: float = 0.25, seed: int = 0
) -> DatasetSplit:
    """UCI Multiple Features: 2,000 handwritten digits (200 per class, label order), 6 views.

    Each file ``mfeat-<view>`` is a whitespace-separated matrix of 2,000 rows and is one feature
    block named ``<view>`` (fou 76, fac 216, kar 64, pix 240, zer 47, mor 6 columns). Row ``r``
    has label ``r // 200`` and ID ``mfeat-<r>``. The split is stratified with ``seed``.
    """
    d = _require_dir(data_dir, "mfeat")
    blocks = {}
    for v in views:
        if v not in MFEAT_VIEWS:
            raise DataError(f"unknown mfeat view {v!r} (views: {', '.join(MFEAT_VIEWS)}).")
        path = d / f"mfeat-{v}"
        if not path.is_file():
            raise DataError(f"mfeat file {str(path)!r} is missing.")
        try:
            x = np.loadtxt(path, dtype=np.float64)
        except ValueError as e:
            raise DataError(f"mfeat file {str(path)!r} is not a numeric matrix ({e}).") from None
        if x.ndim != 2 or x.shape[0] != 2000:
            raise DataError(f"mfeat file {str(path)!r} has shape {x.shape}, expected 2000 rows.")
        blocks[v] = x
    ids = np.array([f"mfeat-{r:04d}" for r in range(2000)])
    y = np.arange(2000) // 200
    ds = HybridDataset("mfeat", ids, y, blocks, [str(c) for c in range(10)])
    return split_train_test(ds, test_fraction, seed)


# ---------------------------------------------------------------------------------------- tables


def _read_table(
    path: Path, sep: str | None, header: bool = True, names: Sequence[str] | None = None, skiprows: int = 0
):
    import pandas as pd

    if not path.is_file():
        raise DataError(f"table file {str(path)!r} does not exist.")
    if path.stat().st_size == 0:
        raise DataError(f"table file {str(path)!r} is empty.")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        return pd.read_csv(
            path,
            sep=sep if sep is not None else ",",
            header=0 if header else None,
            names=list(names) if names is not None else None,
            skiprows=skiprows,
            skipinitialspace=True,
        )
    except ImportError as e:
        raise DataError(f"reading {str(path)!r} needs an optional package ({e}); install hybridfl[parquet].") from None
    except Exception as e:  # pandas raises many parser error types
        raise DataError(f"cannot parse table file {str(path)!r}: {str(e).splitlines()[0]}.") from None


def table_columns(
    frame, blocks: Mapping[str, Sequence[str]], categorical: Sequence[str] | None = None, where: str = "table"
) -> dict[str, list[ColumnSpec]]:
    """How each block's columns are encoded (:class:`~hybridfl.data.encoding.ColumnSpec`): numeric
    columns as they are; columns listed in ``categorical`` and non-numeric columns one-hot over
    their sorted distinct values (stripped strings). A column that is at least 90 % numbers with a
    few other values is an error, not a categorical column.

    Raises:
        DataError: a mostly numeric column with a non-numeric value (names column and row).
    """
    import pandas as pd

    cat = set(categorical or [])
    out: dict[str, list[ColumnSpec]] = {}
    for b, bcols in blocks.items():
        specs = []
        for c in bcols:
            col = frame[c]
            if c not in cat and not pd.api.types.is_numeric_dtype(col):
                # a mostly numeric column with a few stray strings is a broken numeric column,
                # not a categorical one: say where instead of one-hot encoding it silently
                parsed = pd.to_numeric(col, errors="coerce")
                if parsed.notna().mean() >= 0.9:
                    row = int(np.flatnonzero(parsed.isna().to_numpy())[0])
                    raise DataError(
                        f"column {c!r} of {where} has a non-numeric value {str(col.iloc[row])!r} at row {row + 1}."
                    )
            if c in cat or not pd.api.types.is_numeric_dtype(col):
                levels = sorted(col.dropna().astype(str).str.strip().unique())
                specs.append(ColumnSpec(name=str(c), kind="categorical", levels=[str(v) for v in levels] or [""]))
            else:
                specs.append(ColumnSpec(name=str(c)))
        out[b] = specs
    return out


def _check_table_columns(
    frame, label_column: str, blocks: Mapping[str, Sequence[str]], id_column: str | None, where: str
) -> None:
    """The checks of :func:`table_to_dataset` on the table's shape: data rows, the label and ID
    columns, every block's columns present, none in two blocks or the label/ID column.

    Raises:
        DataError: the first problem found.
    """
    cols = list(frame.columns)
    if len(frame) == 0:
        raise DataError(f"{where} has a header but no data rows.")
    if label_column not in cols:
        raise DataError(
            f"label column {label_column!r} is not in {where} (columns: {', '.join(repr(str(c)) for c in cols[:12])}{', ...' if len(cols) > 12 else ''})."
        )
    if id_column is not None and id_column not in cols:
        raise DataError(f"ID column {id_column!r} is not in {where}.")
    if not blocks:
        raise DataError(f"no feature blocks are given for {where}.")
    seen: dict[str, str] = {}
    for b, bcols in blocks.items():
        if not bcols:
            raise DataError(f"block {b!r} of {where} has no columns.")
        for c in bcols:
            if c not in cols:
                raise DataError(f"column {c!r} of block {b!r} is not in {where}.")
            if c in (label_column, id_column):
                raise DataError(f"column {c!r} of block {b!r} is the label or ID column of {where}.")
            if c in seen:
                raise DataError(f"column {c!r} is in both block {seen[c]!r} and block {b!r} of {where}.")
            seen[c] = b


def _table_labels(labels, label_column: str, classes: Sequence[str] | None, where: str) -> tuple[np.ndarray, list[str]]:
    """Class indices ``(n,)`` int64 of the label column and the class list (``classes``, or the
    labels' sorted distinct values).

    Raises:
        DataError: an empty label, or a label not in ``classes``.
    """
    if labels.isna().any():
        row = int(np.flatnonzero(labels.isna().to_numpy())[0])
        raise DataError(f"label column {label_column!r} of {where} is empty at row {row + 1}.")
    lab = labels.astype(str).str.strip().to_numpy()
    class_list = [str(c) for c in classes] if classes is not None else sorted(set(lab))
    lookup = {c: i for i, c in enumerate(class_list)}
    unknown = [v for v in lab if v not in lookup]
    if unknown:
        raise DataError(f"label {unknown[0]!r} in {where} is not one of the classes {class_list}.")
    return np.array([lookup[v] for v in lab], dtype=np.int64), class_list


def _encode_block(frame, bspecs: Sequence[ColumnSpec], where: str) -> np.ndarray:
    """One block's columns encoded (:func:`table_to_dataset`): numbers as they are, a categorical
    column one-hot over its levels; ``(n, width)``.

    Raises:
        DataError: a missing (NaN) or infinite value.
    """
    parts = []
    for spec in bspecs:
        col = frame[spec.name]
        if col.isna().any():
            row = int(np.flatnonzero(col.isna().to_numpy())[0])
            raise DataError(f"column {spec.name!r} of {where} has a missing (NaN) value at row {row + 1}.")
        if spec.kind == "categorical":
            values = col.astype(str).str.strip()
            parts.append(np.stack([(values == v).to_numpy(np.float32) for v in spec.levels or []], axis=1))
        else:
            v = col.to_numpy(np.float64)
            if not np.isfinite(v).all():
                row = int(np.flatnonzero(~np.isfinite(v))[0])
                raise DataError(f"column {spec.name!r} of {where} has an infinite value at row {row + 1}.")
            parts.append(v[:, None])
    return np.concatenate(parts, axis=1)


def table_to_dataset(
    frame,
    *,
    name: str,
    label_column: str,
    blocks: Mapping[str, Sequence[str]],
    id_column: str | None = None,
    classes: Sequence[str] | None = None,
    categorical: Sequence[str] | None = None,
    where: str = "table",
    columns: Mapping[str, list[ColumnSpec]] | None = None,
) -> HybridDataset:
    """Turn a pandas DataFrame into a :class:`HybridDataset`.

    Numeric columns are used as they are; non-numeric columns (and those listed in
    ``categorical``) are one-hot encoded, one column per level, inside their block. A column that
    is at least 90 % numbers with a few other values is an error, not a categorical column.

    Args:
        frame: the table, one row per sample.
        label_column: column with the class labels (any values; classes are their sorted unique
            values unless ``classes`` is given).
        blocks: block name -> column names, in global block order.
        id_column: column with the sample IDs (row numbers ``<name>-<row>`` if ``None``).
        categorical: columns to one-hot encode even if numeric.
        where: file name used in error messages.
        columns: the blocks' column encodings from :func:`table_columns` (computed if ``None``).

    Raises:
        DataError: missing label/ID/block column, a column in two blocks, NaN or empty cells,
            a non-numeric value in a numeric column, a label not in ``classes``.
    """
    _check_table_columns(frame, label_column, blocks, id_column, where)
    y, class_list = _table_labels(frame[label_column], label_column, classes, where)
    specs = columns if columns is not None else table_columns(frame, blocks, categorical, where)
    out = {b: _encode_block(frame, bspecs, where) for b, bspecs in specs.items()}
    ids = frame[id_column].astype(str).to_numpy() if id_column else np.array([f"{name}-{i}" for i in range(len(frame))])
    return HybridDataset(name, ids, y, out, class_list)


def table_encoding(
    frame,
    ds: HybridDataset,
    blocks: Mapping[str, Sequence[str]],
    categorical: Sequence[str] | None,
    id_column: str | None,
    label_column: str,
    sep: str | None = None,
    where: str = "table",
) -> Encoding:
    """The :class:`~hybridfl.data.encoding.Encoding` of a table that :func:`table_to_dataset`
    turned into ``ds`` (the same column encodings, its classes, ID and label columns)."""
    specs = table_columns(frame, blocks, categorical, where)
    return Encoding(
        id_column=id_column,
        label_column=label_column,
        classes=list(ds.classes),
        blocks=[BlockEncoding(name=b, shape=list(ds.block_shapes[b]), columns=specs[b]) for b in blocks],
        sep=sep,
    )


def load_table(
    path: str | Path,
    *,
    label_column: str,
    blocks: Mapping[str, Sequence[str]],
    id_column: str | None = None,
    test_path: str | Path | None = None,
    test_fraction: float = 0.25,
    seed: int = 0,
    sep: str | None = None,
    categorical: Sequence[str] | None = None,
    name: str | None = None,
) -> DatasetSplit:
    """Any CSV or Parquet table given a label column, an optional ID column and a block map.

    With ``test_path`` the second file is the test set (one-hot levels are taken from both files
    so the columns agree); otherwise a stratified ``test_fraction`` split with ``seed``.

    Raises:
        DataError: see :func:`table_to_dataset`, plus unreadable or empty files.
    """
    import pandas as pd

    path = Path(path).expanduser()
    frame = _read_table(path, sep)
    dsname = name or path.stem
    if test_path is None:
        ds = table_to_dataset(
            frame,
            name=dsname,
            label_column=label_column,
            blocks=blocks,
            id_column=id_column,
            categorical=categorical,
            where=path.name,
        )
        split = split_train_test(ds, test_fraction, seed)
        split.encoding = table_encoding(frame, ds, blocks, categorical, id_column, label_column, sep, path.name)
        return split
    test_path = Path(test_path).expanduser()
    test = _read_table(test_path, sep)
    both = pd.concat([frame, test], ignore_index=True)
    ds = table_to_dataset(
        both,
        name=dsname,
        label_column=label_column,
        blocks=blocks,
        id_column=id_column,
        categorical=categorical,
        where=f"{path.name} + {test_path.name}",
    )
    n = len(frame)
    enc = table_encoding(both, ds, blocks, categorical, id_column, label_column, sep, path.name)
    return DatasetSplit(ds.take(np.arange(n)), ds.take(np.arange(n, len(both))), encoding=enc)


CREDIT_BLOCKS = {
    "demographic": ["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE"],
    "repayment": ["PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6"],
    "bill": [f"BILL_AMT{i}" for i in range(1, 7)],
    "payment": [f"PAY_AMT{i}" for i in range(1, 7)],
}


def load_credit_default(data_dir: str | Path, test_fraction: float = 0.25, seed: int = 0) -> DatasetSplit:
    """UCI default of credit card clients (``UCI_Credit_Card.csv``), 30,000 rows, 2 classes.

    Blocks: demographic (LIMIT_BAL..AGE), repayment (PAY_*), bill (BILL_AMT*), payment (PAY_AMT*).
    SEX, EDUCATION and MARRIAGE are one-hot encoded. IDs are the file's ``ID`` column.
    """
    d = _require_dir(data_dir, "credit default")
    return load_table(
        d / "UCI_Credit_Card.csv",
        label_column="default.payment.next.month",
        id_column="ID",
        blocks=CREDIT_BLOCKS,
        categorical=["SEX", "EDUCATION", "MARRIAGE"],
        test_fraction=test_fraction,
        seed=seed,
        name="credit_default",
    )


ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
]
ADULT_BLOCKS = {
    "demographic": ["age", "marital-status", "relationship", "race", "sex", "native-country"],
    "work": ["workclass", "education", "education-num", "occupation", "hours-per-week"],
    "financial": ["fnlwgt", "capital-gain", "capital-loss"],
}


def load_adult(data_dir: str | Path) -> DatasetSplit:
    """UCI Adult (census income): ``adult.data`` (32,561 train) and ``adult.test`` (16,281 test).

    Labels ``<=50K`` (class 0) and ``>50K`` (class 1); the test file's first comment line and
    trailing ``.`` are handled. Categorical columns are one-hot encoded (``?`` is its own level).
    Blocks: demographic, work, financial.
    """
    import pandas as pd

    d = _require_dir(data_dir, "adult")
    train = _read_table(_find(d, "adult.data"), ",", header=False, names=ADULT_COLUMNS)
    test = _read_table(_find(d, "adult.test"), ",", header=False, names=ADULT_COLUMNS, skiprows=1)
    train, test = (f.dropna(how="all").reset_index(drop=True) for f in (train, test))
    for f in (train, test):
        f["income"] = f["income"].astype(str).str.strip().str.rstrip(".")
    n = len(train)
    both = pd.concat([train, test], ignore_index=True)
    both["id"] = [f"adult-train-{i}" for i in range(n)] + [f"adult-test-{i}" for i in range(len(test))]
    ds = table_to_dataset(
        both,
        name="adult",
        label_column="income",
        blocks=ADULT_BLOCKS,
        id_column="id",
        classes=["<=50K", ">50K"],
        where="adult.data + adult.test",
    )
    enc = table_encoding(both, ds, ADULT_BLOCKS, None, "id", "income", None, "adult.data")
    return DatasetSplit(ds.take(np.arange(n)), ds.take(np.arange(n, len(both))), encoding=enc)


DATASETS = ("digits", "mnist", "mfeat", "credit_default", "adult", "table")
