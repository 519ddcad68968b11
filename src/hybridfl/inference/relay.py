"""The server's side of a federated prediction (:mod:`hybridfl.inference.federated`, whose module
docs give the protocol): it relays the organisations' messages in order and reads only counts
and, for an evaluation, the receiver's metrics.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hybridfl.errors import PredictionError
from hybridfl.runtime.messages import SERVER, Message


def run_prediction(
    transport: Any, orgs: Sequence[str], receiver: str, all_units: Sequence[str], task: str = "predict"
) -> dict[str, Any]:
    """The server's side of a federated prediction over ``transport``: relay the messages of the
    protocol (module docs) between the organisations ``orgs`` for the ``receiver``.

    Args:
        task: ``predict`` (new rows) or ``evaluate`` (the organisations' own test rows; the
            receiver replies its metrics), sent in ``predict.hello``. An organisation that has no
            rows or no part for the task answers the hello with ``absent`` and takes no further
            part (over Flower; in process every organisation has rows).

    Returns:
        ``{"scored", "unscored"}``: the receiver's counts of rows, ``metrics`` (the receiver's
        :meth:`~hybridfl.inference.predictors.HybridFLModel.metrics`, for ``evaluate``) and
        ``organisations`` (those that took part).

    Raises:
        PredictionError: an organisation's reply is missing or malformed, or the receiver is absent.
    """

    def ask(messages: list[Message], step: str) -> dict[str, Message]:
        replies = {r.sender: r for r in transport.send_and_receive(messages)}
        for m in messages:
            if m.receiver not in replies:
                raise PredictionError(f"organisation {m.receiver!r} did not answer {step}: the prediction stops.")
        return replies

    hello, orgs = _hello_and_keys(ask, orgs, receiver, task)
    others = [o for o in orgs if o != receiver]
    req = ask([Message("predict.psi_request", SERVER, receiver, 0, {})], "predict.psi_request")[receiver]
    served = ask(
        [Message("predict.psi_serve", SERVER, k, 0, _relayed(req, ("request", "request_sig"))) for k in others],
        "predict.psi_serve",
    )
    payload: dict[str, Any] = {"all_units": list(all_units)}
    for k in others:
        payload[f"setup.{k}"] = served[k].payload.get("setup")
        payload[f"response.{k}"] = served[k].payload.get("response")
        if "response_sig" in served[k].payload:
            payload[f"response_sig.{k}"] = served[k].payload["response_sig"]
        payload[f"units.{k}"] = list(hello[k].payload.get("units", []))
    plans = ask([Message("predict.plan", SERVER, receiver, 0, payload)], "predict.plan")[receiver]
    scores = ask(
        [Message("predict.score", SERVER, k, 0, {"plan": plans.payload.get(f"plan.{k}")}) for k in others],
        "predict.score",
    )
    done = ask(
        [
            Message(
                "predict.combine", SERVER, receiver, 0, {f"masked.{k}": scores[k].payload.get("masked") for k in others}
            )
        ],
        "predict.combine",
    )[receiver]
    out: dict[str, Any] = {
        "scored": _count(done, "scored"),
        "unscored": _count(done, "unscored"),
        "organisations": list(orgs),
    }
    metrics = {k[len("metric.") :]: v for k, v in done.payload.items() if k.startswith("metric.")}
    if task == "evaluate" and metrics:
        out["metrics"] = _checked_metrics(metrics, receiver)
    return out


def _relayed(msg: Message, keys: Sequence[str]) -> dict[str, Any]:
    """The fields ``keys`` of an organisation's reply that it sent (a signature only if it signs)."""
    return {k: msg.payload[k] for k in keys if k in msg.payload}


def _count(msg: Message, key: str) -> int:
    v = msg.payload.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise PredictionError(f"organisation {msg.sender!r} replied a {key} count that is not a count.")
    return v


def _checked_metrics(metrics: dict[str, Any], receiver: str) -> dict[str, float]:
    """The receiver's metrics as the server accepts them: ``accuracy`` and ``auc`` in [0, 1],
    ``n_labelled`` a count (anything else is refused, naming the receiver)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
        if k in ("accuracy", "auc") and ok and 0.0 <= v <= 1.0:
            out[k] = float(v)
        elif k == "n_labelled" and ok and v >= 0 and float(v).is_integer():
            out[k] = int(v)
        else:
            raise PredictionError(f"organisation {receiver!r} replied a metric {k!r} that is not one.")
    if "n_labelled" not in out or "accuracy" not in out:
        raise PredictionError(f"organisation {receiver!r} replied metrics without accuracy and n_labelled.")
    return out


def _hello_and_keys(ask: Any, orgs: Sequence[str], receiver: str, task: str) -> tuple[dict[str, Message], list[str]]:
    """Steps 1-2 (module docs of :mod:`hybridfl.inference.federated`): ``predict.hello`` with a fresh
    run label to every organisation, then ``predict.keys`` (every other organisation's key and
    signature, the receiver's row count and width) to those that take part. Returns the hello
    replies and the organisations taking part.

    Raises:
        PredictionError: the receiver or every other organisation is absent.
    """
    from hybridfl.privacy.roster import RUN_BYTES

    run = os.urandom(RUN_BYTES)  # binds the organisations' signatures to this request
    hello = ask(
        [Message("predict.hello", SERVER, o, 0, {"to": receiver, "task": task, "run": run}) for o in orgs],
        "predict.hello",
    )
    orgs = [o for o in orgs if not hello[o].payload.get("absent")]
    if receiver not in orgs:
        raise PredictionError(f"the receiver {receiver!r} has no rows or no part of the model for this {task}.")
    if len(orgs) < 2:
        raise PredictionError(f"no organisation but the receiver {receiver!r} takes part in this {task}.")
    n, width = hello[receiver].payload.get("n"), hello[receiver].payload.get("width")
    keys = {f"pk.{o}": hello[o].payload.get("pk") for o in orgs}
    keys.update({f"sig.{o}": hello[o].payload["pk_sig"] for o in orgs if "pk_sig" in hello[o].payload})
    peers = {o: [p for p in orgs if p != o] for o in orgs}
    ask(
        [Message("predict.keys", SERVER, o, 0, {"peers": peers[o], "n": n, "width": width, **keys}) for o in orgs],
        "predict.keys",
    )
    return hello, orgs
