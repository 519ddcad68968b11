"""HyFEM's step-size schedule (``lr_decay`` / ``lr_decay_every``, the HyFEM workshop version's
Sec. 4 schedule): the lr each round's ``hyfem.fit`` carries, the baselines on the same schedule,
and the constant default unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.algorithms.training import LocalTrainer
from hybridfl.data.partitioners import ClassBlockPartitioner
from hybridfl.runtime.messages import decode


def test_lr_at_is_the_step_schedule_and_constant_by_default():
    assert [HyFEMConfig(lr=0.1).lr_at(t) for t in (1, 5, 100)] == [0.1, 0.1, 0.1]
    cfg = HyFEMConfig(lr=0.005, lr_decay=0.2, lr_decay_every=8)  # workshop Sec. 4
    got = [cfg.lr_at(t) for t in (1, 8, 9, 16, 17, 32)]
    assert got == pytest.approx([0.005, 0.005, 0.001, 0.001, 0.0002, 0.005 * 0.2**3])
    with pytest.raises(ValidationError, match="lr_decay_every"):
        HyFEMConfig(lr_decay=0.5)
    with pytest.raises(ValidationError):
        HyFEMConfig(lr_decay=1.5, lr_decay_every=2)


def _run(digits_split, **algo):
    part = ClassBlockPartitioner(
        num_clients=3, classes_per_client=[6, 8], blocks_per_client=3, min_cell_coverage=1, seed=0
    ).partition(digits_split.train)
    raw: list[bytes] = []
    cfg = HyFEMConfig(rounds=4, local_steps=3, hidden=8, extractor_dim=4, batch_size=16, baselines=True, **algo)
    res = run_hyfem(digits_split, part, cfg, seed=0, recorder=raw.append)
    return res, [decode(r) for r in raw]


def test_every_fit_message_carries_its_rounds_step_size_and_the_baselines_follow(digits_split):
    res, msgs = _run(digits_split, lr=0.1, lr_decay=0.5, lr_decay_every=2)
    fits = [m for m in msgs if m.kind == "hyfem.fit" and m.sender == "server"]
    assert {m.round for m in fits} == {1, 2, 3, 4}
    for m in fits:
        assert m.payload["lr"] == pytest.approx(0.1 * 0.5 ** ((m.round - 1) // 2)), m.round
    const, _ = _run(digits_split, lr=0.1)
    # the schedule changes the federation's and the baselines' results (all three trained on it)
    for k in ("server_accuracy", "centralized_accuracy", "standalone_accuracy_mean"):
        assert res.summary[k] is not None and const.summary[k] is not None
    assert not np.allclose(
        [res.summary[k] for k in ("client_accuracy_local_mean", "centralized_accuracy")],
        [const.summary[k] for k in ("client_accuracy_local_mean", "centralized_accuracy")],
        atol=0,
    )
    # lr_decay 1 is the constant run exactly
    same, _ = _run(digits_split, lr=0.1, lr_decay=1.0, lr_decay_every=2)
    assert same.summary["server_accuracy"] == const.summary["server_accuracy"]
    assert same.summary["standalone_accuracy"] == const.summary["standalone_accuracy"]


def test_scheduled_baselines_are_chunks_of_q_steps_at_the_rounds_step_size(mfeat_split):
    """:func:`run_schedule` is ``T`` calls of ``Q`` steps at ``lr_at(t)``; the held-cells bound with
    everything held equals the centralised model on the same schedule, step for step."""
    from hybridfl.algorithms.hyfem.baselines import (
        make_model_factory,
        run_schedule,
        train_centralized,
        train_centralized_held,
    )
    from hybridfl.data.partition import ClientShard, Partition
    from hybridfl.models.hybrid import default_extractor

    split = mfeat_split
    names = split.train.block_names
    make = make_model_factory(split, 4, 8, default_extractor("mlp"))
    cfg = HyFEMConfig(lr=0.05, lr_decay=0.1, lr_decay_every=2, local_steps=5)

    def manual():
        torch.manual_seed(3)
        m = make(names)
        tr = LocalTrainer(m, split.train, 16, 0.05, 0.9, 3)
        for t in range(1, 5):
            tr.steps(5 if t < 4 else 3, lr=cfg.lr_at(t))
        return m

    torch.manual_seed(3)
    m = make(names)
    run_schedule(LocalTrainer(m, split.train, 16, 0.05, 0.9, 3), 18, 5, cfg.lr_at)
    ref = manual()
    for k, v in m.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    sched = {"lr_at": cfg.lr_at, "round_steps": 5}
    m1, acc1 = train_centralized(split, make, 18, 16, 0.05, 0.9, seed=3, **sched)
    for k, v in m1.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    everything = Partition([ClientShard("a", split.train.ids, tuple(names))])
    m2, acc2 = train_centralized_held(split, everything, make, 18, 16, 0.05, 0.9, seed=3, **sched)
    assert acc1 == acc2
    for k, v in m1.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    with pytest.raises(ValueError, match="round_steps"):
        run_schedule(LocalTrainer(m, split.train, 16, 0.05, 0.9, 3), 4, 0, cfg.lr_at)
