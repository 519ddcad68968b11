"""HyFEM server steps: extractor averaging closed form, messages, client model views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridfl.algorithms.hyfem import HyFEMConfig, HyFEMServer
from hybridfl.runtime.messages import Message, decode, encode, pack_arrays

SCHEMA = {"a": (5,), "b": (3,), "c": (4,)}


def _reply(sender, blocks, n, server, rng):
    payload = {"n_samples": n}
    for blk in blocks:
        arrs = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in server.model.extractor_arrays(blk).items()}
        payload.update(pack_arrays(f"ext.{blk}.", arrs))
    return Message("hyfem.fit", sender, "server", 1, payload)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(1, 50), min_size=3, max_size=3))
def test_extractor_average_is_the_closed_form_minimiser(seed, sizes):
    """theta_0,b = argmin sum_{m holds b} p_m ||theta_m,b - theta||^2 (HyFEM (10)): equal to the
    p_m-weighted mean, and any perturbation increases the objective; block 'c', held by nobody,
    keeps its value."""
    rng = np.random.default_rng(seed)
    server = HyFEMServer(SCHEMA, 3, HyFEMConfig(hidden=4, extractor_dim=2, baselines=False), seed=0)
    holders = {"x": ["a", "b"], "y": ["a"], "z": ["b"]}
    server.clients = {cid: {"blocks": bl} for cid, bl in holders.items()}
    replies = [_reply(cid, bl, n, server, rng) for (cid, bl), n in zip(holders.items(), sizes)]
    before_c = server.model.extractor_arrays("c")
    server.aggregate_extractors(replies)
    after = {b: server.model.extractor_arrays(b) for b in SCHEMA}
    for blk in ("a", "b"):
        hs = [(r, n) for r, n in zip(replies, sizes) if blk in holders[r.sender]]
        for key, val in after[blk].items():
            vals = [r.payload[f"ext.{blk}.{key}"].astype(np.float64) for r, _ in hs]
            w = np.array([n for _, n in hs], float)
            expect = sum(wi * v for wi, v in zip(w, vals)) / w.sum()
            assert np.allclose(val, expect, atol=1e-5)

            def objective(theta):
                return sum(wi * ((v - theta) ** 2).sum() for wi, v in zip(w, vals))

            d = rng.normal(size=val.shape) * 1e-2
            assert objective(val) <= objective(val + d) + 1e-9
    for key in before_c:
        assert np.array_equal(before_c[key], after["c"][key])


@settings(max_examples=50, deadline=None)
@given(
    arrays=st.dictionaries(
        st.text("abc.", min_size=1, max_size=5),
        st.tuples(st.integers(0, 4), st.integers(0, 3), st.sampled_from(["float32", "float64", "int64"])),
        max_size=4,
    ),
    scalars=st.dictionaries(
        st.text("xyz", min_size=1, max_size=3),
        st.one_of(st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=5)),
        max_size=3,
    ),
)
def test_message_codec_roundtrip(arrays, scalars):
    rng = np.random.default_rng(0)
    payload = {f"arr:{k}": rng.normal(size=(r, c)).astype(dt) for k, (r, c, dt) in arrays.items()}
    payload.update({f"s:{k}": v for k, v in scalars.items()})
    payload["blob"] = b"\x00\x01ciphertext"
    msg = Message("kind.x", "server", "client-1", 7, payload)
    raw = encode(msg)
    back = decode(raw)
    assert (back.kind, back.sender, back.receiver, back.round) == ("kind.x", "server", "client-1", 7)
    assert set(back.payload) == set(payload)
    for k, v in payload.items():
        if isinstance(v, np.ndarray):
            assert back.payload[k].dtype == v.dtype and np.array_equal(back.payload[k], v)
        else:
            assert back.payload[k] == v
    assert len(raw) >= sum(v.nbytes for v in payload.values() if isinstance(v, np.ndarray))


def test_codec_rejects_unsupported_values():
    with pytest.raises(TypeError, match="'obj'"):
        encode(Message("k", "a", "b", 0, {"obj": object()}))


def test_client_model_is_the_server_view_and_predicts_like_it():
    """The model a client receives equals the server model on the client's blocks when the other
    blocks' columns are zero: P_m Theta_0 and Pi_m w_0 select, they do not change values."""
    torch.manual_seed(0)
    cfg = HyFEMConfig(hidden=6, extractor_dim=2, baselines=False)
    server = HyFEMServer(SCHEMA, 3, cfg, seed=0)
    from hybridfl.models.hybrid import block_columns

    server.clients["x"] = {
        "blocks": ["a", "c"],
        "columns": block_columns(["a", "c"], list(SCHEMA), 2),
        "assignment": np.array([5, 0, 2, 1, 4, 3]),
    }
    cm = server.client_model("x")
    x = {b: torch.randn(7, *s) for b, s in SCHEMA.items()}
    W1 = server.classifier.W1.copy()
    server_out_cols = server.model.features(x).detach().numpy()
    cols = server.clients["x"]["columns"]
    h = np.maximum(
        server_out_cols[:, cols] @ W1[[5, 0, 2, 1, 4, 3]][:, cols].T + server.classifier.b1[[5, 0, 2, 1, 4, 3]], 0
    )
    logits = h @ server.classifier.W2[:, [5, 0, 2, 1, 4, 3]].T + server.classifier.b2
    assert np.allclose(cm(x).detach().numpy(), logits, atol=1e-5)


def test_model_for_blocks_cuts_the_server_model():
    """HyFEM Remark 2: a model for any block subset is cut from the server model; for all blocks
    it is the server model itself, for a subset it equals the server with the other blocks'
    classifier columns removed."""
    torch.manual_seed(1)
    server = HyFEMServer(SCHEMA, 3, HyFEMConfig(hidden=5, extractor_dim=2, baselines=False), seed=1)
    x = {b: torch.randn(4, *s) for b, s in SCHEMA.items()}
    full = server.model_for_blocks(list(SCHEMA))
    assert torch.allclose(full(x), server.model(x), atol=1e-6)
    sub = server.model_for_blocks(["c", "a"])  # order follows the global block order
    assert sub.blocks == ("a", "c")
    v = server.model.features(x).detach().numpy()
    cols = np.r_[0:2, 4:6]
    h = np.maximum(v[:, cols] @ server.classifier.W1[:, cols].T + server.classifier.b1, 0)
    assert np.allclose(sub(x).detach().numpy(), h @ server.classifier.W2.T + server.classifier.b2, atol=1e-5)


def _shard(cid, split, rows, blocks):
    from hybridfl.data.partition import ClientShard

    return ClientShard(cid, split.train.ids[rows], tuple(blocks))


def test_held_cells_match_the_partition_coverage(mfeat_split):
    """The pooled rows and block mask of "centralised on the held cells" are exactly the
    (sample, block) cells some client holds: their complement is the partition's unused share."""
    from hybridfl.algorithms.hyfem.baselines import held_cells
    from hybridfl.data.partition import Partition

    split = mfeat_split
    names = split.train.block_names
    y = split.train.y
    part = Partition(
        [
            _shard("a", split, np.flatnonzero(y < 5), names[:3]),
            _shard("b", split, np.flatnonzero((y >= 3) & (y < 8)), names[2:5]),
        ]
    )
    rows, mask = held_cells(split, part)
    assert rows.tolist() == np.flatnonzero(y < 8).tolist()  # classes 8 and 9: nobody
    assert mask[y[rows] < 3].tolist() == [[True] * 3 + [False] * 3] * int((y < 3).sum())
    assert mask[(y[rows] >= 3) & (y[rows] < 5)].all(axis=0).tolist() == [True] * 5 + [False]
    assert 1 - mask.sum() / (y.size * len(names)) == pytest.approx(part.coverage(split.train).unused_share)


def test_centralized_on_held_cells_is_centralized_when_everything_is_held_and_ignores_unheld_blocks(mfeat_split):
    """With every cell held, the held-cells bound is the centralised baseline step for step (same
    initialisation, batches and weights); an unheld block's extractor gets no gradient (its output
    is zero-padded, HyFEM Appendix A) and keeps its initial weights."""
    from hybridfl.algorithms.hyfem.baselines import (
        make_model_factory,
        train_centralized,
        train_centralized_held,
    )
    from hybridfl.data.partition import Partition
    from hybridfl.models.hybrid import default_extractor

    split = mfeat_split
    names = split.train.block_names
    make = make_model_factory(split, 4, 8, default_extractor("mlp"))
    n = split.train.n_samples
    everything = Partition(
        [_shard("a", split, np.arange(n // 2), names), _shard("b", split, np.arange(n // 2, n), names)]
    )
    m1, acc1 = train_centralized(split, make, 40, 16, 0.05, 0.9, seed=3)
    m2, acc2 = train_centralized_held(split, everything, make, 40, 16, 0.05, 0.9, seed=3)
    assert acc1 == acc2
    for k, v in m1.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    partial = Partition([_shard("a", split, np.arange(n), names[1:])])  # block names[0] held by nobody
    torch.manual_seed(3)
    init = make(names).extractor_arrays(names[0])
    m3, _ = train_centralized_held(split, partial, make, 40, 16, 0.05, 0.9, seed=3)
    for k, v in m3.extractor_arrays(names[0]).items():
        assert np.array_equal(v, init[k]), k
    torch.manual_seed(3)
    init1 = make(names).extractor_arrays(names[1])
    assert not np.array_equal(
        m3.extractor_arrays(names[1])["net.0.weight"], init1["net.0.weight"]
    )  # a held block trains


# ---------------------------------------------------------------- batched clients (issue 17)
_BATCH_BLOCKS = ["top_left", "top_right", "bottom_left"]


def _batched_run(batched: bool, flatten: bool = False, **kw):
    """2 rounds of HyFEM on the digits as 4x4 image quadrants (CNN extractors): 3 clients with the
    same 3 blocks and one with 2 blocks (its classifier has another shape); ``flatten``: MLP
    extractors on the flattened quadrants instead."""
    from hybridfl.algorithms.hyfem import SPEC
    from hybridfl.data import load_digits
    from hybridfl.data.partitioners import ClassBlockPartitioner
    from hybridfl.runtime.simulation import build_federation, single_threaded

    split = load_digits(flatten=flatten)
    part = ClassBlockPartitioner(
        clients=[
            {"classes": [0, 1, 2, 3, 4, 5], "blocks": _BATCH_BLOCKS},
            {"classes": [4, 5, 6, 7, 8, 9], "blocks": _BATCH_BLOCKS},
            {"classes": [0, 2, 4, 6, 8], "blocks": _BATCH_BLOCKS},
            {"classes": [1, 3, 5, 7, 9], "blocks": ["top_left", "bottom_right"]},
        ]
    ).partition(split.train)
    cfg = HyFEMConfig(rounds=2, local_steps=10, momentum=0.9, baselines=False, batched_clients=batched, **kw)
    fed = build_federation(SPEC, split, part, cfg, seed=2)
    fed.setup()
    with single_threaded():
        losses = [fed.server.run_round(r, fed.transport)["train_loss"] for r in (1, 2)]
    return fed, losses


@pytest.mark.parametrize(
    ("flatten", "kw"),
    [(False, {}), (False, {"variant": "prox", "mu1": 0.1, "mu2": 0.05}), (True, {})],
    ids=["cnn-avg", "cnn-prox", "mlp-avg"],
)
def test_batched_clients_equal_the_sequential_simulation(flatten, kw, monkeypatch):
    """The same seed, init and per-client mini-batches: batched training (each block's extractor
    vmap-ed over its holders, each classifier shape over its clients) equals training the clients
    one after another up to float32 rounding. Tolerance
    1e-5 absolute on weights of magnitude ~1 (float32 eps is 1.2e-7; the batched convolutions and
    matrix products sum in another order, and 20 SGD steps with momentum 0.9 may amplify a few ulps;
    measured: 1.2e-7) and 1e-6 on the mean losses."""
    from hybridfl.algorithms.hyfem import batched

    trained = []
    real = batched.prefit
    monkeypatch.setattr(batched, "prefit", lambda c, m: trained.append(real(c, m)) or trained[-1])
    import hybridfl.algorithms.hyfem.server as server_mod

    monkeypatch.setattr(server_mod, "prefit", batched.prefit)
    seq, ls = _batched_run(False, flatten, **kw)
    assert trained == []  # off by default: nothing is batched
    bat, lb = _batched_run(True, flatten, **kw)
    assert trained == [4, 4]  # all four clients (3 of them with the same blocks), in each round
    assert np.allclose(ls, lb, rtol=0, atol=1e-6)
    sa, ma = seq.server.get_state()
    sb, mb = bat.server.get_state()
    assert ma["clients"] == mb["clients"]  # the same matching assignments
    for k in sa:
        assert np.allclose(sa[k], sb[k], rtol=0, atol=1e-5), k
    for cid, c in seq.clients.items():
        for (name, p), q in zip(c.model.named_parameters(), bat.clients[cid].model.parameters()):
            assert torch.allclose(p, q, rtol=0, atol=1e-5), (cid, name)
        # the generators advanced exactly as in the sequential run
        assert torch.equal(c.trainer.gen.get_state(), bat.clients[cid].trainer.gen.get_state())


def test_a_prefit_is_used_only_for_the_very_message_it_was_trained_on():
    """A client trained in a batch replies with that model only for the same message; any other
    message (another round or other weights) trains as usual."""
    from hybridfl.algorithms.hyfem.batched import fit_digest

    fed, _ = _batched_run(False)
    server = fed.server
    cid = next(iter(server.clients))
    m1 = server.fit_message(cid, 3)
    m2 = server.fit_message(cid, 4)
    assert fit_digest(m1) != fit_digest(m2)
    client = fed.clients[cid]
    client._prefit = (fit_digest(m2), 123.0)
    reply = client.fit(m1)  # not the message of the prefit: trains
    assert reply.payload["loss"] != 123.0
    assert client._prefit is None  # used up either way
