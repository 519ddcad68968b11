"""Run configuration: a YAML or TOML file validated with pydantic.

A run config has four sections and an optional fifth, ``checkpoint`` (see ``examples/configs/`` for
complete, commented examples)::

    seed: 0
    dataset:            # which data, from which directory, and how it is split into blocks
      name: mfeat       # digits | mnist | mfeat | credit_default | adult | table
      data_dir: ../shared/data/mfeat
    partition:          # who holds what
      kind: class_block # class_block | grid | iid | dirichlet | by_class | vertical | file
      num_clients: 6
      classes_per_client: [5, 7]
      blocks_per_client: 3
    algorithm:          # the algorithm and its parameters
      name: hyfem
      rounds: 30
      local_steps: 20
    checkpoint:         # optional: when `hybridfl run --out` checkpoints (never changes results)
      every: 1          # at most every N rounds
      seconds: 0        # at least S seconds apart
      max_share: 0.1    # within 10 % of the run's wall time; the last round always

Every problem is reported as a :class:`ConfigError` with one sentence naming the file and the
field (``algorithm.rounds: Input should be greater than or equal to 1``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from hybridfl.errors import ConfigError


class DatasetConfig(BaseModel):
    """Which dataset to load and how its features are split into blocks."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["digits", "mnist", "mfeat", "credit_default", "adult", "table"] = "digits"
    data_dir: str | None = Field(None, description="directory holding the dataset's files")
    layout: Literal["halves", "quadrants", "tiles"] = Field(
        "quadrants", description="image block layout (digits, mnist)"
    )
    tiles: int = Field(2, ge=1, description="tiles per side for layout 'tiles'")
    flatten: bool | None = Field(
        None, description="vector blocks instead of image blocks (digits default true, mnist false)"
    )
    classes: list[int] | None = Field(None, description="mnist only: keep these digits, relabelled 0..k-1")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="held-out share when the data has no test file")
    standardize: bool = Field(True, description="z-score vector blocks with training statistics")
    # table
    path: str | None = Field(None, description="table: CSV/Parquet file")
    test_path: str | None = Field(None, description="table: optional test file")
    label_column: str | None = None
    id_column: str | None = None
    blocks: dict[str, list[str]] | None = Field(None, description="table: block name -> columns")
    categorical: list[str] | None = None
    sep: str | None = None

    @field_validator("data_dir", "path", "test_path")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v


class ClientSpecConfig(BaseModel):
    """One client of an explicit ``class_block`` partition: the classes it takes, the blocks it holds."""

    model_config = ConfigDict(extra="forbid")
    classes: list[int] = Field(description="class indices the client takes (all their training samples)")
    blocks: list[str] = Field(description="names of the feature blocks the client holds")


class _PartitionBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def own_fields(cls) -> list[str]:
        """The settings of this partition kind (``kind`` first)."""
        return list(cls.model_fields)


class ClassBlockPartitionConfig(_PartitionBase):
    """Hybrid classes x blocks (HyFEM Tables 2-4; :class:`~hybridfl.data.partitioners.ClassBlockPartitioner`):
    explicit ``clients``, or ``num_clients`` drawn with ``classes_per_client`` and ``blocks_per_client``.

    Raises:
        pydantic.ValidationError: ``clients`` together with a drawing setting (``num_clients``,
            ``classes_per_client``, ``blocks_per_client``), which explicit clients do not use.
    """

    kind: Literal["class_block"] = "class_block"
    num_clients: int = Field(6, ge=1, description="clients drawn (unused with explicit clients)")
    clients: list[ClientSpecConfig] | None = Field(
        None, min_length=1, description="explicit classes x blocks per client"
    )
    classes_per_client: int | tuple[int, int] = Field(
        (5, 7), description="classes of a drawn client: a number or an inclusive [low, high] range"
    )
    blocks_per_client: int | tuple[int, int] = Field(
        3, description="blocks of a drawn client: a number or an inclusive [low, high] range"
    )
    overlap: Literal["full", "split"] = Field(
        "full", description="full: a client takes all samples of its classes; split: they are divided among holders"
    )
    min_cell_coverage: int = Field(0, ge=0, description="redraw until every (class, block) cell is held this often")

    @model_validator(mode="after")
    def _explicit_or_drawn(self) -> ClassBlockPartitionConfig:
        drawn = sorted(self.model_fields_set & set(_DRAWN))
        if self.clients is not None and drawn:
            raise ValueError(f"{drawn[0]}: does not apply with explicit clients, which are not drawn")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # explicit clients: the drawing settings, unused, are not written
        data = handler(self)
        return {k: v for k, v in data.items() if k not in _DRAWN} if self.clients is not None else data


_DRAWN = ("num_clients", "classes_per_client", "blocks_per_client")


class GridPartitionConfig(_PartitionBase):
    """Hybrid grid (HyFDCA Fig. 2; :class:`~hybridfl.data.partitioners.GridPartitioner`): one client
    per (sample group, block group) cell."""

    kind: Literal["grid"]
    sample_groups: int = Field(3, ge=1, description="sample groups S")
    block_groups: int = Field(3, ge=1, description="block groups F")
    replicas: int = Field(1, ge=1, description="clients holding each cell")


class IIDPartitionConfig(_PartitionBase):
    """Horizontal IID (:class:`~hybridfl.data.partitioners.IIDPartitioner`): even shards, all blocks."""

    kind: Literal["iid"]
    num_clients: int = Field(6, ge=1, description="clients")


class DirichletPartitionConfig(_PartitionBase):
    """Horizontal non-IID (:class:`~hybridfl.data.partitioners.DirichletPartitioner`): per-class
    shares drawn from Dirichlet(alpha), all blocks."""

    kind: Literal["dirichlet"]
    num_clients: int = Field(6, ge=1, description="clients")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (smaller: more skew)")


class ByClassPartitionConfig(_PartitionBase):
    """Horizontal pathological non-IID (:class:`~hybridfl.data.partitioners.ClassPartitioner`): each
    client holds ``classes_per_client`` classes, all blocks."""

    kind: Literal["by_class"]
    num_clients: int = Field(6, ge=1, description="clients")
    classes_per_client: int = Field(5, ge=1, description="classes of each client")


class VerticalPartitionConfig(_PartitionBase):
    """Vertical (:class:`~hybridfl.data.partitioners.VerticalPartitioner`): every party holds every
    sample; explicit ``parties`` (block lists) or the blocks dealt to ``num_clients`` parties.

    Raises:
        pydantic.ValidationError: ``parties`` together with ``num_clients``.
    """

    kind: Literal["vertical"]
    num_clients: int = Field(6, ge=1, description="parties the blocks are dealt to (unused with explicit parties)")
    parties: list[list[str]] | None = Field(None, description="the blocks of each party")
    label_party: int = Field(0, ge=0, description="index of the party holding the labels")

    @model_validator(mode="after")
    def _explicit_or_dealt(self) -> VerticalPartitionConfig:
        if self.parties is not None and "num_clients" in self.model_fields_set:
            raise ValueError("num_clients: does not apply with explicit parties")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # explicit parties: num_clients, unused, is not written
        data = handler(self)
        return {k: v for k, v in data.items() if k != "num_clients"} if self.parties is not None else data


class FilePartitionConfig(_PartitionBase):
    """A partition JSON written by ``hybridfl partition --save``."""

    kind: Literal["file"]
    path: str = Field(min_length=1, description="the partition JSON file")


PartitionConfig = Annotated[
    ClassBlockPartitionConfig
    | GridPartitionConfig
    | IIDPartitionConfig
    | DirichletPartitionConfig
    | ByClassPartitionConfig
    | VerticalPartitionConfig
    | FilePartitionConfig,
    Field(discriminator="kind"),
]
"""Who holds what (see :mod:`hybridfl.data.partitioners`): one model per ``kind``, each with only its
own settings; ``kind`` defaults to ``class_block``."""

PARTITION_KINDS: dict[str, type[_PartitionBase]] = {
    m.model_fields["kind"].annotation.__args__[0]: m
    for m in (
        ClassBlockPartitionConfig,
        GridPartitionConfig,
        IIDPartitionConfig,
        DirichletPartitionConfig,
        ByClassPartitionConfig,
        VerticalPartitionConfig,
        FilePartitionConfig,
    )
}
"""Each partition ``kind`` and its settings' model."""


class CheckpointConfig(BaseModel):
    """When a run with an output directory writes its checkpoint (``checkpoint.hfl``).

    A round is checkpointed once ``every`` rounds and ``seconds`` seconds have passed since the last
    checkpoint and writing it keeps checkpointing within ``max_share`` of the run's wall time so
    far; the last round and a clean stop (Ctrl-C, SIGTERM) are always checkpointed. The settings
    do not change the results: a resumed run equals an uninterrupted one.
    """

    model_config = ConfigDict(extra="forbid")
    every: int = Field(1, ge=1, description="at most one checkpoint every this many rounds")
    seconds: float = Field(0.0, ge=0, description="at least this many seconds between two checkpoints")
    max_share: float | None = Field(
        0.1, gt=0, le=1, description="skip a checkpoint that would take checkpointing above this share of wall time"
    )


class RunConfig(BaseModel):
    """A whole run: seed, dataset, partition and algorithm (validated per algorithm), and when to
    checkpoint."""

    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=ClassBlockPartitionConfig)
    algorithm: dict[str, Any] = Field(default_factory=lambda: {"name": "hyfem"})
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @field_validator("partition", mode="before")
    @classmethod
    def _default_kind(cls, v: object) -> object:
        if isinstance(v, dict) and "kind" not in v:
            return {**v, "kind": "class_block"}
        return v

    def algorithm_config(self) -> BaseModel:
        """The ``algorithm`` section validated by the registered algorithm's config model."""
        from hybridfl.algorithms.spec import get_algorithm

        name = self.algorithm.get("name", "hyfem")
        spec = get_algorithm(name)
        try:
            return spec.config_model.model_validate({**self.algorithm, "name": name})
        except ValidationError as e:
            raise ConfigError(_first_error(e, "algorithm")) from None


def simulation_fields(model: type[BaseModel]) -> frozenset[str]:
    """The settings of an algorithm config model that only the simulation and the server use
    (failure injection, modelled latency, the evaluation schedule, baselines, the device): its
    ``simulation_only`` class attribute (empty without one)."""
    return frozenset(getattr(model, "simulation_only", frozenset())) & frozenset(model.model_fields)


def client_settings_json(cfg: BaseModel) -> str:
    """The algorithm settings a deployed client receives in the hello, as JSON: the method, its
    hyperparameters and the protocol and privacy settings, without :func:`simulation_fields`
    (the client validates the JSON with the same model, which fills their defaults)."""
    return cfg.model_dump_json(exclude=set(simulation_fields(type(cfg))))


def _first_error(e: ValidationError, prefix: str = "", where: str = "") -> str:
    err = e.errors()[0]
    loc = ((prefix,) if prefix else ()) + tuple(err["loc"])
    msg = err["msg"]
    kind = None
    if len(loc) >= 2 and loc[0] == "partition" and loc[1] in PARTITION_KINDS:
        kind = str(loc[1])
        loc = (loc[0],) + loc[2:]  # the union's tag is the kind, not a field
    if err["type"] == "union_tag_invalid":
        loc = (*loc, "kind")
        msg = f"must be one of {', '.join(PARTITION_KINDS)}, not {err['ctx']['tag']!r}"
    elif err["type"] == "extra_forbidden" and kind is not None:
        own = ", ".join(f for f in PARTITION_KINDS[kind].own_fields() if f != "kind")
        known = any(loc[-1] in m.model_fields for m in PARTITION_KINDS.values())
        msg = f"{'does not apply to' if known else 'is not a known setting of'} partition kind {kind!r} (its settings: {own})"
    elif err["type"] == "extra_forbidden":
        msg = "is not a known setting"
    elif kind is not None and len(loc) == 1:  # a kind's model validator: "<field>: <problem>"
        field, _, rest = msg.removeprefix("Value error, ").partition(": ")
        loc, msg = (*loc, field), f"{rest} (partition kind {kind!r})"
    place = f" in {where}" if where else ""
    return f"config field {'.'.join(str(p) for p in loc)!r}{place}: {msg}."


def parse_config(data: dict, where: str = "config") -> RunConfig:
    """Validate a config mapping (and its algorithm section).

    Raises:
        ConfigError: one sentence naming the field and the problem.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of sections (seed, dataset, partition, algorithm).")
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_first_error(e, where=where)) from None
    if not isinstance(cfg.algorithm.get("name", "hyfem"), str):
        raise ConfigError(f"config field 'algorithm.name' in {where} must be a string.")
    try:
        cfg.algorithm_config()
    except ConfigError as e:
        raise ConfigError(str(e).rstrip(".") + f" ({where}).") from None
    return cfg


def load_config(path: str | Path) -> RunConfig:
    """Read a ``.yaml``/``.yml`` or ``.toml`` run config.

    Raises:
        ConfigError: missing or unreadable file, syntax error, or an invalid field.
    """
    p = Path(path).expanduser()
    return parse_config(read_config_file(p), where=p.name)


def read_config_file(path: str | Path) -> object:
    """The parsed content of a ``.yaml``/``.yml`` or ``.toml`` file (not yet validated).

    Raises:
        ConfigError: missing file, another suffix, a syntax error, or an empty file.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist.")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"config file {str(p)!r} must end in .yaml, .yml or .toml.")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"config file {str(p)!r} is not valid {p.suffix[1:].upper()}: {first}.") from None
    if data is None:
        raise ConfigError(f"config file {str(p)!r} is empty.")
    return data


def default_config() -> RunConfig:
    """The main job: HyFEM on scikit-learn's digits with a hybrid classes x blocks partition in the
    paper's full-coverage condition (``min_cell_coverage: 1``: every (class, block) cell is held by
    some client, as in HyFEM Table 4 / Fig. 12c), with the centralised and stand-alone baselines
    (HyFEM Sec. 4), so the first run shows the paper's setting and comparison."""
    return parse_config(
        {
            "seed": 0,
            "dataset": {"name": "digits"},
            "partition": {
                "kind": "class_block",
                "num_clients": 6,
                "classes_per_client": [5, 7],
                "blocks_per_client": 3,
                "min_cell_coverage": 1,
            },
            "algorithm": {
                "name": "hyfem",
                "rounds": 30,
                "local_steps": 20,
                "batch_size": 32,
                "lr": 0.05,
                "momentum": 0.9,
                "baselines": True,  # the main job compares with centralised and stand-alone training
            },
        },
        where="default config",
    )


def config_with_overrides(
    path: str | Path | None = None,
    dataset: str | None = None,
    data_dir: str | Path | None = None,
    rounds: int | None = None,
    seed: int | None = None,
) -> RunConfig:
    """The run config of ``path`` (the main job's :func:`default_config` without one) with the
    command line's overrides applied and validated again.

    Raises:
        ConfigError: an unreadable file or an invalid field (also one made invalid by an override).
    """
    cfg = load_config(path) if path is not None else default_config()
    data = cfg.model_dump(mode="json")
    if dataset is not None:
        data["dataset"]["name"] = dataset
    if data_dir is not None:
        data["dataset"]["data_dir"] = str(data_dir)
    if rounds is not None:
        data["algorithm"]["rounds"] = rounds
    if seed is not None:
        data["seed"] = seed
    return parse_config(data, where=Path(path).name if path is not None else "default config")


def run_dir_config(run_dir: str | Path) -> RunConfig:
    """The config of an earlier run, from its output directory's ``config.json`` (for ``--resume``).

    A ``config.json`` holds every algorithm field with its value; one of HyFDCA, hybrid FedAvg or
    the centralised solver without ``fit_intercept`` was written before that option existed, so its
    run had no intercept: ``fit_intercept`` is set to ``false`` for it (the default is ``true``).

    Raises:
        ConfigError: the directory holds no ``config.json`` or it is not a valid run config.
    """
    import json

    p = Path(run_dir) / "config.json"
    if not p.is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no config.json: it is not the output directory of a run.")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError:
        raise ConfigError(f"{str(p)!r} is not valid JSON.") from None
    algo = data.get("algorithm") if isinstance(data, dict) else None
    if isinstance(algo, dict) and algo.get("name") in _INTERCEPT_ALGORITHMS and "fit_intercept" not in algo:
        data = {**data, "algorithm": {**algo, "fit_intercept": False}}  # a run from before the option
    if isinstance(data, dict) and isinstance(data.get("partition"), dict):
        data = {**data, "partition": _own_partition_fields(data["partition"])}
    return parse_config(data, where=str(p))


def _own_partition_fields(part: dict) -> dict:
    """A ``config.json`` partition written when one model held every kind's fields (each with its
    value, used or not) as the settings its kind used: ``by_class`` took the first of a
    ``classes_per_client`` range, explicit clients or parties no drawing setting. A partition of
    the current form is returned as it is."""
    model = PARTITION_KINDS.get(part.get("kind", "class_block"))
    if model is None or set(part) <= set(model.model_fields):
        return part
    own = {k: v for k, v in part.items() if k in model.model_fields}
    if own.get("kind") == "by_class" and isinstance(own.get("classes_per_client"), list):
        own["classes_per_client"] = own["classes_per_client"][0]
    if own.get("clients") is not None or own.get("parties") is not None:
        own = {k: v for k, v in own.items() if k not in _DRAWN}
    return own


_INTERCEPT_ALGORITHMS = ("hyfdca", "hybrid_fedavg", "centralized")
