"""Checkpoints: the state of a run after its last completed round, written atomically.

A checkpoint is one file encoded with the message codec (:mod:`hybridfl.runtime.messages`):
arrays (model weights, generator states) as raw arrays and everything else (round, metrics
history, communication log, small state) as one JSON document. It is written to a temporary file
and renamed into place, so a run killed at any moment leaves either the previous or the new
checkpoint, never a broken one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.errors import HybridFLError
from hybridfl.runtime.messages import Message, decode, encode

CHECKPOINT_NAME = "checkpoint.hfl"


def save_checkpoint(path: str | Path, rnd: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write the state after round ``rnd`` atomically to ``path``."""
    from hybridfl.reporting.results import atomic_write

    payload: dict[str, Any] = {f"a:{k}": np.asarray(v) for k, v in arrays.items()}
    payload["meta"] = json.dumps(meta)
    atomic_write(Path(path), encode(Message("checkpoint", "run", "run", rnd, payload)))


def load_checkpoint(path: str | Path) -> tuple[int, dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint: ``(round, arrays, meta)``.

    Raises:
        HybridFLError: missing or unreadable file.
    """
    p = Path(path)
    if not p.is_file():
        raise HybridFLError(f"no checkpoint {str(p)!r} to resume from.")
    try:
        msg = decode(p.read_bytes())
        meta = json.loads(msg.payload["meta"])
    except Exception:
        raise HybridFLError(f"checkpoint {str(p)!r} is unreadable.") from None
    arrays = {k[2:]: v for k, v in msg.payload.items() if k.startswith("a:")}
    return msg.round, arrays, meta

