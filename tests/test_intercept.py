"""fit_intercept (issue 27, item 5): the intercept of HyFDCA, hybrid FedAvg and the centralised
solver is the weight of a constant block ``intercept`` held by the label holders
(:mod:`hybridfl.algorithms.convex.intercept`). Against the centralised optimum of the same problem
(a grid, where several clients hold the block for the same sample), the threshold problem it
fixes, the final arrays, the helpers, and FedBCD's top-model bias."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hybridfl.algorithms.centralized import CentralizedConfig, run_centralized
from hybridfl.algorithms.convex.intercept import (
    INTERCEPT,
    client_with_intercept,
    server_with_intercept,
    split_with_intercept,
)
from hybridfl.algorithms.hybrid_fedavg import HybridFedAvgConfig, run_hybrid_fedavg
from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.data.dataset import DatasetSplit, HybridDataset, RowBlocks
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.errors import DataError
from hybridfl.runtime.simulation import build_federation, client_data, server_data
from tests.conftest import HYFDCA_BEFORE

pytestmark = pytest.mark.usefixtures("isolated_cache")


def unbalanced(n=600, n_test=400, dims=(4, 3, 3), shift=-2.0, seed=0) -> DatasetSplit:
    """A logistic model with a large negative offset: about a quarter of the labels are positive,
    and the features are centred, so a model without intercept cannot place its threshold."""
    rng = np.random.default_rng(seed)
    N = n + n_test
    X = rng.normal(size=(N, sum(dims)))
    z = 0.7 * X @ rng.normal(size=sum(dims)) + shift
    y = (z + 0.5 * rng.logistic(size=N) > 0).astype(np.int64)
    edges = np.cumsum((0, *dims))
    blocks = {f"b{k}": X[:, edges[k] : edges[k + 1]].astype(np.float32) for k in range(len(dims))}
    full = HybridDataset("unbalanced", [f"s{i}" for i in range(N)], y, blocks, ["neg", "pos"])
    return DatasetSplit(full.take(np.arange(n)), full.take(np.arange(n, N)))


@pytest.fixture(scope="module")
def data():
    split = unbalanced()
    return split, GridPartitioner(2, 3).partition(split.train)  # every sample held by 3 label holders


def _centralised(split, part, fit_intercept=True):
    cfg = CentralizedConfig(loss="logistic", lam=1e-2, tol=1e-10, fit_intercept=fit_intercept, reference=False)
    return run_centralized(split, part, cfg)


def _positive_rate(final, test):
    X = np.concatenate([test.blocks[b].reshape(test.n_samples, -1) for b in test.block_names], axis=1)
    w = final["w"]
    z = X @ w[: X.shape[1]] + final["intercept"][0]
    return float(np.mean(z >= 0))


def test_helpers_add_one_constant_block_for_the_label_holders(data):
    split, part = data
    c1 = dataclasses.replace(part.clients[1], has_labels=False)  # a client without labels: no intercept block
    part = dataclasses.replace(part, clients=[part.clients[0], c1])
    cds = client_data(split, part, with_test=True)
    with_b = client_with_intercept(cds[0])
    assert list(with_b.block_shapes)[-1] == INTERCEPT and with_b.block_shapes[INTERCEPT] == (1,)
    assert with_b.data.block_names == ["b0", INTERCEPT]
    assert isinstance(with_b.data.blocks, RowBlocks)  # still a view of the shared arrays
    np.testing.assert_array_equal(with_b.data.blocks[INTERCEPT], np.ones((with_b.data.n_samples, 1)))
    np.testing.assert_array_equal(with_b.test.blocks[INTERCEPT], np.ones((split.test.n_samples, 1)))
    assert cds[0].data.block_names == ["b0"]  # the input is unchanged
    no_labels = client_with_intercept(cds[1])
    assert no_labels.data.block_names == ["b1"] and INTERCEPT in no_labels.block_shapes
    sd = server_with_intercept(server_data(split, part))
    assert sd.layout[0][1] == ["b0", INTERCEPT] and sd.layout[1][1] == ["b1"]
    assert sd.test.block_names[-1] == INTERCEPT
    s2, p2 = split_with_intercept(split, part)
    assert p2.clients[0].blocks == ("b0", INTERCEPT) and p2.clients[1].blocks == ("b1",)
    assert s2.train.block_names[-1] == INTERCEPT and s2.test.block_names[-1] == INTERCEPT


def test_a_block_named_intercept_is_refused(data):
    split, part = data
    rename = {"b0": "b0", "b1": "b1", "b2": INTERCEPT}
    tr, te = (
        HybridDataset(d.name, d.ids, d.y, {rename[b]: x for b, x in d.blocks.items()}, d.classes)
        for d in (split.train, split.test)
    )
    s = DatasetSplit(tr, te)
    p = GridPartitioner(2, 3).partition(s.train)
    with pytest.raises(DataError, match="already has a block named 'intercept'"):
        build_federation("hyfdca", s, p, HyFDCAConfig(**HYFDCA_BEFORE, rounds=1, reference=False))
    off = HyFDCAConfig(**HYFDCA_BEFORE, rounds=1, reference=False, fit_intercept=False)
    build_federation("hyfdca", s, p, off)  # off: fine


@pytest.fixture(scope="module")
def segment_runs(data):
    """HyFDCA segment mode on the grid with and without the intercept (shared by two tests)."""
    split, part = data
    out = {}
    for on in (True, False):
        cfg = HyFDCAConfig(
            **{**HYFDCA_BEFORE, "dual_mode": "segment"},
            loss="logistic",
            lam=1e-2,
            rounds=25 if on else 10,
            eval_every=0,
            fit_intercept=on,
        )
        out[on] = run_hyfdca(split, part, cfg.model_copy(update={"reference": on}))
    return out


@pytest.mark.parametrize("mode", ["segment", "block"])
def test_hyfdca_reaches_the_centralised_optimum_with_intercept(data, segment_runs, mode):
    """A 2 x 3 grid: the intercept block is held by the 3 holders of each sample (block mode: a
    replicated cell, weighted 1/c; segment mode: exact SDCA over the union)."""
    split, part = data
    if mode == "segment":
        res = segment_runs[True]
    else:
        res = run_hyfdca(split, part, HyFDCAConfig(**HYFDCA_BEFORE, loss="logistic", lam=1e-2, rounds=40, eval_every=0))
    central = _centralised(split, part)
    # measured (seed 0): segment 4.4e-8 after 25 rounds (5.4e-7 after 20); block 2.5e-5 after 40
    assert res.summary["relative_suboptimality"] < (1e-6 if mode == "segment" else 1e-4)
    assert res.final["w"].shape == (11,) and res.final["intercept"].shape == (1,)
    assert res.final["intercept"].dtype == np.float64 and res.final["intercept"][0] == res.final["w"][-1]
    np.testing.assert_allclose(
        res.final["intercept"], central.final["intercept"], atol=2e-2 if mode == "block" else 5e-3
    )
    assert res.summary["intercept"] == res.final["intercept"][0] < -1.0


def test_hybrid_fedavg_reaches_the_centralised_optimum_with_intercept(data):
    """Horizontal (every client all blocks and the intercept, disjoint samples): averaged local SGD
    reaches the centralised optimum of the problem with the constant column."""
    split, _ = data
    part = GridPartitioner(3, 1).partition(split.train)
    cfg = HybridFedAvgConfig(loss="logistic", lam=1e-2, rounds=60, local_steps=20, lr=0.5, eval_every=0)
    res = run_hybrid_fedavg(split, part, cfg)
    assert res.summary["relative_suboptimality"] < 1e-3  # measured 1.7e-4
    np.testing.assert_allclose(res.final["intercept"], _centralised(split, part).final["intercept"], atol=0.05)
    off = run_hybrid_fedavg(split, part, cfg.model_copy(update={"fit_intercept": False, "rounds": 2}))
    assert off.final["w"].shape == (10,) and off.final["intercept"].tolist() == [0.0]


def test_intercept_fixes_the_threshold(data, segment_runs):
    """Unbalanced labels: with the intercept the share predicted positive is close to the true
    one; without it a model of centred features flags far too many (the credit data's 48 %)."""
    split, _ = data
    true_rate = float(split.test.y.mean())
    rates = {on: _positive_rate(r.final, split.test) for on, r in segment_runs.items()}
    # measured (seed 0): 23 % predicted positive with the intercept, 51 % without, 24 % true
    assert abs(rates[True] - true_rate) < 0.05, (rates, true_rate)
    assert abs(rates[False] - true_rate) > 0.15, (rates, true_rate)
    assert segment_runs[True].summary["accuracy"] > segment_runs[False].summary["accuracy"] + 0.1


def test_centralised_solver_solves_the_same_problem(data):
    split, part = data
    on, off = _centralised(split, part), _centralised(split, part, fit_intercept=False)
    assert on.final["w"].shape == (11,) and off.final["w"].shape == (10,)
    assert off.final["intercept"].tolist() == [0.0] and on.final["intercept"][0] < -1.0
    # the same problem as liblinear with a constant column of ones (its intercept regularised too)
    from hybridfl.algorithms.convex.reference import liblinear_solve

    X = np.concatenate([split.train.blocks[b] for b in split.train.block_names], axis=1).astype(np.float64)
    ids = np.argsort(split.train.ids)  # the problem's rows are the sorted sample IDs: order does not matter
    Xc = np.hstack([X[ids], np.ones((X.shape[0], 1))])
    w = liblinear_solve(Xc, np.where(split.train.y[ids] == 1, 1.0, -1.0), 1e-2, "logistic", tol=1e-10, max_iter=10000)
    np.testing.assert_allclose(on.final["w"], w, atol=1e-5)


def test_fedbcd_fit_intercept_switches_the_label_partys_bias():
    from hybridfl.algorithms.fedbcd import FedBCDConfig
    from hybridfl.data import VerticalPartitioner

    split = unbalanced(n=300, n_test=100)
    part = VerticalPartitioner(parties=[["b0"], ["b1", "b2"]], label_party=0).partition(split.train)
    for on in (True, False):
        fed = build_federation("fedbcd", split, part, FedBCDConfig(rounds=3, batch_size=64, fit_intercept=on))
        fed.run(monitor=False)
        top = fed.clients["party-0"].top
        assert (top.bias is not None) == on
        if on:
            assert float(top.bias.detach()) < 0  # a quarter positive: the bias moves down
        assert len(list(top.parameters())) == int(on)


def test_resume_of_a_run_from_before_the_option_keeps_it_off(tmp_path):
    """A run directory's config.json holds every field; one without fit_intercept predates it."""
    import json

    from hybridfl.config import run_dir_config

    base = {"seed": 0, "dataset": {"name": "digits"}, "partition": {"kind": "grid"}}
    for algo, want in (({"name": "hyfdca"}, False), ({"name": "hybrid_fedavg", "fit_intercept": True}, True)):
        (tmp_path / "config.json").write_text(json.dumps({**base, "algorithm": algo}))
        assert run_dir_config(tmp_path).algorithm_config().fit_intercept is want
