"""After training, over Flower: every organisation's part of the model on its own node, federated
evaluation on the organisations' own test rows, and federated prediction of new rows, with the
messages of :mod:`hybridfl.inference.federated` (the steps the in-process path runs).

Node side (:func:`part_step`, :func:`predict_step`; :func:`hybridfl.runtime.flower.node.client_step`
routes ``model.part`` and ``predict.*`` messages here):

- ``model.part``: the organisation's part of the trained model (:mod:`hybridfl.inference.parts`).
  For a model the server holds (HyFDCA's and hybrid FedAvg's ``w``, HyFEM's server model) the
  message carries the part's two files; the node checks them as any part (hashes, shapes,
  finiteness) and that it is its own (its name, its blocks only, the head only if it holds labels,
  its own copy of the schema's encoding) before it replaces ``<data-dir>/model/``. For FedBCD the
  message carries nothing: the party writes its bottom model (and, as the label party, the top's
  bias) from its own state (the spec's ``export_part``); no bottom model ever crosses.
- ``predict.*``: one :class:`~hybridfl.inference.federated.PredictOrg` per request, kept by the
  long-lived process (:class:`~hybridfl.runtime.flower.node.WarmClient`; a ClientApp process per
  message cannot keep a request's keys, so it refuses). Its rows are its own test rows
  (``task: evaluate``, ``client prepare --test-table``) or the new table the organisation named
  in its SuperNode's node config ``predict-table`` (``task: predict``): the server never names a
  file. A receiver of an evaluation replies its metrics; of a prediction, it writes the
  predictions to node config ``predict-out`` (default ``<data-dir>/predictions/<session>.csv``)
  and replies counts. At most :data:`MAX_REQUESTS` requests per run.

A long-lived node fails closed per run: after it refuses any ``predict.*`` or ``model.part``
message it refuses every later task message of the run (:class:`NodeTasks`).

Server side: :func:`deliver_parts`, :func:`evaluate` (after training) and :func:`predict` (a run
with run config ``task='predict'``).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridfl.errors import HybridFLError, PredictionError, ProtocolError
from hybridfl.runtime.messages import SERVER, Message

MODEL_PART = "model.part"
MAX_REQUESTS = 16
"""Federated-prediction requests a node answers per run (evaluation takes one per label holder)."""
MAX_PART_BYTES = 512 * 2**20
PREDICT_TABLE = "predict-table"
PREDICT_OUT = "predict-out"
log = logging.getLogger("hybridfl.flower")


class NodeTasks:
    """What a node keeps of the after-training tasks of one run (in its
    :class:`~hybridfl.runtime.flower.node.WarmClient`).

    Fail closed per run (against a hostile server, as the clients' training protocols,
    :mod:`hybridfl.runtime.failclosed`): once the node refuses a ``predict.*`` or ``model.part``
    message, it refuses every later task message of the run with one sentence naming the first
    refusal (``stopped``), so a refusal is at most one bit per run; only a new run
    (:meth:`reset`, on a new setup) clears it.
    """

    def __init__(self) -> None:
        self.org: Any = None
        self.requests = 0
        self.task = ""
        self.id_name = "id"
        self.head: Any = None
        self.node_config: dict = {}
        self.stopped = ""

    def reset(self) -> None:
        """Forget the requests and the stop of an earlier run (the node config stays)."""
        self.org, self.requests, self.task, self.head, self.stopped = None, 0, "", None, ""

    def answer(self, who: str, msg: Message, step: Callable[[], Message]) -> Message:
        """``step()``'s reply to the task message ``msg`` under the run-level stop (class docstring).

        Raises:
            ProtocolError: the node refused a task message of this run before; or whatever
                ``step`` raises (which stops the tasks for the run).
        """
        if self.stopped:
            raise ProtocolError(
                f"client {who!r} has stopped the after-training tasks of this run after refusing {self.stopped}; "
                "it answers no further task message."
            )
        try:
            return step()
        except Exception as e:
            self.org, self.stopped = None, f"{msg.kind!r} ({type(e).__name__})"
            raise


def is_task(kind: str) -> bool:
    """Whether a message kind is an after-training task (:func:`part_step`, :func:`predict_step`)."""
    return kind == MODEL_PART or kind.startswith("predict.")


# ------------------------------------------------------------------------------------ node


def _own_encoding(cd: Any) -> tuple[Any, Any, str]:
    from hybridfl.data.encoding import encoding_from_meta

    got = encoding_from_meta(cd.meta or {})
    if got is None:
        raise HybridFLError(
            f"client {cd.client_id!r} has no copy of the schema's encoding in its client.json: prepare (or export) "
            "it again with this version to keep a part of the model."
        )
    return got


def _same_encoding(a: Any, b: Any) -> bool:
    import numpy as np

    (ea, sa, _), (eb, sb) = a, b
    if ea.model_dump(exclude={"blocks": {"__all__": {"scale"}}}) != eb.model_dump(
        exclude={"blocks": {"__all__": {"scale"}}}
    ):
        return False
    if set(sa) != set(sb):
        return False
    return all(np.allclose(sa[k][0], sb[k][0], rtol=1e-12) and np.allclose(sa[k][1], sb[k][1], rtol=1e-12) for k in sa)


def part_step(msg: Message, cd: Any, client: Any, setup: dict, tasks: NodeTasks | None = None) -> Message:
    """Answer ``model.part`` (module docs): write this organisation's part to ``<data-dir>/model/``
    as a whole (a failed check leaves an earlier part untouched). With ``tasks`` (a long-lived
    node) under its run-level stop (:meth:`NodeTasks.answer`).

    Raises:
        ProtocolError: files that are not this organisation's part (one sentence), or the node's
            tasks stopped for the run.
        HybridFLError: no client directory, or no copy of the encoding.
    """
    if tasks is not None:
        return tasks.answer(cd.client_id, msg, lambda: part_step(msg, cd, client, setup))
    from hybridfl.algorithms.spec import deployable
    from hybridfl.experiment import MODEL_DIR
    from hybridfl.files import atomic_write
    from hybridfl.inference.modeldir import MANIFEST, WEIGHTS, ModelError
    from hybridfl.inference.parts import load_org_part, write_part

    if cd.path is None:
        raise HybridFLError(f"client {cd.client_id!r} has no directory to keep its part of the model in.")
    enc = _own_encoding(cd)
    spec = deployable(str(setup["algorithm"]))
    cfg = spec.config_model.model_validate_json(str(setup["config"]))
    layout = [(str(c), [str(b) for b in bl], bool(lab)) for c, bl, lab in json.loads(str(setup.get("layout", "[]")))]
    root = Path(cd.path)
    tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=root))
    try:
        staged = tmp / MODEL_DIR
        files = {k: msg.payload.get(k) for k in ("manifest", "weights")}
        if any(v is not None for v in files.values()):
            if not all(isinstance(v, bytes) and 0 < len(v) <= MAX_PART_BYTES for v in files.values()):
                raise ProtocolError(f"client {cd.client_id!r} got a model.part without its two files.")
            staged.mkdir()
            atomic_write(staged / MANIFEST, files["manifest"])
            atomic_write(staged / WEIGHTS, files["weights"])
        elif spec.export_part is not None:
            got = spec.export_part(client, cfg, layout)
            if got is None:
                return msg.reply(written=False)
            parts, info = got
            write_part(staged, parts, enc, cfg.name, str(cd.meta.get("dataset", "")), info)
        else:
            return msg.reply(written=False)
        try:
            loaded = load_org_part(staged)
        except ModelError as e:
            raise ProtocolError(f"client {cd.client_id!r} refused its part of the model: {e}") from None
        own_blocks = set(cd.data.block_names)
        if (
            loaded.organisation != cd.client_id
            or loaded.part.units
            and not all(set(loaded.part.unit_blocks[u]) <= own_blocks for u in loaded.part.units)
        ):
            raise ProtocolError(f"client {cd.client_id!r} got a part of the model that is not its own.")
        if (loaded.part.head is not None) != bool(cd.has_labels):
            raise ProtocolError(f"client {cd.client_id!r} got a part whose head does not match its labels.")
        if not _same_encoding(enc, (loaded.encoding, loaded.scale)):
            raise ProtocolError(f"client {cd.client_id!r} got a part with another encoding than its schema's.")
        old = root / MODEL_DIR
        if old.exists():
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        staged.rename(old)
        return msg.reply(written=True, units=list(loaded.part.units))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _rows(cd: Any, task: str, tasks: NodeTasks, loaded: Any) -> tuple[Any, dict, Any] | None:
    """``(ids, encoded blocks, labels or None)`` of the request's rows, or ``None`` without rows."""
    from hybridfl.inference.evaluation import evaluation_rows

    if task == "evaluate":
        got = evaluation_rows(cd.path)
        if got is None or not len(got[0]):
            return None
        tasks.id_name = "id"
        return got
    from hybridfl.cli.predict import read_table
    from hybridfl.data.encoding import encode_frame, frame_ids, held_blocks

    table = tasks.node_config.get(PREDICT_TABLE)
    if not table:
        return None
    frame = read_table(Path(str(table)), loaded.encoding.sep)
    where = f"the predict-table of {cd.client_id!r}"
    blocks = held_blocks(frame, loaded.encoding, where)
    tasks.id_name, ids = frame_ids(frame, loaded.encoding, where)
    if tasks.id_name == "row":
        raise PredictionError(f"{where} has no ID column {loaded.encoding.id_column!r}: rows are matched by ID.")
    return ids, encode_frame(frame, loaded.encoding, loaded.scale, blocks, where), None


def predict_step(msg: Message, cd: Any, setup: dict, warm: Any) -> Message:
    """Answer one ``predict.*`` message (module docs) as organisation ``cd.client_id``.

    Any refusal stops the node's tasks for the run (:meth:`NodeTasks.answer`).

    Raises:
        ProtocolError: a message outside a request, a bad task or receiver, too many requests,
            the request's own refusals (:meth:`~hybridfl.inference.federated.PredictOrg.handle`),
            or any task message after a refusal in the run.
        HybridFLError: a process that cannot keep a request (no warm client), or a bad table.
    """
    if warm is None:
        raise HybridFLError(
            "federated prediction over Flower needs a SuperNode that keeps the organisation in memory between "
            "messages (the inline or warm executor, the default of deploy-local)."
        )
    t: NodeTasks = warm.tasks
    return t.answer(cd.client_id, msg, lambda: _predict(msg, cd, setup, t))


def _predict(msg: Message, cd: Any, setup: dict, t: NodeTasks) -> Message:
    """:func:`predict_step` inside the run-level stop."""
    from hybridfl.experiment import MODEL_DIR
    from hybridfl.inference.federated import PredictOrg, held_part
    from hybridfl.inference.parts import load_org_part

    if msg.kind != "predict.hello":
        if t.org is None:
            raise ProtocolError(f"client {cd.client_id!r} got {msg.kind!r} outside a prediction request.")
        reply = t.org.handle(msg)
        if msg.kind == "predict.combine" and t.task == "predict":
            _write_predictions(t, cd, setup)
        return reply
    t.org, t.requests = None, t.requests + 1
    if t.requests > MAX_REQUESTS:
        raise ProtocolError(f"client {cd.client_id!r} answers at most {MAX_REQUESTS} prediction requests per run.")
    task, to = msg.payload.get("task"), msg.payload.get("to")
    names = [str(e[0]) for e in json.loads(str(setup.get("layout", "[]")))]
    if task not in ("evaluate", "predict") or not isinstance(to, str) or to not in names:
        raise ProtocolError(f"client {cd.client_id!r} got a prediction request with a bad task or receiver.")
    if cd.path is None or not (Path(cd.path) / MODEL_DIR).is_dir():
        return msg.reply(absent=True)
    loaded = load_org_part(Path(cd.path) / MODEL_DIR)
    rows = _rows(cd, task, t, loaded)
    if rows is None:
        return msg.reply(absent=True)
    ids, xs, y = rows
    receiver = to == cd.client_id
    part = held_part(loaded, list(xs), receiver)
    labels = y if receiver and task == "evaluate" else None
    metrics = loaded.head_model.metrics if labels is not None else None
    from hybridfl.privacy.roster import peer_auth_of

    auth = peer_auth_of(cd.client_id, cd.path)  # its own roster: signed keys (inference.federated)
    t.org = PredictOrg(cd.client_id, ids, xs, part, to, labels=labels, metrics_of=metrics, auth=auth)
    t.task, t.head = task, loaded
    return t.org.handle(msg)


def _write_predictions(t: NodeTasks, cd: Any, setup: dict) -> None:
    from hybridfl.files import atomic_write
    from hybridfl.inference.federated import prediction_frame

    frame = prediction_frame(t.org, t.id_name, t.head)
    out = t.node_config.get(PREDICT_OUT)
    path = Path(str(out)) if out else Path(cd.path) / "predictions" / f"{setup.get('session', 'run')}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, frame.to_csv(index=False))
    log.info("hybridfl: %d predictions of %s written to %s", int(t.org.scored.sum()), cd.client_id, path)


# ------------------------------------------------------------------------------------ server


def all_units(kind: str, layout: list, block_names: list[str]) -> list[str]:
    """Every unit of the model in global order: FedBCD's parties (layout order), else the blocks."""
    return [str(c) for c, _, _ in layout] if kind == "fedbcd" else list(block_names)


def deliver_parts(transport: Any, layout: list, model: Any, exports: bool) -> dict[str, str]:
    """Send every organisation its part (``model.part``): the part's files cut from ``model`` (a
    loaded model the server holds), or (``exports``: FedBCD) an empty message asking the node to
    write its own. Returns organisation -> ``written``, ``none`` or why it failed (logged); a
    failure never stops the run."""
    from hybridfl.inference.modeldir import MANIFEST, WEIGHTS
    from hybridfl.inference.parts import write_org_part

    msgs = []
    with tempfile.TemporaryDirectory() as tmp:
        for c, blocks, lab in layout:
            payload: dict[str, Any] = {}
            if model is not None:
                d = write_org_part(Path(tmp) / c, model, c, blocks, lab)
                payload = {"manifest": (d / MANIFEST).read_bytes(), "weights": (d / WEIGHTS).read_bytes()}
            elif not exports:
                continue
            msgs.append(Message(MODEL_PART, SERVER, c, 0, payload))
    out: dict[str, str] = {}
    try:
        replies = {r.sender: r for r in transport.send_and_receive(msgs)}
    except Exception as e:  # one sentence in the log; the run's results stand
        log.warning("hybridfl: the model parts were not delivered: %s", e)
        return {m.receiver: f"failed: {e}" for m in msgs}
    for m in msgs:
        r = replies.get(m.receiver)
        out[m.receiver] = "missing" if r is None else ("written" if r.payload.get("written") is True else "none")
        if out[m.receiver] == "missing":
            log.warning("hybridfl: organisation %s did not confirm its part of the model", m.receiver)
    return out


def evaluate(transport: Any, layout: list, units: list[str]) -> dict[str, Any]:
    """Federated evaluation over ``transport``: each label holder in turn receives the scores of
    its own test rows and replies its metrics (:func:`~hybridfl.inference.federated.run_prediction`,
    ``task: evaluate``); pooled as in process
    (:func:`~hybridfl.inference.evaluation.federated_evaluate`). A failed request is logged and
    left out; ``{}`` when no label holder has test rows."""
    from hybridfl.inference.evaluation import pool_metrics, pooled
    from hybridfl.inference.federated import run_prediction

    orgs = [str(c) for c, _, _ in layout]
    acc: tuple[float, int] = (0.0, 0)
    auc: tuple[float, int] = (0.0, 0)
    scored = unscored = 0
    for r in [str(c) for c, _, lab in layout if lab]:
        try:
            got = run_prediction(transport, orgs, r, units, task="evaluate")
        except (HybridFLError, RuntimeError, KeyError, ValueError) as e:
            log.warning("hybridfl: no federated evaluation with %s as receiver: %s", r, e)
            continue
        scored, unscored = scored + got["scored"], unscored + got["unscored"]
        acc, auc = pool_metrics(got.get("metrics"), acc, auc)
    if not scored:
        return {}
    return {"test_samples": scored, "test_unscored": unscored, **pooled(acc, auc), "evaluation": "federated"}


def predict(transport: Any, layout: list, units: list[str], to: str | None) -> dict[str, Any]:
    """Federated prediction of the organisations' new rows (node config ``predict-table``) for
    ``to`` (default: the first label holder), who alone writes the predictions.

    Raises:
        PredictionError: no receiver, or the request failed (one sentence).
    """
    from hybridfl.inference.federated import run_prediction

    orgs = [str(c) for c, _, _ in layout]
    receiver = to or next((str(c) for c, _, lab in layout if lab), None)
    if receiver is None or receiver not in orgs:
        raise PredictionError(f"the receiver {receiver!r} is not one of the organisations ({', '.join(orgs)}).")
    got = run_prediction(transport, orgs, receiver, units, task="predict")
    return {"to": receiver, **got}
