"""Scale without changing results (issue 17): the faster evaluation path of the CNN extractors, the
vectorised sample-ID lookups and the partitioner working on row positions give exactly what the
previous code gave. Each reference below is the previous computation, written out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridfl.algorithms.hyfem import SPEC, HyFEMConfig
from hybridfl.algorithms.spec import EvalContext
from hybridfl.data import ClassBlockPartitioner, ClientShard, ClientSpec, HybridDataset, Partition, load_digits
from hybridfl.errors import DataError, PartitionError
from hybridfl.models.hybrid import EVAL_BATCH, CNNExtractor, HybridModel, MaxPool2x2
from hybridfl.runtime.simulation import build_federation, single_threaded


def _old_pool(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.max_pool2d(x, 2)


@pytest.mark.parametrize("shape", [(5, 8, 14, 14), (3, 16, 7, 7), (2, 3, 9, 6), (4, 1, 5, 5)])
def test_pooling_without_autograd_is_max_pool2d(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    x[0, 0, :2, :2] = 0.5  # a tie
    with torch.no_grad():
        got = MaxPool2x2()(x)
    assert got.shape == _old_pool(x).shape
    assert torch.equal(got, _old_pool(x))


@pytest.mark.parametrize("shape", [(1, 14, 14), (3, 15, 13), (2, 8, 8)])
def test_cnn_extractor_evaluation_path_equals_the_autograd_path(shape):
    """Without autograd the ReLU runs after the pooling, in place: bit for bit the old values."""
    torch.manual_seed(0)
    ext = CNNExtractor(shape, 32)
    x = torch.rand((300, *shape), generator=torch.Generator().manual_seed(2)) - 0.3
    with torch.enable_grad():
        want = ext(x).detach()  # nn.MaxPool2d after each ReLU, as before
    with torch.no_grad():
        a = ext(x)
    with torch.inference_mode():
        b = torch.cat([ext(x[s : s + 128]) for s in range(0, 300, 128)])
    assert torch.equal(a, want) and torch.equal(b, want)
    assert not x.requires_grad and (x < 0).any()  # the input is untouched (in-place ReLU on the pooled copy)


def _old_accuracy(model: HybridModel, test: HybridDataset) -> float:
    """A model's test accuracy the way it was computed before: autograd on, ``nn.MaxPool2d``."""
    with torch.enable_grad():
        pred = [
            model({b: torch.from_numpy(test.blocks[b][s : s + EVAL_BATCH]) for b in model.blocks}).argmax(1).numpy()
            for s in range(0, test.n_samples, EVAL_BATCH)
        ]
    return float(np.mean(np.concatenate(pred) == test.y))


def test_hyfem_metrics_equal_the_old_computation_on_image_blocks():
    """A tiny HyFEM run with CNN extractors: every metric of the final evaluation (the clients'
    local models after Q steps, their received models, the server) equals the old way's."""
    split = load_digits(flatten=False)
    part = ClassBlockPartitioner(
        clients=[
            {"classes": [0, 1, 2, 3, 4, 5], "blocks": ["top_left", "top_right", "bottom_left"]},
            {"classes": [4, 5, 6, 7, 8, 9], "blocks": ["top_right", "bottom_left", "bottom_right"]},
            {"classes": [0, 2, 4, 6, 8], "blocks": ["top_left", "bottom_right"]},
        ]
    ).partition(split.train)
    cfg = HyFEMConfig(rounds=2, local_steps=5, baselines=False)
    fed = build_federation(SPEC, split, part, cfg, seed=3)
    fed.setup()
    test = fed.server_data.test
    with single_threaded():
        for rnd in (1, 2):
            fed.server.run_round(rnd, fed.transport)
        got = SPEC.evaluate(EvalContext(fed.server, 2, cfg, fed.server_data, None, fed.clients))
        local = [_old_accuracy(c.model, test) for c in fed.clients.values()]
        received = {cid: _old_accuracy(fed.server.client_model(cid), test) for cid in fed.server.clients}
        server = _old_accuracy(fed.server.model, test)
    assert got["server_accuracy"] == server
    assert got["client_accuracy_local_mean"] == float(np.mean(local))
    assert got["client_accuracy_mean"] == float(np.mean(list(received.values())))
    assert {cid: got[f"client_accuracy[{cid}]"] for cid in received} == received
    assert 0.2 < server < 1.0  # trained, not a constant


def _shuffled_ds(n: int = 150, n_classes: int = 4, seed: int = 0) -> HybridDataset:
    """Unpadded IDs in shuffled rows: string order, row order and insertion order all differ."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"s{i}" for i in rng.permutation(n)])
    y = rng.integers(0, n_classes, n)
    blocks = {f"b{j}": rng.normal(size=(n, 2)).astype(np.float32) for j in range(3)}
    return HybridDataset("toy", ids, y, blocks, [str(c) for c in range(n_classes)])


def _old_class_block(
    ds: HybridDataset, specs: list[ClientSpec], overlap: str, rng: np.random.Generator
) -> list[np.ndarray]:
    """ClassBlockPartitioner's sample IDs as computed before: lists of ID strings, one string sort."""
    holders = {k: [i for i, s in enumerate(specs) if k in s.classes] for k in range(ds.n_classes)}
    buckets: list[list[str]] = [[] for _ in specs]
    for k, hs in holders.items():
        ids = ds.ids[ds.y == k]
        if not hs:
            continue
        if overlap == "full":
            for i in hs:
                buckets[i].extend(ids.tolist())
        else:
            for i, part in zip(hs, [np.sort(a) for a in np.array_split(ids[rng.permutation(ids.size)], len(hs))]):
                buckets[i].extend(part.tolist())
    return [np.sort(np.array(b, dtype=str)) for b in buckets]


@pytest.mark.parametrize("overlap", ["full", "split"])
@pytest.mark.parametrize("seed", [0, 7])
def test_class_block_partition_equals_the_string_based_one(overlap, seed):
    ds = _shuffled_ds(seed=seed)
    specs = [ClientSpec([0, 1], ["b0", "b1"]), ClientSpec([1, 2, 3], ["b1", "b2"]), ClientSpec([0, 3], ["b0"])]
    got = ClassBlockPartitioner(clients=specs, overlap=overlap, seed=seed).partition(ds)
    want = _old_class_block(ds, specs, overlap, np.random.default_rng(seed))
    for c, w in zip(got.clients, want):
        assert np.asarray(c.sample_ids).tolist() == w.tolist()
    partitioner = ClassBlockPartitioner(num_clients=5, classes_per_client=(2, 3), overlap=overlap, seed=seed)
    drawn = partitioner.partition(ds)
    rng = np.random.default_rng(seed)
    specs = partitioner._draw(ds, rng)  # the same draws, then the same generator for the split
    assert [list(s.classes) for s in specs] == [c["classes"] for c in drawn.meta["clients"]]
    for c, w in zip(drawn.clients, _old_class_block(ds, specs, overlap, rng)):
        assert np.asarray(c.sample_ids).tolist() == w.tolist()


def test_positions_and_find_equal_the_dictionary_lookup():
    ds = _shuffled_ds()
    index = {s: i for i, s in enumerate(ds.ids)}
    q = np.array(["s5", "s0", "s149", "s77", "s5"])
    assert ds.positions(q).tolist() == [index[s] for s in q]
    assert ds.positions(list(q)).tolist() == [index[s] for s in q]  # any iterable
    assert ds.positions([]).tolist() == []
    rows, found = ds.find(["s3", "nope", "s10", "s99x"])
    assert found.tolist() == [True, False, True, False]
    assert rows[[0, 2]].tolist() == [index["s3"], index["s10"]]
    with pytest.raises(DataError, match=r"sample ID 'nope' \(client c\) is not in dataset 'toy'"):
        ds.positions(["s1", "nope", "zzz"], where="client c")
    view = ds.view(ds.ids[::3])
    assert view.positions(["s0", view.ids[-1]]).tolist() == [list(view.ids).index("s0"), view.n_samples - 1]
    with pytest.raises(DataError, match="sample ID 's4' occurs more than once"):
        HybridDataset("toy", ["s9", "s4", "s1", "s4", "s9"], [0] * 5, {"b": np.zeros((5, 1))}, ["0"])


def test_validate_reports_what_it_reported_before():
    ds = _shuffled_ds()
    ok = Partition([ClientShard("a", ds.ids[:40], ("b0",)), ClientShard("b", ds.ids[30:], ("b1", "b2"))])
    assert ok.validate(ds) == []
    dup = Partition([ClientShard("a", np.array(["s9", "s4", "s1", "s4", "s9"]), ("b0",))])
    with pytest.raises(PartitionError, match="client 'a' lists sample ID 's4' more than once"):
        dup.validate(ds)
    dup_unknown = Partition([ClientShard("a", np.array(["zz", "s9", "zz", "s1"]), ("b0",))])
    with pytest.raises(PartitionError, match="lists sample ID 'zz' more than once"):
        dup_unknown.validate(ds)
    unknown = Partition([ClientShard("a", np.array(["s1", "zz", "yy"]), ("b0",))])
    with pytest.raises(PartitionError, match="holds sample ID 'yy', which is not in dataset 'toy'"):
        unknown.validate(ds)  # the smallest unknown ID, as np.setdiff1d finds it
    one_class = ds.ids[ds.y == 0]
    part = Partition(
        [ClientShard("a", one_class, ("b0", "b1", "b2")), ClientShard("b", ds.ids, ("b0",), has_labels=False)]
    )
    with pytest.warns(UserWarning):
        notes = part.validate(ds)
    assert notes == [f"class {k!r} is held by no client." for k in ("1", "2", "3")]  # unlabelled rows do not count


def test_sorted_id_cache_describes_each_dataset_s_own_rows():
    """Views and takes get their own sorted IDs (not their parent's); ``sorted_ids`` is ``np.sort``."""
    ds = _shuffled_ds()
    ds.positions(["s1"])  # the parent's cache exists before the children are made
    sub = ds.take(np.arange(10, 60))
    assert sub.positions(sub.ids[::-1]).tolist() == list(range(49, -1, -1))
    view = ds.view(ds.ids[5:40][::-1])
    assert view.positions(view.ids).tolist() == list(range(35))
    with pytest.raises(DataError, match="is not in dataset"):
        view.positions([ds.ids[0]])
    rows = np.array([5, 1, 9, 120, 0])
    assert ds.sorted_ids(rows).tolist() == np.sort(ds.ids[rows]).tolist()
