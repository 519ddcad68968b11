"""One run from a config: prepare (validate everything), train, write the results.

:func:`prepare` does all the checking before any training starts: the config, the dataset files,
the partition against the data, the algorithm settings and the output directory. A problem is a
:class:`HybridFLError` with one sentence, and nothing has been written yet.
"""

from __future__ import annotations

import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from hybridfl.config import RunConfig
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.from_config import build_partition, load_dataset
from hybridfl.data.partition import CoverageWarning, Partition
from hybridfl.errors import ConfigError, HybridFLError, PartitionError
from hybridfl.runtime.checkpoint import CHECKPOINT_NAME
from hybridfl.runtime.loop import ProgressFn
from hybridfl.runtime.simulation import RunResult, single_threaded


@dataclass
class PreparedRun:
    config: RunConfig
    algorithm: BaseModel
    split: DatasetSplit
    partition: Partition
    warnings: list[str]


RUN_FILES = ("config.json", "results.json", CHECKPOINT_NAME)
"""Files that mark a directory as holding a run (finished, or interrupted: its checkpoint)."""


def prepare(
    config: RunConfig,
    out_dir: str | Path | None = None,
    strict: bool = False,
    resume: bool = False,
    force: bool = False,
) -> PreparedRun:
    """Validate and load everything a run needs; raise before any training on a problem.

    With ``strict``, a coverage warning (a block or class held by no client) is an error. An
    ``out_dir`` that already holds a run (any of :data:`RUN_FILES`) is refused unless ``resume``
    (continue that run) or ``force`` (overwrite it), so an earlier or interrupted run is never lost
    by accident; nothing is written here.

    Raises:
        HybridFLError: any problem, in one sentence.
    """
    algo = config.algorithm_config()
    if out_dir is not None:
        _check_out_dir(Path(out_dir), resume, force)
    split = load_dataset(config.dataset, config.seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CoverageWarning)
        partition = build_partition(config.partition, split.train, config.seed)
    notes = [str(w.message) for w in caught if issubclass(w.category, CoverageWarning)]
    if strict and notes:
        raise PartitionError(f"{notes[0].rstrip('.')} (strict mode treats coverage warnings as errors).")
    from hybridfl.algorithms.spec import get_algorithm

    spec = get_algorithm(algo.name)  # type: ignore[attr-defined]
    if spec.check is not None:  # the algorithm's own input checks, before anything is written
        spec.check(split, partition, algo)
    privacy = spec.privacy_warning(algo) if spec.privacy_warning is not None else None
    if privacy:
        notes.append(privacy)
    return PreparedRun(config, algo, split, partition, notes)


def run_config_dict(prep: PreparedRun) -> dict:
    """The run's config with the algorithm section fully validated (all defaults filled in)."""
    config = prep.config.model_dump(mode="json")
    config["algorithm"] = prep.algorithm.model_dump(mode="json")
    return config


def execute(
    prep: PreparedRun, out_dir: str | Path | None = None, progress: ProgressFn | None = None, resume: bool = False
) -> RunResult:
    """Train with the configured algorithm (:func:`hybridfl.runtime.simulation.simulate`) and, with
    ``out_dir``, write the results files.

    With ``out_dir``, the validated config is written first to ``config.json`` and, for federated
    algorithms, a checkpoint (``checkpoint.hfl``) after the rounds the config's ``checkpoint``
    section picks and after the last one; ``resume`` continues from it.

    Raises:
        HybridFLError: ``resume`` for an algorithm without checkpoints, or without ``out_dir``.
    """
    import json

    from hybridfl.algorithms.spec import get_algorithm
    from hybridfl.files import atomic_write
    from hybridfl.inference.modeldir import write_model_dir
    from hybridfl.reporting.plots import plot_coverage
    from hybridfl.reporting.results import write_results
    from hybridfl.runtime.checkpoint import CheckpointPolicy
    from hybridfl.runtime.simulation import simulate

    spec = get_algorithm(prep.algorithm.name)  # type: ignore[attr-defined]
    checkpoint = Path(out_dir) / CHECKPOINT_NAME if out_dir is not None and spec.federated else None
    if resume and checkpoint is None:
        raise HybridFLError(f"algorithm {spec.name!r} cannot resume: it writes no checkpoints.")
    if out_dir is not None and not resume:
        # a new run (``prepare`` allowed it: an empty directory or --force): an earlier run's
        # checkpoint and results must not outlive it next to the new config.json
        for name in ("results.json", CHECKPOINT_NAME):
            (Path(out_dir) / name).unlink(missing_ok=True)
        shutil.rmtree(Path(out_dir) / MODEL_DIR, ignore_errors=True)
        atomic_write(Path(out_dir) / "config.json", json.dumps(run_config_dict(prep), indent=2))
    ck = prep.config.checkpoint
    t0 = time.perf_counter()
    with single_threaded():
        result = simulate(
            spec,
            prep.split,
            prep.partition,
            prep.algorithm,
            prep.config.seed,
            progress,
            checkpoint=checkpoint,
            resume=resume,
            checkpoint_policy=CheckpointPolicy(ck.every, ck.seconds, ck.max_share),
        )
    result.summary.setdefault("dataset", prep.split.name)
    result.summary["seconds_total"] = time.perf_counter() - t0
    if out_dir is not None:
        cov = prep.partition.coverage(prep.split.train)
        extra = {
            "partition": {
                "description": prep.partition.description,
                "clients": prep.partition.summary(),
                "coverage": cov.to_dict(),
                "warnings": prep.warnings,
            }
        }
        if result.model is not None and prep.split.encoding is not None:
            write_model_dir(
                Path(out_dir) / MODEL_DIR,
                result.model,
                prep.split.encoding,
                prep.split.scale,
                spec.name,
                prep.split.name,
                model_metrics(result.summary),
            )
            result.summary["model_dir"] = MODEL_DIR  # relative to the run directory
        write_results(out_dir, result, run_config_dict(prep), extra)
        plot_coverage(cov, Path(out_dir) / "coverage.png")
    return result


MODEL_DIR = "model"
"""The model directory a run writes into its output directory (:mod:`hybridfl.inference`)."""

_MODEL_METRICS = (
    "accuracy",
    "auc",
    "server_accuracy",
    "client_accuracy_mean",
    "client_accuracy",
    "relative_suboptimality",
    "primal_objective",
    "rounds",
    "eval_samples",
)


def model_metrics(summary: dict) -> dict:
    """The run's headline metrics a model's manifest records (those the summary has)."""
    return {k: summary[k] for k in _MODEL_METRICS if k in summary}


@dataclass
class PreparedFederation:
    """A run of a federation of prepared client directories (``hybridfl run --federation``),
    checked and loaded: see :func:`prepare_federation`.

    Attributes:
        schema: the federation schema file (absolute).
        clients: the client directories (absolute), in the clients' ``--index`` order.
        algorithm: the schema's validated algorithm config (``rounds`` overridden if asked).
        seed: the schema's seed.
        server_data: what the server knows (schema and public layout; no test set).
        client_data: every client's own data (and secrets such as ``he_secret.key``).
        warnings: privacy warnings of the algorithm's settings.
    """

    schema: Path
    clients: list[Path]
    algorithm: BaseModel
    seed: int
    server_data: object
    client_data: list
    warnings: list[str]

    def config_dict(self) -> dict:
        """The run's ``config.json``: schema and client paths, seed and the validated algorithm."""
        return {
            "federation": str(self.schema),
            "clients": [str(c) for c in self.clients],
            "seed": int(self.seed),
            "algorithm": self.algorithm.model_dump(mode="json"),
        }


def prepare_federation(
    schema: str | Path,
    clients: list[str | Path],
    out_dir: str | Path | None = None,
    rounds: int | None = None,
    resume: bool = False,
    force: bool = False,
) -> PreparedFederation:
    """Check and load a federation of client directories prepared with ``hybridfl client prepare``
    (or written by ``export-clients``) against their schema, before anything runs or is written:
    the schema, every directory and its agreement with the schema (the checks of ``hybridfl
    federation assemble``), the algorithm section, who holds labels (the algorithm's
    :class:`~hybridfl.algorithms.spec.LabelRule`), the output directory (as :func:`prepare`), and
    then every client and the server are built once as the run will build them, so what only
    building finds (a missing or mismatched ``he_secret.key``, labels that are not binary for the
    loss) also stops the run here, with nothing written.

    Rows without a label are left out of training (:func:`~hybridfl.data.export.load_client_dir`);
    each client holding some gets a line in ``warnings``.

    Raises:
        HybridFLError: any problem, in one sentence.
    """
    from hybridfl.algorithms.spec import get_algorithm
    from hybridfl.data.federation import load_federation, load_schema

    if not clients:
        raise ConfigError("--federation needs the client directories too: --clients DIR [DIR ...].")
    schema_path = Path(schema).expanduser().resolve()
    fs = load_schema(schema_path)
    algo_section = dict(fs.algorithm)
    if rounds is not None:
        algo_section["rounds"] = int(rounds)
    name = str(algo_section.get("name", "hyfem"))
    try:
        spec = get_algorithm(name)
    except KeyError:
        raise ConfigError(f"the schema's algorithm {name!r} is not known (see `hybridfl algorithms`).") from None
    if not spec.federated:
        raise ConfigError(f"algorithm {name!r} is not federated: it cannot run on a federation of client directories.")
    try:
        algo = spec.config_model.model_validate(algo_section)
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"the schema's [algorithm] {'.'.join(map(str, err['loc']))}: {err['msg']}.") from None
    if out_dir is not None:
        _check_out_dir(Path(out_dir), resume, force)
    server_data, client_data = load_federation(schema_path, clients)
    if spec.labels is not None:
        spec.labels.check(server_data.layout)
    from hybridfl.runtime.simulation import assemble_federation

    assemble_federation(spec, server_data, client_data, algo, int(fs.seed))  # built and dropped: checks only
    dirs = [Path(cd.path).resolve() for cd in client_data]
    notes = [
        f"client {cd.client_id!r} holds {cd.unlabelled} rows without a label: they are left out of training "
        f"(it trains on its {cd.data.n_samples} labelled rows)."
        for cd in client_data
        if cd.unlabelled
    ]
    privacy = spec.privacy_warning(algo) if spec.privacy_warning is not None else None
    if privacy:
        notes.append(privacy)
    return PreparedFederation(schema_path, dirs, algo, int(fs.seed), server_data, client_data, notes)


def _check_out_dir(out: Path, resume: bool, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {str(out)!r} exists and is not a directory.")
    held = [f for f in RUN_FILES if (out / f).exists()] if out.is_dir() else []
    if held and not (resume or force):
        raise ConfigError(
            f"output directory {str(out)!r} already holds a run ({held[0]}): continue it with --resume, "
            "overwrite it with --force, or choose another --out."
        )


def execute_federation(
    prep: PreparedFederation,
    out_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    resume: bool = False,
    checkpoint_policy=None,
) -> RunResult:
    """Train the federation in process (:func:`hybridfl.runtime.simulation.simulate_directories`)
    and, with ``out_dir``, write ``config.json`` first, a checkpoint as :func:`execute` does, and
    the results files.

    :func:`prepare_federation` has checked the input; what only the setup exchanges can find (e.g.
    FedBCD parties without a common sample) stops a new run before its first checkpoint, and then
    the ``config.json`` written here is removed again (and ``out_dir`` if this call created it), so
    the next attempt needs no ``--force``.

    Raises:
        HybridFLError: ``resume`` without ``out_dir``; any input problem found while training.
    """
    import json

    from hybridfl.files import atomic_write
    from hybridfl.reporting.results import write_results
    from hybridfl.runtime.checkpoint import CheckpointPolicy
    from hybridfl.runtime.simulation import simulate_directories

    checkpoint = Path(out_dir) / CHECKPOINT_NAME if out_dir is not None else None
    if resume and checkpoint is None:
        raise HybridFLError("--resume needs the run's output directory.")
    created = out_dir is not None and not Path(out_dir).exists()
    if out_dir is not None and not resume:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for name in ("results.json", CHECKPOINT_NAME):
            (Path(out_dir) / name).unlink(missing_ok=True)
        atomic_write(Path(out_dir) / "config.json", json.dumps(prep.config_dict(), indent=2))
    t0 = time.perf_counter()
    try:
        with single_threaded():
            result = simulate_directories(
                prep.server_data,
                prep.client_data,
                prep.algorithm,
                prep.seed,
                progress,
                checkpoint=checkpoint,
                resume=resume,
                checkpoint_policy=checkpoint_policy if checkpoint_policy is not None else CheckpointPolicy(),
            )
    except HybridFLError:
        if out_dir is not None and not resume and checkpoint is not None and not checkpoint.exists():
            (Path(out_dir) / "config.json").unlink(missing_ok=True)  # a run that never started leaves nothing
            if created and not any(Path(out_dir).iterdir()):
                Path(out_dir).rmdir()
        raise
    trained = _trained_model(prep, result)  # written and loaded once: evaluation and model directories
    _federated_evaluation(prep, result, trained)
    result.summary["seconds_total"] = time.perf_counter() - t0
    if out_dir is not None:
        _write_federation_model(prep, result, trained, Path(out_dir))
        write_results(out_dir, result, prep.config_dict(), {"federation": {"schema": str(prep.schema)}})
    return result


@dataclass
class _TrainedModel:
    """A federation run's model, loaded once for its evaluation and its model directories: the
    loaded predictor and the schema's encoding and federated standardisation (float64)."""

    model: Any
    encoding: Any
    scale: dict
    dataset: str


def _trained_model(prep: PreparedFederation, result: RunResult) -> _TrainedModel | None:
    """The run's model (``result.model``) with the schema's encoding, written to a temporary model
    directory and loaded back (the same checks as any model); ``None`` without one."""
    import tempfile

    from hybridfl.data.encoding import schema_encoding
    from hybridfl.data.federation import load_schema
    from hybridfl.inference import load_model
    from hybridfl.inference.modeldir import write_model_dir

    if result.model is None:
        return None
    schema = load_schema(prep.schema)
    enc, scale = schema_encoding(schema)
    with tempfile.TemporaryDirectory() as tmp:
        write_model_dir(
            Path(tmp) / MODEL_DIR, result.model, enc, scale, prep.algorithm.name, schema.name, {}, "float64"
        )  # type: ignore[attr-defined]
        return _TrainedModel(load_model(Path(tmp) / MODEL_DIR), enc, scale, schema.name)


def _federated_evaluation(prep: PreparedFederation, result: RunResult, trained: _TrainedModel | None) -> None:
    """Evaluate the trained model on the organisations' own test rows (``client prepare
    --test-table``) by federated prediction (:func:`hybridfl.inference.evaluation.federated_evaluate`):
    the label holders compute the metrics; they go into the summary and the last round's row
    (``accuracy``, HyFEM's ``server_accuracy``, ``auc``). Nothing happens without test rows."""
    from hybridfl.inference.evaluation import evaluation_rows, federated_evaluate
    from hybridfl.privacy.roster import peer_auth_of

    rows, auths = {}, {}
    for cd in prep.client_data:
        got = evaluation_rows(cd.path) if cd.path is not None else None
        if got is not None:
            rows[cd.client_id] = got
            auths[cd.client_id] = peer_auth_of(cd.client_id, cd.path)  # its own roster, if installed
    if not rows or trained is None:
        return
    metrics = federated_evaluate(trained.model, rows, auths)
    if "accuracy" in metrics and trained.model.kind == "hyfem":
        metrics["server_accuracy"] = metrics.pop("accuracy")
    metrics["evaluation"] = "federated"
    result.summary.update(metrics)
    if result.history:
        result.history[-1].update({k: v for k, v in metrics.items() if k in ("accuracy", "server_accuracy", "auc")})


SERVER_MODEL_KINDS = ("linear", "hyfem")
"""The model kinds whose whole model the server holds in the protocol (HyFDCA's and hybrid
FedAvg's ``w``, HyFEM's server model and the models it sends each client); a FedBCD party's
bottom model never leaves its party, so a federation writes no server-side FedBCD model."""


def _write_federation_model(
    prep: PreparedFederation, result: RunResult, trained: _TrainedModel | None, out: Path
) -> None:
    """``<out>/model/`` of a federation run (the server's model, :data:`SERVER_MODEL_KINDS`) with
    the schema's encoding and federated standardisation (float64, as ``client prepare`` applied
    it), and every organisation's part into its own client directory (:func:`_write_org_parts`)."""
    from hybridfl.inference.modeldir import write_model_dir

    shutil.rmtree(out / MODEL_DIR, ignore_errors=True)
    if trained is None or result.model is None:
        return
    if result.model.kind in SERVER_MODEL_KINDS:
        name = prep.algorithm.name  # type: ignore[attr-defined]
        metrics = model_metrics(result.summary)
        write_model_dir(
            out / MODEL_DIR, result.model, trained.encoding, trained.scale, name, trained.dataset, metrics, "float64"
        )
        result.summary["model_dir"] = MODEL_DIR  # relative to the run directory
    _write_org_parts(prep, trained.model)


def _write_org_parts(prep: PreparedFederation, model: Any) -> None:
    """Every organisation's part of the loaded ``model`` into its own client directory
    (``<client>/model/``, :mod:`hybridfl.inference.parts`): the weights of its blocks (FedBCD: its
    party's bottom model), and the model's head for a label holder. A model with a FedBCD
    ``concat`` top has no parts (federated prediction needs a summed top): nothing is written then."""
    from hybridfl.inference.parts import PredictionError, model_units, write_org_part

    try:
        model_units(model)
    except PredictionError:
        return
    for cd in prep.client_data:
        if cd.path is not None:
            write_org_part(Path(cd.path) / MODEL_DIR, model, cd.client_id, list(cd.data.block_names), cd.has_labels)
