"""Checkpoints: the state of a run after its last completed round, written atomically.

A checkpoint is one file encoded with the message codec (:mod:`hybridfl.runtime.messages`):
arrays (model weights, generator states) as raw arrays and everything else (round, metrics
history, communication log, small state) as one JSON document. It is written to a temporary file
and renamed into place, so a run killed at any moment leaves either the previous or the new
checkpoint, never a broken one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.errors import HybridFLError
from hybridfl.runtime.messages import (
    Message,
    decode,
    encode,
    pack_arrays,
    unpack_arrays,
)

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



def open_for_resume(path: str | Path | None, algorithm: str, members: Iterable[str], what: str = "clients") -> tuple[int, dict[str, np.ndarray], dict[str, Any]]:
    """``(last completed round, arrays, meta)`` of the checkpoint at ``path``, checked to be from a
    run of ``algorithm`` with exactly these ``members`` (client or party names).

    Raises:
        HybridFLError: no path, a missing or unreadable file, or a checkpoint of another algorithm
            or federation."""
    if path is None:
        raise HybridFLError("resuming needs a checkpoint file.")
    done, arrays, meta = load_checkpoint(path)
    server = meta.get("server") if isinstance(meta.get("server"), dict) else {}
    held = meta.get("clients", server.get("clients", server.get("parties")))  # older files keep the list in the server's state
    if meta.get("algorithm") != algorithm or held is None or set(held) != set(members):
        raise HybridFLError(f"checkpoint {str(path)!r} is not from a {algorithm} run with these {what}.")
    return done, arrays, meta


def federation_state(server: Any, members: Mapping[str, Any], prefix: str = "client",
                     member_state: Callable[[str, Any], dict[str, np.ndarray]] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays of a checkpoint for a server and its clients (``server.*`` and
    ``<prefix>.<name>.*``, from their ``get_state()``, or ``member_state(name, member)``) and the
    server's JSON state."""
    s_arrays, s_meta = server.get_state()
    arrays = pack_arrays("server.", s_arrays)
    for name, m in members.items():
        arrays.update(pack_arrays(f"{prefix}.{name}.", member_state(name, m) if member_state else m.get_state()))
    return arrays, s_meta


def restore_federation(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], server: Any, members: Mapping[str, Any], transport: Any,
                       prefix: str = "client", set_member: Callable[[Any, dict[str, np.ndarray]], None] | None = None) -> None:
    """Put back what :func:`federation_state` saved (``meta["server"]``, ``meta["transport"]``):
    the server's and every member's state (``set_state``, or ``set_member(member, state)``) and
    the transport's log and failure draws."""
    server.set_state(unpack_arrays("server.", dict(arrays)), meta["server"])
    for name, m in members.items():
        st = unpack_arrays(f"{prefix}.{name}.", dict(arrays))
        set_member(m, st) if set_member else m.set_state(st)
    transport.set_state(meta["transport"])
