"""The federation schema: what every organisation's client directory must agree on, without any data.

``hybridfl federation init --config run.yaml --out federation.toml`` writes it from a run config's
``dataset:`` section of kind ``table`` (nothing is read but the config), and ``hybridfl client
prepare`` checks an organisation's own table against it. The file is plain TOML, meant to be read
and edited by people::

    format = 1
    name = "customers"             # dataset name recorded in every client directory
    id_column = "ID"
    label_column = "default"
    classes = ["0", "1"]           # label values, class index = position
    standardize = true             # clients write per-block sums for a federated z-score
    sep = ","                      # CSV delimiter of the organisations' tables (client prepare --sep overrides)
    missing = "error"              # a missing feature cell: "error", or "impute_mean" (the federation's mean)
    seed = 0

    [blocks]                       # block name -> its columns, in global block order
    demographic = ["AGE", "SEX"]
    bill = ["BILL_AMT1", "BILL_AMT2"]

    [categorical]                  # column -> its levels (one-hot, in this order); others numeric
    SEX = ["1", "2"]

    [algorithm]                    # the run's algorithm section, validated
    name = "hyfem"
    rounds = 30

Optional ``[means]`` and ``[stds]`` tables (block -> one value per feature, after one-hot encoding)
hold global standardisation statistics; a client then standardises its blocks with them.

The config's ``dataset`` section may carry, for this command only, string ``classes``, a
``levels`` mapping (column -> levels) of its ``categorical`` columns and ``missing``.

**What the organisations must agree on** (:func:`schema_digest`): only what decides the content of
a prepared client directory -- the dataset name, ID and label columns, classes, blocks and their
columns, categorical levels, ``standardize`` with the global ``means``/``stds``, ``sep`` and
``missing``. Each client directory records the digest of these fields, and ``federation
assemble``, ``run --federation`` and ``deploy-local --federation`` refuse a directory prepared for
other data. The ``seed`` and the ``[algorithm]`` section are training settings: a client directory
does not depend on them (``client prepare`` writes no algorithm-specific material; HyFDCA's
``he_secret.key`` is made apart with ``hybridfl he-keys`` and checked when the run starts), so
they can change -- more rounds, another ``lr``, even another algorithm -- without preparing again.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hybridfl.config import read_config_file
from hybridfl.data.toml_writer import toml_key as _key
from hybridfl.data.toml_writer import toml_value as _value
from hybridfl.errors import ConfigError
from hybridfl.files import atomic_write
from hybridfl.privacy.credentials import PUBLIC_KEY_FIELD, public_key_hex
from hybridfl.privacy.roster import write_roster

SCHEMA_FORMAT = 1
"""Version of the federation schema file."""


class FederationSchema(BaseModel):
    """The public schema a federation agrees on before any client reads its data.

    Attributes:
        format: schema file version (:data:`SCHEMA_FORMAT`).
        name: dataset name recorded in every client directory.
        id_column: the column holding the sample IDs (the join key across organisations).
        label_column: the column holding the labels (only some organisations have it).
        classes: the label values as strings; class index = position (``C = len(classes)``).
        standardize: whether features are to be z-scored (clients record per-block sums).
        sep: the CSV delimiter of the organisations' tables (``client prepare --sep`` overrides it).
        missing: a missing numeric cell: ``"error"`` (refused, naming column and row) or
            ``"impute_mean"`` (filled with the federation's mean of that feature, the schema's
            ``means`` from ``hybridfl federation stats``). A missing categorical cell is always
            refused.
        seed: the run seed.
        blocks: block name -> its column names, in global block order.
        categorical: column -> its levels, one-hot encoded in this order; every other column of a
            block is numeric.
        means, stds: optional global standardisation statistics, block -> one value per feature
            (the block's width after one-hot encoding).
        algorithm: the run's ``algorithm`` section.

    Raises:
        pydantic.ValidationError: on construction, for an inconsistent schema (use
            :func:`load_schema` to get a one-sentence :class:`ConfigError` instead).
    """

    model_config = ConfigDict(extra="forbid")
    format: int = SCHEMA_FORMAT
    name: str = Field(min_length=1)
    id_column: str = Field(min_length=1)
    label_column: str = Field(min_length=1)
    classes: list[str] = Field(min_length=1)
    standardize: bool = False
    sep: str = Field(",", min_length=1)
    missing: Literal["error", "impute_mean"] = "error"
    seed: int = 0
    blocks: dict[str, list[str]] = Field(min_length=1)
    categorical: dict[str, list[str]] = Field(default_factory=dict)
    means: dict[str, list[float]] = Field(default_factory=dict)
    stds: dict[str, list[float]] = Field(default_factory=dict)
    algorithm: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> FederationSchema:
        if self.format != SCHEMA_FORMAT:
            raise ValueError(f"format {self.format} is not supported (this hybridfl reads format {SCHEMA_FORMAT})")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("classes repeat a value")
        seen: dict[str, str] = {}
        for b, cols in self.blocks.items():
            if not cols:
                raise ValueError(f"block {b!r} has no columns")
            for c in cols:
                if c in (self.id_column, self.label_column):
                    raise ValueError(f"column {c!r} of block {b!r} is the ID or label column")
                if c in seen:
                    raise ValueError(f"column {c!r} is in both block {seen[c]!r} and block {b!r}")
                seen[c] = b
        for c, levels in self.categorical.items():
            if c not in seen:
                raise ValueError(f"categorical column {c!r} is in no block")
            if not levels:
                raise ValueError(f"categorical column {c!r} has no levels")
            if len(set(levels)) != len(levels):
                raise ValueError(f"categorical column {c!r} repeats a level")
        for what, table in (("means", self.means), ("stds", self.stds)):
            for b, v in table.items():
                if b not in self.blocks:
                    raise ValueError(f"{what} names block {b!r}, which is not in blocks")
                if len(v) != self.width(b):
                    raise ValueError(f"{what} of block {b!r} has {len(v)} values for {self.width(b)} features")
                if not all(math.isfinite(x) for x in v):
                    raise ValueError(f"{what} of block {b!r} holds a value that is not finite")
        if set(self.means) != set(self.stds):
            raise ValueError("means and stds must name the same blocks")
        return self

    def width(self, block: str) -> int:
        """The number of features of ``block``: 1 per numeric column, one per level of a categorical one."""
        return sum(len(self.categorical[c]) if c in self.categorical else 1 for c in self.blocks[block])

    @property
    def block_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every block name -> its per-sample shape ``(width,)``, in global block order."""
        return {b: (self.width(b),) for b in self.blocks}

    def column_type(self, column: str) -> str:
        """``"categorical"`` or ``"numeric"``."""
        return "categorical" if column in self.categorical else "numeric"


# ------------------------------------------------------------------------------------ from a config


def _read_mapping(path: Path) -> dict:
    data = read_config_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must be a mapping of sections (seed, dataset, algorithm).")
    return data


def schema_from_config(path: str | Path) -> FederationSchema:
    """The federation schema a run config's ``dataset:`` section (kind ``table``) describes; no data is read.

    Needs ``dataset.name: table``, ``dataset.blocks``, ``dataset.label_column``, ``dataset.id_column``
    and ``dataset.classes`` (label values; strings allowed here), and ``dataset.levels`` (column ->
    levels) for every column listed in ``dataset.categorical``. The ``algorithm`` section is
    validated by its algorithm's config model and written in full (defaults included, ``null``
    values left out).

    Raises:
        ConfigError: an unreadable or invalid config, or a missing field (one sentence naming it).
    """
    from hybridfl.algorithms.spec import get_algorithm
    from hybridfl.config import parse_config

    p = Path(path).expanduser()
    raw = _read_mapping(p)
    ds = raw.get("dataset")
    if not isinstance(ds, dict):
        raise ConfigError(f"config {p.name} has no 'dataset' section (federation init needs dataset.name: table).")
    ds = dict(ds)
    classes = ds.pop("classes", None)
    levels = ds.pop("levels", None)
    missing = ds.pop("missing", "error")
    if missing not in ("error", "impute_mean"):
        raise ConfigError(f"config field 'dataset.missing' in {p.name} must be 'error' or 'impute_mean'.")
    cfg = parse_config({**raw, "dataset": ds}, where=p.name)
    d = cfg.dataset
    if d.name != "table":
        raise ConfigError(
            f"config field 'dataset.name' in {p.name} must be 'table' for federation init, not {d.name!r}."
        )
    for fld in ("blocks", "label_column", "id_column"):
        if not getattr(d, fld):
            raise ConfigError(f"config {p.name} is missing the field 'dataset.{fld}', which federation init needs.")
    _check_classes(classes, p.name)
    cat = _categorical_levels(levels, d.categorical or [], p.name)
    algo = cfg.algorithm_config()
    spec = get_algorithm(cfg.algorithm.get("name", "hyfem"))
    algo_json = _drop_none(algo.model_dump(mode="json"))
    if spec.config_model.model_validate(algo_json) != algo:
        raise ConfigError(f"config section 'algorithm' in {p.name} sets a value to null that TOML cannot hold.")
    name = Path(d.path).stem if d.path else p.stem
    try:
        return FederationSchema(
            name=name,
            id_column=d.id_column,
            label_column=d.label_column,
            classes=[str(c) for c in classes],
            standardize=d.standardize,
            sep=d.sep if d.sep is not None else ",",
            missing=missing,
            seed=cfg.seed,
            blocks=d.blocks,
            categorical=cat,
            algorithm=algo_json,
        )
    except ValidationError as e:
        raise ConfigError(f"config {p.name} does not give a valid federation schema: {_first(e)}.") from None


def _check_classes(classes: Any, where: str) -> None:
    """``dataset.classes`` of a federation config: a non-empty list of label values, no booleans.

    Raises:
        ConfigError: missing or malformed (one sentence).
    """
    if classes is None:
        raise ConfigError(
            f"config {where} is missing the field 'dataset.classes' (the label values), which federation init needs."
        )
    if not isinstance(classes, list) or not classes or not all(isinstance(c, (str, int)) for c in classes):
        raise ConfigError(f"config field 'dataset.classes' in {where} must be a non-empty list of label values.")
    if any(isinstance(c, bool) for c in classes):
        raise ConfigError(
            f"config field 'dataset.classes' in {where} holds a boolean (YAML reads yes/no/true/false so): quote it."
        )


def _categorical_levels(levels: Any, categorical: list[str], where: str) -> dict[str, list[str]]:
    """``dataset.levels`` checked against ``dataset.categorical``: column -> its levels as strings.

    Raises:
        ConfigError: not a mapping, a categorical column without levels, or levels of another column.
    """
    levels = levels if levels is not None else {}
    if not isinstance(levels, dict):
        raise ConfigError(f"config field 'dataset.levels' in {where} must map columns to lists of levels.")
    cat: dict[str, list[str]] = {}
    for c in categorical:
        lv = levels.get(c)
        if not isinstance(lv, list) or not lv:
            raise ConfigError(
                f"config {where} is missing the field 'dataset.levels.{c}' (the levels of categorical column {c!r})."
            )
        cat[c] = [str(v) for v in lv]
    extra = [c for c in levels if c not in cat]
    if extra:
        raise ConfigError(
            f"config field 'dataset.levels.{extra[0]}' in {where} names a column not in 'dataset.categorical'."
        )
    return cat


def _drop_none(v: Any) -> Any:
    """``v`` without ``None`` values in mappings, recursively (TOML has no null)."""
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_none(x) for x in v]
    return v


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


# ------------------------------------------------------------------------------------ TOML file
def schema_to_toml(schema: FederationSchema) -> str:
    """The schema as TOML text (top-level keys, then one table per mapping); ``tomllib`` reads it back equal.

    Raises:
        ConfigError: an algorithm value TOML cannot hold (not str, number, bool, list or mapping).
    """
    data = schema.model_dump()
    lines = ["# hybridfl federation schema: written by `hybridfl federation init`, read by `hybridfl client prepare`"]
    tables = ("blocks", "categorical", "means", "stds", "algorithm")
    for k, v in data.items():
        if k not in tables:
            lines.append(f"{_key(k)} = {_value(v)}")
    for t in tables:
        if data[t] or t in ("blocks", "algorithm"):
            lines += ["", f"[{t}]"] + [f"{_key(str(k))} = {_value(v)}" for k, v in data[t].items() if v is not None]
    return "\n".join(lines) + "\n"


def write_schema(schema: FederationSchema, path: str | Path) -> Path:
    """Write ``schema`` as TOML to ``path`` (atomically); return the path.

    Raises:
        ConfigError: ``path`` is an existing directory, or a value TOML cannot hold.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"federation schema path {str(p)!r} is a directory.")
    text = schema_to_toml(schema)
    if FederationSchema.model_validate(tomllib.loads(text)) != schema:  # the writer is ours: check the round trip
        raise ConfigError(f"the federation schema cannot be written to {str(p)!r} without changing a value.")
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, text.encode())
    return p


def load_schema(path: str | Path) -> FederationSchema:
    """Read a federation schema TOML file (written by :func:`write_schema`, possibly edited by hand).

    Raises:
        ConfigError: a missing or unreadable file, invalid TOML, or an invalid schema (one sentence).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"federation schema {str(p)!r} does not exist (write it with `hybridfl federation init`).")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"federation schema {str(p)!r} is not valid TOML: {str(e).splitlines()[0]}.") from None
    try:
        return FederationSchema.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"federation schema {str(p)!r} is invalid: {_first(e)}.") from None


DATA_FIELDS = (
    "format",
    "name",
    "id_column",
    "label_column",
    "classes",
    "standardize",
    "sep",
    "missing",
    "blocks",
    "categorical",
    "means",
    "stds",
)
"""The schema fields a prepared client directory depends on: what :func:`schema_digest` covers."""


def schema_digest(schema: FederationSchema | str | Path) -> str:
    """SHA-256 (hex) of the schema's data fields (:data:`DATA_FIELDS`; of the file's schema when
    given a path): recorded in each client directory (``client.json`` ``schema_sha256``), so a
    later step can check that every organisation prepared its data the same way.

    Covered: dataset name, ID and label columns, classes, ``standardize`` with the global
    ``means``/``stds``, ``sep``, ``missing``, blocks with their columns in order, categorical
    levels in order. Not covered: ``seed`` and ``[algorithm]`` (training settings: a prepared
    directory holds nothing that depends on them, so changing rounds, ``lr`` or the algorithm needs
    no new ``client prepare``), comments and formatting of the file.

    Raises:
        ConfigError: a path that is not a valid schema file.
    """
    s = schema if isinstance(schema, FederationSchema) else load_schema(schema)
    data = {k: getattr(s, k) for k in DATA_FIELDS}
    data["blocks"] = [[b, list(c)] for b, c in s.blocks.items()]  # block order is the global feature order
    for k in ("categorical", "means", "stds"):
        data[k] = sorted([c, list(v)] for c, v in getattr(s, k).items())
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def combine_stats(schema: FederationSchema, stats: Sequence[tuple[str, Mapping[str, Any]]]) -> FederationSchema:
    """The schema with global ``means`` and ``stds`` per block from the organisations' ``stats.json``
    (``{"blocks": {block: {"count", "sum", "sumsq"}}}``, :func:`hybridfl.data.prepare.block_stats`):
    ``mean = sum_k sum_k / sum_k n_k`` and ``std = sqrt(sum_k sumsq_k / sum_k n_k - mean^2)`` (a
    feature with std 0 gets 1), per feature, over the organisations holding the block. ``count``
    is one integer (every feature observed in every row) or one per feature (with ``missing =
    "impute_mean"``, the cells observed). Only these aggregates are combined, never rows; a block
    nobody holds gets no statistics.

    Args:
        stats: ``(where, content)`` per organisation (``where`` names it in errors).

    Raises:
        ConfigError: no statistics, a block not in the schema, a count that is not a positive
            integer, sums of another length than the block's features, or a non-finite value.
    """
    if not stats:
        raise ConfigError("no statistics to combine (give every organisation's stats.json).")
    total: dict[str, list] = {}
    for where, content in stats:
        blocks = content.get("blocks") if isinstance(content, Mapping) else None
        if not isinstance(blocks, Mapping):
            raise ConfigError(f"{where} holds no 'blocks' statistics.")
        for b, s in blocks.items():
            if b not in schema.blocks:
                raise ConfigError(f"{where} has statistics for block {b!r}, which is not in the schema.")
            n = s.get("count") if isinstance(s, Mapping) else None
            counts = n if isinstance(n, list) and len(n) == schema.width(b) else [n]
            if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts) or max(counts) < 1:
                raise ConfigError(
                    f"{where}: the count of block {b!r} is not a positive integer (or one integer per feature)."
                )
            sums = []
            for key in ("sum", "sumsq"):
                v = s.get(key)
                if not isinstance(v, list) or len(v) != schema.width(b):
                    raise ConfigError(f"{where}: {key!r} of block {b!r} does not hold {schema.width(b)} values.")
                a = np.asarray(v, dtype=np.float64)
                if not np.isfinite(a).all():
                    raise ConfigError(f"{where}: {key!r} of block {b!r} holds a value that is not finite.")
                sums.append(a)
            acc = total.setdefault(b, [np.zeros(schema.width(b)), np.zeros(schema.width(b)), np.zeros(schema.width(b))])
            acc[0] += np.asarray(n, dtype=np.float64)
            acc[1] += sums[0]
            acc[2] += sums[1]
    means, stds = {}, {}
    for b, (n, s, sq) in total.items():
        if not (n > 0).all():
            j = int(np.flatnonzero(n <= 0)[0])
            raise ConfigError(f"no organisation observed feature {j} of block {b!r} (every cell missing): no mean.")
        mean = s / n
        std = np.sqrt(np.maximum(sq / n - mean * mean, 0.0))
        means[b] = mean.tolist()
        stds[b] = np.where(std > 0, std, 1.0).tolist()
    return schema.model_copy(update={"means": means, "stds": stds})


def federation_server_meta(
    schema_path: str | Path, client_infos: Sequence[tuple[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """The ``server.json`` content of a federation of prepared clients, from the schema and each
    organisation's public ``client.json`` (its name, index, blocks and whether it holds labels;
    never data): what :func:`assemble_server` writes and ``hybridfl run --federation`` builds in
    memory. The server gets no test set.

    Args:
        client_infos: ``(where, client.json content)`` per organisation.

    Raises:
        ConfigError: no clients, a client prepared against another schema, a repeated name or
            index, indices that are not ``0..K-1``, or a block not in the schema.
    """
    from hybridfl.data.export import FORMAT_VERSION

    schema = load_schema(schema_path)
    digest = schema_digest(schema_path)
    if not client_infos:
        raise ConfigError("no clients to assemble (give every organisation's client.json).")
    rows = []
    for where, info in client_infos:
        try:
            cid, index = str(info["client_id"]), int(info["index"])
            blocks, labels = [str(b) for b in info["blocks"]], bool(info["has_labels"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where} is not a client.json of a prepared client.") from None
        if info.get("schema_sha256") not in (None, digest):
            raise ConfigError(
                f"{where} was prepared against another federation schema than {str(schema_path)!r} (other blocks, "
                "columns, levels, classes, standardisation, sep or missing policy): prepare it again with this schema."
            )
        unknown = [b for b in blocks if b not in schema.blocks]
        if unknown:
            raise ConfigError(f"{where} holds block {unknown[0]!r}, which is not in the schema.")
        key = info.get(PUBLIC_KEY_FIELD)
        if key is not None:
            key = public_key_hex(key, where)
        rows.append((index, cid, blocks, labels, key))
    rows.sort(key=lambda r: (r[0], r[1]))
    names = [r[1] for r in rows]
    if len(set(names)) != len(names):
        raise ConfigError(f"two organisations prepared the same client name {names[0]!r}.")
    if [r[0] for r in rows] != list(range(len(rows))):
        raise ConfigError(
            f"the clients' --index values are {[r[0] for r in rows]}, not 0..{len(rows) - 1} (one per organisation)."
        )
    meta = {
        "format": FORMAT_VERSION,
        "dataset": "federation",
        "classes": list(schema.classes),
        "block_shapes": {b: list(s) for b, s in schema.block_shapes.items()},
        "client_ids": names,
        "seed": int(schema.seed),
        "has_test": False,
        "client_blocks": {r[1]: r[2] for r in rows},
        "client_labels": {r[1]: r[3] for r in rows},
        # public Ed25519 keys from client.json (client prepare): a deployment checks each node's hello
        "client_keys": {r[1]: r[4] for r in rows if r[4] is not None},
        "run_config": {"seed": int(schema.seed), "algorithm": dict(schema.algorithm)},
        "schema_sha256": digest,
    }
    from hybridfl.data.encoding import encoding_meta, schema_encoding

    enc, scale = schema_encoding(schema)
    meta["encoding"] = encoding_meta(enc, scale, "float64")  # the server's model directory (hybridfl.inference)
    return meta


def assemble_server(
    schema_path: str | Path, client_infos: Sequence[tuple[str, Mapping[str, Any]]], out_dir: str | Path
) -> Path:
    """Write the ``server/`` directory of a federation of prepared clients (the layout
    :func:`hybridfl.data.export.load_server_dir` reads): ``server.json`` from
    :func:`federation_server_meta`. The server gets no test set: evaluation needs an algorithm
    whose clients hold one, or none.

    Raises:
        ConfigError: as :func:`federation_server_meta`, or an ``out_dir`` that exists.
    """
    out = Path(out_dir).expanduser()
    if out.exists():
        raise ConfigError(f"{str(out)!r} exists: assemble the server directory into a new path.")
    return write_server_dir(federation_server_meta(schema_path, client_infos), out)


def write_server_dir(meta: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Create the server directory ``out_dir`` (mode 0700) holding ``server.json`` = ``meta`` (the
    content :func:`federation_server_meta` makes; :func:`load_federation` returns it as the
    server data's ``meta``) and, when every client registered a credential key, ``roster.json``
    (:mod:`hybridfl.privacy.roster`: each organisation installs it with ``hybridfl client roster``).

    Raises:
        ConfigError: ``out_dir`` exists.
    """
    import json

    from hybridfl.data.export import DIR_MODE, FILE_MODE

    out = Path(out_dir).expanduser()
    if out.exists():
        raise ConfigError(f"{str(out)!r} exists: write the server directory into a new path.")
    out.mkdir(mode=DIR_MODE, parents=True)
    atomic_write(out / "server.json", json.dumps(meta, indent=1), mode=FILE_MODE)
    write_roster(out, meta)  # public: each organisation installs it (hybridfl client roster) after comparing
    return out


def load_federation(schema_path: str | Path, client_dirs: Sequence[str | Path]):
    """The server's public data and every organisation's client data of a federation of prepared
    client directories, in memory (``hybridfl run --federation``): the same objects a deployment
    reads from ``server/`` (:func:`assemble_server`) and from each SuperNode's ``data-dir``.

    Returns:
        ``(server_data, client_data)``: a :class:`~hybridfl.data.export.ServerData` without a test
        set and one :class:`~hybridfl.data.export.ClientData` per directory, in the clients'
        ``--index`` order.

    Raises:
        ConfigError: as :func:`federation_server_meta`, or a directory given twice.
        DataError: a directory that is not a client directory, or whose block shapes or classes
            differ from the schema's.
    """
    import json

    from hybridfl.data.export import ServerData, load_client_dir
    from hybridfl.errors import DataError

    schema = load_schema(schema_path)
    resolved = [Path(d).expanduser().resolve() for d in client_dirs]
    if len(set(resolved)) != len(resolved):
        raise ConfigError("a client directory is given twice in --clients.")
    clients, infos = [], []
    for d in resolved:
        cd = load_client_dir(d)
        if {b: tuple(s) for b, s in cd.block_shapes.items()} != schema.block_shapes:
            raise DataError(f"client directory {str(d)!r} has other blocks or block widths than the schema.")
        if list(cd.classes) != list(schema.classes):
            raise DataError(f"client directory {str(d)!r} has other classes than the schema.")
        info = dict(cd.meta)
        info.setdefault("blocks", list(cd.data.block_names))
        clients.append(cd)
        infos.append((str(d / "client.json"), info))
    meta = json.loads(json.dumps(federation_server_meta(schema_path, infos)))
    clients.sort(key=lambda c: c.index)
    server = ServerData(
        {b: tuple(int(v) for v in s) for b, s in meta["block_shapes"].items()},
        list(meta["classes"]),
        list(meta["client_ids"]),
        None,
        meta,
    )
    return server, clients
