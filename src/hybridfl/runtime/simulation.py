"""The in-process simulation: an algorithm's spec run over an :class:`InProcessTransport`.

:func:`build_federation` makes, from a dataset split and a partition, exactly what a deployment
has: one :class:`~hybridfl.data.export.ClientData` per client (its samples and blocks; labels only
if it holds them; shared secrets), the server's :class:`~hybridfl.data.export.ServerData` (public
schema, client layout, test set), and from those the server and the clients through the
algorithm's :class:`~hybridfl.algorithms.spec.AlgorithmSpec`. :func:`simulate` sets them up and
runs the :class:`~hybridfl.runtime.loop.RoundLoop` that the Flower ServerApp runs too, with
checkpoints and resume, then the algorithm's report and baselines.

Evaluation exchanges (FedBCD's joint prediction) go through a second in-process transport without
simulated failures, so they never count as round traffic nor change a round's failure draws.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.algorithms.spec import AlgorithmSpec, get_algorithm
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.privacy import psi
from hybridfl.runtime.checkpoint import (
    CheckpointPolicy,
    exit_for_tests,
    federation_state,
    open_for_resume,
    restore_federation,
    save_checkpoint,
    stop_round_for_tests,
)
from hybridfl.runtime.loop import ProgressFn, RoundLoop
from hybridfl.runtime.memory import keep_freed_memory
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


@dataclass
class RunResult:
    """What a run produced.

    Attributes:
        summary: the headline numbers (become ``results.json`` with the config added).
        history: one metrics row per round (become ``metrics.csv``).
        comm: the communication log (``None`` for centralised runs).
        plots: extra plot writers ``fn(out_dir)`` an algorithm adds to the standard ones.
        final: the final model as arrays (the spec's ``final_arrays``, e.g. HyFDCA's ``w``), or
            ``None`` for algorithms without them; written to ``final.npz``.
        model: the model the run leaves (the spec's ``export_model``, a
            :class:`~hybridfl.inference.modeldir.ModelParts`), or ``None``; written to ``model/``.
    """

    summary: dict[str, Any]
    history: list[dict[str, float]]
    comm: CommLog | None = None
    plots: list[Callable[[Path], None]] = field(default_factory=list)
    final: dict[str, np.ndarray] | None = None
    model: Any = None


def _unlabelled(ds: HybridDataset) -> HybridDataset:
    return ds.view(y=np.zeros(ds.n_samples, dtype=np.int64))


def client_data(
    split: DatasetSplit, partition: Partition, secrets: dict[str, bytes] | None = None, with_test: bool = False
) -> list[ClientData]:
    """One :class:`ClientData` per partition entry, in memory: what ``hybridfl export-clients``
    would write into its directory (its samples restricted to its blocks; labels all zero unless
    it holds them; ``secrets``; with ``with_test`` its blocks of the test set).

    Every client's data is a :meth:`~hybridfl.data.dataset.HybridDataset.view` of the split: the
    clients index the one copy of the features (a block's rows are gathered only if a client
    reads it whole; :meth:`~hybridfl.data.dataset.HybridDataset.row_source` avoids even that)."""
    train = split.train
    schema = dict(train.block_shapes)
    out = []
    for i, c in enumerate(partition.clients):
        data = train.view(c.sample_ids, c.blocks)
        test = split.test.view(None, c.blocks) if with_test else None
        if not c.has_labels:
            data = _unlabelled(data)
            test = _unlabelled(test) if test is not None else None
        out.append(
            ClientData(
                c.client_id,
                i,
                data,
                bool(c.has_labels),
                schema,
                list(train.classes),
                {},
                None,
                dict(secrets or {}),
                test,
            )
        )
    return out


def server_data(split: DatasetSplit, partition: Partition) -> ServerData:
    """The server's public data, in memory: what an export's ``server/`` holds (schema, client
    names and layout, test set)."""
    meta = {
        "client_blocks": {c.client_id: list(c.blocks) for c in partition.clients},
        "client_labels": {c.client_id: bool(c.has_labels) for c in partition.clients},
        "dataset": split.name,
    }
    return ServerData(
        dict(split.train.block_shapes),
        list(split.train.classes),
        [c.client_id for c in partition.clients],
        split.test,
        meta,
    )


@dataclass
class Federation:
    """A simulated federation: the server, the clients and the transport between them, built by
    the algorithm's spec from the same data objects a deployment reads from disk.

    Attributes:
        spec: the algorithm's recipe.
        config: its validated config.
        seed: the run seed.
        server: the server-side object.
        clients: client ID -> client-side object.
        transport: the in-process transport (with ``failure_rate`` and ``fail_at`` failures).
        server_data: the server's public data.
        client_data: each client's data, partition order.
        secrets: the clients' shared secrets (``{}`` without encryption).
        split: the dataset split (for the monitor and the baselines only; ``None`` for a
            federation of client directories).
        partition: the partition (``None`` likewise).
    """

    spec: AlgorithmSpec
    config: Any
    seed: int
    server: Any
    clients: dict[str, Any]
    transport: InProcessTransport
    server_data: ServerData
    client_data: list[ClientData]
    secrets: dict[str, bytes]
    split: DatasetSplit | None
    partition: Partition | None
    monitor: Any = None

    def setup(self) -> None:
        """The server's one-off setup exchanges (every client's PSI steps in one pool of worker
        processes: :func:`hybridfl.privacy.psi.one_pool`)."""
        with psi.one_pool():
            self.server.setup(self.transport, self.transport.client_ids)

    def loop(
        self, progress: ProgressFn | None = None, on_round: Callable | None = None, monitor: bool = True
    ) -> RoundLoop:
        """The :class:`RoundLoop` of this federation (evaluation through a failure-free transport)."""
        if monitor and self.monitor is None and self.spec.monitor is not None and self.split is not None:
            self.monitor = self.spec.monitor(
                self.split, self.partition, self.config, self.seed, self.clients, self.secrets
            )
        ev = InProcessTransport(self.clients, self.transport.recorder)
        return RoundLoop(
            self.spec,
            self.config,
            self.server,
            self.transport,
            self.server_data,
            ev.send_and_receive,
            self.monitor if monitor else None,
            progress,
            on_round,
        )

    def run(self, progress: ProgressFn | None = None, monitor: bool = True) -> list[dict[str, float]]:
        """Set up and run all rounds (no checkpoints); return the metrics rows."""
        self.setup()
        return self.loop(progress, monitor=monitor).run()


def build_federation(
    spec: AlgorithmSpec | str,
    split: DatasetSplit,
    partition: Partition,
    config: Any,
    seed: int = 0,
    recorder: Callable[[bytes], None] | None = None,
    secrets: dict[str, bytes] | None = None,
    fail_at: Any = (),
) -> Federation:
    """Check the inputs, make every client's data and build server, clients and transport.

    Args:
        spec: the algorithm (or its name).
        recorder: receives the raw bytes of every message (audits).
        secrets: the clients' shared secrets; default: the spec deals new ones (HyFDCA's key pair).
        fail_at: explicit ``(round, client)`` failures (replies lost) besides ``failure_rate``.

    Raises:
        HybridFLError: any input problem (the algorithm's ``check``), before anything is built.
    """
    spec = get_algorithm(spec) if isinstance(spec, str) else spec
    if not spec.federated:
        raise TypeError(f"algorithm {spec.name!r} is not federated")
    if spec.check is not None:
        spec.check(split, partition, config)
    if secrets is None:
        secrets = (spec.deal_secrets(config) if spec.deal_secrets is not None else None) or {}
    cds = client_data(split, partition, secrets, with_test=spec.clients_hold_test)
    fed = assemble_federation(spec, server_data(split, partition), cds, config, seed, recorder, fail_at)
    fed.secrets, fed.split, fed.partition = dict(secrets), split, partition
    return fed


def assemble_federation(
    spec: AlgorithmSpec,
    server_data: ServerData,
    client_data: Sequence[ClientData],
    config: Any,
    seed: int = 0,
    recorder: Callable[[bytes], None] | None = None,
    fail_at: Any = (),
) -> Federation:
    """Server, clients and in-process transport from the data objects a deployment reads from
    disk (the one place the simulation builds a federation; :func:`build_federation` makes the
    data from a split and a partition, ``hybridfl run --federation`` reads prepared client
    directories). The federation has no ``split`` or ``partition``, so no monitor and no
    baselines, unless the caller sets them.

    Args:
        client_data: every client's data, in the server's ``client_ids`` order (``layout``).
    """
    layout = server_data.layout
    clients = {cd.client_id: spec.build_client(cd, config, seed, layout) for cd in client_data}
    hello = {
        cd.client_id: (spec.hello_payload(cd, config) if spec.hello_payload is not None else {}) for cd in client_data
    }
    server = spec.build_server(server_data, config, seed, hello)
    transport = InProcessTransport(clients, recorder, float(getattr(config, "failure_rate", 0.0)), seed, fail_at)
    return Federation(spec, config, seed, server, clients, transport, server_data, list(client_data), {}, None, None)


def simulate(
    spec: AlgorithmSpec | str,
    split: DatasetSplit,
    partition: Partition,
    config: Any,
    seed: int = 0,
    progress: ProgressFn | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    secrets: dict[str, bytes] | None = None,
    fail_at: Any = (),
    checkpoint_policy: CheckpointPolicy | None = None,
) -> RunResult:
    """Run an algorithm in process: build, set up, the round loop, the report, the baselines.

    Args:
        checkpoint: file to write the whole federation's state to (atomically, mode 0600: it holds
            every party's state and shared secrets), after the rounds ``checkpoint_policy`` picks
            and always after the last one. While the loop runs, SIGINT or SIGTERM (in the main
            thread) stops the run cleanly after the current round, with a checkpoint, by raising
            :class:`KeyboardInterrupt`; a second SIGINT interrupts at once. (Tests only: the
            environment variable ``HYBRIDFL_TEST_STOP_AFTER_ROUND`` ends the process after a
            chosen round's checkpoint, see :func:`~hybridfl.runtime.checkpoint.stop_round_for_tests`.)
        resume: continue from ``checkpoint`` after its last completed round (build, setup, restore:
            the same order for every algorithm); the result equals an uninterrupted run's.
        checkpoint_policy: when to checkpoint (default: after every round). Its cost goes into the
            summary as ``checkpoint_writes``, ``checkpoint_seconds`` and ``checkpoint_share`` (of
            ``wall_seconds``) when ``checkpoint`` is given.

    Raises:
        HybridFLError: an input problem, or ``resume`` without a checkpoint of this federation.
    """
    spec = get_algorithm(spec) if isinstance(spec, str) else spec
    t_start = time.perf_counter()
    if spec.run is not None:
        return spec.run(split, partition, config, seed, progress)
    start, history0, values, meta = 1, [], {}, {}
    if resume:
        done, values, meta = open_for_resume(checkpoint, spec.name, [c.client_id for c in partition.clients])
        secrets = {k.removeprefix("secrets."): bytes(v) for k, v in values.items() if k.startswith("secrets.")}
        start, history0 = done + 1, meta["history"]
    fed = build_federation(spec, split, partition, config, seed, recorder, secrets, fail_at)
    base = (lambda: spec.baselines(split, partition, config, seed)) if spec.baselines is not None else None
    return _run(
        fed, split.name, t_start, progress, checkpoint, resume, values, meta, start, history0, base, checkpoint_policy
    )


def simulate_directories(
    server_data: ServerData,
    client_data: Sequence[ClientData],
    config: Any,
    seed: int = 0,
    progress: ProgressFn | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_policy: CheckpointPolicy | None = None,
) -> RunResult:
    """Run an algorithm in process on a federation of client directories (``hybridfl run
    --federation``): the server gets only ``server_data`` (the schema and the clients' public
    layout, no test set) and every client only its own directory's data and secrets, as over
    Flower. No monitor (nobody holds all the data) and no baselines; otherwise as :func:`simulate`
    (checkpoints, resume, SIGINT).

    Raises:
        HybridFLError: ``resume`` without a checkpoint of this federation.
        TypeError: an algorithm that is not federated.
    """
    spec = get_algorithm(config.name)
    t_start = time.perf_counter()
    if not spec.federated:
        raise TypeError(f"algorithm {spec.name!r} is not federated")
    start, history0, values, meta = 1, [], {}, {}
    if resume:
        done, values, meta = open_for_resume(checkpoint, spec.name, list(server_data.client_ids))
        start, history0 = done + 1, meta["history"]
    fed = assemble_federation(spec, server_data, client_data, config, seed, recorder)
    name = str(server_data.meta.get("dataset", "federation"))
    return _run(
        fed, name, t_start, progress, checkpoint, resume, values, meta, start, history0, None, checkpoint_policy
    )


def _run(
    fed: Federation,
    name: str,
    t_start: float,
    progress: ProgressFn | None,
    checkpoint: str | Path | None,
    resume: bool,
    values: dict,
    meta: dict,
    start: int,
    history0: list,
    baselines: Callable[[], dict] | None,
    checkpoint_policy: CheckpointPolicy | None,
) -> RunResult:
    """Set up ``fed``, restore it on ``resume``, run the round loop with checkpoints, then the
    baselines, summary and plots (the shared second half of :func:`simulate` and
    :func:`simulate_directories`)."""
    spec, config = fed.spec, fed.config
    keep_freed_memory()
    fed.setup()
    if resume:
        restore_federation(values, meta["server"], fed.server, fed.clients)
        fed.transport.set_state(meta["transport"])
        _set_global_rng(values)

    policy = checkpoint_policy if checkpoint_policy is not None else CheckpointPolicy()
    policy.begin(start - 1)
    stop = _StopRequest()
    halt_at = stop_round_for_tests()  # test-only (HYBRIDFL_TEST_STOP_AFTER_ROUND); None in real runs

    def on_round(rnd: int, history: list[dict], finished: bool) -> None:
        halt = rnd == halt_at
        if checkpoint is None or not policy.due(rnd, finished or stop.requested or halt):
            return
        t0 = time.perf_counter()
        vals, s_meta = federation_state(fed.server, fed.clients)
        vals.update({f"secrets.{k}": v for k, v in fed.secrets.items()})
        vals.update(_global_rng())
        save_checkpoint(
            checkpoint,
            rnd,
            vals,
            {
                "algorithm": spec.name,
                "clients": list(fed.clients),
                "server": s_meta,
                "transport": fed.transport.get_state(),
                "history": history,
            },
        )
        policy.record(rnd, time.perf_counter() - t0)
        if halt:
            exit_for_tests(rnd)
        if stop.requested and not finished:
            raise KeyboardInterrupt(f"stopped after round {rnd}, checkpoint written")

    loop = fed.loop(progress, on_round)
    with stop.catching(checkpoint is not None):
        history = loop.run(start, history0)
    base = baselines() if baselines is not None else {}
    summary = loop.summary(history, len(fed.clients), name, base)
    summary["dataset"] = name
    summary["wall_seconds"] = time.perf_counter() - t_start
    if checkpoint is not None:
        summary.update(policy.summary(summary["wall_seconds"]))
    title = f"{spec.name} on {name}"
    plots = spec.plots(history, config, title) if spec.plots is not None else []
    final = spec.final_arrays(fed.server) if spec.final_arrays is not None else None
    model = spec.export_model(fed.server, fed.clients, config) if spec.export_model is not None else None
    return RunResult(summary, history, fed.transport.log, plots, final, model)


class _StopRequest:
    """A clean stop asked for by SIGINT/SIGTERM: the round in progress ends, is checkpointed, and
    the run raises :class:`KeyboardInterrupt`. A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    @contextlib.contextmanager
    def catching(self, active: bool = True) -> Iterator[None]:
        """Route SIGINT and SIGTERM to this request inside the block (main thread only)."""
        if not active or threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in before:
            signal.signal(s, self._handle)
        try:
            yield
        finally:
            for s, h in before.items():
                signal.signal(s, h)


def _global_rng() -> dict[str, np.ndarray]:
    """torch's global random state (algorithms that build models draw from it), for checkpoints."""
    import torch

    return {"rng.torch": torch.get_rng_state().numpy().copy()}


def _set_global_rng(values: dict[str, Any]) -> None:
    import torch

    if "rng.torch" in values:
        torch.set_rng_state(torch.from_numpy(np.ascontiguousarray(values["rng.torch"], dtype=np.uint8)))
