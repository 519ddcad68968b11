"""Partitions and partitioners: property tests (hypothesis) and validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridfl.data import (
    ClassBlockPartitioner,
    ClassPartitioner,
    ClientShard,
    ClientSpec,
    CoverageWarning,
    DirichletPartitioner,
    GridPartitioner,
    HybridDataset,
    IIDPartitioner,
    Partition,
    VerticalPartitioner,
)
from hybridfl.errors import PartitionError


def make_ds(n: int, n_blocks: int, n_classes: int, seed: int = 0) -> HybridDataset:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    blocks = {f"b{j}": rng.normal(size=(n, 2)).astype(np.float32) for j in range(n_blocks)}
    return HybridDataset("toy", [f"s{i}" for i in range(n)], y, blocks, [str(c) for c in range(n_classes)])


datasets = st.builds(
    make_ds,
    n=st.integers(20, 120),
    n_blocks=st.integers(1, 6),
    n_classes=st.integers(2, 6),
    seed=st.integers(0, 10_000),
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def all_ids(p: Partition) -> list[str]:
    return [s for c in p.clients for s in np.asarray(c.sample_ids).tolist()]


@SETTINGS
@given(ds=datasets, m=st.integers(1, 8), seed=st.integers(0, 1000))
def test_iid_is_a_partition_of_the_samples(ds, m, seed):
    p = IIDPartitioner(m, seed).partition(ds)
    ids = all_ids(p)
    assert sorted(ids) == sorted(ds.ids.tolist())  # every sample exactly once
    sizes = [c.n_samples for c in p.clients]
    assert max(sizes) - min(sizes) <= 1
    assert all(c.blocks == tuple(ds.block_names) for c in p.clients)
    p.validate(ds)


@SETTINGS
@given(ds=datasets, m=st.integers(1, 5), alpha=st.floats(0.1, 10.0), seed=st.integers(0, 1000))
def test_dirichlet_is_a_partition_of_the_samples(ds, m, alpha, seed):
    p = DirichletPartitioner(m, alpha, seed).partition(ds)
    assert sorted(all_ids(p)) == sorted(ds.ids.tolist())
    assert all(c.n_samples >= 1 for c in p.clients)


@SETTINGS
@given(ds=datasets, m=st.integers(1, 8), k=st.integers(1, 3), seed=st.integers(0, 1000))
def test_by_class_clients_hold_only_their_classes(ds, m, k, seed):
    k = min(k, ds.n_classes)
    p = ClassPartitioner(m, k, seed).partition(ds)
    ids = all_ids(p)
    assert len(ids) == len(set(ids))  # disjoint
    for c, owned in zip(p.clients, p.meta["owned_classes"]):
        labels = set(ds.y[ds.positions(c.sample_ids)].tolist())
        assert labels <= set(owned)
    if m * k >= ds.n_classes:
        assert sorted(ids) == sorted(ds.ids.tolist())


@SETTINGS
@given(ds=datasets, parties=st.integers(1, 6), seed=st.integers(0, 3))
def test_vertical_parties_hold_all_samples_and_disjoint_blocks(ds, parties, seed):
    parties = min(parties, len(ds.block_names))
    label = seed % parties
    p = VerticalPartitioner(parties, label_party=label).partition(ds)
    blocks = [b for c in p.clients for b in c.blocks]
    assert sorted(blocks) == sorted(ds.block_names)
    assert all(sorted(c.sample_ids.tolist()) == sorted(ds.ids.tolist()) for c in p.clients)
    assert [c.has_labels for c in p.clients] == [i == label for i in range(parties)]


@SETTINGS
@given(ds=datasets, s=st.integers(1, 4), f=st.integers(1, 6), r=st.integers(1, 2), seed=st.integers(0, 1000))
def test_grid_holds_every_cell_replicas_times(ds, s, f, r, seed):
    f = min(f, len(ds.block_names))
    p = GridPartitioner(s, f, r, seed).partition(ds)
    assert p.n_clients == s * f * r
    held = {}
    for c in p.clients:
        for sid in c.sample_ids:
            for b in c.blocks:
                held[(sid, b)] = held.get((sid, b), 0) + 1
    assert len(held) == ds.n_samples * len(ds.block_names)
    assert set(held.values()) == {r}
    assert p.coverage(ds).unused_share == 0.0


@SETTINGS
@given(ds=datasets, m=st.integers(2, 8), seed=st.integers(0, 1000), overlap=st.sampled_from(["full", "split"]))
def test_class_block_clients_take_their_classes_and_blocks(ds, m, seed, overlap):
    C, B = ds.n_classes, len(ds.block_names)
    part = ClassBlockPartitioner(
        num_clients=m,
        classes_per_client=(1, C),
        blocks_per_client=(1, B),
        overlap=overlap,
        no_full_client=False,
        seed=seed,
    )
    try:
        p = part.partition(ds)
    except PartitionError:
        return  # could not cover every class and block with m clients: a clear error is right
    specs = p.meta["clients"]
    for c, spec in zip(p.clients, specs):
        assert list(c.blocks) == spec["blocks"]
        labels = ds.y[ds.positions(c.sample_ids)]
        assert set(labels.tolist()) <= set(spec["classes"])
        if overlap == "full":  # all samples of its classes
            assert c.n_samples == int(np.isin(ds.y, spec["classes"]).sum())
    assert {k for s in specs for k in s["classes"]} == set(range(C))
    assert {b for s in specs for b in s["blocks"]} == set(ds.block_names)
    if overlap == "split":
        ids = all_ids(p)
        assert len(ids) == len(set(ids)) == ds.n_samples


@SETTINGS
@given(ds=datasets, m=st.integers(1, 6), seed=st.integers(0, 1000))
def test_partitioners_are_reproducible(ds, m, seed):
    for make in (
        lambda: IIDPartitioner(m, seed),
        lambda: DirichletPartitioner(m, 1.0, seed),
        lambda: GridPartitioner(2, 1, 1, seed),
    ):
        a, b = make().partition(ds), make().partition(ds)
        assert [c.sample_ids.tolist() for c in a.clients] == [c.sample_ids.tolist() for c in b.clients]


@SETTINGS
@given(ds=datasets, m=st.integers(1, 6), seed=st.integers(0, 1000))
def test_coverage_matches_brute_force(ds, m, seed):
    rng = np.random.default_rng(seed)
    clients = []
    for i in range(m):
        ids = rng.choice(ds.ids, size=int(rng.integers(1, ds.n_samples + 1)), replace=False)
        blocks = tuple(b for b in ds.block_names if rng.random() < 0.6) or (ds.block_names[0],)
        clients.append(ClientShard(f"c{i}", ids, blocks))
    p = Partition(clients)
    cov = p.coverage(ds)
    for k in range(ds.n_classes):
        for j, b in enumerate(ds.block_names):
            expect = sum(1 for c in clients if b in c.blocks and k in set(ds.y[ds.positions(c.sample_ids)].tolist()))
            assert cov.counts[k, j] == expect
    cells = {(s, b) for c in clients for s in c.sample_ids for b in c.blocks}
    assert cov.unused_share == pytest.approx(1 - len(cells) / (ds.n_samples * len(ds.block_names)))


# ------------------------------------------------------------------------------------ validation


def test_validation_errors_are_one_sentence():
    ds = make_ds(30, 3, 3)
    ok = ClientShard("a", ds.ids[:10], ("b0",))
    cases = {
        "unknown block 'nope'": [ok, ClientShard("b", ds.ids[:5], ("nope",))],
        "holds no samples": [ok, ClientShard("b", np.array([], dtype=str), ("b0",))],
        "holds no feature blocks": [ok, ClientShard("b", ds.ids[:5], ())],
        "more than once": [ok, ClientShard("b", np.array(["s1", "s1"]), ("b0",))],
        "not in dataset": [ok, ClientShard("b", np.array(["zzz"]), ("b0",))],
        "client name 'a' occurs more than once": [ok, ok],
    }
    for needle, clients in cases.items():
        with pytest.raises(PartitionError, match=needle) as e:
            Partition(clients).validate(ds)
        assert str(e.value).count("\n") == 0 and str(e.value).endswith(".")
    with pytest.raises(PartitionError, match="no clients"):
        Partition([]).validate(ds)


def test_unheld_blocks_and_classes_are_warnings():
    ds = make_ds(30, 3, 3)
    only0 = ds.ids[ds.y == 0]
    p = Partition([ClientShard("a", only0, ("b0", "b1"))])
    with pytest.warns(CoverageWarning):
        notes = p.validate(ds)
    assert "block 'b2' is held by no client." in notes
    assert "class '1' is held by no client." in notes and "class '2' is held by no client." in notes


def test_bad_partitioner_parameters():
    ds = make_ds(30, 3, 3)
    with pytest.raises(PartitionError, match="num_clients"):
        IIDPartitioner(0)
    with pytest.raises(PartitionError, match="alpha"):
        DirichletPartitioner(3, alpha=0)
    with pytest.raises(PartitionError, match="unknown block"):
        ClassBlockPartitioner(clients=[ClientSpec([0, 1], ["b0", "zz"])]).partition(ds)
    with pytest.raises(PartitionError, match="outside"):
        ClassBlockPartitioner(clients=[ClientSpec([0, 7], ["b0"])]).partition(ds)
    with pytest.raises(PartitionError, match="label_party"):
        VerticalPartitioner(2, label_party=5)


def test_partition_json_roundtrip(tmp_path):
    ds = make_ds(40, 3, 4)
    p = ClassBlockPartitioner(num_clients=3, classes_per_client=(2, 3), blocks_per_client=2, seed=3).partition(ds)
    p.save(tmp_path / "p.json")
    q = Partition.load(tmp_path / "p.json")
    assert [(c.client_id, c.blocks, c.sample_ids.tolist()) for c in p.clients] == [
        (c.client_id, c.blocks, c.sample_ids.tolist()) for c in q.clients
    ]


@SETTINGS
@given(seed=st.integers(0, 1000), need=st.integers(1, 2))
def test_class_block_min_cell_coverage(seed, need):
    ds = make_ds(60, 4, 4, seed)
    try:
        p = ClassBlockPartitioner(
            num_clients=6, classes_per_client=(2, 3), blocks_per_client=(2, 3), min_cell_coverage=need, seed=seed
        ).partition(ds)
    except PartitionError as e:
        assert "5000 draws" in str(e)
        return
    assert p.coverage(ds).counts.min() >= need
