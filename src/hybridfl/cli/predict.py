"""Use a trained model from the command line (registered in :mod:`hybridfl.cli.main`).

- ``hybridfl predict --model RUN/model --table new.csv --out predictions.csv``: score every row
  of one table (CSV or Parquet, encoded as in training) and write the ID column, ``prediction``
  (the data's own class labels) and the score (``p(<class>)`` per class, or a linear model's
  ``margin``); with the label column present, the accuracy (and AUC) is printed too. HyFEM:
  global inference when the table holds every block, local inference (the server model cut to
  the blocks present) otherwise, or ``--client ID`` for that client's own model.
- ``hybridfl export-table --config run.yaml --part test --out test.csv``: the rows of a run
  config's dataset as a raw table in the columns a model of it reads (built-in datasets get
  ``<block>_<j>`` columns), e.g. to score a run's own test rows with ``predict``.
- ``hybridfl export-onnx --model RUN/model --out model.onnx [--client ID] [--blocks a,b]``: the
  model as an ONNX graph (:mod:`hybridfl.inference.onnx`: one float32 input per block of encoded
  features, the standardisation inside the graph, the raw output ``logits`` or ``margin``);
  HyFEM: ``--client`` for a client's own model, ``--blocks`` for the server model cut to those
  blocks. Needs ``pip install 'hybridfl[onnx]'``.

Every problem is one sentence and exit status 2, and nothing is written: the whole table is
checked and scored before the output file is written (atomically; an existing one is refused
unless ``--force``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console(soft_wrap=True)


def read_table(path: Path, sep: str | None):
    """A CSV (delimiter ``sep``, default ``,``) or Parquet table as a DataFrame.

    Raises:
        DataError: a missing, empty or unparsable file.
    """
    from hybridfl.data.loaders import _read_table

    return _read_table(Path(path).expanduser(), sep)


def _check_out(out: Path, force: bool) -> None:
    from hybridfl.errors import HybridFLError

    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise HybridFLError(f"output path {str(out)!r} exists and is not a regular file: choose another --out.")
    if out.exists() and not force:
        raise HybridFLError(f"output file {str(out)!r} already exists: choose another --out, or --force to replace it.")


def predict_frame(model, frame, where: str, client: str | None = None):
    """The predictions table of ``frame``: the ID column (or ``row``), ``prediction`` and the
    score columns (:meth:`~hybridfl.inference.predictors.HybridFLModel.score_columns`), and the
    metrics when ``frame`` has labels (``{}`` otherwise).

    Raises:
        HybridFLError: any input problem (one sentence).
    """
    import pandas as pd

    from hybridfl.data.encoding import frame_ids, frame_labels

    kw = {"client": client} if client is not None else {}
    if client is not None and model.kind != "hyfem":
        from hybridfl.errors import HybridFLError

        raise HybridFLError(f"--client picks one of HyFEM's client models; this is a {model.kind} model.")
    id_name, ids = frame_ids(frame, model.encoding, where)
    y = frame_labels(frame, model.encoding, where)
    raw = model.raw(frame, where, **kw)  # one pass of the model; the rest is derived from it
    pred, scores = model.outputs(raw)
    metrics = model.metrics(raw, y) if y is not None and (y >= 0).any() else {}
    return pd.DataFrame({id_name: ids, "prediction": pred, **scores}), metrics


def _split(values: list[str]) -> list[str]:
    return [v for item in values for v in str(item).split(",") if v]


def _federated(model_dir: Path | None, schema: Path | None, clients: list[str], tables: list[str], to: str | None, sep):
    """Federated prediction in process (:func:`hybridfl.inference.federated.federated_predict`)
    from the organisations' client directories and new tables: ``(predictions, stats)``.

    Raises:
        HybridFLError: any problem, before anything is written (one sentence).
    """
    import json

    from hybridfl.data.federation import load_schema
    from hybridfl.errors import HybridFLError
    from hybridfl.inference import load_model
    from hybridfl.inference.federated import federated_predict

    dirs, paths = [Path(c) for c in _split(clients)], [Path(t) for t in _split(tables)]
    if schema is None or not dirs or not paths:
        raise HybridFLError("federated prediction needs --federation, --clients and --tables together.")
    if len(dirs) != len(paths):
        raise HybridFLError(f"--tables names {len(paths)} tables for {len(dirs)} --clients: give one per organisation.")
    from hybridfl.inference.parts import load_org_part

    m = load_model(model_dir) if model_dir is not None else None
    parts = None if m is not None else {}
    fs = load_schema(schema)
    names, labels = [], []
    for d in dirs:
        meta = d / "client.json"
        if not meta.is_file():
            raise HybridFLError(f"{str(d)!r} is not a client directory (no client.json).")
        try:
            info = json.loads(meta.read_text())
            names.append(str(info["client_id"]))
            labels.append(bool(info.get("has_labels", False)))
        except (ValueError, KeyError, TypeError):
            raise HybridFLError(f"client.json of {str(d)!r} is not a client description.") from None
    if len(set(names)) != len(names):
        raise HybridFLError("two --clients directories are the same organisation.")
    if parts is not None:  # each organisation's own part, from its own directory
        for n, d in zip(names, dirs):
            if not (d / "model").is_dir():
                raise HybridFLError(
                    f"{str(d)!r} keeps no part of a model (model/): run --federation first, or give --model."
                )
            parts[n] = load_org_part(d / "model")
    enc = m.encoding if m is not None else next(iter(parts.values())).encoding  # type: ignore[union-attr]
    if list(fs.blocks) != enc.block_names or list(fs.classes) != list(enc.classes):
        raise HybridFLError(f"the model's blocks or classes are not those of the federation schema {str(schema)!r}.")
    receiver = to if to is not None else next((n for n, lab in zip(names, labels) if lab), None)
    if receiver is None:
        raise HybridFLError("no organisation holds labels: say which receives the predictions with --to.")
    frames = {n: read_table(p, sep if sep is not None else enc.sep) for n, p in zip(names, paths)}
    from hybridfl.privacy.roster import peer_auth_of

    auths = {n: peer_auth_of(n, d) for n, d in zip(names, dirs)}  # each organisation's own roster, if any
    preds, stats = federated_predict(m, frames, receiver, parts=parts, auths=auths)
    return preds, {**stats, "to": receiver, "organisations": len(names)}


def predict_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Predictions file to write (CSV)."),
    model: Optional[Path] = typer.Option(
        None,
        "--model",
        "-m",
        help="A run's model directory (RUN/model); with --federation optional: each organisation's part "
        "from its client directory's model/.",
    ),
    table: Optional[Path] = typer.Option(None, "--table", "-t", help="The rows to score: CSV or Parquet."),
    sep: Optional[str] = typer.Option(
        None, "--sep", help="CSV delimiter of the tables (default: the model's, or ',')."
    ),
    client: Optional[str] = typer.Option(None, "--client", help="HyFEM: score with this client's own model."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out file."),
    federation: Optional[Path] = typer.Option(
        None, "--federation", help="Federated prediction: the federation schema the organisations prepared with."
    ),
    clients: Optional[list[str]] = typer.Option(
        None,
        "--clients",
        help="With --federation: the organisations' client directories (comma-separated or repeated).",
    ),
    tables: Optional[list[str]] = typer.Option(
        None, "--tables", help="With --federation: each organisation's new rows, in --clients order."
    ),
    to: Optional[str] = typer.Option(
        None,
        "--to",
        help="With --federation: the organisation that receives the predictions (default: a label holder).",
    ),
) -> None:
    """Score every row of one table with a trained model and write predictions.csv; with
    --federation, the organisations score the receiver's rows together (federated prediction)."""
    from hybridfl.errors import HybridFLError
    from hybridfl.files import atomic_write
    from hybridfl.inference import load_model

    if federation is not None or clients or tables or to is not None:
        if table is not None or client is not None:
            raise HybridFLError("--federation scores the organisations' --tables: drop --table and --client.")
        _check_out(out, force)
        preds, stats = _federated(model, federation, clients or [], tables or [], to, sep)
        atomic_write(out, preds.to_csv(index=False))
        console.print(
            f"{stats['scored']} of {stats['scored'] + stats['unscored']} rows of {stats['to']!r} scored by "
            f"{stats['organisations']} organisations ({stats['unscored']} lack a block nobody holds): {out}; "
            f"{stats['messages']} messages, {stats['bytes'] / 1e6:.2f} MB, {stats['seconds']:.1f} s",
            markup=False,
            highlight=False,
        )
        return
    if table is None or model is None:
        raise HybridFLError("predict needs --model and --table (or --federation with --clients and --tables).")
    _check_out(out, force)
    m = load_model(model)
    frame = read_table(table, sep if sep is not None else m.encoding.sep)
    preds, metrics = predict_frame(m, frame, table.name, client)
    atomic_write(out, preds.to_csv(index=False))
    console.print(f"{len(preds)} predictions written to {out}", markup=False, highlight=False)
    if metrics:
        parts = [f"{k} {v:.4f}" for k, v in metrics.items() if k != "n_labelled"]
        console.print(
            f"on the {metrics['n_labelled']} labelled rows: {', '.join(parts)}", markup=False, highlight=False
        )


def export_table_cmd(
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="Run config (its dataset section is read; default: the main job's)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="CSV file to write."),
    part: str = typer.Option("test", "--part", help="test or train."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Override dataset.data_dir."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out file."),
) -> None:
    """Write a run config's train or test rows as a raw table (the columns a model of it reads)."""
    from hybridfl.config import config_with_overrides
    from hybridfl.data.export_table import raw_table
    from hybridfl.errors import HybridFLError
    from hybridfl.files import atomic_write

    if part not in ("test", "train"):
        raise HybridFLError(f"--part must be test or train, not {part!r}.")
    _check_out(out, force)
    cfg = config_with_overrides(config, None, data_dir, None, None)
    frame = raw_table(cfg.dataset, cfg.seed, part)
    atomic_write(out, frame.to_csv(index=False))
    console.print(f"{len(frame)} {part} rows written to {out}", markup=False, highlight=False)


def export_onnx_cmd(
    model: Path = typer.Option(..., "--model", "-m", help="A run's model directory (RUN/model)."),
    out: Path = typer.Option(..., "--out", "-o", help="ONNX file to write."),
    client: Optional[str] = typer.Option(None, "--client", help="HyFEM: export this client's own model."),
    blocks: Optional[str] = typer.Option(
        None, "--blocks", help="HyFEM: the server model cut to these blocks (comma-separated)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out file."),
) -> None:
    """Export a trained model as an ONNX graph (inputs: the blocks' encoded features; the
    standardisation is part of the graph)."""
    from hybridfl.inference import load_model
    from hybridfl.inference.onnx import export_onnx, require_onnx

    require_onnx()  # before anything else: the one sentence naming the extra
    _check_out(out, force)
    m = load_model(model)
    names = [b.strip() for b in blocks.split(",") if b.strip()] if blocks is not None else None
    export_onnx(m, out, blocks=names, client=client)
    which = f"client {client}'s model" if client is not None else "global model"
    if names is not None:
        which = f"server model on blocks {', '.join(names)}"
    console.print(f"{m.kind} {which} written to {out} (ONNX)", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``predict``, ``export-table`` and ``export-onnx`` to the ``hybridfl`` app."""
    app.command("predict")(predict_cmd)
    app.command("export-table")(export_table_cmd)
    app.command("export-onnx")(export_onnx_cmd)
