"""Baselines with the same update budget as a federated run (HyFEM Sec. 4).

- Centralised: the server-shaped model (all blocks) trained on all training samples.
- Stand-alone: each client trains its own client-shaped model on its own samples and blocks,
  with no communication.
- Centralised on the held cells (not in the paper; ours, a fair upper bound for these holdings): the
  server-shaped model trained on the pooled data the clients hold, each sample with only the
  blocks some client holds for it; an unheld block's extractor output is 0 in the classifier
  input, the zero padding ``P_m^T v_m`` of HyFEM Appendix A. It is the best a federation of these
  holdings could do, whereas "centralised" also learns from the (sample, block) cells nobody holds.

Both take ``steps = T * Q`` SGD steps of ``batch_size`` samples, the budget of one HyFEM client.
Accuracy follows the papers: the centralised model on all test samples with all blocks; each
stand-alone model on all test samples with its own blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from hybridfl.algorithms.training import LocalTrainer
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import Partition
from hybridfl.models.hybrid import ExtractorFactory, HybridModel, model_device, predict


def accuracy(model: HybridModel, test: HybridDataset) -> float:
    """Share in ``[0, 1]`` of ``test`` samples classified correctly, using the model's blocks only
    (``test`` must hold them, with labels)."""
    return float(np.mean(predict(model, {b: test.blocks[b] for b in model.blocks}) == test.y))


def train_centralized(
    split: DatasetSplit,
    make_model: Callable[[list[str]], HybridModel],
    steps: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    seed: int = 0,
    eval_every: int = 0,
    on_eval: Callable[[int, float], None] | None = None,
    lr_at: Callable[[int], float] | None = None,
    round_steps: int = 0,
) -> tuple[HybridModel, float]:
    """Train the server-shaped model on all training data for ``steps`` SGD steps (HyFEM Sec. 4,
    "centralised"); ``torch.manual_seed(seed)`` before the model is made.

    Args:
        make_model: ``blocks -> model`` (see :func:`make_model_factory`).
        eval_every: if > 0, call ``on_eval(steps_done, test_accuracy)`` every that many steps.
        lr_at, round_steps: the federation's step-size schedule (:func:`run_schedule`); then
            ``eval_every`` is ignored.

    Returns:
        The model and its test accuracy (all blocks).
    """
    torch.manual_seed(seed)
    model = make_model(split.train.block_names)
    trainer = LocalTrainer(model, split.train, batch_size, lr, momentum, seed)
    if lr_at is not None:
        run_schedule(trainer, steps, round_steps, lr_at)
        return model, accuracy(model, split.test)
    done = 0
    chunk = steps if not eval_every else eval_every
    while done < steps:
        k = min(chunk, steps - done)
        trainer.steps(k)
        done += k
        if on_eval is not None and eval_every:
            on_eval(done, accuracy(model, split.test))
    return model, accuracy(model, split.test)


def run_schedule(trainer: LocalTrainer, steps: int, round_steps: int, lr_at: Callable[[int], float]) -> None:
    """``steps`` SGD steps of ``trainer`` on the federation's schedule: chunk ``t = 1, 2, ...`` of
    ``round_steps`` steps (the clients' ``Q``) at step size ``lr_at(t)`` (e.g.
    :meth:`HyFEMConfig.lr_at`), the momentum reset between chunks as a client's is between rounds.

    Raises:
        ValueError: ``round_steps`` < 1.
    """
    if round_steps < 1:
        raise ValueError(f"round_steps must be >= 1 with a schedule, got {round_steps}")
    done, t = 0, 1
    while done < steps:
        k = min(round_steps, steps - done)
        trainer.steps(k, lr=lr_at(t))
        done, t = done + k, t + 1


def held_cells(split: DatasetSplit, partition: Partition) -> tuple[np.ndarray, np.ndarray]:
    """The pooled data the clients hold: the training rows some labelled client holds and, per row,
    which blocks (in ``split.train.block_names`` order) some client holds for it.

    Returns:
        ``rows`` ``(n,)`` training row positions and ``mask`` ``(n, d0)`` bool.
    """
    train = split.train
    bidx = {b: j for j, b in enumerate(train.block_names)}
    held = np.zeros((train.n_samples, len(bidx)), dtype=bool)
    for c in partition.clients:
        if not c.has_labels:
            continue
        rows = train.positions(np.asarray(c.sample_ids).astype(str), where=f"client {c.client_id}")
        held[np.ix_(rows, [bidx[b] for b in c.blocks])] = True
    rows = np.flatnonzero(held.any(axis=1))
    return rows, held[rows]


def train_centralized_held(
    split: DatasetSplit,
    partition: Partition,
    make_model: Callable[[list[str]], HybridModel],
    steps: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    seed: int = 0,
    lr_at: Callable[[int], float] | None = None,
    round_steps: int = 0,
) -> tuple[HybridModel, float]:
    """Train the server-shaped model for ``steps`` SGD steps on the cells the clients hold
    (:func:`held_cells`): mini-batches drawn uniformly from the pooled rows, every unheld block's
    extractor output set to 0 in the classifier input (HyFEM Appendix A's zero padding
    ``P_m^T v_m``); ``torch.manual_seed(seed)`` before the model is made, as
    :func:`train_centralized`, so both start from the same weights. With ``lr_at`` the step size
    of step ``k`` is ``lr_at(k // round_steps + 1)`` and the momentum is reset every
    ``round_steps`` steps (:func:`run_schedule`).

    Returns:
        The model and its test accuracy (all test samples, all blocks).
    """
    rows, mask = held_cells(split, partition)
    torch.manual_seed(seed)
    model = make_model(split.train.block_names)
    dev = model_device(model)
    x = {b: torch.from_numpy(np.ascontiguousarray(split.train.blocks[b][rows])).to(dev) for b in model.blocks}
    y = torch.from_numpy(split.train.y[rows]).to(dev)
    m = torch.from_numpy(mask.astype(np.float32)).to(dev)
    n = int(rows.size)
    bs = max(1, min(int(batch_size), n))
    gen = torch.Generator().manual_seed(int(seed))
    if lr_at is not None and round_steps < 1:
        raise ValueError(f"round_steps must be >= 1 with a schedule, got {round_steps}")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    for k in range(int(steps)):
        if lr_at is not None and k % round_steps == 0:
            opt = torch.optim.SGD(model.parameters(), lr=lr_at(k // round_steps + 1), momentum=momentum)
        idx = torch.randint(n, (bs,), generator=gen).to(dev)
        feats = [model.extractors[b](x[b][idx]) * m[idx, j : j + 1] for j, b in enumerate(model.blocks)]
        loss = loss_fn(model.classifier(torch.cat(feats, dim=1)), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model, accuracy(model, split.test)


def train_standalone(
    split: DatasetSplit,
    partition: Partition,
    make_model: Callable[[list[str]], HybridModel],
    steps: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    seed: int = 0,
    initial: Mapping[str, HybridModel] | None = None,
    lr_at: Callable[[int], float] | None = None,
    round_steps: int = 0,
) -> dict[str, float]:
    """Train every labelled client alone for ``steps`` SGD steps (HyFEM Sec. 4, "stand-alone");
    client ``i`` of the partition is seeded with ``seed + 1000 + i``.

    Args:
        initial: optional client -> model to start from (e.g. the federated run's round-0 model).
        lr_at, round_steps: the federation's step-size schedule (:func:`run_schedule`).

    Returns:
        Client ID -> test accuracy of its model on its own blocks (clients without labels are
        left out).
    """
    out = {}
    for i, c in enumerate(partition.clients):
        if not c.has_labels:
            continue
        data = split.train.subset(c.sample_ids, c.blocks)
        torch.manual_seed(seed + 1000 + i)
        model = make_model(list(c.blocks))
        if initial is not None and c.client_id in initial:
            model.load_state_dict(initial[c.client_id].state_dict())
        trainer = LocalTrainer(model, data, batch_size, lr, momentum, seed + 1000 + i)
        if lr_at is None:
            trainer.steps(steps)
        else:
            run_schedule(trainer, steps, round_steps, lr_at)
        out[c.client_id] = accuracy(model, split.test)
    return out


def make_model_factory(
    split: DatasetSplit,
    extractor_dim: int,
    hidden: int,
    factory: ExtractorFactory,
    device: torch.device | str = "cpu",
) -> Callable[[list[str]], HybridModel]:
    """``blocks -> HybridModel`` over ``split``'s schema with extractor width ``extractor_dim``,
    classifier hidden width ``hidden`` and the extractors ``factory`` makes, initialised on the CPU
    (the same weights on any device) and moved to ``device``; the trainers put their data there."""

    def make(blocks: list[str]) -> HybridModel:
        model = HybridModel(blocks, split.train.block_shapes, split.train.n_classes, extractor_dim, hidden, factory)
        return model.to(device)

    return make
