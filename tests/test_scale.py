"""Scale and speed (issue 17): HyFEM's evaluation computes each distinct model once and gives the
same metrics as evaluating every client's model on its own; clients index one shared dataset
instead of copying their rows."""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.hyfem import SPEC, HyFEMConfig
from hybridfl.algorithms.hyfem.baselines import accuracy
from hybridfl.algorithms.spec import EvalContext
from hybridfl.data import load_digits
from hybridfl.data.partitioners import ClassBlockPartitioner
from hybridfl.runtime.simulation import build_federation, single_threaded


class SubsampledConfig(HyFEMConfig):
    """HyFEM's config with the evaluation's ``test_subsample``."""

    test_subsample: int = 0


def reference(fed, rnd: int, last: bool = True) -> dict[str, float]:
    """The metrics as HyFEM's evaluation computed them before: every model on its own, whole (the
    clients' own models after the ``last`` round only)."""
    test = fed.server_data.test
    server = fed.server
    row = {"server_accuracy": accuracy(server.model, test)}
    local = {cid: accuracy(server.client_model(cid), test) for cid in server.clients}
    row["client_accuracy_mean"] = float(np.mean(list(local.values())))
    if last:
        row["client_accuracy_local_mean"] = float(np.mean([accuracy(c.model, test) for c in fed.clients.values()]))
    row.update({f"client_accuracy[{cid}]": v for cid, v in local.items()})
    return row


@pytest.fixture(scope="module")
def image_fed():
    """HyFEM on the digits as 4x4 image quadrants (conv extractors), 5 clients, 2 of them with the
    same blocks and classes (so that they may receive the same model)."""
    split = load_digits(flatten=False)
    part = ClassBlockPartitioner(
        clients=[
            {"classes": [0, 1, 2, 3, 4, 5], "blocks": ["top_left", "top_right", "bottom_left"]},
            {"classes": [0, 1, 2, 3, 4, 5], "blocks": ["top_left", "top_right", "bottom_left"]},
            {"classes": [4, 5, 6, 7, 8, 9], "blocks": ["top_right", "bottom_left", "bottom_right"]},
            {"classes": [0, 2, 4, 6, 8], "blocks": ["top_left", "bottom_right"]},
            {"classes": [1, 3, 5, 7, 9], "blocks": ["top_left", "top_right", "bottom_left", "bottom_right"]},
        ]
    ).partition(split.train)
    cfg = SubsampledConfig(rounds=3, local_steps=10, baselines=False, test_subsample=100)
    fed = build_federation(SPEC, split, part, cfg, seed=2)
    fed.setup()
    return fed, cfg


def test_evaluation_gives_the_metrics_of_every_model_on_its_own(image_fed):
    fed, cfg = image_fed
    full = cfg.model_copy(update={"test_subsample": 0, "rounds": 2})
    with single_threaded():
        for rnd in (1, 2):
            fed.server.run_round(rnd, fed.transport)
            got = SPEC.evaluate(EvalContext(fed.server, rnd, full, fed.server_data, None, fed.clients))
            want = reference(fed, rnd, last=rnd == full.rounds)
            assert got == want, rnd  # bit for bit: the same batches through the same weights


def test_test_subsample_for_per_client_metrics_and_the_last_round_in_full(image_fed):
    fed, cfg = image_fed
    with single_threaded():
        sub = SPEC.evaluate(EvalContext(fed.server, 1, cfg, fed.server_data, None, fed.clients))
        last = SPEC.evaluate(EvalContext(fed.server, cfg.rounds, cfg, fed.server_data, None, fed.clients))
        want = reference(fed, cfg.rounds)
    assert last == want
    assert sub["server_accuracy"] == want["server_accuracy"]  # the server model always on every sample
    n = fed.server_data.test.n_samples
    for k, v in sub.items():
        if k.startswith("client_accuracy["):
            assert round(v * 100) == pytest.approx(v * 100)  # a share of the 100 subsampled samples
    # the clients' own models (each a whole model) are scored once, after the last round
    assert 0 < n and sub.keys() == want.keys() - {"client_accuracy_local_mean"}


def _big_split(n: int = 400, d: int = 2500):
    from hybridfl.data.dataset import DatasetSplit, HybridDataset

    rng = np.random.default_rng(0)

    def ds(prefix: str, m: int) -> HybridDataset:
        blocks = {b: rng.standard_normal((m, d)).astype(np.float32) for b in ("a", "b")}
        return HybridDataset("big", [f"{prefix}{i}" for i in range(m)], rng.integers(0, 2, m), blocks, ["0", "1"])

    return DatasetSplit(ds("tr", n), ds("te", 50))


def test_clients_holding_the_same_rows_share_them():
    """Two clients with the same rows and blocks take no more memory than one: their data are views
    of the one training set (tracemalloc), equal to copies of their rows."""
    import tracemalloc

    from hybridfl.data.partition import ClientShard, Partition
    from hybridfl.runtime.simulation import client_data

    split = _big_split()
    ids = split.train.ids[::2]  # every other row: a gather, not a slice
    one_client_bytes = 2 * len(ids) * split.train.blocks["a"].shape[1] * 4

    def traced(n_clients: int) -> int:
        part = Partition([ClientShard(f"c{k}", ids, ("a", "b")) for k in range(n_clients)])
        tracemalloc.start()
        cds = client_data(split, part, with_test=True)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(cds) == n_clients
        return peak

    one, two = traced(1), traced(2)
    assert one < 0.1 * one_client_bytes and two < 0.1 * one_client_bytes  # no features copied at all
    part = Partition([ClientShard(f"c{k}", ids, ("a", "b"), has_labels=k == 0) for k in range(2)])
    cds = client_data(split, part)
    want = split.train.subset(ids, ["a", "b"])
    for cd in cds:
        base, rows = cd.data.row_source("b")
        assert base is split.train.blocks["b"]  # the shared array itself
        np.testing.assert_array_equal(base[rows], want.blocks["b"])
        np.testing.assert_array_equal(cd.data.blocks["a"], want.blocks["a"])  # read whole: gathered once
        assert cd.data.block_shapes == want.block_shapes and cd.data.n_samples == want.n_samples
        assert list(cd.data.ids) == list(want.ids)
    np.testing.assert_array_equal(cds[0].data.y, want.y)
    assert not cds[1].data.y.any()  # no labels: zeros
    assert cds[1].data.positions([ids[3]]).tolist() == [3]
