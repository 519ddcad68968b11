"""Local SGD on one party's data: shared by HyFEM clients and the baselines.

Mini-batches are drawn uniformly at random from the party's own samples (HyFEM Alg. 2 line 4,
with ``batch_size`` samples per step), so every step costs ``batch_size`` sample-gradient
evaluations whatever the algorithm: that makes budgets comparable (``T * Q`` steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from hybridfl.data.dataset import HybridDataset
from hybridfl.models.hybrid import HybridModel, model_device


class LocalTrainer:
    """SGD steps of a :class:`HybridModel` on a fixed dataset.

    Args:
        model: the model to train (updated in place).
        data: the party's samples with (at least) the model's blocks.
        batch_size: samples per step (capped at the number of samples).
        lr: SGD step size ``eta``.
        momentum: SGD momentum (0 = plain SGD as in HyFEM Alg. 2; the state is reset each call).
        seed: seeds the party's own mini-batch generator.

    The data tensors live on the model's device (:func:`~hybridfl.models.hybrid.model_device`); on
    the CPU they share the dataset's memory, elsewhere only the party's rows are copied there. The
    mini-batch generator stays on the CPU, so every device draws the same mini-batches.
    """

    def __init__(
        self, model: HybridModel, data: HybridDataset, batch_size: int, lr: float, momentum: float = 0.0, seed: int = 0
    ):
        self.model = model
        self.device = model_device(model)
        # a view of a shared dataset (HybridDataset.row_source): gather each mini-batch from the
        # shared array through the client's row indices, never a copy of its rows (so memory does not
        # grow with the number of clients)
        src = {b: data.row_source(b) for b in model.blocks}
        rows = {None if r is None else id(r): r for _, r in src.values()}
        self.rows = None
        if self.device.type == "cpu" and len(rows) == 1 and next(iter(rows.values())) is not None:
            self.x = {b: torch.from_numpy(np.ascontiguousarray(a)) for b, (a, _) in src.items()}
            self.rows = torch.from_numpy(np.asarray(next(iter(rows.values())), dtype=np.int64))
        else:  # the party's own rows (on an accelerator: only those are copied there)
            self.x = {
                b: torch.from_numpy(np.ascontiguousarray(a if r is None else a[r])).to(self.device)
                for b, (a, r) in src.items()
            }
        self.y = torch.from_numpy(data.y).to(self.device)
        self.n = int(self.y.shape[0])
        self.batch_size = max(1, min(int(batch_size), self.n))
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.gen = torch.Generator().manual_seed(int(seed))
        self.loss_fn = nn.CrossEntropyLoss()

    def steps(
        self,
        q: int,
        prox: Sequence[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], float]] = (),
        lr: float | None = None,
    ) -> float:
        """Run ``q`` SGD steps; return the mean mini-batch loss (without proximal terms).

        Args:
            q: number of local steps ``Q``.
            prox: groups ``(params, anchors, mu)``: adds ``(mu/2) ||p - anchor||^2`` to the loss,
                i.e. ``mu (p - anchor)`` to the gradient (HyFEM Alg. 2 lines 5-6, HyFEM-Prox).
            lr: step size for this call (default: the trainer's).
        """
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr if lr is None else lr, momentum=self.momentum)
        total = 0.0
        self.model.train()
        for _ in range(int(q)):
            idx = torch.randint(self.n, (self.batch_size,), generator=self.gen).to(self.device)
            at = idx if self.rows is None else self.rows[idx]
            xb = {b: x[at] for b, x in self.x.items()}
            loss = self.loss_fn(self.model(xb), self.y[idx])
            total += float(loss.detach())
            reg = 0.0
            for params, anchors, mu in prox:
                if mu:
                    reg = reg + 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))
            opt.zero_grad(set_to_none=True)
            (loss + reg).backward()
            opt.step()
        return total / max(int(q), 1)
