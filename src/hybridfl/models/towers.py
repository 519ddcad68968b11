"""Party models for vertical FL (FedBCD, FedSGD): bottom models per party and the top model.

In vertical FL every party ``k`` holds some feature blocks of the same samples and a *bottom*
model producing ``H_k`` per sample (FedBCD paper Sec. 3-4, SPEC.md "FedBCD"); the label party
combines the ``H_k`` of all parties with a *top* model into one logit and computes the logistic
loss.

- ``linear``: ``H_k = x_k theta_k`` (``(batch, 1)``, no bias; paper eq. (2)), top
  :class:`SumTop` ``H = sum_k H_k + b``: logistic regression split over the parties.
- ``cnn``: :class:`PaperCNNTower`, the public reference setup (``yankang18/FedBCD``): two 2x2
  convolutions with 64 channels (stride 1, "same" padding, ReLU), then a fully connected
  representation of 256 units; top :class:`LinearTop` over the concatenated representations
  (the paper's "logistic regression model with 512 parameters" for two parties).
- ``mlp``: :class:`MLPTower` for vector blocks, top :class:`LinearTop`.

Any ``torch.nn.Module`` mapping ``(batch, *input_shape)`` to ``(batch, out_dim)`` can be a bottom
model (``TowerFactory``), any module mapping a list of ``(batch, out_dim_k)`` tensors to
``(batch,)`` logits can be a top model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from hybridfl.models.hybrid import he_init

TowerFactory = Callable[[int, tuple[int, ...], int], nn.Module]
"""``factory(party_index, input_shape, out_dim) -> nn.Module`` producing ``(batch, out_dim)``."""


class LinearBottom(nn.Module):
    """``H_k = x_k theta_k``: input ``(batch, *shape)`` flattened to ``(batch, d_k)``, output
    ``(batch, 1)``; ``theta_k`` starts at zero (convex problem, as the reference LR code)."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.theta = nn.Linear(in_dim, 1, bias=False)
        nn.init.zeros_(self.theta.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``H_k = x_k theta_k`` (paper eq. (2)): ``(batch, *shape)`` -> ``(batch, 1)``."""
        return self.theta(x.reshape(x.shape[0], -1))


class PaperCNNTower(nn.Module):
    """Two ``2x2`` convolutions (``channels`` each, stride 1, "same" padding, ReLU), flatten,
    ``Linear(channels * h * w, out_dim) -> ReLU``. Input ``(batch, c, h, w)``, output
    ``(batch, out_dim)``. He init. Source: FedBCD paper Sec. 8 "MNIST" and SPEC.md (2x2 kernels
    as in the public reference code; the paper text says 3x3)."""

    def __init__(self, shape: tuple[int, ...], out_dim: int = 256, channels: int = 64):
        super().__init__()
        if len(shape) != 3:
            raise ValueError(f"the CNN tower needs image input (channels, height, width), got shape {shape}")
        c, h, w = shape
        # TensorFlow "SAME" padding for a 2x2 kernel: one zero row/column at the bottom/right
        self.conv = nn.Sequential(
            nn.ZeroPad2d((0, 1, 0, 1)),
            nn.Conv2d(c, channels, 2),
            nn.ReLU(),
            nn.ZeroPad2d((0, 1, 0, 1)),
            nn.Conv2d(channels, channels, 2),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(channels * h * w, out_dim), nn.ReLU())
        he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The party's representation ``H_k``: ``(batch, c, h, w)`` -> ``(batch, out_dim)``."""
        return self.head(self.conv(x))


class MLPTower(nn.Module):
    """``Linear(d, hidden) -> ReLU -> Linear(hidden, out_dim) -> ReLU`` on the flattened input."""

    def __init__(self, in_dim: int, out_dim: int = 64, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim), nn.ReLU())
        he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The party's representation ``H_k``: ``(batch, *shape)`` (flattened to ``(batch, d)``) ->
        ``(batch, out_dim)``."""
        return self.net(x.reshape(x.shape[0], -1))


class SumTop(nn.Module):
    """``H = sum_k H_k + b`` for ``(batch, 1)`` inputs (paper eq. (2)); returns ``(batch,)``."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, hs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``H = sum_k H_k + b`` (paper eq. (2)): one ``(batch, 1)`` tensor per party -> logits ``(batch,)``."""
        return torch.stack([h.reshape(h.shape[0]) for h in hs], dim=0).sum(dim=0) + self.bias


class LinearTop(nn.Module):
    """Logistic regression over the concatenated party outputs: ``Linear(sum_k r_k, 1)``; returns
    ``(batch,)`` logits. Weights start at zero."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.fc = nn.Linear(in_dim, 1)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, hs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits of the concatenated party outputs: ``(batch, r_k)`` per party, in party order ->
        ``(batch,)``."""
        return self.fc(torch.cat(list(hs), dim=1)).reshape(-1)


def bottom_factory(kind: str, representation_dim: int = 256, hidden: int = 128, channels: int = 64) -> TowerFactory:
    """Built-in bottom models: ``linear``, ``cnn`` (:class:`PaperCNNTower`), ``mlp``."""

    def factory(party: int, shape: tuple[int, ...], out_dim: int) -> nn.Module:
        if kind == "linear":
            return LinearBottom(int(np.prod(shape)))
        if kind == "cnn":
            return PaperCNNTower(shape, out_dim, channels)
        if kind == "mlp":
            return MLPTower(int(np.prod(shape)), out_dim, hidden)
        raise ValueError(f"unknown bottom model kind {kind!r} (linear, cnn, mlp)")

    return factory


def bottom_out_dim(kind: str, representation_dim: int) -> int:
    """Output width of the built-in bottom models: 1 for ``linear``, else ``representation_dim``."""
    return 1 if kind == "linear" else int(representation_dim)


def make_top(kind: str, out_dims: Sequence[int]) -> nn.Module:
    """The label party's top model: :class:`SumTop` for ``linear``, else :class:`LinearTop`."""
    if kind == "linear":
        return SumTop()
    return LinearTop(int(sum(out_dims)))
