"""The ``hybridfl`` command line.

- ``hybridfl run``: the main job (HyFEM on the bundled digits with a hybrid partition), or
  ``hybridfl run --config FILE --out DIR [--dataset NAME --data-dir DIR --rounds N --seed N]``;
  a ``DIR`` that already holds a run is refused unless ``--resume DIR`` (continue it) or ``--force``
  (overwrite it).
- ``hybridfl partition``: print the partition's clients and its class x block coverage table
  (and save the heatmap / the partition JSON).
- ``hybridfl algorithms``: list the algorithms a config can name; ``hybridfl algorithms --describe
  NAME``: every option of that algorithm's config (description, type or allowed values, range, default).

A user error (missing file, unknown block, NaN in a table, bad config field, ...) prints one
sentence to standard error and exits with status 2, without a traceback.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hybridfl.errors import HybridFLError

app = typer.Typer(
    pretty_exceptions_show_locals=False,
    add_completion=False,
    no_args_is_help=True,
    help="Hybrid federated learning: clients hold some samples and some feature blocks.",
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _fmt(v, fmt: str = "percent") -> str:
    if v is None:
        return "-"
    if fmt == "percent":
        return f"{100 * v:.2f} %"
    if fmt == "sci":
        return f"{v:.3e}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def report_rows(summary: dict) -> list[tuple[str, object, str]]:
    """Rows of the final table: ``summary["report"]`` (a list of ``[label, value, format]`` with
    format ``percent``, ``sci`` or ``plain``) if the algorithm gives one, else HyFEM's accuracies."""
    if summary.get("report"):
        return [(str(a), b, str(c)) for a, b, c in summary["report"]]
    return [
        ("server (global: all test samples, all blocks)", summary.get("server_accuracy"), "percent"),
        ("clients, mean (local: all test samples, own blocks)", summary.get("client_accuracy_mean"), "percent"),
        ("centralised (all training data, same T*Q budget)", summary.get("centralized_accuracy"), "percent"),
        ("stand-alone clients, mean (no communication)", summary.get("standalone_accuracy_mean"), "percent"),
    ]


def _execute_with_progress(prep, out_dir: Path, resume: bool, quiet: bool):
    """``execute`` the prepared run, with a progress bar unless ``quiet``."""
    from hybridfl.experiment import execute

    return _with_progress(lambda progress: execute(prep, out_dir, progress, resume=resume), quiet)


def _with_progress(work, quiet: bool):
    """``work(progress)`` with a rich progress bar of the rounds (``progress=None`` if ``quiet``)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if quiet:
        return work(None)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    ) as bar:
        task = bar.add_task("rounds", total=None, info="")

        def progress(done: int, total: int, row: dict) -> None:
            info = "  ".join(
                f"{k}={v:.3f}"
                for k, v in row.items()
                if k in ("server_accuracy", "client_accuracy_mean", "accuracy", "relative_suboptimality", "auc")
            )
            bar.update(task, completed=done, total=total, info=info)

        return work(progress)


@app.command()
def run(
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="YAML or TOML run config (default: HyFEM on digits)."
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Output directory (default: runs/<dataset>-<algorithm>-<time>)."
    ),
    dataset: Optional[str] = typer.Option(None, help="Override dataset.name."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Override dataset.data_dir."),
    rounds: Optional[int] = typer.Option(None, help="Override algorithm.rounds."),
    seed: Optional[int] = typer.Option(None, help="Override the seed."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    strict: bool = typer.Option(
        False, "--strict", help="Treat coverage warnings (a block or class held by nobody) as errors."
    ),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue the interrupted run in this output directory from its last completed round."
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite the run already in --out (refused without it: use --resume to continue it)."
    ),
    checkpoint_every: Optional[int] = typer.Option(
        None, "--checkpoint-every", min=1, help="Override checkpoint.every: checkpoint at most every N rounds."
    ),
    checkpoint_seconds: Optional[float] = typer.Option(
        None, "--checkpoint-seconds", min=0, help="Override checkpoint.seconds: at least S seconds between checkpoints."
    ),
    federation: Optional[Path] = typer.Option(
        None,
        "--federation",
        help="Federation schema (hybridfl federation init): run the federation of the --clients directories in process.",
    ),
    clients: Optional[list[str]] = typer.Option(
        None,
        "--clients",
        help="With --federation: the organisations' client directories (client prepare); repeat it or separate by commas.",
    ),
) -> None:
    """Train a federated model and write results.json, metrics.csv and plots.

    With ``--federation F --clients A --clients B ...`` the run is the federation of those prepared
    client directories, in process: the quick check before deploying them over Flower.

    A checkpoint is written after the last round and, between, as the config's ``checkpoint``
    section allows (by default within 10 % of the run time); Ctrl-C stops after the current round
    with a checkpoint, which ``--resume`` continues."""
    from hybridfl.experiment import prepare

    if federation is not None or clients or (resume is not None and _is_federation_run(resume)):
        if config is not None or dataset is not None or data_dir is not None or seed is not None or strict:
            raise HybridFLError(
                "--federation takes its data, seed and algorithm from the schema and the client directories: "
                "drop --config, --dataset, --data-dir, --seed and --strict."
            )
        _run_federation(
            federation, clients or [], out, rounds, quiet, resume, force, checkpoint_every, checkpoint_seconds
        )
        return
    cfg, out = _run_config(
        config, out, dataset, data_dir, rounds, seed, resume, force, checkpoint_every, checkpoint_seconds
    )
    algo_name = cfg.algorithm.get("name", "hyfem")
    out_dir = out or Path("runs") / f"{cfg.dataset.name}-{algo_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    prep = prepare(cfg, out_dir, strict=strict, resume=resume is not None, force=force)
    for w in prep.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    if not quiet:
        console.print(
            f"[bold]{algo_name}[/] on [bold]{prep.split.name}[/]: {prep.partition.description}; "
            f"{prep.split.train.n_samples} train / {prep.split.test.n_samples} test samples, blocks {', '.join(prep.split.train.block_names)}"
        )
    try:
        result = _execute_with_progress(prep, out_dir, resume is not None, quiet)
    except KeyboardInterrupt:
        _interrupted(out_dir)
    _print_final(result.summary, f"{algo_name} on {prep.split.name}", out_dir)


def _run_config(
    config: Optional[Path],
    out: Optional[Path],
    dataset: Optional[str],
    data_dir: Optional[Path],
    rounds: Optional[int],
    seed: Optional[int],
    resume: Optional[Path],
    force: bool,
    checkpoint_every: Optional[int],
    checkpoint_seconds: Optional[float],
):
    """The run config of :func:`run` (``--resume``: the run directory's, else the config file with
    the command line's overrides; the checkpoint options either way) and its output directory.

    Raises:
        HybridFLError: ``--resume`` with another setting than the checkpoint options.
    """
    from hybridfl.config import config_with_overrides, run_dir_config

    if resume is not None:
        if force or any(v is not None for v in (config, out, dataset, data_dir, rounds, seed)):
            raise HybridFLError("--resume takes the run directory only: its config.json fixes every setting.")
        cfg = run_dir_config(resume)
        out = resume
    else:
        cfg = config_with_overrides(config, dataset, data_dir, rounds, seed)
    ck_update = {k: v for k, v in (("every", checkpoint_every), ("seconds", checkpoint_seconds)) if v is not None}
    if ck_update:  # when to checkpoint never changes the results, so a resumed run may change it too
        cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update=ck_update)})
    return cfg, out


def _interrupted(out_dir: Path) -> None:
    """After Ctrl-C: say how to resume (or that nothing can be) and exit with status 130."""
    from hybridfl.runtime.checkpoint import CHECKPOINT_NAME

    if (Path(out_dir) / CHECKPOINT_NAME).is_file():
        err_console.print(f"interrupted: continue the run with `hybridfl run --resume {out_dir}`.")
    else:
        err_console.print("interrupted before the first checkpoint: nothing to resume.")
    raise typer.Exit(130) from None


def _print_final(s: dict, what: str, out_dir: Path) -> None:
    """The final results table, the communication line and the files written."""
    table = Table(title=f"{what}: final results after {s.get('rounds')} rounds")
    table.add_column("model / quantity")
    table.add_column("value", justify="right")
    for label, value, fmt in report_rows(s):
        table.add_row(label, _fmt(value, fmt))
    console.print(table)
    if s.get("bytes_total") is not None:
        console.print(
            f"communication: {s.get('messages_total')} messages, {s['bytes_total'] / 1e6:.2f} MB in {s.get('rounds')} rounds"
        )
    written = ", ".join(sorted(f.name for f in Path(out_dir).iterdir() if not f.name.startswith(".")))
    console.print(f"results written to [bold]{out_dir}[/]: {written}")


def _is_federation_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run of ``--federation`` (its ``config.json`` names a schema)."""
    import json

    try:
        return "federation" in json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def _run_federation(
    federation: Optional[Path],
    clients: list[str],
    out: Optional[Path],
    rounds: Optional[int],
    quiet: bool,
    resume: Optional[Path],
    force: bool,
    checkpoint_every: Optional[int],
    checkpoint_seconds: Optional[float],
) -> None:
    """``hybridfl run --federation F --clients ...`` (and its ``--resume``): prepare, train in
    process with a progress bar, print the final table, write the results."""
    import json

    from hybridfl.experiment import execute_federation, prepare_federation
    from hybridfl.runtime.checkpoint import CheckpointPolicy

    if resume is not None:
        if federation is not None or clients or out is not None or rounds is not None or force:
            raise HybridFLError("--resume takes the run directory only: its config.json fixes every setting.")
        saved = json.loads((resume / "config.json").read_text(encoding="utf-8"))
        federation, clients, out = Path(saved["federation"]), list(saved["clients"]), resume
        rounds = int(saved["algorithm"]["rounds"])
    if federation is None:
        raise HybridFLError("--clients needs the federation schema too: --federation FILE.")
    from hybridfl.cli.federation import split_client_dirs

    dirs = split_client_dirs(clients)
    out_dir = out or Path("runs") / f"federation-{time.strftime('%Y%m%d-%H%M%S')}"
    prep = prepare_federation(federation, dirs, out_dir, rounds, resume=resume is not None, force=force)
    for w in prep.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    name = prep.algorithm.name  # type: ignore[attr-defined]
    if not quiet:
        console.print(
            f"[bold]{name}[/] on the federation of {federation}: {len(prep.client_data)} client directories "
            f"({', '.join(cd.client_id for cd in prep.client_data)}), in process"
        )
    policy = CheckpointPolicy(every=checkpoint_every or 1, seconds=checkpoint_seconds or 0.0, max_share=0.1)
    try:
        result = _with_progress(
            lambda progress: execute_federation(prep, out_dir, progress, resume is not None, policy), quiet
        )
    except KeyboardInterrupt:
        _interrupted(out_dir)
    _print_final(result.summary, f"{name} on the federation", out_dir)


@app.command()
def partition(
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="Run config whose dataset and partition to show."
    ),
    dataset: Optional[str] = typer.Option(None, help="Override dataset.name."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Override dataset.data_dir."),
    seed: Optional[int] = typer.Option(None, help="Override the seed."),
    png: Optional[Path] = typer.Option(None, help="Also save the coverage heatmap to this PNG."),
    save: Optional[Path] = typer.Option(None, help="Also save the partition (client -> sample IDs, blocks) as JSON."),
) -> None:
    """Print who holds what: clients, and the class x block coverage table."""
    from hybridfl.config import config_with_overrides
    from hybridfl.experiment import prepare

    prep = prepare(config_with_overrides(config, dataset, data_dir, None, seed))
    for w in prep.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    t = Table(title=prep.partition.description)
    for col in ("client", "samples", "blocks", "labels"):
        t.add_column(col)
    for row in prep.partition.summary():
        t.add_row(row["client"], str(row["samples"]), row["blocks"], "yes" if row["labels"] else "no")
    console.print(t)
    cov = prep.partition.coverage(prep.split.train)
    console.print("clients holding each (class, block):")
    console.print(cov.to_text(), markup=False, highlight=False)
    if png is not None:
        from hybridfl.reporting.plots import plot_coverage

        plot_coverage(cov, png)
        console.print(f"heatmap written to {png}")
    if save is not None:
        prep.partition.save(save)
        console.print(f"partition written to {save}")


@app.command("algorithms")
def list_algorithms(
    describe: Optional[str] = typer.Option(
        None,
        "--describe",
        metavar="NAME",
        help="Print every option of algorithm NAME's config: its description, type, allowed values and default.",
    ),
) -> None:
    """List the algorithms a run config can name (with --describe NAME: that algorithm's options)."""
    from hybridfl.algorithms.spec import algorithms, get_algorithm

    if describe is not None:
        spec = get_algorithm(describe)  # an unknown name: ConfigError, one sentence, exit 2
        typer.echo(describe_algorithm(spec.name, spec.description, spec.config_model))
        return
    for name, spec in sorted(algorithms().items()):
        console.print(f"[bold]{name}[/]: {spec.description}")


_TYPE_NAMES = {bool: "true/false", int: "integer", float: "number", str: "text"}


def _yaml_value(v) -> str:
    """``v`` as it is written in a YAML run config."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _type_text(ann) -> str:
    """A field annotation in words: ``integer``, ``one of a, b``, ``list of integer or null``, ..."""
    import types
    from typing import Literal, Union, get_args, get_origin

    from pydantic import BaseModel

    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return "one of " + ", ".join(_yaml_value(a) for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        text = " or ".join(_type_text(a) for a in kept)
        return f"{text} or null" if len(kept) < len(args) else text
    if origin is list:
        return f"list of {_type_text(args[0])}" if args else "list"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return _TYPE_NAMES.get(ann, getattr(ann, "__name__", str(ann)))


def _range_text(info) -> str:
    """The numeric constraints of a field (``ge``, ``gt``, ``le``, ``lt``) as ``> 0``, ``[0, 1)``, ...;
    empty without any."""
    low = high = None
    for m in info.metadata:
        for attr, side, sym in (("ge", "low", "["), ("gt", "low", "("), ("le", "high", "]"), ("lt", "high", ")")):
            if getattr(m, attr, None) is not None:
                if side == "low":
                    low = (sym, getattr(m, attr))
                else:
                    high = (sym, getattr(m, attr))
    if low and high:
        return f"in {low[0]}{_yaml_value(low[1])}, {_yaml_value(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_yaml_value(low[1])}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {_yaml_value(high[1])}"
    return ""


def describe_algorithm(name: str, description: str, model) -> str:
    """The text of ``hybridfl algorithms --describe NAME``: per option of the pydantic config
    ``model`` (nested sections' options as ``section.field``), its name (and accepted aliases), its
    type or allowed values, its range, its default, then its description."""
    import textwrap

    from pydantic import AliasChoices
    from pydantic_core import PydanticUndefined

    from hybridfl.algorithms.presets import describe_presets
    from hybridfl.algorithms.spec import config_fields

    lines = [f"{name}: {description}", f"options of the algorithm: section of a run config (name: {name}):", ""]
    for key, info in config_fields(model):
        head = key
        alias = info.validation_alias
        others = [a for a in alias.choices if a != key.rsplit(".", 1)[-1]] if isinstance(alias, AliasChoices) else []
        if others:
            head += f" (or {', '.join(map(str, others))})"
        parts = [_type_text(info.annotation)]
        rng = _range_text(info)
        if rng:
            parts.append(rng)
        if info.default is not PydanticUndefined:
            parts.append(f"default {_yaml_value(info.default)}")
        elif info.default_factory is not None and parts[0] != "section":
            parts.append(f"default {_yaml_value(info.default_factory())}")
        lines.append(f"{head}: {'; '.join(parts)}")
        text = (info.description or "").strip() or "(no description)"
        lines.extend(textwrap.wrap(text, 100, initial_indent="    ", subsequent_indent="    "))
    presets = describe_presets(name)
    if presets:
        lines.append("")
        for line in presets:
            lines.extend(textwrap.wrap(line, 100, subsequent_indent="    "))
    return "\n".join(lines)


from hybridfl.cli import deploy as _deploy  # noqa: E402  (export-clients, flower-app, deploy-local)

_deploy.register(app)
from hybridfl.cli import federation as _federation  # noqa: E402  (federation init, client prepare)

_federation.register(app)
from hybridfl.cli import predict as _predict  # noqa: E402  (predict, export-table)

_predict.register(app)


def main() -> None:
    """Entry point: run the app, turning user errors into one sentence and exit status 2."""
    try:
        app()
    except HybridFLError as e:
        err_console.print(Text.assemble(("error: ", "red"), str(e)))
        sys.exit(2)
    except FileNotFoundError as e:
        err_console.print(Text.assemble(("error: ", "red"), f"file {e.filename!r} does not exist."))
        sys.exit(2)


if __name__ == "__main__":
    main()
