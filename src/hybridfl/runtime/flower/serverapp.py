"""The Flower ServerApp of hybridfl (``hybridfl.runtime.flower.serverapp:app``).

Run config (``flwr run APP FEDERATION --run-config "server-dir='...' rounds=2"``):

- ``server-dir`` (required): the ``server/`` directory written by ``hybridfl export-clients``;
- ``out-dir``: where to write ``history.json``, ``summary.json``, ``wire.json`` ("" = nowhere);
- ``rounds``: override the exported config's rounds (0 = keep);
- ``poll-interval``: seconds between pulls for replies (default 0.05);
- ``reply-timeout``: seconds a client may take to answer one message, or to come back after its
  SuperNode failed (default 600);
- ``node-wait``: seconds to wait until a node holding every client answered the hello (default 300);
- ``node-check``: seconds between looks for restarted SuperNodes while waiting for replies (1);
- ``pings``: empty exchanges with every client before the run, to measure Flower's overhead (0);
- ``task``: ``train`` (default: training, then each organisation's part of the model and the
  federated evaluation) or ``predict`` (a federated prediction of the organisations' new rows,
  each node's ``predict-table``; :mod:`hybridfl.runtime.flower.tasks`);
- ``to``: the organisation that receives the predictions of a ``predict`` task (default: the first
  label holder).
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def fast_object_retries(first: float) -> None:
    """In this (ServerApp) process, retry pulling a reply's objects first after ``first`` seconds
    (then doubling up to 1 s) instead of Flower 1.41's fixed 1 s: a reply is often listed by the
    SuperLink before the SuperNode has uploaded its objects, and a fast poller then always waits
    the full second. Flower's overall limit (``PULL_MAX_TIME``) still applies."""
    import functools

    import flwr.superlink.grid.http_grid as http_grid

    if not isinstance(http_grid.pull_objects, functools.partial):  # once per process
        http_grid.pull_objects = functools.partial(
            http_grid.pull_objects, initial_backoff=float(first), backoff_cap=1.0, max_tries_per_object=None
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp's entry point: read the run config (see the module docstring) and run the
    exported algorithm with :func:`hybridfl.runtime.flower.node.run_server` over ``grid``.

    Raises:
        ConfigError: the run config has no ``server-dir``.
    """
    from hybridfl.errors import ConfigError
    from hybridfl.runtime.flower.node import run_server

    logging.getLogger("hybridfl.flower").setLevel(logging.INFO)
    if not logging.getLogger("hybridfl.flower").handlers:
        logging.getLogger("hybridfl.flower").addHandler(logging.StreamHandler())
    rc = context.run_config
    server_dir = str(rc.get("server-dir", "") or "")
    if not server_dir:
        raise ConfigError(
            "the run config has no server-dir: pass --run-config \"server-dir='/path/to/export/server'\"."
        )
    out = str(rc.get("out-dir", "") or "") or None
    if float(rc.get("poll-interval", 0.05)) < 1.0:  # a reply's objects: first retry after at most 0.01 s
        fast_object_retries(min(max(float(rc.get("poll-interval", 0.05)), 0.005), 0.01))
    summary = run_server(
        grid,
        server_dir,
        out,
        rounds=int(rc.get("rounds", 0) or 0) or None,
        poll_interval=float(rc.get("poll-interval", 0.05)),
        reply_timeout=float(rc.get("reply-timeout", 600.0)),
        node_wait=float(rc.get("node-wait", 300.0)),
        pings=int(rc.get("pings", 0) or 0),
        node_check=float(rc.get("node-check", 1.0)),
        task=str(rc.get("task", "train") or "train"),
        to=str(rc.get("to", "") or "") or None,
    )
    logging.getLogger("hybridfl.flower").info(
        "hybridfl: done %s", {k: v for k, v in summary.items() if k not in ("exchange_seconds", "final")}
    )
