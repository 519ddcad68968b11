"""Where torch models run: the ``device`` setting (``cpu | cuda | auto``) of every torch path.

Every algorithm config that trains torch models (HyFEM, FedBCD towers, the baselines) has a
``device`` field; :func:`check_device` validates it before anything runs and :func:`resolve_device`
turns it into a :class:`torch.device` on which the models and every tensor made from client data
are created. ``auto`` is the default: a machine with a GPU uses it, one without runs on the CPU
(the run's summary records which, :func:`device_name`).
"""

from __future__ import annotations

from typing import Literal

import torch

from hybridfl.errors import ConfigError

DeviceName = Literal["cpu", "cuda", "auto"]
"""The values of the ``device`` setting: ``cpu``; ``cuda`` (the first GPU; an error without one);
``auto`` (``cuda`` when a GPU is present, else ``cpu``)."""

DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")
"""The accepted ``device`` values."""


def check_device(name: str) -> None:
    """Check a ``device`` setting before a run starts.

    Raises:
        ConfigError: ``name`` is not one of :data:`DEVICES`, or is ``cuda`` on a machine without a
            CUDA GPU (one sentence).
    """
    if name not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, not {name!r}.")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for but torch sees no CUDA GPU on this machine; use cpu or auto.")


def resolve_device(name: str = "cpu") -> torch.device:
    """The :class:`torch.device` of a ``device`` setting (``auto``: ``cuda`` if available, else ``cpu``).

    Raises:
        ConfigError: as :func:`check_device`.
    """
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(config: object) -> str | None:
    """The device a run of ``config`` uses (``"cpu"``, ``"cuda"``), or ``None`` for a config without
    a ``device`` setting (an algorithm without torch models).

    Raises:
        ConfigError: as :func:`check_device`.
    """
    name = getattr(config, "device", None)
    return None if name is None else resolve_device(str(name)).type
