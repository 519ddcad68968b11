"""Results files of a run: ``results.json``, ``metrics.csv`` and plots, written atomically.

Every file goes through :func:`hybridfl.files.atomic_write`, so an interrupted run never leaves a
half-written file.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.files import atomic_write
from hybridfl.runtime.simulation import RunResult


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return v


def metrics_csv(history: list[dict[str, float]]) -> str:
    """Per-round rows as CSV; columns are the union of all rows' keys (first-seen order)."""
    cols: list[str] = []
    for row in history:
        for k in row:
            if k not in cols:
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for row in history:
        w.writerow({k: row.get(k, "") for k in cols})
    return buf.getvalue()


def write_results(out_dir: str | Path, result: RunResult, config: dict, extra: dict | None = None) -> dict[str, Path]:
    """Write ``results.json`` (summary + ``config`` + ``extra``), ``metrics.csv``, the plots and,
    when the algorithm has one, the final model ``final.npz``.

    Returns:
        name -> path of every file written.
    """
    from hybridfl.reporting.plots import plot_accuracy

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {**result.summary, **(extra or {}), "config": config}
    files = {"results": out / "results.json", "metrics": out / "metrics.csv"}
    atomic_write(files["results"], json.dumps(_jsonable(payload), indent=2))
    atomic_write(files["metrics"], metrics_csv(result.history))
    if any("server_accuracy" in r or "accuracy" in r for r in result.history):
        files["accuracy_plot"] = plot_accuracy(result, out / "accuracy.png")
    for fn in result.plots:
        fn(out)
    if getattr(result, "final", None):
        import io

        import numpy as np

        buf = io.BytesIO()
        np.savez(buf, **result.final)
        files["final"] = out / "final.npz"
        atomic_write(files["final"], buf.getvalue())
    return files
