"""Federated evaluation: the trained model scored on the organisations' own test rows (``client
prepare --test-table``) by federated prediction (:mod:`hybridfl.inference.federated`), each label
holder computing the metrics of its rows; labels and scores never leave it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hybridfl.errors import PredictionError
from hybridfl.inference.federated import PredictOrg, run_prediction
from hybridfl.inference.parts import model_units, org_part


def evaluation_rows(client_dir: str | Any) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None] | None:
    """An organisation's own test rows (``client prepare --test-table``, ``evaluation/``):
    ``(ids, blocks (encoded and standardised as its training rows), labels or None)``, or
    ``None`` when it kept none. A label holder's rows without a label are left out."""
    import json
    from pathlib import Path

    from hybridfl.data.export import _read_dataset_dir
    from hybridfl.data.prepare import EVAL_DIR

    d = Path(client_dir) / EVAL_DIR
    if not (d / "blocks.json").is_file():
        return None
    meta = json.loads((Path(client_dir) / "client.json").read_text())
    has = bool(meta.get("has_labels"))
    ds, _ = _read_dataset_dir(d, str(meta.get("dataset", "")), [str(c) for c in meta["classes"]], has)
    return ds.ids, {b: np.asarray(ds.blocks[b]) for b in ds.block_names}, (ds.y if has else None)


def pool_metrics(
    m: Mapping[str, float] | None, acc: tuple[float, int], auc: tuple[float, int]
) -> tuple[tuple[float, int], tuple[float, int]]:
    """Add one receiver's metrics ``m`` (``accuracy``, ``auc``, ``n_labelled``) to the running
    ``(sum, count)`` of accuracy and AUC, weighted by its labelled rows."""
    if not m:
        return acc, auc
    k = int(m["n_labelled"])
    acc = (acc[0] + m["accuracy"] * k, acc[1] + k)
    if "auc" in m:
        auc = (auc[0] + m["auc"] * k, auc[1] + k)
    return acc, auc


def pooled(acc: tuple[float, int], auc: tuple[float, int]) -> dict[str, float]:
    """``accuracy`` and ``auc`` from the running sums of :func:`pool_metrics` (where defined)."""
    out = {}
    if acc[1]:
        out["accuracy"] = acc[0] / acc[1]
    if auc[1]:
        out["auc"] = auc[0] / auc[1]
    return out


def federated_evaluate(
    model: Any,
    rows: Mapping[str, tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]],
    auths: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Federated evaluation: every organisation holding labelled test rows is in turn the receiver
    of a federated prediction of its rows (the others contribute their blocks of those samples,
    found by PSI) and computes the metrics itself; labels and scores never leave it. Returns the
    pooled ``accuracy`` (weighted by rows), the weighted mean ``auc`` (where defined),
    ``test_samples`` (rows scored), ``test_unscored`` (rows no organisation could complete),
    ``evaluation_messages`` and ``evaluation_bytes``.

    Args:
        model: the loaded model.
        rows: organisation -> its :func:`evaluation_rows` (already encoded and standardised).
        auths: organisation -> its :class:`~hybridfl.privacy.roster.PeerAuth` or ``None`` (signed
            keys: :mod:`hybridfl.inference.federated`).

    Raises:
        PredictionError: no organisation holds labelled test rows, or an exchange failed.
    """
    from hybridfl.runtime.transport import InProcessTransport

    receivers = [n for n, (_, _, y) in rows.items() if y is not None and len(y)]
    if not receivers:
        raise PredictionError("no organisation holds labelled test rows (client prepare --test-table).")
    all_units = list(model_units(model))
    scored_total = unscored_total = messages = nbytes = 0
    acc: tuple[float, int] = (0.0, 0)
    auc: tuple[float, int] = (0.0, 0)
    for r in receivers:
        orgs = {
            n: PredictOrg(
                n,
                ids,
                xs,
                org_part(model, list(xs), n == r),
                r,
                labels=y if n == r else None,
                metrics_of=model.metrics if n == r else None,
                auth=(auths or {}).get(n),
            )
            for n, (ids, xs, y) in rows.items()
            if len(ids)
        }
        transport = InProcessTransport(orgs)  # type: ignore[arg-type]
        got = run_prediction(transport, list(orgs), r, all_units, task="evaluate")
        messages += transport.log.messages_total
        nbytes += transport.log.bytes_total
        scored_total += got["scored"]
        unscored_total += got["unscored"]
        acc, auc = pool_metrics(got.get("metrics"), acc, auc)
    out: dict[str, Any] = {
        "test_samples": scored_total,
        "test_unscored": unscored_total,
        "evaluation_messages": messages,
        "evaluation_bytes": nbytes,
    }
    out.update(pooled(acc, auc))
    return out
