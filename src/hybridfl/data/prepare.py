"""An organisation turns its own table into a client directory: ``hybridfl client prepare``.

``prepare_client`` reads one table (CSV, Parquet, or NumPy ``.npz`` with an ``ids`` array and one
1-D array per column), keeps the blocks of the federation schema (:mod:`hybridfl.data.federation`)
the table holds, checks every held column, and writes a client directory in exactly the layout
``hybridfl export-clients`` writes (:mod:`hybridfl.data.export`), so :func:`load_client_dir`
reads it and a Flower SuperNode can serve it. No data leaves the organisation and nothing is
pooled: with ``standardize = true`` the directory gets a ``stats.json`` of per-block feature sums,
sums of squares and counts, for a federated combination; only global ``means``/``stds`` already in
the schema are applied.

Rules (each violation is one sentence naming the column and the problem; nothing is written):

- a block is held when all its columns are in the table; a block with only some is an error;
- columns in no block of the schema are ignored; the table must hold at least one block;
- numeric columns: numbers, finite; a missing cell is refused with the schema's ``missing =
  "error"`` (the default), and with ``missing = "impute_mean"`` filled with the federation's mean of
  that feature (the schema's ``means``, from ``hybridfl federation stats``). Before those means
  exist the directory is written with the cells unfilled and is refused by every loader until
  prepared again with the schema that has them (its ``stats.json``, over the observed cells,
  is what the means are made of);
- categorical columns: values among the schema's levels (compared as stripped strings), one-hot
  encoded in the schema's order; a missing cell is refused;
- IDs: present, non-empty, unique;
- labels: an organisation may hold no label column (it holds no labels) or a label column with
  empty cells: those rows are unlabelled (``labels.npy`` holds -1 for them). They stay in the
  directory as feature rows, and :func:`~hybridfl.data.export.load_client_dir` gives the
  algorithms only the labelled rows of a client holding labels (README, "who must hold labels").
  A label column with no value at all is the same as none. A value must be among the classes.

The table's CSV delimiter is the schema's ``sep`` (``client prepare --sep`` overrides it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hybridfl.data.dataset import HybridDataset
from hybridfl.data.encoding import encoding_meta, schema_encoding
from hybridfl.data.export import DIR_MODE, FILE_MODE, FORMAT_VERSION, _check_client_names, _write_dataset_dir
from hybridfl.data.federation import FederationSchema, load_schema, schema_digest
from hybridfl.errors import DataError
from hybridfl.files import atomic_write
from hybridfl.privacy.credentials import PUBLIC_KEY_FIELD, new_client_key

STATS_FILE = "stats.json"
"""A prepared client directory's local standardisation statistics (per block: count, sum, sumsq)."""


@dataclass
class PreparedClient:
    """What :func:`prepare_client` wrote.

    Attributes:
        path: the client directory.
        client_id: the client's name.
        n_samples: rows of the table (``n_m``).
        blocks: the schema's blocks the table holds, in global block order.
        has_labels: whether the table holds labels (a label column with at least one value).
        n_labelled: the rows with a label (``n_samples`` minus the unlabelled ones; 0 without labels).
        imputed: the missing numeric cells filled with the federation's means.
        unfilled: the missing numeric cells left unfilled because the schema has no means yet
            (``missing = "impute_mean"`` before ``federation stats``): the directory cannot be
            used until it is prepared again with the schema that has them.
        ignored: the table's columns that are in no block (nor the ID or label column).
        standardized: whether global means/stds from the schema were applied.
        stats: whether ``stats.json`` was written.
    """

    path: Path
    client_id: str
    n_samples: int
    blocks: list[str]
    has_labels: bool
    ignored: list[str] = field(default_factory=list)
    standardized: bool = False
    stats: bool = False
    n_labelled: int = 0
    imputed: int = 0
    unfilled: int = 0


def read_client_table(path: str | Path, sep: str = ","):
    """Read an organisation's table into a pandas DataFrame: ``.csv`` (any other suffix too; columns
    separated by ``sep``), ``.parquet``/``.pq``, or ``.npz`` (an ``ids`` array and one 1-D array per
    column, all of the same length; the ID column is then called ``ids``).

    Raises:
        DataError: a missing, empty or unparsable file, or an ``.npz`` with arrays of other shapes.
    """
    import pandas as pd

    from hybridfl.data.loaders import _read_table

    p = Path(path).expanduser()
    if p.suffix.lower() != ".npz":
        return _read_table(p, sep)
    if not p.is_file():
        raise DataError(f"table file {str(p)!r} does not exist.")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # zip and format errors of every kind
        raise DataError(f"cannot read {str(p)!r} as a NumPy .npz file: {str(e).splitlines()[0]}.") from None
    if "ids" not in arrays:
        raise DataError(f"{p.name} has no array 'ids' (the sample IDs).")
    n = arrays["ids"].shape[0] if arrays["ids"].ndim == 1 else -1
    for k, a in arrays.items():
        if a.ndim != 1 or a.shape[0] != n:
            raise DataError(
                f"array {k!r} of {p.name} has shape {a.shape}; every array must have shape ({n},) like 'ids'."
            )
    return pd.DataFrame(arrays)


def _check_ids(frame, id_column: str, where: str) -> np.ndarray:
    if id_column not in frame.columns:
        raise DataError(f"ID column {id_column!r} is not in {where}.")
    col = frame[id_column]
    if col.isna().any():
        row = int(np.flatnonzero(col.isna().to_numpy())[0])
        raise DataError(f"ID column {id_column!r} of {where} is empty at row {row + 1}.")
    ids = col.astype(str).str.strip().to_numpy()
    empty = np.flatnonzero(ids == "")
    if empty.size:
        raise DataError(f"ID column {id_column!r} of {where} is empty at row {int(empty[0]) + 1}.")
    uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if uniq.size != ids.size:
        dup = uniq[counts > 1][0]
        rows = np.flatnonzero(ids == dup)[:2] + 1
        raise DataError(
            f"ID column {id_column!r} of {where} holds ID {str(dup)!r} twice (rows {rows[0]} and {rows[1]})."
        )
    return ids


def _strings(col) -> np.ndarray:
    """A column's cells as stripped strings; a float column of whole numbers (pandas reads an
    integer column with empty cells as float) gives ``"1"``, not ``"1.0"``."""
    import pandas as pd

    if pd.api.types.is_float_dtype(col):
        v = col.to_numpy(np.float64)
        seen = v[~np.isnan(v)]
        if seen.size and np.all(np.isfinite(seen)) and np.all(seen == np.round(seen)):
            return np.array(["" if np.isnan(x) else str(int(x)) for x in v], dtype=object)
    return col.astype(str).str.strip().to_numpy()


def _check_labels(frame, label_column: str, classes: list[str], where: str) -> np.ndarray:
    """Class indices, ``-1`` for an empty cell (an unlabelled row)."""
    col = frame[label_column]
    lab = _strings(col)
    empty = col.isna().to_numpy() | np.array([str(v) == "" for v in lab], dtype=bool)
    lookup = {c: i for i, c in enumerate(classes)}
    bad = [i for i, v in enumerate(lab) if not empty[i] and str(v) not in lookup]
    if bad:
        raise DataError(
            f"label column {label_column!r} of {where} has value {str(lab[bad[0]])!r} at row {bad[0] + 1}, "
            f"which is not one of the schema's classes {classes}."
        )
    return np.array([-1 if empty[i] else lookup[str(v)] for i, v in enumerate(lab)], dtype=np.int64)


def _numeric(frame, c: str, where: str, missing: str) -> np.ndarray:
    """``(n, 1)`` float64; a missing cell is NaN with ``missing = "impute_mean"``, else refused."""
    import pandas as pd

    col = frame[c]
    gaps = col.isna().to_numpy()
    if gaps.any() and missing == "error":
        row = int(np.flatnonzero(gaps)[0])
        raise DataError(
            f'column {c!r} of {where} has a missing value at row {row + 1} (the schema says missing = "error"; '
            '"impute_mean" fills numeric cells with the federation\'s mean).'
        )
    if not pd.api.types.is_numeric_dtype(col):  # e.g. strings: all must parse as numbers
        parsed = pd.to_numeric(col.astype(str).str.strip(), errors="coerce")
        unparsed = parsed.isna().to_numpy() & ~gaps
        if unparsed.any():
            row = int(np.flatnonzero(unparsed)[0])
            raise DataError(
                f"column {c!r} of {where} is numeric in the schema but has the value {str(col.iloc[row])!r} "
                f"at row {row + 1}."
            )
        col = parsed
    v = col.to_numpy(np.float64, copy=True)
    bad = ~np.isfinite(v) & ~gaps
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"column {c!r} of {where} has a value that is not finite ({v[row]}) at row {row + 1}.")
    v[gaps] = np.nan
    return v[:, None]


def _categorical(frame, c: str, levels: list[str], where: str) -> np.ndarray:
    col = frame[c]
    if col.isna().any():
        row = int(np.flatnonzero(col.isna().to_numpy())[0])
        raise DataError(
            f"column {c!r} of {where} has a missing value at row {row + 1} (a categorical cell is never imputed)."
        )
    values = _strings(col)
    known = set(levels)
    bad = [i for i, v in enumerate(values) if v not in known]
    if bad:
        raise DataError(
            f"column {c!r} of {where} has the value {values[bad[0]]!r} at row {bad[0] + 1}, "
            f"which is not one of its levels {levels} in the schema."
        )
    return np.stack([(values == lv).astype(np.float64) for lv in levels], axis=1)


@dataclass
class ClientTable:
    """An organisation's table, checked against the schema and encoded (:func:`table_to_client_dataset`).

    Attributes:
        ids: ``(n_m,)`` sample IDs (str).
        blocks: held block -> ``(n_m, width)`` float64, global block order; with ``missing =
            "impute_mean"`` a missing numeric cell is NaN.
        labels: ``(n_m,)`` class indices, -1 for an unlabelled row; ``None`` without labels.
        ignored: the table's columns in no block (nor the ID or label column).
    """

    ids: np.ndarray
    blocks: dict[str, np.ndarray]
    labels: np.ndarray | None
    ignored: list[str]

    @property
    def has_labels(self) -> bool:
        """Whether the table holds labels: a label column with at least one value."""
        return self.labels is not None


def table_to_client_dataset(
    frame,
    schema: FederationSchema,
    *,
    id_column: str | None = None,
    label_column: str | None = None,
    where: str = "table",
) -> ClientTable:
    """Check an organisation's table against the schema and encode its held blocks.

    Args:
        frame: the table, one row per sample (pandas DataFrame).
        schema: the federation schema.
        id_column: the table's ID column (default: the schema's).
        label_column: the table's label column; ``None``: the schema's, if the table has it (else
            the table holds no labels). A given column must be in the table.
        where: the file name used in error messages.

    Returns:
        The :class:`ClientTable`: IDs, held blocks (float64, global block order; missing numeric
        cells NaN under ``missing = "impute_mean"``), labels (-1: unlabelled row; ``None``: no
        labels, also for a label column without any value) and the ignored columns.

    Raises:
        DataError: an empty table, a missing/empty/duplicate ID, a block with only some of its
            columns, no block at all, a bad value in a held column, a missing cell the schema's
            ``missing`` policy refuses, or a label not in the classes.
    """
    cols = [str(c) for c in frame.columns]
    frame = frame.set_axis(cols, axis=1)
    if len(frame) == 0:
        raise DataError(f"{where} has no data rows.")
    id_column = id_column or schema.id_column
    ids = _check_ids(frame, id_column, where)
    if label_column is not None and label_column not in cols:
        raise DataError(f"label column {label_column!r} is not in {where}.")
    label_column = label_column or (schema.label_column if schema.label_column in cols else None)
    in_block = {c: b for b, bcols in schema.blocks.items() for c in bcols}
    for what, c in (("ID", id_column), ("label", label_column)):
        if c in in_block:
            raise DataError(
                f"{what} column {c!r} of {where} is a feature column of block {in_block[c]!r} in the schema."
            )
    present = set(cols)
    held: list[str] = []
    for b, bcols in schema.blocks.items():
        have = [c for c in bcols if c in present]
        if have and len(have) < len(bcols):
            missing = next(c for c in bcols if c not in present)
            raise DataError(
                f"{where} holds column {have[0]!r} of block {b!r} but not its column {missing!r} "
                "(a block is held with all its columns or not at all)."
            )
        if have:
            held.append(b)
    if not held:
        raise DataError(
            f"{where} holds none of the schema's blocks ({', '.join(repr(b) for b in schema.blocks)}): "
            "check its column names against the schema."
        )
    blocks: dict[str, np.ndarray] = {}
    for b in held:
        parts = [
            _categorical(frame, c, schema.categorical[c], where)
            if c in schema.categorical
            else _numeric(frame, c, where, schema.missing)
            for c in schema.blocks[b]
        ]
        blocks[b] = np.concatenate(parts, axis=1)
    labels = _check_labels(frame, label_column, schema.classes, where) if label_column is not None else None
    if labels is not None and not (labels >= 0).any():
        labels = None  # a label column without any value: the organisation holds no labels
    ignored = [c for c in cols if c not in in_block and c not in (id_column, label_column)]
    return ClientTable(ids, blocks, labels, ignored)


def block_stats(blocks: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per block: ``count`` (n_m; with missing cells, NaN, one count per feature of its observed
    cells), ``sum`` and ``sumsq`` (one float per feature, float64, over the observed cells) of the
    raw features: what a federated mean and variance need (``mean = sum/count``, ``var =
    sumsq/count - mean**2`` over all organisations holding the block)."""
    out = {}
    for b, x in blocks.items():
        x = np.asarray(x, dtype=np.float64).reshape(x.shape[0], -1)
        seen = ~np.isnan(x)
        x = np.where(seen, x, 0.0)
        count = int(x.shape[0]) if seen.all() else seen.sum(axis=0).astype(int).tolist()
        out[b] = {"count": count, "sum": x.sum(axis=0).tolist(), "sumsq": (x * x).sum(axis=0).tolist()}
    return out


EVAL_DIR = "evaluation"
"""The sub-directory of a client directory holding the organisation's own test rows (``client
prepare --test-table``), in the layout of the directory itself."""


def _encoded(ct: ClientTable, schema: FederationSchema) -> tuple[HybridDataset, np.ndarray | None, int, int, bool]:
    """``(dataset, labels (-1: none) or None, imputed, unfilled, standardized)`` of a checked
    table: missing cells filled with the schema's means (``impute_mean``; placeholders counted as
    ``unfilled`` before the federation has means), then the federated z-score."""
    blocks, imputed, unfilled = {}, 0, 0
    for b, x in ct.blocks.items():
        gaps = np.isnan(x)
        if gaps.any():
            if b in schema.means:
                x = np.where(gaps, np.asarray(schema.means[b], dtype=np.float64)[None, :], x)
                imputed += int(gaps.sum())
            else:  # no federation mean yet: a placeholder the loader never gives to an algorithm
                x = np.where(gaps, 0.0, x)
                unfilled += int(gaps.sum())
        blocks[b] = x
    standardized = False
    if schema.standardize and schema.means:
        for b, x in blocks.items():
            if b in schema.means:
                sd = np.asarray(schema.stds[b], dtype=np.float64)
                sd[sd < 1e-12] = 1.0
                blocks[b] = (x - np.asarray(schema.means[b])) / sd
        standardized = True
    labels = ct.labels
    y = np.maximum(labels, 0) if labels is not None else np.zeros(len(ct.ids), np.int64)
    return HybridDataset(schema.name, ct.ids, y, blocks, list(schema.classes)), labels, imputed, unfilled, standardized


def prepare_client(
    table: str | Path,
    schema_path: str | Path,
    out_dir: str | Path,
    *,
    id_column: str | None = None,
    label_column: str | None = None,
    client_id: str | None = None,
    index: int = 0,
    sep: str | None = None,
    test_table: str | Path | None = None,
) -> PreparedClient:
    """Write the client directory ``out_dir`` from an organisation's own table and the federation schema.

    The directory has the layout of ``hybridfl export-clients`` (``client.json``, ``blocks.json``,
    ``sample_ids.npy``, ``block-<k>-<name>.npz`` of float32 ``(n_m, width)``, ``labels.npy`` if the
    table holds labels, -1 for an unlabelled row), plus ``stats.json`` when the schema says
    ``standardize = true`` or ``missing = "impute_mean"``. It is written in a temporary directory
    next to ``out_dir`` and renamed at the end: on any error nothing is left.

    Missing numeric cells (``missing = "impute_mean"``) are filled with the schema's ``means`` of
    their feature; without them the cells stay unfilled (``client.json`` ``unfilled``), and
    :func:`~hybridfl.data.export.load_client_dir` refuses the directory until it is prepared again
    with the schema ``hybridfl federation stats`` writes. Global ``means``/``stds`` standardise the
    blocks when the schema says ``standardize = true``.

    Args:
        table: CSV, Parquet or ``.npz`` file (see :func:`read_client_table`).
        schema_path: the federation schema TOML (``hybridfl federation init``).
        out_dir: the client directory to create; an existing one must be empty.
        id_column, label_column: see :func:`table_to_client_dataset`.
        client_id: the client's name (default: ``out_dir``'s name).
        index: the client's position in the federation (its seed is ``seed + 1 + index``; give each
            organisation a different one).
        sep: the CSV delimiter (default: the schema's ``sep``).
        test_table: the organisation's own test rows (other samples, the same blocks and label
            column), checked and encoded like ``table`` and kept in ``evaluation/`` for federated
            evaluation (:mod:`hybridfl.inference.federated`); never trained on.

    Raises:
        ConfigError: a missing or invalid schema.
        DataError: the table does not match the schema (see :func:`table_to_client_dataset`), an
            unreadable table, a non-empty or symbolic-link ``out_dir``, or a client name that is not a safe
            directory name.
    """
    schema = load_schema(schema_path)
    table = Path(table).expanduser()
    out = Path(out_dir).expanduser()
    cid = client_id if client_id is not None else out.resolve().name
    _check_client_names([cid])  # a safe directory name, not 'server'
    if index < 0:
        raise DataError(f"client index {index} must be 0 or more.")
    if sep is not None and not sep:
        raise DataError("--sep must not be empty.")
    if out.is_symlink():  # the rename below would fail on it (a traceback) or write through it
        raise DataError(
            f"client directory {str(out)!r} is a symbolic link: give the path of a new or empty directory itself."
        )
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise DataError(f"client directory {str(out)!r} exists and is not an empty directory: prepare into a new one.")
    frame = read_client_table(table, sep if sep is not None else schema.sep)
    ct = table_to_client_dataset(frame, schema, id_column=id_column, label_column=label_column, where=table.name)
    stats = block_stats(ct.blocks) if schema.standardize or schema.missing == "impute_mean" else None
    ds, labels, imputed, unfilled, standardized = _encoded(ct, schema)
    test = _test_rows(test_table, table, ct, schema, id_column, label_column, sep)  # its own evaluation rows
    meta, tail = _client_meta(schema, cid, index, labels, test, standardized, imputed, unfilled)
    _write_client_dir(out, ds, labels, test, stats, meta, tail)
    return PreparedClient(
        out,
        cid,
        ds.n_samples,
        list(ds.block_names),
        labels is not None,
        ct.ignored,
        standardized,
        stats is not None,
        meta["n_labelled"],
        imputed,
        tail["unfilled"],
    )


def _test_rows(
    test_table: str | Path | None,
    table: Path,
    ct: ClientTable,
    schema: FederationSchema,
    id_column: str | None,
    label_column: str | None,
    sep: str | None,
) -> tuple[HybridDataset, np.ndarray | None, int, int, bool] | None:
    """An organisation's own test rows (:func:`prepare_client`'s ``test_table``), checked and
    encoded like its training table ``ct``: :func:`_encoded` of them (``None`` without a test table).

    Raises:
        DataError: other blocks than the training table, the label column in only one of them,
            an ID of the training table, or what :func:`table_to_client_dataset` refuses.
    """
    if test_table is None:
        return None
    test_table = Path(test_table).expanduser()
    tframe = read_client_table(test_table, sep if sep is not None else schema.sep)
    tct = table_to_client_dataset(tframe, schema, id_column=id_column, label_column=label_column, where=test_table.name)
    if list(tct.blocks) != list(ct.blocks):
        raise DataError(
            f"{test_table.name} holds blocks {', '.join(tct.blocks)}, the training table {', '.join(ct.blocks)}: "
            "an organisation's test rows have the blocks of its training rows."
        )
    if (tct.labels is None) != (ct.labels is None):
        raise DataError(f"{test_table.name} and {table.name} must both have the label column, or neither.")
    both = np.intersect1d(tct.ids, ct.ids)
    if both.size:
        raise DataError(f"{test_table.name} repeats {both.size} IDs of {table.name}: test rows must be other samples.")
    return _encoded(tct, schema)


def _write_client_dir(
    out: Path,
    ds: HybridDataset,
    labels: np.ndarray | None,
    test: tuple | None,
    stats: dict | None,
    head: dict,
    tail: dict,
) -> None:
    """Write the client directory ``out`` (:func:`prepare_client`) in a temporary directory next to
    it and rename it at the end (nothing is left on an error): the data files, the evaluation
    rows, a new credential (``client_key.pem``), ``stats.json`` and ``client.json`` (``head``, the
    data files' entries, ``tail`` and the public key before ``tail``'s last entry, ``encoding``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.prepare-", dir=out.parent))
    try:
        stage = tmp / "client"
        info = _write_dataset_dir(stage, ds, with_labels=labels is not None, labels=labels)
        if test is not None:
            _write_dataset_dir(stage / EVAL_DIR, test[0], with_labels=test[1] is not None, labels=test[1])
        public_key = new_client_key(stage)  # client_key.pem: the node's proof of identity at the hello
        rest = dict(tail)
        encoding = rest.pop("encoding")
        meta = {**head, **info, **rest, PUBLIC_KEY_FIELD: public_key, "encoding": encoding}
        if stats is not None:
            atomic_write(stage / STATS_FILE, json.dumps({"blocks": stats}, indent=1), mode=FILE_MODE)
        atomic_write(stage / "client.json", json.dumps(meta, indent=1), mode=FILE_MODE)
        os.chmod(stage, DIR_MODE)
        os.rename(stage, out)  # an existing out is empty (checked by the caller): the rename replaces it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _client_meta(
    schema: FederationSchema,
    cid: str,
    index: int,
    labels: np.ndarray | None,
    test: tuple | None,
    standardized: bool,
    imputed: int,
    unfilled: int,
) -> tuple[dict, dict]:
    """The entries of ``client.json`` (:func:`prepare_client`) before the data files' entries and
    after them (:func:`_write_client_dir` adds those and the public key); ``unfilled`` counts the
    training table's unfilled cells, the test rows' are added."""
    n_labelled = int((labels >= 0).sum()) if labels is not None else 0
    meta = {
        "format": FORMAT_VERSION,
        "dataset": schema.name,
        "classes": list(schema.classes),
        "block_shapes": {b: list(s) for b, s in schema.block_shapes.items()},
        "client_id": cid,
        "index": int(index),
        "has_labels": labels is not None,
        "n_labelled": n_labelled,
        "n_test": 0 if test is None else int(test[0].n_samples),
    }
    tail = {
        "prepared": True,
        "schema_sha256": schema_digest(schema),
        "standardized": standardized,
        "imputed": imputed,
        "unfilled": unfilled + (0 if test is None else test[3]),
        # the schema's public encoding: the organisation's own copy, for its part of a model
        "encoding": encoding_meta(*schema_encoding(schema), "float64"),
    }
    return meta, tail
