"""The in-process simulation: rounds of server-side steps over an :class:`InProcessTransport`.

:func:`simulate` is algorithm-agnostic: it calls ``server.setup(transport, client_ids)`` once, then
``server.run_round(rnd, transport)`` for each round, evaluates every ``eval_every`` rounds (and
after the last), records per-round metrics with the bytes and messages that crossed, and reports
progress. Evaluation runs outside the protocol (it reads the test set directly, like Flower's
server-side ``evaluate_fn``) and is not counted as communication.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hybridfl.runtime.transport import CommLog, InProcessTransport


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """One compute thread for torch and for NumPy's BLAS inside the block.

    The simulated clients' models and the matching's matrices are small: extra threads only
    contend (measured: the PFNM cost took 17 ms per call with 2 BLAS threads under load, 0.5 ms
    alone). Also makes runs reproducible across machines with different core counts. The first
    ``torch.optim.SGD`` of a process imports ``torch._dynamo`` (1-4 s): done here, before any
    timing, so that no round or baseline is charged for it.
    """
    import torch
    from threadpoolctl import threadpool_limits

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # first use imports torch._dynamo

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)


class RoundServer(Protocol):
    def setup(self, transport: Any, client_ids: list[str]) -> None: ...

    def run_round(self, rnd: int, transport: Any) -> dict[str, float]: ...


ProgressFn = Callable[[int, int, dict[str, float]], None]
"""``progress(round_done, rounds_total, metrics)``, called after every round."""


@dataclass
class RunResult:
    """What a run produced.

    Attributes:
        summary: the headline numbers (become ``results.json`` with the config added).
        history: one metrics row per round (become ``metrics.csv``).
        comm: the communication log (``None`` for centralised runs).
        plots: extra plot writers ``fn(out_dir)`` an algorithm adds to the standard ones.
    """

    summary: dict[str, Any]
    history: list[dict[str, float]]
    comm: CommLog | None = None
    plots: list[Callable[[Path], None]] = field(default_factory=list)


def simulate(
    server: RoundServer,
    transport: InProcessTransport,
    rounds: int,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    eval_every: int = 1,
    progress: ProgressFn | None = None,
    start_round: int = 1,
    history: list[dict[str, float]] | None = None,
    after_round: Callable[[int, list[dict[str, float]]], None] | None = None,
) -> list[dict[str, float]]:
    """Run rounds ``start_round..rounds``; return the per-round metrics rows.

    Each row has ``round`` (1-based), the server's round metrics, ``bytes`` and ``messages`` of
    that round, cumulative ``bytes_total``, ``seconds`` (wall time of the round without
    evaluation) and, on evaluated rounds, what ``evaluate(round)`` returned.

    Resuming (``start_round > 1``): the server, clients and transport must already hold the state
    after round ``start_round - 1`` and ``history`` its rows; the one-off ``setup`` is skipped.
    ``after_round(rnd, history)`` is called after every completed round (e.g. to checkpoint).
    """
    history = list(history or [])
    if start_round <= 1:
        server.setup(transport, transport.client_ids)
    for rnd in range(start_round, rounds + 1):
        n_before = len(transport.log.entries)
        t0 = time.perf_counter()
        metrics = dict(server.run_round(rnd, transport))
        seconds = time.perf_counter() - t0
        new = transport.log.entries[n_before:]
        row: dict[str, float] = {"round": rnd, **metrics}
        row["bytes"] = sum(e.nbytes for e in new)
        row["messages"] = len(new)
        row["bytes_total"] = transport.log.bytes_total
        row["seconds"] = seconds
        if evaluate is not None and ((eval_every and rnd % eval_every == 0) or rnd == rounds):
            row.update(evaluate(rnd))
        history.append(row)
        if after_round is not None:
            after_round(rnd, history)
        if progress is not None:
            progress(rnd, rounds, row)
    return history
