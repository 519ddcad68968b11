"""The two sides of a deployment, independent of Flower's process machinery.

- :func:`client_step`: what a SuperNode's ClientApp does with one message: load the node's own
  data directory, rebuild the algorithm's client object, restore its state, call its ``handle``,
  save its state, return the encoded reply.
- :func:`serve`: :func:`client_step` made safe to repeat: a message the server re-sends after a
  node failure (same sequence number, same bytes) gets the reply already given.
- :class:`WarmClient`: for a long-lived process (the warm executor,
  :mod:`hybridfl.runtime.flower.executor`), the client object and its data kept in memory between
  the messages of a run; the state is still saved after every message.
- :func:`run_server`: what the ServerApp does: learn which client each SuperNode holds
  (``deploy.hello``), build the server from the algorithm's
  :class:`~hybridfl.algorithms.spec.AlgorithmSpec`, run its ``setup`` and then the
  :class:`~hybridfl.runtime.loop.RoundLoop` (the simulation's loop) over a :class:`FlowerTransport`,
  and write results.

A client is built only by its spec's ``build_client`` and keeps its state only through its own
``get_state``/``set_state``: the same objects and the same state as in the simulation.

Both work on our encoded message bytes only, so they are tested without Flower processes too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from hybridfl.algorithms.spec import deployable
from hybridfl.data.export import ClientData, load_client_dir, load_server_dir
from hybridfl.errors import ConfigError, HybridFLError
from hybridfl.files import atomic_write
from hybridfl.runtime.flower.bridge import HELLO, SETUP
from hybridfl.runtime.flower.hello import answer_hello, answer_setup
from hybridfl.runtime.flower.tasks import MODEL_PART, part_step
from hybridfl.runtime.messages import SERVER, Message, decode, encode

PING = "deploy.ping"
log = logging.getLogger("hybridfl.flower")


def _load(data_dir: str | None) -> ClientData:
    if not data_dir:
        raise HybridFLError(
            "this SuperNode has no data directory: start it with --node-config 'data-dir=\"/path/to/client-dir\"' "
            "(a directory written by `hybridfl export-clients`)."
        )
    return load_client_dir(data_dir)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One compute thread for NumPy's BLAS and (if the algorithm uses it) torch, like
    :func:`hybridfl.runtime.simulation.single_threaded`, without importing torch for algorithms
    that do not need it (a ClientApp process lives for one message)."""
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch is not None and before is not None:
            torch.set_num_threads(before)


class WarmClient:
    """One client object kept in memory between the messages of a run, by a long-lived process.

    :func:`client_step` reuses the object only while the store still holds the setup and the
    state the object was left in (so a store loaded from the state file after a restart, or any
    other change of the store, rebuilds it), and forgets it when its ``handle`` raises (the object
    may be half-updated). The loaded client directory is kept too, keyed by the directory and the
    modification time of its ``client.json``.
    """

    def __init__(self) -> None:
        from hybridfl.runtime.flower.tasks import NodeTasks

        self.client: Any = None
        self.key: tuple[bytes, bytes] | None = None
        self._data: tuple[tuple[str, int], ClientData] | None = None
        self.tasks = NodeTasks()  # after training: the run's prediction requests (tasks.py)

    def load(self, data_dir: str | None) -> ClientData:
        """The client directory ``data_dir``, loaded once while its ``client.json`` is unchanged.

        Raises:
            HybridFLError: no or a bad data directory.
        """
        if not data_dir:
            return _load(data_dir)
        try:
            stamp = (str(data_dir), (Path(data_dir) / "client.json").stat().st_mtime_ns)
        except OSError:
            return _load(data_dir)  # its one-sentence error
        if self._data is None or self._data[0] != stamp:
            self._data = (stamp, _load(data_dir))
        return self._data[1]

    def get(self, setup: bytes, state: bytes | None) -> Any:
        """The kept client if it was left with exactly ``setup`` and ``state``, else None."""
        if self.key is None or state is None or self.client is None:
            return None
        return self.client if self.key == (setup, state) else None

    def keep(self, client: Any, setup: bytes, state: bytes) -> None:
        """Keep ``client``, which is now at ``setup`` and ``state``."""
        self.client, self.key = client, (setup, state)

    def forget(self) -> None:
        """Drop the kept client (the next message rebuilds it from the store)."""
        self.client, self.key = None, None


def client_step(
    raw: bytes, data_dir: str | None, store: MutableMapping[str, bytes], warm: WarmClient | None = None
) -> bytes:
    """Answer one encoded message as the client whose exported directory is ``data_dir``.

    Args:
        raw: our encoded message (:func:`hybridfl.runtime.messages.encode`).
        data_dir: the node's own client directory (node config ``data-dir``).
        store: bytes kept by this node between messages (Flower's ``context.state``; it never
            leaves the node): the algorithm settings from the hello and the client's state.
        warm: keep the client object (and its loaded data) in memory for the next message
            (``None``: build it for this message only, as a ClientApp process per message must).

    Returns:
        The encoded reply.

    The run starts with two unsequenced exchanges: the hello (``deploy.hello``: the run's
    ``session`` and a fresh ``nonce`` only), answered with the client's name and its proof (and how
    far this node got in this session: ``seq``, ``ready``), and, only to a node whose proof the
    server verified, the setup (``deploy.setup``: algorithm, config, seed, layout, session),
    answered with the client's public structure and its algorithm's hello payload.

    Raises:
        HybridFLError: no or a bad data directory; a message for another client or from
            anyone but the server.
        RuntimeError: an algorithm message before the setup.
        ValueError: a hello without a proper nonce and session, a setup without a session.
    """
    msg = decode(raw)
    if msg.sender != SERVER:  # only the server sends a client messages (a peer's words travel inside them)
        raise HybridFLError(f"a message from {msg.sender!r}, not the server, reached a client node.")
    cd = warm.load(data_dir) if warm is not None else _load(data_dir)
    if msg.kind == PING:  # no algorithm: measures Flower's own cost of one exchange
        return encode(msg.reply(client_id=cd.client_id, echo=msg.payload.get("echo", b"")))
    if msg.kind == HELLO:
        return answer_hello(msg, cd, store)
    if msg.kind == SETUP:
        return answer_setup(msg, cd, store, warm)
    if "setup" not in store:
        raise RuntimeError(f"client {cd.client_id!r} got {msg.kind!r} before the {SETUP!r} exchange of its run.")
    if msg.receiver != cd.client_id:
        raise HybridFLError(f"a message for client {msg.receiver!r} reached the node holding client {cd.client_id!r}.")
    setup_raw = bytes(store["setup"])
    if msg.kind.startswith("predict."):  # after training: a federated prediction request (tasks.py)
        from hybridfl.runtime.flower.tasks import predict_step

        with _one_thread():
            return encode(predict_step(msg, cd, decode(setup_raw).payload, warm))
    with _one_thread():  # as `hybridfl run` does in process: one compute thread
        client = warm.get(setup_raw, store.get("state")) if warm is not None else None
        if client is None:
            setup = decode(setup_raw).payload
            spec = deployable(str(setup["algorithm"]))
            cfg = spec.config_model.model_validate_json(str(setup["config"]))
            layout = [
                (str(c), [str(b) for b in blocks], bool(lab))
                for c, blocks, lab in json.loads(str(setup.get("layout", "[]")))
            ]
            client = spec.build_client(cd, cfg, int(setup["seed"]), layout)
            if "state" in store:
                client.set_state(decode(store["state"]).payload)
        if warm is not None:
            warm.forget()  # until handle and get_state have succeeded: the object may be half-updated
        try:
            if msg.kind == MODEL_PART:  # after training: this organisation's part of the model
                reply = part_step(msg, cd, client, decode(setup_raw).payload, warm.tasks if warm is not None else None)
            else:
                reply = client.handle(msg)
        except Exception:
            keep = getattr(client, "failed_state", None)  # fail closed: the stop survives the rebuild
            if callable(keep):
                old = decode(store["state"]).payload if "state" in store else {}
                store["state"] = encode(Message("state", cd.client_id, cd.client_id, msg.round, {**old, **keep()}))
            raise
        state = encode(Message("state", cd.client_id, cd.client_id, msg.round, dict(client.get_state())))
        store["state"] = state
        if warm is not None:
            warm.keep(client, setup_raw, state)
    return encode(reply)


class StaleMessage(RuntimeError):
    """A message older than the last one the client handled (the server gave it up long ago)."""


def serve(
    raw: bytes,
    seq: int | None,
    data_dir: str | None,
    store: MutableMapping[str, bytes],
    acked: int | None = None,
    warm: WarmClient | None = None,
) -> bytes:
    """What the ClientApp does with one Flower message: :func:`client_step`, made safe to repeat.

    The server's :class:`~hybridfl.runtime.flower.bridge.FlowerTransport` numbers the algorithm
    messages of each client 1, 2, ... after its hello (0) and re-sends a message, with the same
    number, when the node it went to failed before the reply arrived. ``store`` (the node's
    saved state) keeps the number of the last message handled, a digest of it and its reply:

    - ``seq`` is None (hello, ping): :func:`client_step`;
    - ``seq`` is the next number: :func:`client_step`, then remember number, digest and reply;
    - ``seq`` is the last number and the bytes are the same: the reply already given (the node
      had handled the message and saved its state but its reply was lost), state untouched;
    - ``acked <= last < seq``: the server gave up waiting for the messages between (their replies
      never arrived: the transport's deadline passed) and goes on; whether this node handled
      them or never got them, the algorithm's missing-reply policy has already accounted for it.

    ``warm`` is passed on to :func:`client_step` (keep the client object between messages).

    Raises:
        StaleMessage: ``seq`` is below the last number handled (a message the server abandoned,
            delivered late): it is not applied.
        RuntimeError: any other number: the saved state does not belong with this message.
    """
    if seq is None or "setup" not in store:
        return client_step(raw, data_dir, store, warm)
    last = int(store.get("seq", b"0"))
    digest = hashlib.sha256(raw).digest()
    if seq == last and store.get("request") == digest and "reply" in store:
        return bytes(store["reply"])
    if seq < last:
        raise StaleMessage(f"client got message #{seq} after message #{last}: the server gave it up; not applied.")
    if seq != last + 1 and not (acked is not None and acked <= last < seq):
        raise RuntimeError(
            f"client got message #{seq} but its saved state is after message #{last}: the node's state (Flower's "
            "context.state and the state-dir) was lost or belongs to another run."
        )
    reply = client_step(raw, data_dir, store, warm)
    store["seq"] = str(seq).encode()
    store["request"] = digest
    store["reply"] = reply
    return reply


def algorithm_from(server_dir: str | Path, rounds: int | None = None) -> tuple[Any, Any, int]:
    """The server data, the validated algorithm config and the seed of an exported ``server/``.

    Raises:
        ConfigError: the export has no run config, or the algorithm cannot be deployed.
    """
    sd = load_server_dir(server_dir)
    rc = sd.meta.get("run_config")
    if not rc or "algorithm" not in rc:
        raise ConfigError(
            f"server directory {str(server_dir)!r} has no run config (export it with `hybridfl export-clients --config FILE`)."
        )
    algo = dict(rc["algorithm"])
    if rounds:
        algo["rounds"] = int(rounds)
    spec = deployable(str(algo.get("name", "hyfem")))
    cfg = spec.config_model.model_validate(algo)
    return sd, cfg, int(sd.meta.get("seed", 0))


def client_credentials(sd, server_dir: str | Path) -> dict[str, str]:
    """Every client's registered public key (``server.json`` ``client_keys``, from each client's
    ``client.json``): a node is mapped to a client only with a proof under that key.

    Raises:
        ConfigError: a client without a valid key (a server directory written before credentials
            existed, or edited): export, or prepare and assemble, again.
    """
    from hybridfl.privacy.credentials import public_key_hex

    keys = sd.meta.get("client_keys")
    keys = keys if isinstance(keys, dict) else {}
    out = {}
    for c in sd.client_ids:
        if c not in keys:
            raise ConfigError(
                f"server directory {str(server_dir)!r} has no public key for client {c!r}, so no node could prove it "
                "holds that client: export (or prepare and assemble) the federation again with this version."
            )
        out[c] = public_key_hex(keys[c], f"server directory {str(server_dir)!r}, client {c!r}")
    return out


def assign_clients(hello_replies: dict[int, Message], expected: list[str]) -> dict[str, int]:
    """Client ID -> node ID from the hello replies, in the export's client order.

    Raises:
        HybridFLError: two nodes hold the same client, a node holds an unknown client, or an
            expected client is missing.
    """
    nodes: dict[str, int] = {}
    for nid, r in hello_replies.items():
        cid = str(r.payload["client_id"])
        if cid in nodes:
            raise HybridFLError(f"nodes {nodes[cid]} and {nid} both hold client {cid!r} (check their data-dir).")
        if cid not in expected:
            raise HybridFLError(
                f"node {nid} holds client {cid!r}, which is not in this export (clients: {', '.join(expected)})."
            )
        nodes[cid] = nid
    missing = [c for c in expected if c not in nodes]
    if missing:
        raise HybridFLError(f"no connected node holds client(s) {', '.join(missing)}.")
    return {c: nodes[c] for c in expected}


def run_server(
    grid,
    server_dir: str | Path,
    out_dir: str | Path | None = None,
    rounds: int | None = None,
    poll_interval: float = 0.02,
    reply_timeout: float = 600.0,
    node_wait: float = 300.0,
    pings: int = 0,
    node_check: float = 1.0,
    task: str = "train",
    to: str | None = None,
) -> dict:
    """The ServerApp's work: one run of the exported set-up's algorithm over Flower.

    Args:
        grid: the ServerApp's Flower ``Grid``.
        server_dir: the export's ``server/`` directory (schema, client names, run config, test set).
        out_dir: where to write ``results.json``, ``metrics.csv`` and the algorithm's plots (the
            simulation's files), ``history.json``, ``summary.json``, ``wire.json``, ``model/``
            (the server's model, :func:`_write_server_model`) and (for algorithms with a final
            model, e.g. HyFDCA's ``w``) ``final.npz``; ``None``: nowhere.
        rounds: override the config's number of rounds.
        poll_interval: seconds between pulls for replies.
        reply_timeout: seconds a client may take to answer one message (also: to come back after
            its SuperNode failed); after that its reply counts as missing and the algorithm's
            missing-reply policy applies, exactly as for a failure in the simulation.
        node_wait: seconds to wait until a node holding every client has answered the hello.
        pings: before the algorithm, this many ``deploy.ping`` exchanges with every client (no
            algorithm work: measures Flower's own seconds per exchange; not in the byte counts).
        node_check: seconds between two looks at the SuperLink's node list while waiting for
            replies (how fast a restarted SuperNode is noticed).
        task: ``train`` (then every organisation gets its part of the model and the label
            holders evaluate it on their own test rows: :mod:`hybridfl.runtime.flower.tasks`) or
            ``predict`` (no training: a federated prediction of the organisations' new rows, named
            by each node's ``predict-table``, for ``to``).
        to: the receiver of a ``predict`` task (default: the first label holder).

    Returns:
        The summary (also written to ``out_dir/summary.json``).

    Raises:
        ConfigError: an unknown task.
    """
    from hybridfl.config import client_settings_json
    from hybridfl.runtime.flower.bridge import FlowerTransport

    if task not in ("train", "predict"):
        raise ConfigError(f"the run config's task must be train or predict, got {task!r}.")
    t_start = time.perf_counter()
    sd, cfg, seed = algorithm_from(server_dir, rounds)
    spec = deployable(cfg.name)
    if spec.labels is not None and task == "train":  # who must hold labels, from the public layout
        spec.labels.check(sd.layout)
    # hello: every node proves which client it holds; only then does it learn the algorithm
    # settings (the setup); "session" tells a restarted node of this run (its state kept on disk)
    # from a node of another run; the simulation-only settings stay here
    hello = {"algorithm": cfg.name, "config": client_settings_json(cfg), "seed": seed}
    hello.update(layout=json.dumps(sd.layout), session=os.urandom(12).hex())
    transport = FlowerTransport(grid, None, poll_interval, reply_timeout, node_check=node_check)
    t0 = time.perf_counter()
    found = transport.hello_all(hello, sd.client_ids, node_wait, client_credentials(sd, server_dir))
    hello_seconds = time.perf_counter() - t0
    nodes = assign_clients(found, sd.client_ids)
    transport.attach(nodes)
    log.info("hybridfl: %d SuperNodes hold the %d clients; %s (%s)", len(found), len(nodes), cfg.name, task)
    if task == "predict":
        return _predict_run(transport, cfg, sd, out_dir, to, t_start)
    ping_seconds = _pings(grid, nodes, poll_interval, reply_timeout, pings)
    server = spec.build_server(sd, cfg, seed, {c: found[n].payload for c, n in nodes.items()})
    out = Path(out_dir) if out_dir is not None else None
    history, summary = _train(transport, spec, cfg, sd, server, out)
    trained_wire, trained_exchanges = transport.wire.wire_total, len(transport.wire.exchanges)
    after = _after_training(transport, spec, server, cfg, sd, summary, history)
    summary.update(_deploy_summary(transport, history, trained_wire, trained_exchanges))
    summary.update(setup_exchange_seconds=hello_seconds, ping_seconds=ping_seconds, poll_interval=poll_interval)
    summary["wall_seconds"] = time.perf_counter() - t_start
    if out is not None:
        _write_outputs(out, spec, cfg, seed, server, sd, transport, history, summary, after)
    return summary


def _pings(grid: Any, nodes: dict, poll_interval: float, reply_timeout: float, pings: int) -> list[float]:
    """Seconds of ``pings`` empty exchanges with every client (``deploy.ping``: Flower's own cost)."""
    from hybridfl.runtime.flower.bridge import FlowerTransport

    out = []
    for _ in range(int(pings)):
        pt = FlowerTransport(grid, nodes, poll_interval, reply_timeout, sequenced=False)
        t0 = time.perf_counter()
        pt.send_and_receive([Message(PING, SERVER, c, 0, {"echo": b""}) for c in nodes])
        out.append(time.perf_counter() - t0)
    return out


def _deploy_summary(transport: Any, history: list, trained_wire: int, trained_exchanges: int) -> dict:
    """What a deployed run adds to the loop's summary: nodes, wire bytes and exchanges of the
    training, rejoins, refused nodes, bad replies, the last round's row."""
    ex = transport.wire.exchanges[:trained_exchanges]
    return {
        "after_training_wire_bytes": transport.wire.wire_total - trained_wire,  # parts and evaluation
        "after_training_exchanges": len(transport.wire.exchanges) - trained_exchanges,
        "nodes": {c: int(v) for c, v in transport.nodes.items()},  # at the end (after any rejoin)
        "wire_bytes_total": trained_wire,  # training (the summary's bytes_total and messages_total)
        "exchanges": len(ex),
        "exchange_seconds_mean": sum(e["seconds"] for e in ex) / max(len(ex), 1),
        "exchange_seconds": [e["seconds"] for e in ex],
        "round_seconds": [r["seconds"] for r in history],
        "rejoins": transport.rejoins,
        "refused_nodes": {str(n): why for n, why in transport.refused.items()},
        "abandoned_messages": transport.abandoned,
        "bad_replies": transport.strikes.events,
        "dropped_clients": transport.strikes.dropped,
        "retried_messages": sum(1 for e in transport.wire.entries if e.retry),
        "final": dict(history[-1]),
    }


def _train(transport: Any, spec: Any, cfg: Any, sd: Any, server: Any, out: Path | None) -> tuple[list[dict], dict]:
    """The algorithm's setup and rounds (the simulation's :class:`~hybridfl.runtime.loop.RoundLoop`)
    over ``transport``: ``(history, summary)``; ``out/progress.json`` after every round."""
    from hybridfl.runtime.loop import RoundLoop
    from hybridfl.runtime.simulation import single_threaded

    def progress(done: int, total: int, row: dict) -> None:
        log.info(
            "hybridfl: round %d/%d %s",
            done,
            total,
            {k: round(v, 6) for k, v in row.items() if "[" not in k and isinstance(v, float)},
        )
        if out is not None:  # for whoever watches the run (tests, operators): rounds done so far
            atomic_write(
                out / "progress.json", json.dumps({"round": done, "rounds": total, "rejoins": transport.rejoins})
            )

    with single_threaded():
        server.setup(transport, transport.client_ids)
        loop = RoundLoop(spec, cfg, server, transport, sd, transport.evaluation_exchange, None, progress)
        history = loop.run()
    return history, loop.summary(history, len(sd.client_ids), str(sd.meta.get("dataset", "")))


def _server_model(spec: Any, server: Any, cfg: Any, sd: Any) -> tuple[Any, Any]:
    """``(parts, loaded model)`` of the model the server holds (:data:`~hybridfl.experiment.SERVER_MODEL_KINDS`)
    with the encoding recorded in ``server.json``; ``(None, None)`` otherwise (FedBCD's parties
    keep theirs; an export written before encodings were recorded)."""
    from hybridfl.data.encoding import encoding_from_meta
    from hybridfl.experiment import MODEL_DIR, SERVER_MODEL_KINDS
    from hybridfl.inference import load_model
    from hybridfl.inference.modeldir import write_model_dir

    parts = spec.export_model(server, None, cfg) if spec.export_model is not None else None
    got = encoding_from_meta(sd.meta or {})
    if parts is None or parts.kind not in SERVER_MODEL_KINDS or got is None:
        return None, None
    enc, scale, dtype = got
    with tempfile.TemporaryDirectory() as tmp:
        d = write_model_dir(
            Path(tmp) / MODEL_DIR, parts, enc, scale, cfg.name, str(sd.meta.get("dataset", "")), {}, dtype
        )
        return parts, load_model(d)


def _after_training(transport: Any, spec: Any, server: Any, cfg: Any, sd: Any, summary: dict, history: list) -> dict:
    """Every organisation's part of the model to its node, then the federated evaluation on the
    organisations' own test rows (:mod:`hybridfl.runtime.flower.tasks`); its metrics go into the
    summary and the last round's row (HyFEM's ``accuracy`` as ``server_accuracy``, as in process).
    Returns ``{"parts": server-held ModelParts or None}``."""
    from hybridfl.inference.parts import PredictionError, model_units
    from hybridfl.runtime.flower.tasks import all_units, deliver_parts, evaluate

    parts, model = _server_model(spec, server, cfg, sd)
    layout = [(str(c), [str(b) for b in bl], bool(lab)) for c, bl, lab in sd.layout]
    exports = model is None and spec.export_part is not None
    if model is None and not exports:
        return {"parts": parts}
    try:
        units = list(model_units(model)) if model is not None else all_units("fedbcd", layout, [])
    except PredictionError:  # a model with no parts (e.g. FedBCD top: concat)
        return {"parts": parts}
    status = deliver_parts(transport, layout, model, exports)
    summary["model_parts"] = status
    if any(v == "written" for v in status.values()):
        metrics = evaluate(transport, layout, units)
        if "accuracy" in metrics and (model is not None and model.kind == "hyfem"):
            metrics["server_accuracy"] = metrics.pop("accuracy")
        summary.update(metrics)
        if history and metrics:
            history[-1].update({k: v for k, v in metrics.items() if k in ("accuracy", "server_accuracy", "auc")})
    return {"parts": parts}


def _write_outputs(
    out: Path, spec, cfg, seed: int, server, sd, transport, history: list, summary: dict, after: dict
) -> None:
    """The run's files in ``out`` (:func:`run_server`'s ``out_dir``)."""
    from hybridfl.reporting.results import write_results
    from hybridfl.runtime.simulation import RunResult

    plots = spec.plots(history, cfg, f"{cfg.name} over Flower") if spec.plots is not None else []
    write_results(
        out, RunResult(summary, history, transport.log, plots), {"algorithm": cfg.model_dump(mode="json"), "seed": seed}
    )
    atomic_write(out / "history.json", json.dumps(history, indent=1))
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, default=str))
    atomic_write(out / "wire.json", json.dumps([e.__dict__ for e in transport.wire.entries]))
    if spec.final_arrays is not None:
        import io

        import numpy as np

        buf = io.BytesIO()
        np.savez(buf, **spec.final_arrays(server))
        atomic_write(out / "final.npz", buf.getvalue())
    if after.get("parts") is not None:
        _write_server_model(after["parts"], cfg, sd, out, summary)


def _write_server_model(parts: Any, cfg: Any, sd: Any, out: Path, summary: dict) -> None:
    """``<out>/model/``: the model the server holds (HyFDCA's and hybrid FedAvg's ``w``, HyFEM's
    server and client models) with the encoding recorded in ``server.json`` and the run's metrics."""
    from hybridfl.data.encoding import encoding_from_meta
    from hybridfl.experiment import MODEL_DIR, model_metrics
    from hybridfl.inference.modeldir import write_model_dir

    enc, scale, dtype = encoding_from_meta(sd.meta or {})  # type: ignore[misc]
    write_model_dir(
        out / MODEL_DIR, parts, enc, scale, cfg.name, str(sd.meta.get("dataset", "")), model_metrics(summary), dtype
    )


def _predict_run(transport: Any, cfg: Any, sd: Any, out_dir: str | Path | None, to: str | None, t_start: float) -> dict:
    """A run with ``task: predict``: one federated prediction (:func:`hybridfl.runtime.flower.tasks.predict`);
    the summary (counts, messages, bytes, seconds) to ``out_dir/summary.json``."""
    from hybridfl.runtime.flower.tasks import all_units, predict

    layout = [(str(c), [str(b) for b in bl], bool(lab)) for c, bl, lab in sd.layout]
    units = all_units("fedbcd" if cfg.name == "fedbcd" else "", layout, list(sd.block_shapes))
    summary = predict(transport, layout, units, to)
    summary.update(
        {
            "task": "predict",
            "messages": transport.log.messages_total,
            "bytes": transport.log.bytes_total,
            "wall_seconds": time.perf_counter() - t_start,
        }
    )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out_dir) / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary
