"""Party models for vertical FL (FedBCD, FedSGD): bottom models per party and the top model.

In vertical FL every party ``k`` holds some feature blocks of the same samples and a *bottom*
model producing ``H_k`` per sample (FedBCD paper Sec. 3-4, ``H_i^k = x_i^k theta_k``; Sec. 6 for
neural sub-models); the label party
combines the ``H_k`` of all parties with a *top* model into one logit and computes the logistic
loss.

- ``linear``: ``H_k = x_k theta_k`` (``(batch, 1)``, no bias; paper eq. (2)), top
  :class:`SumTop` ``H = sum_k H_k + b``: logistic regression split over the parties.
- ``cnn``: :class:`PaperCNNTower`, the public reference setup (``yankang18/FedBCD``): two 2x2
  convolutions with 64 channels (stride 1, "same" padding, ReLU), then a fully connected
  representation of 256 units.
- ``mlp``: :class:`MLPTower` for vector blocks.

Two layouts of the top layer for the neural towers (``top`` setting, :func:`bottom_factory`,
:func:`make_top`):

- ``party_slice`` (the paper's, eq. (2) with ``x_k`` replaced by the tower's output, Fig. 1a;
  the reference code's ``VFLHostModel.W``): each party owns its slice ``w_k`` of the final
  logistic layer, so its bottom model is :class:`SlicedTower` ``H_k = w_k^T G_k(x_k)``, one value
  per sample, and the label party's top is :class:`SumTop` ``sum_k H_k + b``. The joint model is
  the same function as ``concat``'s (a logistic layer over the concatenated representations,
  ``sum_k r_k + 1`` parameters: the paper's "512 parameters" for two 256-unit towers); only where
  ``w_k`` lives, and so what crosses the network, differs.
- ``concat``: the bottom model is the tower itself (``H_k`` of width ``r_k``) and the label party
  holds the whole layer, :class:`LinearTop` over the concatenated ``H_k``.

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
    ``(batch, out_dim)``. He init. Source: FedBCD paper Sec. 8 "MNIST" (two convolutions with 64
    channels, 256 units); 2x2 kernels as in the public reference code ``yankang18/FedBCD``, where
    the paper text says 3x3."""

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
    """``H = sum_k H_k + b`` for ``(batch, 1)`` inputs (paper eq. (2)); returns ``(batch,)``.

    Args:
        bias: learn the intercept ``b`` (starts at 0; FedBCD's ``fit_intercept``); ``False``: no
            ``b`` (no parameter, ``H = sum_k H_k``).
    """

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, hs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``H = sum_k H_k + b`` (paper eq. (2)): one ``(batch, 1)`` tensor per party -> logits ``(batch,)``."""
        h = torch.stack([h.reshape(h.shape[0]) for h in hs], dim=0).sum(dim=0)
        return h + self.bias if self.bias is not None else h


class LinearTop(nn.Module):
    """Logistic regression over the concatenated party outputs: ``Linear(sum_k r_k, 1)``; returns
    ``(batch,)`` logits. Weights start at zero; ``bias`` ``False``: no intercept."""

    def __init__(self, in_dim: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_dim, 1, bias=bias)
        nn.init.zeros_(self.fc.weight)
        if bias:
            nn.init.zeros_(self.fc.bias)

    def forward(self, hs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits of the concatenated party outputs: ``(batch, r_k)`` per party, in party order ->
        ``(batch,)``."""
        return self.fc(torch.cat(list(hs), dim=1)).reshape(-1)


class SlicedTower(nn.Module):
    """A tower followed by the party's own slice of the top layer (``top: party_slice``):
    ``H_k = G_k(x_k) w_k``, ``(batch, *shape)`` -> ``(batch, 1)``; ``w_k`` ``(r_k,)`` starts at zero
    (as :class:`LinearTop`'s weights). FedBCD paper eq. (2) with ``x_k`` replaced by the tower's
    output ``G_k(x_k)`` (Sec. 6 and Fig. 1a: local models connected at the final prediction
    layer); "a single value per sample" is exchanged (Sec. 1)."""

    def __init__(self, tower: nn.Module, in_dim: int):
        super().__init__()
        self.tower = tower
        # zeros without drawing from torch's random state: the towers' initial weights are the
        # same as with top: concat
        self.weight = nn.Parameter(torch.zeros(1, int(in_dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``H_k = G_k(x_k) w_k``: ``(batch, *shape)`` -> ``(batch, 1)``."""
        return self.tower(x) @ self.weight.T


TOPS: tuple[str, ...] = ("party_slice", "concat")
"""The layouts of the top layer (see the module docs); ``party_slice`` is the paper's."""


def bottom_factory(
    kind: str, representation_dim: int = 256, hidden: int = 128, channels: int = 64, top: str = "party_slice"
) -> TowerFactory:
    """Built-in bottom models: ``linear`` (:class:`LinearBottom`), ``cnn`` (:class:`PaperCNNTower`),
    ``mlp`` (:class:`MLPTower`); with ``top`` = ``party_slice`` a ``cnn`` or ``mlp`` tower of
    width ``out_dim`` is wrapped in :class:`SlicedTower` (output width 1).

    Raises:
        ValueError: (when the factory is called) an unknown ``kind`` or ``top``.
    """

    def factory(party: int, shape: tuple[int, ...], out_dim: int) -> nn.Module:
        if top not in TOPS:
            raise ValueError(f"unknown top layout {top!r} (party_slice, concat)")
        if kind == "linear":
            return LinearBottom(int(np.prod(shape)))
        if kind == "cnn":
            tower: nn.Module = PaperCNNTower(shape, out_dim, channels)
        elif kind == "mlp":
            tower = MLPTower(int(np.prod(shape)), out_dim, hidden)
        else:
            raise ValueError(f"unknown bottom model kind {kind!r} (linear, cnn, mlp)")
        return SlicedTower(tower, out_dim) if top == "party_slice" else tower

    return factory


def make_top(kind: str, out_dims: Sequence[int], top: str = "party_slice", bias: bool = True) -> nn.Module:
    """The label party's top model: :class:`SumTop` for ``linear`` or ``top`` = ``party_slice``,
    else :class:`LinearTop` over ``sum(out_dims)`` inputs; ``bias``: with its intercept (FedBCD's
    ``fit_intercept``)."""
    if kind == "linear" or top == "party_slice":
        return SumTop(bias)
    return LinearTop(int(sum(out_dims)), bias)
