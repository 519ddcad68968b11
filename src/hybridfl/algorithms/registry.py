"""Algorithm registry: the ``algorithm.name`` of a run config -> config model and runner.

An algorithm registers an :class:`AlgorithmSpec` whose ``run(split, partition, config, seed,
progress)`` returns a :class:`~hybridfl.runtime.simulation.RunResult`. Built-in algorithms are
imported lazily on first lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from hybridfl.errors import ConfigError

_BUILTIN_MODULES = ("hybridfl.algorithms.hyfem_run", "hybridfl.algorithms.fedbcd_run", "hybridfl.algorithms.hyfdca_run")


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config_model: type[BaseModel]
    run: Callable
    description: str = ""


_REGISTRY: dict[str, AlgorithmSpec] = {}
_loaded = False


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _BUILTIN_MODULES:
            importlib.import_module(mod)


def algorithms() -> dict[str, AlgorithmSpec]:
    _load_builtin()
    return dict(_REGISTRY)


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up an algorithm by name.

    Raises:
        ConfigError: unknown name (lists the known ones).
    """
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown algorithm {name!r} (known: {', '.join(sorted(_REGISTRY))}).")
    return _REGISTRY[name]
