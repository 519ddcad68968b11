"""How each algorithm is deployed: build its server and one client from exported data.

A :class:`Deployable` tells the Flower app, for one algorithm, how to build the *same* server and
client objects the in-process simulation builds (``build_hyfem`` etc.), from what a deployment has:
the server from the public schema of an exported ``server/`` directory, a client from its own
exported directory (:class:`~hybridfl.data.export.ClientData`). It also names the client state that
must survive between two messages: Flower runs one ClientApp process per message, so the client
object is rebuilt for every message and its state restored from ``context.state``.

No algorithm is implemented here: every step is the algorithm's own ``handle``/``setup``/
``run_round``. To add an algorithm, register a :class:`Deployable` with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from hybridfl.data.export import ClientData, ServerData
from hybridfl.errors import ConfigError, PartitionError

StateDict = dict[str, np.ndarray]


@dataclass(frozen=True)
class Deployable:
    """One algorithm's deployment recipe.

    Attributes:
        name: the algorithm name (``algorithm.name`` of a run config).
        config_model: its pydantic config class.
        build_server: ``(server_data, config, seed) -> server`` with ``setup``/``run_round``.
        build_client: ``(client_data, config, seed) -> client`` with ``handle(msg) -> msg``.
        get_state: ``client -> {name: array}``: what must survive until the next message.
        set_state: ``(client, state) -> None``: restore it into a freshly built client.
        evaluate: optional ``(server, server_data, round) -> metrics`` on the server's test set.
    """

    name: str
    config_model: type[BaseModel]
    build_server: Callable[[ServerData, Any, int], Any]
    build_client: Callable[[ClientData, Any, int], Any]
    get_state: Callable[[Any], StateDict]
    set_state: Callable[[Any, Mapping[str, np.ndarray]], None]
    evaluate: Callable[[Any, ServerData, int], dict[str, float]] | None = None


_REGISTRY: dict[str, Deployable] = {}


def register(d: Deployable) -> Deployable:
    _REGISTRY[d.name] = d
    return d


def deployable(name: str) -> Deployable:
    """The deployment recipe of an algorithm.

    Raises:
        ConfigError: the algorithm has no Flower deployment (lists those that do).
    """
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"algorithm {name!r} cannot be deployed on Flower yet (deployable: {', '.join(sorted(_REGISTRY))}).")
    return _REGISTRY[name]


def deployables() -> dict[str, Deployable]:
    _load_builtin()
    return dict(_REGISTRY)


# --------------------------------------------------------------------------------------- HyFEM
def _hyfem() -> Deployable:
    from hybridfl.algorithms.hyfem import HyFEMClient, HyFEMConfig, HyFEMServer
    from hybridfl.models.hybrid import default_extractor

    def build_server(sd: ServerData, cfg: HyFEMConfig, seed: int) -> HyFEMServer:
        return HyFEMServer(sd.block_shapes, sd.n_classes, cfg, seed, default_extractor(cfg.extractor))

    def build_client(cd: ClientData, cfg: HyFEMConfig, seed: int) -> HyFEMClient:
        if not cd.has_labels:
            raise PartitionError(f"HyFEM needs labels at every client, but client {cd.client_id!r} has none.")
        # the seeds of hybridfl.algorithms.hyfem_run.build_hyfem: client i gets seed + 1 + i
        return HyFEMClient(cd.client_id, cd.data, cd.block_shapes, cd.n_classes, cfg, seed + 1 + cd.index,
                           default_extractor(cfg.extractor))

    def evaluate(server: HyFEMServer, sd: ServerData, rnd: int) -> dict[str, float]:
        # the server-side metrics of hybridfl.algorithms.hyfem_run.run_hyfem's evaluate
        from hybridfl.algorithms.baselines import accuracy

        if sd.test is None:
            return {}
        row = {"server_accuracy": accuracy(server.model, sd.test)}
        local = {cid: accuracy(server.client_model(cid), sd.test) for cid in server.clients}
        row["client_accuracy_mean"] = float(np.mean(list(local.values())))
        for cid, v in local.items():
            row[f"client_accuracy[{cid}]"] = v
        return row

    return Deployable("hyfem", HyFEMConfig, build_server, build_client,
                      lambda c: c.get_state(), lambda c, s: c.set_state(s), evaluate)


_BUILTIN: tuple[Callable[[], Deployable], ...] = (_hyfem,)
_loaded = False


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for make in _BUILTIN:
            register(make())
