"""The round loop: one implementation, run by the simulation and by the Flower ServerApp.

:class:`RoundLoop` calls ``server.run_round(rnd, transport)`` for each round, evaluates when due,
records one metrics row per round with the bytes and messages that crossed, calls a hook after
every completed round (the simulation checkpoints there, as its
:class:`~hybridfl.runtime.checkpoint.CheckpointPolicy` decides), reports progress, and stops early
when the algorithm says so. Resuming is the same loop started at ``start`` with the history so far: the state of the
server, the clients and the transport is restored by the caller (build, setup, restore).

Each row has ``round`` (1-based), the server's round metrics, ``bytes`` and ``messages`` of that
round (evaluation exchanges excluded), cumulative ``bytes_total``, ``seconds`` (wall time of the
round without evaluation) and, on evaluated rounds, the algorithm's evaluation metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridfl.algorithms.spec import AlgorithmSpec, EvalContext, ReportContext
from hybridfl.runtime.messages import Message

ProgressFn = Callable[[int, int, dict[str, float]], None]
"""``progress(round_done, rounds_total, metrics_row)``, called after every round."""

RoundHook = Callable[[int, list[dict[str, float]], bool], None]
"""``on_round(round_done, history, finished)``, called after every round (e.g. to checkpoint)."""


def eval_every_of(config: Any) -> int:
    """The config's ``eval_every`` (0: only after the last round; default 1)."""
    return int(getattr(config, "eval_every", 1) or 0)


@dataclass
class RoundLoop:
    """Rounds of one algorithm over one transport.

    Attributes:
        spec: the algorithm's recipe (evaluate, should_stop, eval_due, report).
        config: its validated config (``rounds``, ``eval_every``).
        server: the server-side object, already set up.
        transport: a :class:`~hybridfl.runtime.transport.Transport`.
        server_data: the server's public data (its ``test`` set for evaluation).
        eval_exchange: sends evaluation messages to clients (see :class:`EvalContext`).
        monitor: the simulation's privileged evaluator, ``None`` over Flower.
        progress: called after every round.
        on_round: called after every round with ``(round, history, finished)``.
    """

    spec: AlgorithmSpec
    config: Any
    server: Any
    transport: Any
    server_data: Any
    eval_exchange: Callable[[list[Message]], list[Message]]
    monitor: Any = None
    progress: ProgressFn | None = None
    on_round: RoundHook | None = None

    @property
    def rounds(self) -> int:
        """The number of rounds the config asks for."""
        return int(self.config.rounds)

    def finished(self, history: list[dict]) -> bool:
        """Whether the run is over after ``history`` (all rounds done, or the algorithm stops)."""
        if history and int(history[-1]["round"]) >= self.rounds:
            return True
        return bool(history and self.spec.should_stop is not None and self.spec.should_stop(history, self.config))

    def _due(self, rnd: int, history: list[dict]) -> bool:
        k = eval_every_of(self.config)
        if rnd == self.rounds or (k and rnd % k == 0):
            return True
        return self.spec.eval_due is not None and bool(self.spec.eval_due(rnd, history, self.config))

    def evaluate(self, rnd: int, history: list[dict]) -> dict[str, float]:
        """The algorithm's evaluation metrics after round ``rnd`` ({} without ``evaluate``)."""
        if self.spec.evaluate is None:
            return {}
        ctx = EvalContext(self.server, rnd, self.config, self.server_data, self.eval_exchange, self.monitor, history)
        return dict(self.spec.evaluate(ctx))

    def run(self, start: int = 1, history: list[dict] | None = None) -> list[dict[str, float]]:
        """Rounds ``start..rounds`` (fewer if the algorithm stops early); return all rows.

        With ``start > 1`` (resume), ``history`` holds the rows of rounds ``1..start-1``. The last
        row is always evaluated, also when the run stops early before an evaluation was due.
        """
        history = list(history or [])
        log = self.transport.log
        if self.finished(history):
            return history
        for rnd in range(start, self.rounds + 1):
            n_before = len(log.entries)
            t0 = time.perf_counter()
            metrics = dict(self.server.run_round(rnd, self.transport))
            seconds = time.perf_counter() - t0
            new = log.entries[n_before:]
            row: dict[str, float] = {"round": rnd, **metrics}
            row["bytes"] = sum(e.nbytes for e in new)
            row["messages"] = len(new)
            row["bytes_total"] = sum(e.nbytes for e in log.entries)
            row["seconds"] = seconds
            stop = self.spec.should_stop is not None and self.spec.should_stop([*history, row], self.config)
            if self._due(rnd, history) or stop:
                row.update(self.evaluate(rnd, history))
                stop = self.spec.should_stop is not None and self.spec.should_stop([*history, row], self.config)
            history.append(row)
            done = stop or rnd == self.rounds
            if self.on_round is not None:
                self.on_round(rnd, history, done)
            if self.progress is not None:
                self.progress(rnd, self.rounds, row)
            if stop:
                break
        return history

    def summary(
        self, history: list[dict], n_clients: int, dataset: str = "", baselines: dict | None = None
    ) -> dict[str, Any]:
        """The common summary keys of every federated run, then the algorithm's own
        (``report``), with the final table rows under ``report``."""
        log = self.transport.log
        last = history[-1] if history else {}
        s: dict[str, Any] = {
            "algorithm": self.spec.name,
            "rounds": int(last.get("round", 0)),
            "rounds_planned": self.rounds,
            "stopped_early": bool(history) and int(last["round"]) < self.rounds,
            "clients": n_clients,
            "messages_total": log.messages_total,
            "bytes_total": log.bytes_total,
            "bytes_per_client": log.per_client(),
            "client_failures": len(getattr(self.transport, "failures", []) or []),
            "train_seconds": float(sum(float(r.get("seconds", 0.0)) for r in history)),
            **(baselines or {}),
        }
        if hasattr(self.config, "device"):  # the device that ran (device: auto resolved)
            from hybridfl.models.device import device_name

            s["device"] = device_name(self.config)
        if self.spec.report is not None:
            ctx = ReportContext(
                self.server,
                self.config,
                history,
                self.transport,
                self.server_data,
                self.monitor,
                n_clients,
                dataset,
                dict(baselines or {}),
            )
            own, rows = self.spec.report(ctx)
            s.update(own)
            s["report"] = rows
        return s


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite number (helper for ``should_stop`` rules)."""
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
