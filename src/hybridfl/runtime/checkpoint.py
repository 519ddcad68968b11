"""Checkpoints: the state of a run after its last completed round, written atomically.

A checkpoint is one file encoded with the message codec (:mod:`hybridfl.runtime.messages`):
arrays (model weights, generator states) as raw arrays and everything else (round, metrics
history, communication log, small state) as one JSON document. It is written to a temporary file
and renamed into place, so a run killed at any moment leaves either the previous or the new
checkpoint, never a broken one. The file is readable by its owner only (a simulated run holds
every party's state).

:class:`CheckpointPolicy` decides after which rounds a checkpoint is written: at most every
``every`` rounds, at least ``seconds`` apart, and (with ``max_share``) only while writing them keeps
below that share of the run's wall time; the last round (or an early stop) and a clean stop
(SIGINT/SIGTERM, see :mod:`hybridfl.runtime.simulation`) always write one.

For tests only, :data:`TEST_STOP_ENV` (``HYBRIDFL_TEST_STOP_AFTER_ROUND=N``) makes a run end its
process right after the checkpoint of round ``N`` is written, as a kill would, but at a chosen
round instead of whenever a timer fires (:func:`stop_round_for_tests`, :func:`exit_for_tests`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.errors import HybridFLError, MessageError
from hybridfl.files import atomic_write
from hybridfl.runtime.messages import Message, decode, encode

CHECKPOINT_NAME = "checkpoint.hfl"

TEST_STOP_ENV = "HYBRIDFL_TEST_STOP_AFTER_ROUND"
"""Test-only: the environment variable read by :func:`stop_round_for_tests`. Never set it outside
tests: a run that sees it ends its process after that round's checkpoint, without results."""

TEST_STOP_EXIT_CODE = 86
"""Test-only: the exit status of a process ended by :func:`exit_for_tests`."""


def stop_round_for_tests() -> int | None:
    """Test-only: the round ``N`` of ``HYBRIDFL_TEST_STOP_AFTER_ROUND=N`` (:data:`TEST_STOP_ENV`),
    ``None`` when the variable is unset or empty (then the hook has no effect at all).

    Tests that interrupt a run set it on the subprocess: the simulation then checkpoints round
    ``N`` (whatever the :class:`CheckpointPolicy` says) and calls :func:`exit_for_tests`, so the
    interruption lands after round ``N`` deterministically instead of racing a timer.

    Raises:
        ValueError: a value that is not a positive integer.
    """
    raw = os.environ.get(TEST_STOP_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{TEST_STOP_ENV} must be a round number >= 1, not {raw!r}")
    return int(raw)


def exit_for_tests(rnd: int) -> None:
    """Test-only: end this process at once with :data:`TEST_STOP_EXIT_CODE` after the checkpoint of
    round ``rnd`` was written (``os._exit``: no cleanup, no results, as a SIGKILL would leave the
    run). Called only when :func:`stop_round_for_tests` returned ``rnd``."""
    os._exit(TEST_STOP_EXIT_CODE)


@dataclass
class CheckpointPolicy:
    """After which rounds to write a checkpoint, and what writing them cost.

    A round that is not the last is checkpointed when all of these hold: at least ``every`` rounds
    and at least ``seconds`` seconds have passed since the last checkpoint (or the start), and,
    with ``max_share``, the time spent checkpointing so far plus the last write's duration stays
    within ``max_share`` of the wall time since the start. The last round, an early stop and a
    clean stop are always checkpointed (``force``). The default writes after every round.

    Attributes:
        every: rounds between two checkpoints, at least 1.
        seconds: minimum seconds between two checkpoints (0: no minimum).
        max_share: the largest share of wall time checkpointing may take (``None``: no limit).
        writes: checkpoints written so far (by this process).
        spent: seconds spent writing them (state capture, encoding, writing, ``fsync``).
    """

    every: int = 1
    seconds: float = 0.0
    max_share: float | None = None
    writes: int = 0
    spent: float = 0.0
    _start: float = field(default_factory=time.perf_counter, repr=False)
    _last_round: int = field(default=0, repr=False)
    _last_time: float | None = field(default=None, repr=False)
    _last_cost: float = field(default=0.0, repr=False)

    def begin(self, last_round: int = 0) -> None:
        """Start the clock; ``last_round`` is the round of the checkpoint the run resumes from (0)."""
        self._start = self._last_time = time.perf_counter()
        self._last_round = int(last_round)

    def due(self, rnd: int, force: bool = False) -> bool:
        """Whether to checkpoint after round ``rnd`` (always with ``force``)."""
        if force:
            return True
        now = time.perf_counter()
        last = self._start if self._last_time is None else self._last_time
        if rnd - self._last_round < max(1, int(self.every)) or now - last < float(self.seconds):
            return False
        if self.max_share is not None and self.writes:
            return self.spent + self._last_cost <= float(self.max_share) * (now - self._start)
        return True

    def record(self, rnd: int, seconds: float) -> None:
        """Note that the checkpoint of round ``rnd`` took ``seconds``."""
        self.writes += 1
        self.spent += float(seconds)
        self._last_cost = float(seconds)
        self._last_round = int(rnd)
        self._last_time = time.perf_counter()

    def summary(self, wall_seconds: float) -> dict[str, float]:
        """``checkpoint_writes``, ``checkpoint_seconds`` and ``checkpoint_share`` (of ``wall_seconds``)."""
        share = self.spent / wall_seconds if wall_seconds > 0 else 0.0
        return {"checkpoint_writes": self.writes, "checkpoint_seconds": self.spent, "checkpoint_share": share}


STATIC_MARK = "static:"
"""A value whose name contains this (e.g. ``client.c1.static:gram.0.0``) is setup state that no
round changes (HyFDCA's batch Gram matrices): :func:`save_checkpoint` writes such values to a side
file ``<checkpoint>.static-<token>`` once and again only when one of them is replaced by another
object, and the checkpoint names that file; :func:`load_checkpoint` merges it back."""

_STATIC_WRITTEN: dict[str, tuple[str, dict[str, Any]]] = {}  # checkpoint path -> (side file, value refs)


def _ref(v: Any) -> Any:
    """A weak reference to ``v`` where it allows one (arrays), else ``v`` itself."""
    try:
        return weakref.ref(v)
    except TypeError:
        return v


def _same(ref: Any, v: Any) -> bool:
    """Whether ``ref`` (from :func:`_ref`) still refers to the object ``v``."""
    return (ref() if isinstance(ref, weakref.ref) else ref) is v


def _codec_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``a:<name>`` -> codec value (lists and tuples as arrays)."""
    return {f"a:{k}": (np.asarray(v) if isinstance(v, (list, tuple)) else v) for k, v in values.items()}


def save_checkpoint(path: str | Path, rnd: int, values: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """Write the state after round ``rnd`` atomically to ``path``.

    Values named with :data:`STATIC_MARK` go to a side file, written only when one of them is a
    different object than at the last write to ``path`` by this process (so a run writes its
    static setup state once); the side file is written before the checkpoint that names it, and
    older side files are removed after, so a run killed at any moment leaves a readable pair.

    Args:
        values: name -> codec value (arrays, bytes, str, numbers): the server's arrays and every
            client's ``get_state()``.
        meta: JSON-able run state (history, transport log, the server's JSON state).
    """
    p = Path(path)
    static = {k: v for k, v in values.items() if STATIC_MARK in k}
    payload = _codec_values({k: v for k, v in values.items() if STATIC_MARK not in k})
    side = None
    if static:
        key = str(p.resolve())
        prev = _STATIC_WRITTEN.get(key)
        if (
            prev is None
            or prev[1].keys() != static.keys()
            or not all(_same(prev[1][k], v) for k, v in static.items())
            or not (p.parent / prev[0]).is_file()
        ):
            name = f"{p.name}.static-{secrets.token_hex(8)}"
            blob = encode(Message("checkpoint.static", "run", "run", rnd, _codec_values(static)))
            atomic_write(p.parent / name, blob, mode=0o600)
            _STATIC_WRITTEN[key] = (name, {k: _ref(v) for k, v in static.items()})
        side = _STATIC_WRITTEN[key][0]
        payload["static"] = side
    payload["meta"] = json.dumps(meta).encode()  # in the body: a long run's history outgrows a header's item limit
    atomic_write(p, encode(Message("checkpoint", "run", "run", rnd, payload)), mode=0o600)
    for old in p.parent.glob(f"{p.name}.static-*"):
        if old.name != side and not old.name.endswith(".tmp"):
            old.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Read a checkpoint: ``(round, values, meta)``.

    Raises:
        HybridFLError: missing or unreadable file.
    """
    p = Path(path)
    if not p.is_file():
        raise HybridFLError(f"no checkpoint {str(p)!r} to resume from.")
    try:
        msg = decode(p.read_bytes())
        meta = json.loads(msg.payload["meta"])
        if not isinstance(meta, dict):
            raise TypeError("meta")
        items = dict(msg.payload)
        side = items.get("static")
        if side is not None:
            if not isinstance(side, str) or not re.fullmatch(re.escape(p.name) + r"\.static-[0-9a-f]{16}", side):
                raise TypeError("static")
            extra = decode((p.parent / side).read_bytes()).payload
            items.update({k: v for k, v in extra.items() if k.startswith("a:")})
    except (MessageError, KeyError, TypeError, ValueError, RecursionError, OSError):
        raise HybridFLError(f"checkpoint {str(p)!r} (or its static side file) is unreadable.") from None
    values = {k[2:]: v for k, v in items.items() if k.startswith("a:")}
    return msg.round, values, meta


def open_for_resume(
    path: str | Path | None, algorithm: str, members: Iterable[str]
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """``(last completed round, values, meta)`` of the checkpoint at ``path``, checked to be from a
    run of ``algorithm`` with exactly these ``members`` (client names).

    Raises:
        HybridFLError: no path, a missing or unreadable file, or a checkpoint of another algorithm
            or federation.
    """
    if path is None:
        raise HybridFLError("resuming needs a checkpoint file.")
    done, values, meta = load_checkpoint(path)
    held = meta.get("clients")
    if meta.get("algorithm") != algorithm or held is None or set(held) != set(members):
        raise HybridFLError(f"checkpoint {str(path)!r} is not from a {algorithm} run with these clients.")
    return done, values, meta


def federation_state(server: Any, clients: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values of a checkpoint for a server and its clients (``server.*`` from the server's
    ``get_state()`` arrays, ``client.<name>.*`` from each client's ``get_state()``) and the
    server's JSON state."""
    s_arrays, s_meta = server.get_state()
    values: dict[str, Any] = {f"server.{k}": v for k, v in s_arrays.items()}
    for name, c in clients.items():
        values.update({f"client.{name}.{k}": v for k, v in c.get_state().items()})
    return values, s_meta


def restore_federation(values: Mapping[str, Any], server_meta: dict, server: Any, clients: Mapping[str, Any]) -> None:
    """Put back what :func:`federation_state` saved into a server (after its ``setup``) and its
    clients (``set_state``)."""
    server.set_state({k[7:]: v for k, v in values.items() if k.startswith("server.")}, server_meta)
    for name, c in clients.items():
        pre = f"client.{name}."
        c.set_state({k[len(pre) :]: v for k, v in values.items() if k.startswith(pre)})
