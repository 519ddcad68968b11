"""One recipe per algorithm: :class:`AlgorithmSpec`, the only way an algorithm is built.

An algorithm is written once, as client-side steps (an object with ``handle(msg) -> msg``) and
server-side steps (``setup`` and ``run_round`` over a
:class:`~hybridfl.runtime.transport.Transport`). Its :class:`AlgorithmSpec` says how to build those
objects from what each side has, and how to evaluate, report and stop. Both runtimes consume the
spec and nothing else:

- the simulation (:func:`hybridfl.runtime.simulation.simulate`) makes one
  :class:`~hybridfl.data.export.ClientData` per partition entry in memory and one
  :class:`~hybridfl.data.export.ServerData`, and runs everything in this process;
- Flower (:mod:`hybridfl.runtime.flower.node`) reads a ``ClientData`` from each SuperNode's own
  directory and the ``ServerData`` from the server's, and runs the same objects across processes.

Both drive the rounds with the same :class:`~hybridfl.runtime.loop.RoundLoop`.

Contracts (duck-typed; see :class:`ServerSteps` and :class:`ClientSteps`):

- a client's ``get_state()`` returns everything it must keep between two messages as a mapping of
  codec-encodable values (arrays, bytes, str, numbers), and ``set_state(state)`` restores it into
  a freshly built client. Flower rebuilds the client for every message, and checkpoints save the
  same mapping: there is no second copy of a client's state anywhere.
- a server's ``get_state()`` returns ``(arrays, json_meta)``; ``set_state(arrays, meta)`` restores
  it after ``setup`` (every runtime resumes in the order build, setup, restore).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel

from hybridfl.errors import ConfigError
from hybridfl.runtime.messages import Message

LayoutEntry = tuple[str, list[str], bool]
"""The public structure of one client: ``(client_id, block names, has_labels)``, partition order."""


def no_labels_message(title: str, client_id: str) -> str:
    """The one sentence for a client without labels in an algorithm that needs labels at every client."""
    return (
        f"{title} needs labels at every client (each trains on the rows it holds labels for), but client "
        f"{client_id!r} holds none; FedBCD trains with labels at one party only."
    )


@dataclass(frozen=True)
class LabelRule:
    """Who must hold labels, as an algorithm states it (:attr:`AlgorithmSpec.labels`), checked on the
    public layout before any training (``run --federation``, the Flower ServerApp; the simulation's
    ``check`` does the same on the partition).

    Every algorithm trains a client holding labels on its labelled rows only (a row with an empty
    label cell stays in the client directory but is left out: :func:`~hybridfl.data.export.load_client_dir`).

    Attributes:
        title: the algorithm as its messages name it (``"HyFDCA"``).
        holders: ``"every"``: every client holds labels (HyFEM, HyFDCA, hybrid FedAvg); ``"one"``:
            exactly one client does, the label party (FedBCD).
    """

    title: str
    holders: str = "every"

    def check(self, layout: Sequence[Sequence[Any]]) -> None:
        """Raise unless the layout ``[(client_id, blocks, has_labels)]`` has labels where this rule says.

        Raises:
            PartitionError: a client without labels (``every``), or not exactly one label party (``one``).
        """
        from hybridfl.errors import PartitionError

        holding = [str(c) for c, _, lab in layout if lab]
        if self.holders == "every":
            missing = [str(c) for c, _, lab in layout if not lab]
            if missing:
                raise PartitionError(no_labels_message(self.title, missing[0]))
        elif len(holding) != 1:
            who = f"clients {', '.join(repr(c) for c in holding)} hold labels" if holding else "no client holds labels"
            raise PartitionError(
                f"{self.title} needs exactly one label party, but {who}: prepare only the label party's table with "
                "the label column (HyFEM, HyFDCA and hybrid FedAvg train with labels at every client)."
            )


class ClientSteps(Protocol):
    """Client-side steps of an algorithm."""

    def handle(self, msg: Message) -> Message:
        """Answer one server message with one reply (usually ``msg.reply(...)``: same round,
        sender and receiver swapped). Called once per message the client receives.

        Raises:
            ProtocolError: a message of a kind the algorithm does not know, or out of order.
        """
        ...

    def get_state(self) -> Mapping[str, Any]:
        """Everything the client must keep between two messages, as a mapping of codec-encodable
        values (arrays, bytes, str, numbers); data, labels and config come from the constructor."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_state` returned into a freshly built client, so it continues
        exactly; an empty ``state`` (the client's first message) keeps the constructor's values."""
        ...


class ServerSteps(Protocol):
    """Server-side steps of an algorithm."""

    def setup(self, transport: Any, client_ids: Sequence[str]) -> None:
        """Prepare the run before round 1, usually by asking every client in ``client_ids``
        (partition order) for its public structure through ``transport`` (round 0 messages).

        Raises:
            ProtocolError: a reply of an unexpected kind or from a client that was not asked.
        """
        ...

    def run_round(self, rnd: int, transport: Any) -> dict[str, float]:
        """Run round ``rnd`` (1-based) over ``transport`` and return its metrics (name -> number).

        The replies that did not arrive are handled by the algorithm's missing-reply policy; the
        :class:`~hybridfl.runtime.loop.RoundLoop` adds ``round``, ``bytes``, ``messages`` and
        ``seconds`` to the row.
        """
        ...

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything the server carries from round to round: ``(arrays, json_meta)``, name ->
        NumPy array and a JSON-able dict (written to checkpoints)."""
        ...

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
        """Restore what :meth:`get_state` returned, on a server built with the same config and
        already set up (resume order build, setup, restore)."""
        ...


def client_seed(seed: int, index: int) -> int:
    """The seed of the client at position ``index`` (0-based) of the partition: ``seed + 1 + index``.

    The one place this rule lives: the simulation and every SuperNode build clients with it, so a
    client makes the same random choices in both."""
    return int(seed) + 1 + int(index)


@dataclass
class EvalContext:
    """What an algorithm's ``evaluate`` may use after round ``round``.

    Attributes:
        server: the server-side object.
        round: the round just completed (1-based).
        config: the validated algorithm config.
        server_data: the server's public data (schema; ``test`` may be ``None``).
        exchange: sends evaluation messages to clients and returns the replies that arrived
            (FedBCD's joint prediction needs every party); not counted in the round's bytes.
        monitor: the simulation's privileged view (``None`` over Flower): an object the
            algorithm's ``monitor`` factory built with the whole training data, the clients and
            any shared secret, for metrics no deployment can compute (duality gap, clients' local
            models). Never used by the protocol.
        history: the metrics rows of the rounds before this one.
    """

    server: Any
    round: int
    config: Any
    server_data: Any
    exchange: Callable[[list[Message]], list[Message]]
    monitor: Any = None
    history: list[dict] = field(default_factory=list)


@dataclass
class ReportContext:
    """What an algorithm's ``report`` may use at the end of a run.

    Attributes:
        server: the server-side object.
        config: the validated algorithm config.
        history: one metrics row per completed round.
        transport: the run's transport (its ``log``; ``failures`` in the simulation).
        server_data: the server's public data.
        monitor: the simulation's privileged view, or ``None`` over Flower.
        n_clients: the number of clients.
        dataset: the dataset's name.
        baselines: what the spec's ``baselines`` returned (simulation only; ``{}`` otherwise).
    """

    server: Any
    config: Any
    history: list[dict]
    transport: Any
    server_data: Any
    monitor: Any = None
    n_clients: int = 0
    dataset: str = ""
    baselines: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm's recipe (register it with :func:`register`).

    Attributes:
        name: ``algorithm.name`` in a run config.
        config_model: its pydantic config class (with ``rounds``; ``eval_every``, ``failure_rate``
            where it has them).
        description: one line for ``hybridfl algorithms``.
        build_server: ``(server_data, config, seed, hello) -> server``; ``hello`` maps client ID ->
            what that client added to its hello (:attr:`hello_payload`), e.g. HE public material.
        build_client: ``(client_data, config, seed, layout) -> client``; ``layout`` is the public
            structure ``[(client_id, blocks, has_labels)]`` in partition order.
        check: ``(split, partition, config) -> None``: every input check before any training
            (one-sentence :class:`~hybridfl.errors.HybridFLError`); the simulation calls it, a
            deployment checks its own directories.
        evaluate: ``EvalContext -> metrics`` after evaluated rounds.
        report: ``ReportContext -> (summary, report_rows)``: the algorithm's own summary keys
            and the final table rows ``[label, value, "percent" | "sci" | "plain"]``.
        should_stop: ``(history, config) -> bool`` after each round (early stopping).
        eval_due: ``(rnd, history, config) -> bool``: evaluate this round although ``eval_every``
            does not say so (FedBCD's dense evaluation near the target).
        hello_payload: ``(client_data, config) -> dict``: what a client adds to its hello reply
            (public values only).
        deal_secrets: ``config -> {name: bytes}`` or ``None``: material every client shares and
            the server must not have (HyFDCA's HE key pair). The simulation plays the client
            organisation that makes it; a deployment reads it from each client's directory.
        monitor: ``(split, partition, config, seed, clients, secrets) -> object``: the
            simulation's privileged evaluator (see :class:`EvalContext`).
        final_arrays: ``server -> {name: array}``: the final model, written to ``final.npz``.
        export_model: ``(server, clients, config) -> ModelParts | None``: the model a run leaves
            in its ``model/`` directory (:mod:`hybridfl.inference`); ``clients`` is client ID ->
            client object where the caller holds them (the simulation), else ``None``.
        export_part: ``(client, config, layout) -> (ModelParts, info) | None``: an organisation's
            own part of the model (:mod:`hybridfl.inference.parts`) from its client object, for an
            algorithm whose server never holds the whole model (FedBCD's bottom models, over
            Flower); ``info`` names its units, head and width.
        plots: ``(history, config, title) -> [fn(out_dir)]``: extra plot writers.
        baselines: ``(split, partition, config, seed) -> dict``: simulation only, comparison runs
            after the federation (HyFEM's centralised and stand-alone models).
        run: for an algorithm that is not federated (the centralised solver): ``(split,
            partition, config, seed, progress) -> RunResult`` instead of the round loop.
        clients_hold_test: each client also holds its blocks of the test samples
            (``ClientData.test``; the export writes them), for evaluations that need every party.
        privacy_warning: ``config -> str | None``: one line saying what the server learns under
            these settings when a privacy setting is off (printed before training; docs/privacy.md).
        labels: who must hold labels (:class:`LabelRule`), checked on the public layout before
            any training of a federation of client directories; ``None``: not checked there.
    """

    name: str
    config_model: type[BaseModel]
    description: str
    build_server: Callable[..., Any] | None = None
    build_client: Callable[..., Any] | None = None
    check: Callable[..., None] | None = None
    evaluate: Callable[[EvalContext], dict[str, float]] | None = None
    report: Callable[[ReportContext], tuple[dict, list]] | None = None
    should_stop: Callable[[list[dict], Any], bool] | None = None
    eval_due: Callable[[int, list[dict], Any], bool] | None = None
    hello_payload: Callable[[Any, Any], dict] | None = None
    deal_secrets: Callable[[Any], dict[str, bytes] | None] | None = None
    monitor: Callable[..., Any] | None = None
    final_arrays: Callable[[Any], dict[str, np.ndarray]] | None = None
    export_model: Callable[[Any, Mapping[str, Any] | None, Any], Any] | None = None
    export_part: Callable[[Any, Any, Any], Any] | None = None
    plots: Callable[[list[dict], Any, str], list[Callable[[Path], None]]] | None = None
    baselines: Callable[..., dict] | None = None
    run: Callable[..., Any] | None = None
    clients_hold_test: bool = False
    privacy_warning: Callable[[Any], str | None] | None = None
    labels: LabelRule | None = None

    @property
    def federated(self) -> bool:
        """Whether the algorithm is client and server steps (and so can be deployed on Flower)."""
        return self.build_server is not None and self.build_client is not None


_BUILTIN = {
    "hyfem": "hybridfl.algorithms.hyfem.spec",
    "hyfdca": "hybridfl.algorithms.hyfdca.spec",
    "fedbcd": "hybridfl.algorithms.fedbcd.spec",
    "hybrid_fedavg": "hybridfl.algorithms.hybrid_fedavg.spec",
    "centralized": "hybridfl.algorithms.centralized",
}
_REGISTRY: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Make ``spec`` available under ``spec.name`` (a second registration replaces the first)."""
    _REGISTRY[spec.name] = spec
    return spec


def _load(name: str | None = None) -> None:
    """Import the built-in algorithms lazily (a SuperNode process imports only its algorithm)."""
    for n, mod in _BUILTIN.items():
        if n not in _REGISTRY and (name is None or n == name):
            importlib.import_module(mod)


def algorithms() -> dict[str, AlgorithmSpec]:
    """Every registered algorithm, name -> spec."""
    _load()
    return dict(_REGISTRY)


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up an algorithm by name.

    Raises:
        ConfigError: unknown name (lists the known ones).
    """
    _load(name)
    if name not in _REGISTRY:
        _load()
        known = ", ".join(sorted(_REGISTRY))
        raise ConfigError(f"unknown algorithm {name!r} (known: {known}).")
    return _REGISTRY[name]


def config_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """Every option of a pydantic config class as ``(name, FieldInfo)``, in declaration order;
    the fields of a nested model (a section such as HyFEM's ``matching``) follow that section's
    own entry, named ``section.field``. ``hybridfl algorithms --describe`` prints these."""
    out: list[tuple[str, Any]] = []
    for name, info in model.model_fields.items():
        out.append((prefix + name, info))
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(config_fields(ann, f"{prefix}{name}."))
    return out


def deployable(name: str) -> AlgorithmSpec:
    """The spec of an algorithm that can run on Flower.

    Raises:
        ConfigError: unknown, or not federated (lists those that are).
    """
    spec = get_algorithm(name)
    if not spec.federated:
        ok = ", ".join(sorted(n for n, s in algorithms().items() if s.federated))
        raise ConfigError(f"algorithm {name!r} is not federated and cannot be deployed on Flower (deployable: {ok}).")
    return spec
