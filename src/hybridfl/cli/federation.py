"""Commands for organisations that each bring their own table (registered in :mod:`hybridfl.cli.main`).

- ``hybridfl federation init --config run.yaml --out federation.toml``: the federation schema
  (blocks and their columns, categorical levels, label column and classes, ID column, CSV
  delimiter, missing-value policy, seed and algorithm) from a run config's ``dataset:`` section of
  kind ``table``; no data is read;
- ``hybridfl client prepare --table customers.csv --schema federation.toml --out client-dir/``:
  one organisation's own table -> a client directory in the layout ``hybridfl export-clients``
  writes (checked against the schema; nothing is written on an error);
- ``hybridfl federation stats --schema federation.toml --stats a/stats.json b/stats.json --out
  federation-std.toml``: global means and stds per block from the organisations' sums, sums of
  squares and counts (federated standardisation; no rows are pooled);
- ``hybridfl federation assemble --schema federation.toml --client a/client.json ... --out server/``:
  the server directory of the prepared clients, from their public ``client.json`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console(soft_wrap=True)

federation_app = typer.Typer(
    no_args_is_help=True, help="The federation schema every organisation prepares its data against."
)
client_app = typer.Typer(no_args_is_help=True, help="One organisation's client directory from its own table.")


@federation_app.command("init")
def federation_init_cmd(
    config: Path = typer.Option(
        ...,
        "--config",
        "-c",
        help="Run config with a dataset of kind table (blocks, label_column, id_column, classes).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Federation schema file to write (TOML)."),
) -> None:
    """Write the federation schema (blocks, columns, classes, algorithm) from a run config; no data is read."""
    from hybridfl.data.federation import schema_from_config, write_schema

    schema = schema_from_config(config)
    write_schema(schema, out)
    console.print(
        f"federation schema written to {out}: {len(schema.blocks)} blocks ({', '.join(schema.blocks)}), "
        f"{len(schema.classes)} classes, algorithm {schema.algorithm.get('name')}",
        markup=False,
        highlight=False,
    )


@federation_app.command("stats")
def federation_stats_cmd(
    schema: Path = typer.Option(..., "--schema", "-s", help="Federation schema (hybridfl federation init)."),
    stats: list[Path] = typer.Option(..., "--stats", help="Each organisation's stats.json (from client prepare)."),
    out: Path = typer.Option(..., "--out", "-o", help="New schema file with the global means and stds (TOML)."),
) -> None:
    """Combine the organisations' per-block sums and counts into global means and stds (no rows pooled)."""
    import json

    from hybridfl.data.federation import combine_stats, load_schema, write_schema
    from hybridfl.errors import ConfigError

    if out.exists():
        raise ConfigError(f"{str(out)!r} exists: choose a new file for the schema with statistics.")
    contents = []
    for p in stats:
        try:
            contents.append((str(p), json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            raise ConfigError(f"{str(p)!r} is not a readable stats.json.") from None
    combined = combine_stats(load_schema(schema), contents)
    write_schema(combined, out)
    console.print(
        f"{out}: global means and stds of blocks {', '.join(combined.means)} from {len(stats)} organisations; "
        "give it to every organisation to prepare again (client prepare applies them)",
        markup=False,
        highlight=False,
    )


@federation_app.command("assemble")
def federation_assemble_cmd(
    schema: Path = typer.Option(..., "--schema", "-s", help="The federation schema the clients prepared against."),
    client_json: list[Path] = typer.Option(
        ..., "--client", help="Each organisation's client.json (public: name, index, blocks, labels yes/no)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The server directory to create."),
) -> None:
    """Write the server directory of a federation of prepared clients (schema + their public client.json)."""
    import json

    from hybridfl.data.federation import assemble_server
    from hybridfl.errors import ConfigError

    infos = []
    for p in client_json:
        try:
            infos.append((str(p), json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            raise ConfigError(f"{str(p)!r} is not a readable client.json.") from None
    path = assemble_server(schema, infos, out)
    console.print(f"server directory written to {path} ({len(infos)} clients)", markup=False, highlight=False)
    from hybridfl.privacy.roster import ROSTER_FILE, roster_of_dir

    roster = roster_of_dir(path)
    if roster is not None:
        console.print(
            f"roster: {path / ROSTER_FILE}; every organisation installs it (hybridfl client roster) and compares "
            "these fingerprints with the others out of band:",
            markup=False,
            highlight=False,
        )
        for line in roster.fingerprints():
            console.print(f"  {line}", markup=False, highlight=False)


@client_app.command("roster")
def client_roster_cmd(
    client: Path = typer.Option(..., "--client", "-c", help="The organisation's own client directory."),
    roster: Path = typer.Option(..., "--roster", "-r", help="The roster.json federation assemble wrote."),
) -> None:
    """Install the federation's roster (every organisation's credential key) in a client directory,
    after checking it lists this client's own key; prints the fingerprints to compare out of band."""
    from hybridfl.privacy.roster import install_roster

    r = install_roster(client, roster)
    console.print(
        f"roster installed in {client} ({len(r.keys)} clients); compare these fingerprints with every other "
        "organisation before training:",
        markup=False,
        highlight=False,
    )
    for line in r.fingerprints():
        console.print(f"  {line}", markup=False, highlight=False)


@client_app.command("prepare")
def client_prepare_cmd(
    table: Path = typer.Option(..., "--table", "-t", help="The organisation's table: CSV, Parquet or .npz."),
    schema: Path = typer.Option(..., "--schema", "-s", help="Federation schema (hybridfl federation init)."),
    out: Path = typer.Option(..., "--out", "-o", help="Client directory to create (new or empty)."),
    id_column: Optional[str] = typer.Option(None, "--id-column", help="The table's ID column (default: the schema's)."),
    label_column: Optional[str] = typer.Option(
        None, "--label-column", help="The table's label column (default: the schema's, if the table has it)."
    ),
    client_id: Optional[str] = typer.Option(None, "--client-id", help="The client's name (default: --out's name)."),
    index: int = typer.Option(
        0, "--index", min=0, help="The client's position in the federation (seeds it); distinct per organisation."
    ),
    sep: Optional[str] = typer.Option(None, "--sep", help="The CSV delimiter (default: the schema's sep)."),
    test_table: Optional[Path] = typer.Option(
        None, "--test-table", help="The organisation's own test rows (federated evaluation; never trained on)."
    ),
) -> None:
    """Check the organisation's own table against the schema and write its client directory."""
    from hybridfl.data.prepare import STATS_FILE, prepare_client

    r = prepare_client(
        table,
        schema,
        out,
        id_column=id_column,
        label_column=label_column,
        client_id=client_id,
        index=index,
        sep=sep,
        test_table=test_table,
    )
    labels = "no"
    if r.has_labels:
        labels = "yes" if r.n_labelled == r.n_samples else f"{r.n_labelled} of {r.n_samples} rows"
    console.print(
        f"{r.path}  (client {r.client_id}: {r.n_samples} samples, blocks {', '.join(r.blocks)}, labels {labels})",
        markup=False,
        highlight=False,
    )
    if r.has_labels and r.n_labelled < r.n_samples:
        console.print(
            f"{r.n_samples - r.n_labelled} rows have no label: they stay in the directory, and no algorithm "
            "trains on them (README: who must hold labels)",
            markup=False,
            highlight=False,
        )
    if r.imputed:
        console.print(f"{r.imputed} missing cells filled with the federation's means", markup=False, highlight=False)
    if r.unfilled:
        console.print(
            f"{r.unfilled} missing cells are not filled yet: the schema has no federation means (missing = "
            "impute_mean); combine the organisations' stats.json with `hybridfl federation stats` and prepare again "
            "with its schema (this directory cannot train until then)",
            markup=False,
            highlight=False,
        )
    if r.ignored:
        console.print(f"ignored columns in no block: {', '.join(r.ignored)}", markup=False, highlight=False)
    if r.stats:
        console.print(
            f"{STATS_FILE}: per-block sums for a federated standardisation (not applied: the data is raw)"
            if not r.standardized
            else f"{STATS_FILE} written; blocks standardised with the schema's global means and stds",
            markup=False,
            highlight=False,
        )


def split_client_dirs(values: list[str] | None) -> list[str]:
    """The directories of ``--clients``, given repeated and/or separated by commas."""
    return [d for v in values or [] for d in v.split(",") if d]


def register(app: typer.Typer) -> None:
    """Add the ``federation`` and ``client`` command groups to the ``hybridfl`` app."""
    app.add_typer(federation_app, name="federation")
    app.add_typer(client_app, name="client")
