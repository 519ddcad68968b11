"""Deployment commands of the ``hybridfl`` CLI (registered in :mod:`hybridfl.cli.main`).

- ``hybridfl export-clients --config FILE --out DIR``: one directory per client (its data only)
  plus ``server/`` (schema, run config, test set), ready for one SuperNode per client;
- ``hybridfl he-keys --scheme paillier --out FILE``: the clients' shared HE key pair, made on a
  client machine; copy the file into every client directory as ``he_secret.key`` (never to the
  server: the server receives only the public material, from the clients, in the hello exchange);
- ``hybridfl flower-app [--out DIR]``: print (or copy) the Flower app directory for ``flwr run``;
- ``hybridfl deploy-local --config FILE --out DIR`` (or ``--federation F --clients A,B,...``):
  export (or assemble the organisations' prepared directories), start a SuperLink (TLS and
  SuperNode authentication unless ``--insecure``) and one SuperNode per client on 127.0.0.1, run
  the algorithm over Flower, stop everything, print the results;
- ``hybridfl flower-executor --runtime-api-address HOST:PORT``: the warm ClientApp executor for a
  SuperNode started with ``--isolation process`` (one long-lived process answers every message).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console()


def export_clients_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="Run config (dataset, partition, algorithm)."),
    out: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="Output directory (new or empty): one sub-directory per client, plus server/; all mode 0700/0600.",
    ),
    rounds: Optional[int] = typer.Option(None, help="Override algorithm.rounds."),
    seed: Optional[int] = typer.Option(None, help="Override the seed."),
    no_test: bool = typer.Option(
        False, "--no-test", help="Do not write the test set into server/ (no server-side evaluation)."
    ),
) -> None:
    """Export a partition: one directory per client with only its own data (per-block .npz, sample IDs, blocks.json, labels if it holds them)."""
    from hybridfl.config import config_with_overrides
    from hybridfl.data.export import export_clients
    from hybridfl.experiment import prepare

    cfg = config_with_overrides(config, None, None, rounds, seed)
    prep = prepare(cfg)
    data = cfg.model_dump(mode="json")
    data["algorithm"] = prep.algorithm.model_dump(mode="json")
    from hybridfl.algorithms.spec import get_algorithm

    spec = get_algorithm(prep.algorithm.name)  # type: ignore[attr-defined]
    dirs = export_clients(
        prep.split,
        prep.partition,
        out,
        seed=cfg.seed,
        include_test=not no_test,
        run_config=data,
        client_test=spec.clients_hold_test,
    )
    secrets = (spec.deal_secrets(prep.algorithm) if spec.deal_secrets is not None else None) or {}
    if "he_secret" in secrets:
        # a simulated set-up deploys as it is: the export plays the client organisation that makes
        # the shared key; it goes into the client directories only, never into server/
        from hybridfl.data.export import SECRET_FILE
        from hybridfl.privacy.keys import write_secret_bytes

        for d in dirs:  # created 0600 with O_EXCL | O_NOFOLLOW: never over an existing file or a link
            write_secret_bytes(secrets["he_secret"], d / SECRET_FILE)
        console.print(f"HE key pair written to every client directory as {SECRET_FILE} (not to server/)")
    for d, c in zip(dirs, prep.partition.clients):
        console.print(
            f"{d}  ({c.n_samples} samples, blocks {', '.join(c.blocks)}, labels {'yes' if c.has_labels else 'no'})"
        )
    console.print(f"{out / 'server'}  (schema, run config{'' if no_test else ', test set'})")


def he_keys_cmd(
    scheme: str = typer.Option(..., help="paillier or ckks (the run config's algorithm.encryption)."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Secret key file to create (mode 0600; an existing file is never overwritten)."
    ),
    paillier_bits: int = typer.Option(2048, help="Paillier modulus bits (algorithm.paillier_bits)."),
    precision_bits: int = typer.Option(40, help="Paillier fixed-point fraction bits."),
    ckks_degree: int = typer.Option(
        4096, help="CKKS polynomial modulus degree (4096: 2048 values per ciphertext; 8192, 16384: more)."
    ),
    ckks_scale_bits: int = typer.Option(40, help="CKKS scale bits."),
) -> None:
    """Make the clients' shared HE key pair on a client machine (copy it to every client directory as he_secret.key; never to the server)."""
    from hybridfl.errors import ConfigError
    from hybridfl.privacy.he import KeyDealer
    from hybridfl.privacy.keys import write_secret

    if scheme not in ("paillier", "ckks"):
        raise ConfigError(f"--scheme must be paillier or ckks, got {scheme!r}.")
    write_secret(KeyDealer(scheme, paillier_bits, precision_bits, ckks_degree, ckks_scale_bits), out)
    console.print(
        f"{scheme} key pair written to {out}: copy it to every client directory as he_secret.key, never to the server"
    )


def flower_app_cmd(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Copy the app's pyproject.toml into this directory."),
) -> None:
    """Print the Flower app directory to pass to `flwr run` (or copy it to --out)."""
    from hybridfl.runtime.flower import APP_DIR

    if out is None:
        console.print(str(APP_DIR), markup=False, highlight=False, soft_wrap=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(APP_DIR / "pyproject.toml", out / "pyproject.toml")
    console.print(str(out), markup=False, highlight=False)


def deploy_local_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the export, the Flower logs and the results."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="Run config (dataset, partition, algorithm): export it, then deploy."
    ),
    federation: Optional[Path] = typer.Option(
        None, "--federation", help="Federation schema (hybridfl federation init): deploy the --clients directories."
    ),
    clients: Optional[list[str]] = typer.Option(
        None,
        "--clients",
        help="With --federation: the organisations' client directories (client prepare); repeat it or separate by commas.",
    ),
    rounds: Optional[int] = typer.Option(None, help="Override algorithm.rounds."),
    seed: Optional[int] = typer.Option(None, help="Override the seed (--config only)."),
    stock: bool = typer.Option(
        False,
        "--stock",
        help="Stock flower-supernode (3 s polling, a ClientApp process per message) instead of the fast-polling launcher.",
    ),
    executor: str = typer.Option(
        "inline",
        help="inline: each SuperNode answers in its own process and keeps the client in memory (fastest); "
        "warm: one long-lived hybridfl executor process next to each SuperNode; "
        "flower: Flower's default path, a new ClientApp process per message.",
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Local experiments only: no TLS and no SuperNode authentication (anyone reaching the port can join).",
    ),
    poll_interval: float = typer.Option(
        0.05,
        help="SuperNode poll interval in seconds right after a message (fast launcher); it backs off to 0.2 s "
        "while no message comes.",
    ),
    timeout: float = typer.Option(3600.0, help="Seconds the run may take."),
    predict_tables: Optional[list[str]] = typer.Option(
        None,
        "--predict-tables",
        help="With --federation, after a run: no training; score each organisation's new table (one per --clients "
        "directory, in order: its SuperNode's predict-table) with the parts of the model the organisations keep; "
        "only the receiver's node writes predictions (<client>/predictions/).",
    ),
    to: Optional[str] = typer.Option(None, "--to", help="With --predict-tables: the organisation that receives."),
) -> None:
    """Start a SuperLink (TLS, SuperNode authentication) and one SuperNode per client on 127.0.0.1, run over Flower, stop.

    The clients come from ``--config`` (exported into OUT/export) or from ``--federation F
    --clients A,B,...`` (the organisations' own prepared directories; the server directory is
    assembled from their public client.json into OUT/server). With ``--predict-tables`` the run
    is a federated prediction instead of training (``task: predict``).
    """
    from hybridfl.runtime.flower.local import LocalFederation

    executor, tables = _deploy_options(executor, config, federation, clients, stock, predict_tables, to)
    dirs, server_dir = _deploy_dirs(out, config, federation, clients, rounds, seed, tables)
    if insecure:
        console.print("[yellow]--insecure: no TLS and no SuperNode authentication; for local experiments only[/]")
    (out / "flower").mkdir(parents=True, exist_ok=True)
    fed = LocalFederation(
        dirs,
        fast=not stock,
        poll_interval=poll_interval,
        work_dir=out / "flower",
        warm=executor != "flower",
        inline=executor == "inline",
        tls=not insecure,
        auth=not insecure,
        node_configs=[{"predict-table": str(t)} for t in tables] if tables else None,
    )
    run_config = _flower_run_config(server_dir, out, tables, to, rounds if config is None else None)
    security = "insecure" if insecure else "TLS, SuperNode authentication"
    _run_local(fed, run_config, out, security, executor, timeout)


def _deploy_options(
    executor: str,
    config: Optional[Path],
    federation: Optional[Path],
    clients: Optional[list[str]],
    stock: bool,
    predict_tables: Optional[list[str]],
    to: Optional[str],
) -> tuple[str, list[Path]]:
    """The checked options of :func:`deploy_local_cmd`: the executor (``flower`` with ``--stock``)
    and the ``--predict-tables`` files.

    Raises:
        ConfigError: an unknown executor, both or neither of ``--config`` and ``--federation``,
            ``--clients`` without ``--federation``, prediction options that do not fit, or a table
            that is not a file.
    """
    from hybridfl.errors import ConfigError

    if executor not in ("inline", "warm", "flower"):
        raise ConfigError(f"--executor must be inline, warm or flower, got {executor!r}.")
    if (config is None) == (federation is None):
        raise ConfigError("give either --config FILE or --federation FILE --clients DIR,... (not both, not neither).")
    if clients and federation is None:
        raise ConfigError("--clients needs the federation schema too: --federation FILE.")
    if stock and executor != "flower":
        executor = "flower"  # the stock SuperNode has no warm executor
    tables = [Path(t).expanduser().resolve() for item in (predict_tables or []) for t in str(item).split(",") if t]
    if (tables or to) and (federation is None or executor == "flower"):
        raise ConfigError(
            "--predict-tables and --to need --federation and a SuperNode that keeps the organisation in memory "
            "(--executor inline or warm)."
        )
    if to and not tables:
        raise ConfigError("--to names the receiver of a prediction: give --predict-tables too.")
    missing = [str(t) for t in tables if not t.is_file()]
    if missing:
        raise ConfigError(f"--predict-tables names {missing[0]!r}, which is not a file.")
    return executor, tables


def _deploy_dirs(
    out: Path,
    config: Optional[Path],
    federation: Optional[Path],
    clients: Optional[list[str]],
    rounds: Optional[int],
    seed: Optional[int],
    tables: list[Path],
) -> tuple[list[Path], Path]:
    """The client directories (in the federation's order) and the server directory of
    :func:`deploy_local_cmd`: ``--config`` exported into OUT/export, or ``--federation``'s
    client directories checked as ``run --federation`` checks them and the server directory
    assembled from their public client.json into OUT/server.

    Raises:
        ConfigError: ``--seed`` or no ``--clients`` with ``--federation``, OUT/server exists, or
            not one prediction table per client directory.
    """
    from hybridfl.errors import ConfigError

    if config is not None:
        export_clients_cmd(config, out / "export", rounds, seed, False)
        server_dir = out / "export" / "server"
        dirs = [d for d in sorted((out / "export").iterdir()) if (d / "client.json").is_file()]
        order = json.loads((out / "export" / "manifest.json").read_text())["client_ids"]
        dirs.sort(key=lambda d: order.index(d.name))
        return dirs, server_dir
    from hybridfl.cli.federation import split_client_dirs
    from hybridfl.data.federation import write_server_dir
    from hybridfl.experiment import prepare_federation

    if seed is not None:
        raise ConfigError("--seed is the federation schema's with --federation (it seeds every organisation).")
    given = split_client_dirs(clients)
    if not given:
        raise ConfigError("--federation needs the client directories: --clients DIR,DIR,...")
    if (out / "server").exists():
        raise ConfigError(f"{str(out / 'server')!r} exists: deploy into a new --out directory.")
    # every check of `run --federation` before anything starts (directories against the schema,
    # who holds labels, every client and the server built once: HE keys); the server directory
    # is the one `federation assemble` would write from the clients' public client.json
    prep = prepare_federation(federation, given, None, rounds)
    for w in prep.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    dirs = [Path(c.path) for c in prep.client_data]
    if tables and len(tables) != len(dirs):
        raise ConfigError(f"--predict-tables names {len(tables)} tables for {len(dirs)} --clients: one each.")
    return dirs, write_server_dir(prep.server_data.meta, out / "server")


def _flower_run_config(
    server_dir: Path, out: Path, tables: list[Path], to: Optional[str], rounds: Optional[int]
) -> dict[str, object]:
    """The ``flwr run`` config of :func:`deploy_local_cmd`: the server and results directories, a
    prediction task (with its receiver) and the rounds (``--federation`` only)."""
    run_config: dict[str, object] = {
        "server-dir": str(Path(server_dir).resolve()),
        "out-dir": str((out / "results").resolve()),
    }
    if tables:
        run_config["task"] = "predict"
        if to:
            run_config["to"] = to
    if rounds is not None:
        run_config["rounds"] = int(rounds)
    return run_config


def _run_local(fed, run_config: dict, out: Path, security: str, executor: str, timeout: float) -> None:
    """Start ``fed`` (a :class:`~hybridfl.runtime.flower.local.LocalFederation`), run
    ``run_config`` on it, stop it (always) and print the run's summary.

    Raises:
        HybridFLError: start-up or the run failed or timed out (one sentence; the logs say more).
    """
    try:
        fed.start()
        console.print(
            f"SuperLink on 127.0.0.1:{fed.port} ({security}), "
            f"{len(fed.client_dirs)} SuperNodes ({executor} executor); running (logs in {out / 'flower'})"
        )
        fed.run(run_config, timeout=timeout)
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as e:  # one sentence; the logs say more
        from hybridfl.errors import HybridFLError

        raise HybridFLError(f"{str(e).strip().splitlines()[0]} (logs in {out / 'flower'})") from None
    finally:
        fed.stop()
    s = json.loads((out / "results" / "summary.json").read_text())
    console.print({k: v for k, v in s.items() if k not in ("exchange_seconds", "nodes", "round_seconds")})
    console.print(f"results in {out / 'results'}")


def flower_executor_cmd(
    runtime_api_address: str = typer.Option(
        "127.0.0.1:9094", help="The SuperNode's Runtime API, HOST:PORT (its --host and --port)."
    ),
    insecure: bool = typer.Option(False, "--insecure", help="Connect to the Runtime API without TLS."),
    root_certificates: Optional[Path] = typer.Option(
        None, help="CA certificate (PEM) of the Runtime API's TLS (the SuperNode's --ssl-ca-certfile)."
    ),
    poll_interval: float = typer.Option(0.02, help="Seconds between two polls for tasks."),
    parent_pid: Optional[int] = typer.Option(None, help="Exit when this process (the SuperNode) exits."),
) -> None:
    """Run the warm ClientApp executor for a SuperNode started with --isolation process (keeps the client in memory)."""
    from hybridfl.errors import ConfigError
    from hybridfl.runtime.flower.executor import serve

    if not insecure and root_certificates is None:
        raise ConfigError("give --insecure (a Runtime API without TLS) or --root-certificates CA_FILE.")
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    serve(
        runtime_api_address,
        insecure,
        str(root_certificates) if root_certificates is not None else None,
        poll_interval,
        parent_pid,
    )


def register(app: typer.Typer) -> None:
    """Add the deployment commands to the ``hybridfl`` app."""
    app.command("export-clients")(export_clients_cmd)
    app.command("he-keys")(he_keys_cmd)
    app.command("flower-app")(flower_app_cmd)
    app.command("deploy-local")(deploy_local_cmd)
    app.command("flower-executor")(flower_executor_cmd)
