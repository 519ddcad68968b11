"""FedSGD / FedBCD (issue 4): correctness against central training and against a plain NumPy
reference of the paper's update rules, the message log, state round trips and input errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from hybridfl.algorithms.fedbcd import SPEC, FedBCDConfig, fedbcd_spec, party_input, run_fedbcd
from hybridfl.config import parse_config
from hybridfl.data import VerticalPartitioner
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import ConfigError, DataError, PartitionError, ProtocolError
from hybridfl.models.towers import LinearTop, MLPTower
from hybridfl.runtime.messages import Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError


def synthetic(n=400, dims=(5, 4, 3), seed=0, classes=2, n_test=200) -> DatasetSplit:
    rng = np.random.default_rng(seed)
    out = []
    for part, m in (("train", n), ("test", n_test)):
        xs = {f"b{i}": rng.normal(size=(m, d)).astype(np.float32) for i, d in enumerate(dims)}
        z = sum(x @ np.linspace(-1, 1, x.shape[1]) for x in xs.values())
        y = (z > 0).astype(np.int64) if classes == 2 else rng.integers(0, classes, m)
        out.append(
            HybridDataset("synthetic", [f"{part}-{i}" for i in range(m)], y, xs, [str(c) for c in range(classes)])
        )
    return DatasetSplit(*out)


def vertical(split, k=3, label_party=1):
    return VerticalPartitioner(parties=[[b] for b in split.train.block_names[:k]], label_party=label_party).partition(
        split.train
    )


def build(split, part, cfg, seed=0, recorder=None, spec="fedbcd"):
    """``(coordinator, parties, transport)`` of a simulated FedBCD federation."""
    fed = build_federation(spec, split, part, cfg, seed, recorder=recorder)
    return fed.server, fed.clients, fed.transport


def record_batches(server):
    batches = []
    orig = server.sample_batch

    def sample():
        b = orig()
        batches.append(b.copy())
        return b

    server.sample_batch = sample
    return batches


def run_rounds(server, transport, rounds):
    server.setup(transport, transport.client_ids)
    for r in range(1, rounds + 1):
        server.run_round(r, transport)


def params_of(parties, order):
    out = []
    for cid in order:
        p = parties[cid]
        out += [t.detach().clone() for t in p.bottom.parameters()]
        if p.is_label:
            out += [t.detach().clone() for t in p.top.parameters()]
    return out


# ------------------------------------------------------------------ FedSGD == central SGD


@pytest.mark.parametrize(
    "model,top,optimizer",
    [
        ("linear", "party_slice", "sgd"),
        ("mlp", "party_slice", "sgd"),
        ("mlp", "concat", "sgd"),
        ("mlp", "party_slice", "adam"),
        ("mlp", "concat", "adam"),
    ],
)
def test_fedsgd_equals_central_training_on_the_joint_model(model, top, optimizer):
    """The split model's gradients equal those of the same model trained centrally: after every
    FedSGD round the parties' parameters equal those of central mini-batch training on the joint
    model (same initial weights, batches and step sizes eta_0 / sqrt(t + 1), L2 included), in both
    layouts of the top layer (the paper's party slices, the wide concatenated top). With
    ``optimizer: adam`` (the reference code's MNIST-CNN choice; Adam works per coordinate) the
    central run is ``torch.optim.Adam`` on the joint model, the step settings name the optimizer,
    and the run ends elsewhere than with ``sgd``."""
    split = synthetic()
    part = vertical(split)
    order = [c.client_id for c in part.clients]
    cfg = FedBCDConfig(
        variant="sgd",
        rounds=6,
        batch_size=32,
        lr=0.3 if optimizer == "sgd" else 0.01,
        l2=0.01,
        model=model,
        representation_dim=8,
        hidden=16,
        top=top,
        optimizer=optimizer,
    )
    server, parties, transport = build(split, part, cfg, seed=4)
    assert server._common(1).get("optimizer") == (None if optimizer == "sgd" else "adam")
    label = next(p for p in parties.values() if p.is_label)
    bottoms = {cid: copy.deepcopy(parties[cid].bottom) for cid in order}
    top_model = copy.deepcopy(label.top)
    xs = {c.client_id: torch.from_numpy(party_input(split.train, list(c.blocks))) for c in part.clients}
    y = torch.from_numpy(split.train.y.astype(np.float32))
    batches = record_batches(server)
    server.setup(transport, transport.client_ids)
    # same parameter order as params_of: each party's bottom, the label party's top after its bottom
    central_params = []
    for cid in order:
        central_params += list(bottoms[cid].parameters())
        if parties[cid].is_label:
            central_params += list(top_model.parameters())
    adam = torch.optim.Adam(central_params, lr=cfg.lr) if optimizer == "adam" else None
    for rnd in range(1, cfg.rounds + 1):
        server.run_round(rnd, transport)
        s = torch.from_numpy(batches[rnd - 1])  # aligned order = dataset order here
        logits = top_model([bottoms[cid](xs[cid][s]) for cid in order])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y[s])
        loss = loss + 0.5 * cfg.l2 * sum((p**2).sum() for p in central_params)
        if adam is None:
            grads = torch.autograd.grad(loss, central_params)
            with torch.no_grad():
                for p, g in zip(central_params, grads):
                    p -= cfg.step_size(rnd - 1) * g
        else:
            adam.zero_grad()
            loss.backward()
            adam.param_groups[0]["lr"] = cfg.step_size(rnd - 1)
            adam.step()
        fed = params_of(parties, order)
        assert len(fed) == len(central_params)
        for a, b in zip(fed, central_params):
            torch.testing.assert_close(
                a, b.detach(), rtol=1e-5 if adam is None else 1e-4, atol=1e-6 if adam is None else 1e-5
            )
    # training actually moved the parameters away from the initial ones
    init = build(split, part, cfg, seed=4)[1]
    assert any(not torch.equal(a, b) for a, b in zip(params_of(parties, order), params_of(init, order)))
    if adam is not None:  # Adam is not SGD: the same run with optimizer sgd ends elsewhere
        sgd_server, sgd_parties, sgd_t = build(split, part, cfg.model_copy(update={"optimizer": "sgd"}), seed=4)
        run_rounds(sgd_server, sgd_t, cfg.rounds)
        assert any(
            not torch.allclose(a, b, atol=1e-3)
            for a, b in zip(params_of(parties, order), params_of(sgd_parties, order))
        )


def test_optimizer_sgd_is_the_default_and_sends_nothing_new():
    """``optimizer: sgd`` (the default) is the run without the option: no ``optimizer`` in any
    message, no Adam state, the same parameters bit for bit."""
    split = synthetic(seed=5)
    part = vertical(split)
    order = [c.client_id for c in part.clients]
    base = dict(
        variant="p", local_steps=3, rounds=4, batch_size=30, lr=0.3, model="mlp", representation_dim=4, hidden=8
    )
    assert FedBCDConfig(**base).optimizer == "sgd"
    runs = {}
    for extra in ({}, {"optimizer": "sgd"}):
        server, parties, transport = build(split, part, FedBCDConfig(**base, **extra), seed=3)
        assert "optimizer" not in server._common(1)
        run_rounds(server, transport, 4)
        assert not any(k.startswith("adam.") for p in parties.values() for k in p.get_state())
        runs[bool(extra)] = params_of(parties, order)
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True]))


def test_a_bad_optimizer_in_a_step_message_is_refused():
    split = synthetic(seed=5)
    part = vertical(split)
    cfg = FedBCDConfig(variant="p", local_steps=2, rounds=2, batch_size=30, lr=0.3, model="mlp", hidden=8)
    server, parties, transport = build(split, part, cfg, seed=3)
    run_rounds(server, transport, 1)
    passive = next(p for p in parties.values() if not p.is_label)
    before = {k: v.copy() for k, v in passive.get_state().items()}
    grad = np.zeros((len(passive.batch), passive.out_dim), np.float32)
    msg = Message(
        "fedbcd.party_step",
        "server",
        passive.party_id,
        2,
        {"grad": grad, "local_steps": 2, "lr": 0.1, "mu": 0.0, "l2": 0.0, "optimizer": "rmsprop"},
    )
    with pytest.raises(PayloadError, match="optimizer"):
        passive.handle(msg)
    after = passive.get_state()
    assert all(np.array_equal(before[k], after[k]) for k in before if not k.startswith(("snap", "protocol")))
    assert passive.protocol.stopped  # fail closed: the refusal stops the party for the run


@pytest.mark.parametrize("variant,mu", [("p", None), ("prox", 0.5)])
def test_q1_fedbcd_p_equals_fedsgd_step_for_step(variant, mu):
    split = synthetic(seed=1)
    part = vertical(split, k=3, label_party=2)
    order = [c.client_id for c in part.clients]
    runs = {}
    for v, extra in (("sgd", {}), (variant, {"mu": mu} if mu else {})):
        cfg = FedBCDConfig(
            variant=v,
            local_steps=1,
            rounds=5,
            batch_size=40,
            lr=0.5,
            model="mlp",
            representation_dim=6,
            hidden=8,
            **extra,
        )
        server, parties, transport = build(split, part, cfg, seed=2)
        server.setup(transport, transport.client_ids)
        traj = []
        for r in range(1, 6):
            server.run_round(r, transport)
            traj.append(params_of(parties, order))
        runs[v] = traj
    for a_round, b_round in zip(runs["sgd"], runs[variant]):
        for a, b in zip(a_round, b_round):
            assert torch.equal(a, b)


# ------------------------------------------------------------------ FedBCD-p/-s vs a NumPy reference


def numpy_reference(split, part, cfg, batches):
    """Linear FedBCD from the paper's rules (Alg. 2 / Alg. 3, eq. (15)): passive parties reuse
    the stale residual d = (sigmoid(H) - y) / B; the label party recomputes its loss exactly
    with the stale H of the others."""
    order = [c.client_id for c in part.clients]
    lab = next(c.client_id for c in part.clients if c.has_labels)
    X = {c.client_id: party_input(split.train, list(c.blocks)).astype(np.float64) for c in part.clients}
    y = split.train.y.astype(np.float64)
    w = {cid: np.zeros(X[cid].shape[1]) for cid in order}
    b = 0.0
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    Q, mu, l2 = cfg.Q, cfg.mu or 0.0, cfg.l2
    for t, S in enumerate(batches[: cfg.rounds]):
        lr = cfg.step_size(t)
        B = len(S)
        if cfg.variant == "s":
            for k in [c for c in order if c != lab]:
                d = (sig(sum(X[j][S] @ w[j] for j in order) + b) - y[S]) / B
                w0 = w[k].copy()
                for _ in range(Q):
                    w[k] = w[k] - lr * (X[k][S].T @ d + l2 * w[k] + mu * (w[k] - w0))
            stale = sum(X[j][S] @ w[j] for j in order if j != lab)
        else:
            H = {j: X[j][S] @ w[j] for j in order}
            d = (sig(sum(H.values()) + b) - y[S]) / B
            for k in [c for c in order if c != lab]:
                w0 = w[k].copy()
                for _ in range(Q):
                    w[k] = w[k] - lr * (X[k][S].T @ d + l2 * w[k] + mu * (w[k] - w0))
            stale = sum(H[j] for j in order if j != lab)
        w0, b0 = w[lab].copy(), b
        for _ in range(Q):
            dK = (sig(X[lab][S] @ w[lab] + stale + b) - y[S]) / B
            w[lab], b = (
                w[lab] - lr * (X[lab][S].T @ dK + l2 * w[lab] + mu * (w[lab] - w0)),
                b - lr * (dK.sum() + l2 * b + mu * (b - b0)),
            )
    return w, b


@pytest.mark.parametrize("variant,Q,mu", [("p", 4, None), ("s", 3, None), ("prox", 6, 0.3)])
def test_linear_fedbcd_matches_numpy_reference(variant, Q, mu):
    split = synthetic(seed=2)
    part = vertical(split, k=3, label_party=1)
    cfg = FedBCDConfig(variant=variant, local_steps=Q, rounds=7, batch_size=50, lr=0.8, l2=0.02, mu=mu)
    server, parties, transport = build(split, part, cfg, seed=5)
    batches = record_batches(server)
    run_rounds(server, transport, cfg.rounds)
    w, b = numpy_reference(split, part, cfg, batches)
    for cid, p in parties.items():
        np.testing.assert_allclose(p.bottom.theta.weight.detach().numpy().ravel(), w[cid], rtol=1e-4, atol=1e-5)
        if p.is_label:
            np.testing.assert_allclose(float(p.top.bias.detach()), b, rtol=1e-4, atol=1e-5)


def test_sequential_differs_from_parallel_and_q_matters():
    """Guards against a variant silently running another: same seed, different trajectories."""
    split = synthetic(seed=3)
    part = vertical(split)
    finals = {}
    for v, q in (("p", 3), ("s", 3), ("p", 1)):
        s, parties, tr = build(
            split, part, FedBCDConfig(variant=v, local_steps=q, rounds=4, batch_size=50, lr=0.5), seed=0
        )
        run_rounds(s, tr, 4)
        finals[(v, q)] = np.concatenate([p.bottom.theta.weight.detach().numpy().ravel() for p in parties.values()])
    assert not np.allclose(finals[("p", 3)], finals[("s", 3)])
    assert not np.allclose(finals[("p", 3)], finals[("p", 1)])


# ------------------------------------------------------------------ messages


@pytest.mark.parametrize("variant,k", [("p", 2), ("s", 3), ("sgd", 4)])
def test_message_counts_per_round(variant, k):
    split = synthetic(dims=(3, 3, 3, 3))
    part = vertical(split, k=k, label_party=0)
    cfg = FedBCDConfig(variant=variant, local_steps=1 if variant == "sgd" else 2, rounds=3, batch_size=20, lr=0.1)
    res = run_fedbcd(split, part, cfg, seed=0)
    msgs = [r["messages"] for r in res.history]
    passive = k - 1
    per_round = 2 + 2 * passive if variant != "s" else 4 * passive + 2
    assert msgs[1:] == [per_round] * (cfg.rounds - 1)
    assert msgs[0] == per_round + 2 * passive  # first round also fetches H_k of the first batch
    # both directions: properties (k), psi_request (1), psi_serve (k-1), psi_result (1), align (k-1)
    setup = 2 * (k + 1 + (k - 1) + 1 + (k - 1))
    assert res.summary["messages_total"] == setup + sum(msgs)
    per_client = res.summary["bytes_per_client"]
    assert sum(v["bytes_up"] + v["bytes_down"] for v in per_client.values()) == res.summary["bytes_total"]


def test_no_raw_feature_or_label_in_any_message(credit_dir):
    from hybridfl.data import load_credit_default, standardize

    split = standardize(load_credit_default(credit_dir))
    small = DatasetSplit(split.train.take(np.arange(600)), split.test.take(np.arange(300)))
    part = VerticalPartitioner(parties=[["demographic"], ["repayment"], ["bill", "payment"]], label_party=1).partition(
        small.train
    )
    raw: list[bytes] = []
    for variant in ("p", "s"):
        cfg = FedBCDConfig(variant=variant, local_steps=2, rounds=4, batch_size=64, lr=0.1)
        server, parties, transport = build(small, part, cfg, seed=0, recorder=raw.append)
        batches = record_batches(server)
        run_rounds(server, transport, cfg.rounds)
        for cid, p in parties.items():
            assert p.is_label == (cid == "party-1") and (hasattr(p, "y") == p.is_label)
    assert len(raw) > 20
    blob = b"\x00".join(raw)
    # every training row of every block, as stored (float32) and as float64: in no message
    for b, x in small.train.blocks.items():
        for row in x:
            assert row.tobytes() not in blob, f"a raw row of block {b!r} crossed"
            assert row.astype(np.float64).tobytes() not in blob
        for col in x.T:  # nor any column segment of 8 consecutive samples
            assert col[:8].tobytes() not in blob
    # the labels of no mini-batch, in any dtype, in any message (bodies or JSON header lists)
    for S in batches:
        ys = small.train.y[S]
        for dt in (np.int64, np.int32, np.float32, np.float64, np.uint8, np.bool_):
            assert ys.astype(dt).tobytes() not in blob
    for r in raw:
        m = decode(r)
        for key, v in m.payload.items():
            if isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v):
                assert len(set(v)) > 2, f"a 0/1 list {key!r} crossed in {m.kind}"
        assert set(m.payload) <= {
            "request",
            "setup",
            "response",
            "dh",
            "run",  # the alignment's run label (random) and the label party's set size
            "n",
            "sig",  # peer signatures (with a roster)
            "tags",
            "blocks",
            "out_dim",
            "has_labels",
            "n_test",
            "n_aligned",
            "batch",
            "h",
            "h_next",
            "grad",
            "loss",
            "grads_for",
            "local_steps",
            "lr",
            "mu",
            "l2",
            "next_batch",
            "return_current",
        } | {k for k in m.payload if k.startswith(("h.", "grad.", "setup.", "response.", "dh.", "tags.", "sig."))}


# ------------------------------------------------------------------ state round trip


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_state_dict_round_trip_continues_identically(optimizer):
    """Parties keep their state in plain arrays: replacing every party by a fresh object loaded
    from its get_state() mid-run (as a Flower ClientApp would) changes nothing (with ``adam``:
    the Adam moments and step counts are part of that state)."""
    split = synthetic(seed=4)
    part = vertical(split)
    cfg = FedBCDConfig(
        variant="p",
        local_steps=3,
        rounds=6,
        batch_size=30,
        lr=0.3 if optimizer == "sgd" else 0.01,
        model="mlp",
        representation_dim=4,
        hidden=8,
        optimizer=optimizer,
    )
    ref_s, ref_p, ref_t = build(split, part, cfg, seed=7)
    run_rounds(ref_s, ref_t, 6)
    s, parties, t = build(split, part, cfg, seed=7)
    s.setup(t, t.client_ids)
    for r in range(1, 4):
        s.run_round(r, t)
    fresh_s, fresh, _ = build(split, part, cfg, seed=99)  # different initial weights
    for cid, p in parties.items():
        sd = {k: np.array(v) for k, v in p.get_state().items()}
        fresh[cid].set_state(sd)
        t.clients[cid] = fresh[cid]
    if optimizer == "adam":  # 3 rounds of Q = 3 Adam steps so far
        steps = {
            k: float(v[0])
            for k, v in parties[part.clients[0].client_id].get_state().items()
            if k.startswith("adam.") and k.endswith(".step")
        }
        assert steps and set(steps.values()) == {9.0}
    for r in range(4, 7):
        s.run_round(r, t)
    order = [c.client_id for c in part.clients]
    for a, b in zip(params_of(ref_p, order), params_of(fresh, order)):
        assert torch.equal(a, b)


class Rebuilt:
    """A party rebuilt for every message from its own data and its saved state, as a Flower
    ClientApp does: build_client (the one build path), set_state, handle, get_state (encoded)."""

    def __init__(self, cd, cfg, seed, layout):
        self.args = (cd, cfg, seed, layout)
        self.saved: bytes | None = None

    def party(self):
        p = SPEC.build_client(*self.args)
        if self.saved is not None:
            p.set_state(decode(self.saved).payload)
        return p

    def handle(self, msg):
        p = self.party()
        reply = p.handle(msg)
        self.saved = encode(Message("state", msg.receiver, msg.receiver, msg.round, p.get_state()))
        return reply


def rows_of(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


@pytest.mark.parametrize("variant,optimizer", [("p", "sgd"), ("s", "sgd"), ("p", "adam"), ("s", "adam")])
def test_skip_and_undo_work_on_parties_rebuilt_for_every_message(variant, optimizer):
    """The round snapshot is part of every party's state: with replies lost (a party still gets
    the ``undo`` of a skipped round with its next message), parties rebuilt for every message give
    the simulation's metrics (AUC included) and final models bit for bit."""
    split = synthetic(seed=4)
    part = vertical(split)
    cfg = FedBCDConfig(
        variant=variant,
        local_steps=2,
        rounds=7,
        batch_size=30,
        lr=0.3,
        model="mlp",
        representation_dim=4,
        hidden=8,
        eval_every=2,
        eval_subset=50,
        optimizer=optimizer,
    )
    fail = [(2, "party-1"), (3, "party-0"), (5, "party-2"), (6, "party-2")]
    if optimizer == "adam":  # rounds 3-4 without a failure: Adam's moments must survive between messages
        fail = [(2, "party-1"), (5, "party-0"), (6, "party-2")]
    ref = build_federation("fedbcd", split, part, cfg, seed=7, fail_at=fail)
    ref_hist = ref.run()
    fed = build_federation("fedbcd", split, part, cfg, seed=7, fail_at=fail)
    layout = [(c.client_id, list(c.blocks), c.has_labels) for c in part.clients]
    fed.clients = {cd.client_id: Rebuilt(cd, cfg, 7, layout) for cd in fed.client_data}
    fed.transport.clients = fed.clients
    hist = fed.run()
    assert [r for r, _ in fed.server.skipped] == [r for r, _ in fail] == [r for r, _ in ref.server.skipped]
    assert rows_of(hist) == rows_of(ref_hist)
    assert sum("auc" in r for r in hist) == 4
    for cid, p in ref.clients.items():
        a, b = p.get_state(), fed.clients[cid].party().get_state()
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_evaluation_through_messages_equals_direct_auc_and_leaks_nothing():
    """The AUC and accuracy of every evaluated round, computed from ``fedbcd.evaluate`` messages,
    equal those computed directly from the parties' models (embed + top_logits) on the same test
    rows; the evaluation messages carry no label and no raw feature value."""
    from sklearn.metrics import roc_auc_score

    split = synthetic(seed=8)
    part = vertical(split, k=3, label_party=1)
    cfg = FedBCDConfig(
        variant="p",
        local_steps=2,
        rounds=5,
        batch_size=40,
        lr=0.3,
        model="mlp",
        representation_dim=4,
        hidden=8,
        eval_subset=60,
    )
    raw: list[bytes] = []
    fed = build_federation("fedbcd", split, part, cfg, seed=3, recorder=raw.append)
    fed.setup()
    rows = np.sort(np.random.default_rng(3 + 12345).choice(split.test.n_samples, 60, replace=False))
    assert np.array_equal(fed.server.eval_rows(), rows)
    test = split.test.take(rows)
    direct = []

    def after_round(rnd, total, row):  # the models as they were evaluated
        hs = {c.client_id: fed.clients[c.client_id].embed(party_input(test, list(c.blocks))) for c in part.clients}
        z = fed.clients["party-1"].top_logits(hs)
        direct.append((float(roc_auc_score(test.y, z)), float(np.mean((z > 0).astype(np.int64) == test.y))))

    history = fed.loop(after_round).run()
    assert [(r["auc"], r["accuracy"]) for r in history] == direct
    assert len(direct) == cfg.rounds and 0.5 < direct[-1][0] < 1
    evals = [decode(r) for r in raw if decode(r).kind == "fedbcd.evaluate"]
    assert len(evals) == cfg.rounds * 2 * 3  # per round: rows to 2 passive parties, h to the label party; replies
    for m in evals:
        keys = set(m.payload)
        if m.receiver == "party-1":
            assert keys == {"rows", "h.party-0", "h.party-2"}
        elif m.sender == "party-1":
            assert keys == {"auc", "accuracy"}
        else:
            assert keys <= {"rows", "h"}
    blob = b"\x00".join(r for r in raw if decode(r).kind == "fedbcd.evaluate")
    for ds in (split.train, split.test):
        for b, x in ds.blocks.items():
            for row in x:
                assert row.tobytes() not in blob and row.astype(np.float64).tobytes() not in blob, b
            for col in x.T:
                for s in range(0, len(col) - 8, 8):
                    assert col[s : s + 8].tobytes() not in blob, b
    for y in (test.y, split.test.y, split.train.y):
        for dt in (np.int64, np.int32, np.float32, np.float64, np.uint8, np.bool_):
            assert y.astype(dt).tobytes() not in blob
    # a missing reply: no metrics that round
    assert fed.server.evaluate(9, lambda msgs: []) == {}
    assert (
        fed.server.evaluate(9, lambda msgs: [] if msgs[0].receiver == "party-1" else fed.loop().eval_exchange(msgs))
        == {}
    )


def test_evaluation_messages_are_checked_on_both_sides(caplog):
    """``fedbcd.evaluate`` from an untrusted sender: a party refuses float, missing or extra
    ``rows`` and a wrongly shaped ``h.<j>``; the coordinator takes a label reply with an AUC
    outside [0, 1], a missing accuracy, NaN without ``diverged`` or a string as no metrics (logged),
    and still accepts an honest reply and an honest divergence."""
    from hybridfl.runtime.messages import SERVER, Message
    from hybridfl.runtime.validate import PayloadError

    split = synthetic(seed=8)
    part = vertical(split, k=3, label_party=1)
    fed = build_federation("fedbcd", split, part, FedBCDConfig(rounds=1, model="mlp", representation_dim=4, hidden=8))
    fed.setup()
    label, passive = fed.clients["party-1"], fed.clients["party-0"]
    rows = np.arange(5, dtype=np.int64)
    fresh = {"label": label.get_state(), "passive": passive.get_state()}  # a refusal stops a party: restore
    h = passive.handle(Message("fedbcd.evaluate", SERVER, "party-0", 1, {"rows": rows})).payload["h"]
    good = {"rows": rows, "h.party-0": h, "h.party-2": h}
    for payload, field in [
        ({"rows": rows.astype(np.float64)}, "rows"),
        ({}, "rows"),
        ({"rows": rows, "w": rows}, "w"),
    ]:
        passive.set_state(fresh["passive"])
        with pytest.raises(PayloadError, match=repr(field)):
            passive.handle(Message("fedbcd.evaluate", SERVER, "party-0", 1, payload))
    with pytest.raises(PayloadError, match="'h.party-2'"):
        label.handle(Message("fedbcd.evaluate", SERVER, "party-1", 1, {**good, "h.party-2": h[:3]}))
    label.set_state(fresh["label"])
    ok = label.handle(Message("fedbcd.evaluate", SERVER, "party-1", 1, good))
    assert 0.0 <= ok.payload["auc"] <= 1.0
    nan = np.full_like(h, np.nan)  # an evaluation is answered once a round: the next round's
    diverged = label.handle(Message("fedbcd.evaluate", SERVER, "party-1", 2, {**good, "h.party-0": nan}))
    assert diverged.payload["diverged"] == 1.0

    passive.set_state(fresh["passive"])  # its last refusal stopped it
    rounds = iter(range(9, 100))  # a party answers one evaluation a round

    def reply_with(payload):
        rnd = next(rounds)

        def exchange(msgs):
            if msgs[0].receiver == "party-1":
                return [Message("fedbcd.evaluate", "party-1", SERVER, rnd, payload)]
            return fed.loop().eval_exchange(msgs)

        return fed.server.evaluate(rnd, exchange)

    assert reply_with(ok.payload) == {"auc": ok.payload["auc"], "accuracy": ok.payload["accuracy"]}
    assert reply_with(diverged.payload)["diverged"] == 1.0
    for bad in [
        {"auc": 5.0, "accuracy": 0.5},
        {"auc": 0.5},
        {"auc": float("nan"), "accuracy": 0.5},
        {"auc": "high", "accuracy": 0.5},
        {"auc": 0.5, "accuracy": 0.5, "diverged": 1.0},
    ]:
        caplog.clear()
        assert reply_with(bad) == {}
        assert "counts as missing" in caplog.text


def test_parties_must_agree_on_the_test_set_size():
    split = synthetic(seed=8)
    fed = build_federation("fedbcd", split, vertical(split), FedBCDConfig(rounds=1), seed=0)
    fed.clients["party-2"].test_x = fed.clients["party-2"].test_x[:-1]
    with pytest.raises(ProtocolError, match="test sets of different sizes"):
        fed.setup()


# ------------------------------------------------------------------ towers and plug-in models


def test_custom_towers_and_top_are_used():
    split = synthetic(seed=5)
    part = vertical(split, k=2, label_party=0)
    made = []

    def towers(i, shape, out_dim):
        made.append((i, shape))
        return MLPTower(int(np.prod(shape)), 3, 5)

    tops = []

    def top(dims):
        tops.append(dims)
        return LinearTop(sum(dims))

    spec = fedbcd_spec(tower_factory=towers, top_factory=top)
    server, parties, transport = build(split, part, FedBCDConfig(model="mlp", rounds=1), seed=0, spec=spec)
    # every party replays the initialisation of all bottoms (one build path), the label party the top
    assert made == [(0, (5,)), (1, (4,))] * len(part.clients)
    assert tops == [[3, 3]]
    assert parties["party-0"].out_dim == 3 and isinstance(parties["party-0"].top, LinearTop)
    assert SPEC.build_client is not spec.build_client and spec.name == SPEC.name


# ------------------------------------------------------------------ bad input


def test_bad_inputs_fail_before_training():
    split = synthetic(dims=(2,) * 9)
    cfg = FedBCDConfig(rounds=1)
    with pytest.raises(PartitionError, match="2 to 8 parties"):
        build(split, VerticalPartitioner(parties=[[f"b{i}"] for i in range(9)]).partition(split.train), cfg)
    with pytest.raises(PartitionError, match="2 to 8 parties"):
        build(split, VerticalPartitioner(parties=[["b0", "b1"]]).partition(split.train), cfg)
    ids = split.train.ids
    no_label = Partition([ClientShard("a", ids, ("b0",), False), ClientShard("b", ids, ("b1",), False)])
    with pytest.raises(PartitionError, match="exactly one label party"):
        build(split, no_label, cfg)
    no_blocks = Partition([ClientShard("a", ids, ("b0",), True), ClientShard("b", ids, (), False)])
    with pytest.raises(PartitionError, match="'b' holds no feature block"):
        build(split, no_blocks, cfg)
    disjoint = Partition([ClientShard("a", ids[:10], ("b0",), True), ClientShard("b", ids[10:], ("b1",), False)])
    with pytest.raises(PartitionError, match="no sample ID is held by every party"):
        build(split, disjoint, cfg)
    multi = synthetic(classes=3)
    with pytest.raises(DataError, match="binary logistic model.*3 classes"):
        build(multi, vertical(multi), cfg)
    with pytest.raises(ConfigError, match="one image block"):
        build(split, vertical(split), FedBCDConfig(model="cnn"))


@pytest.mark.parametrize(
    "algo,needle",
    [
        ({"variant": "sgd", "local_steps": 5}, "one local step per exchange"),
        ({"variant": "p", "mu": 0.1}, "proximal weight of variant 'prox'"),
        ({"variant": "prox", "mu": 0}, "needs mu > 0"),
        ({"variant": "q"}, "algorithm.variant"),
        ({"local_steps": 0}, "algorithm.local_steps"),
        ({"target_auc": 1.5}, "algorithm.target_auc"),
        ({"stop_at_target": True}, "needs target_auc"),
    ],
)
def test_config_errors_are_one_sentence(algo, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(
            {"dataset": {"name": "digits"}, "partition": {"kind": "vertical"}, "algorithm": {"name": "fedbcd", **algo}}
        )


def test_defaults():
    assert FedBCDConfig(variant="sgd").Q == 1
    assert FedBCDConfig(variant="p").Q == 5
    assert FedBCDConfig(variant="prox").mu == 0.1
    c = FedBCDConfig(lr=0.4)
    assert c.step_size(0) == pytest.approx(0.4) and c.step_size(3) == pytest.approx(0.2)


# ------------------------------------------------------------------ runs, results files, real data


def test_divergence_is_reported_not_raised():
    split = synthetic(seed=6)
    res = run_fedbcd(
        split,
        vertical(split),
        FedBCDConfig(
            variant="p", local_steps=50, rounds=30, batch_size=50, lr=1e20, model="mlp", representation_dim=8, hidden=8
        ),
        seed=0,
    )
    assert res.summary["diverged"] is True
    assert res.summary["rounds"] < 30  # stopped at the divergence


def test_dense_evaluation_locates_the_target_round():
    split = synthetic(seed=7, n=2000, dims=(8, 8, 8))
    part = vertical(split)
    base = dict(variant="p", local_steps=2, rounds=40, batch_size=20, lr=0.02)
    curve = [r["auc"] for r in run_fedbcd(split, part, FedBCDConfig(**base, eval_every=1), seed=0).history]
    # a target first reached after round 12: a new running maximum there
    r_star = next(r for r in range(12, 40) if curve[r - 1] > max(curve[: r - 1]))
    target = curve[r_star - 1]
    coarse = run_fedbcd(
        split,
        part,
        FedBCDConfig(**base, target_auc=target, eval_every=10, eval_dense_from=min(curve[9], target)),
        seed=0,
    )
    assert coarse.summary["rounds_to_target"] == r_star
    evaluated = [int(r["round"]) for r in coarse.history if "auc" in r]
    assert evaluated[0] == 10 and evaluated[1:] == list(range(11, len(evaluated) + 10))


def test_credit_default_four_parties_cli_config(credit_dir, tmp_path):
    """examples/configs/fedbcd_credit.yaml end to end (25 rounds: its AUC passes 0.69 at round 3 and
    is 0.704 at round 25, about the 0.707 of round 80): learns, writes rounds_to_target."""
    import json

    from hybridfl.config import load_config
    from hybridfl.experiment import execute, prepare
    from tests.conftest import ROOT

    cfg = load_config(ROOT / "examples" / "configs" / "fedbcd_credit.yaml")
    data = cfg.model_dump(mode="json")
    data["dataset"]["data_dir"] = str(credit_dir)
    data["algorithm"].update(rounds=25, target_auc=0.69)
    prep = prepare(parse_config(data))
    res = execute(prep, tmp_path)
    s = json.loads((tmp_path / "results.json").read_text())
    assert s["parties"] == 4 and s["method"] == "FedBCD-p" and s["local_steps"] == 5
    assert s["auc"] > 0.69 and s["rounds_to_target"] is not None and s["rounds_to_target"] <= 25
    assert (tmp_path / "auc.png").is_file() and (tmp_path / "accuracy.png").is_file()
    assert res.summary["report"][0][2] == "percent"


def test_example_configs_are_valid():
    from hybridfl.config import load_config
    from tests.conftest import ROOT

    names = sorted(p.name for p in (ROOT / "examples" / "configs").glob("fedbcd_*.yaml"))
    assert {"fedbcd_credit.yaml", "fedbcd_mnist.yaml"} <= set(names)
    for name in names:
        cfg = load_config(ROOT / "examples" / "configs" / name)
        assert cfg.algorithm_config().name == "fedbcd"  # type: ignore[attr-defined]
        assert cfg.partition.kind == "vertical" and "shared/data" in (cfg.dataset.data_dir or "")


def test_mnist_halves_cnn_towers_small_run(mnist_dir):
    """The paper's MNIST-CNN setup, scaled down (8-channel towers, 32 units, 6 rounds)."""
    from hybridfl.data import load_mnist

    split = load_mnist(mnist_dir, layout="halves", classes=[3, 8])
    part = VerticalPartitioner(parties=[["left"], ["right"]], label_party=0).partition(split.train)
    cfg = FedBCDConfig(
        variant="p",
        local_steps=3,
        rounds=6,
        batch_size=64,
        lr=0.1,
        model="cnn",
        channels=8,
        representation_dim=32,
        eval_every=6,
        eval_subset=400,
    )
    s = run_fedbcd(split, part, cfg, seed=0).summary
    assert s["auc"] > 0.9  # 3 vs 8 from two halves: far above chance after 18 local steps
    assert s["eval_samples"] == 400


# ------------------------------------------------------------------ top layout, local gradient, device (issue 16, 17)


def training_arrays(raw):
    """``(kind, key, shape)`` of every array in the round messages (alignment and evaluation excluded)."""
    out = []
    for r in raw:
        m = decode(r)
        if m.kind in ("fedbcd.forward", "fedbcd.label", "fedbcd.party_step"):
            out += [(m.kind, k, v.shape) for k, v in m.payload.items() if isinstance(v, np.ndarray) and k != "batch"]
    return [a for a in out if a[1] not in ("next_batch",)]


def test_party_slice_sends_one_value_per_sample_and_is_the_concat_model():
    """``top: party_slice`` (paper eq. (2), Fig. 1a): every ``H_k`` and ``dL/dH_k`` in a round
    message is ``(B, 1)``; ``concat`` sends ``(B, representation_dim)``. Under FedSGD both layouts
    train the same joint model: the towers are equal and each party's slice equals its segment of
    the concatenated top layer (same initial weights)."""
    split = synthetic(seed=9)
    part = vertical(split, k=3, label_party=1)
    order = [c.client_id for c in part.clients]
    feds, shapes, per_round = {}, {}, {}
    for top in ("party_slice", "concat"):
        raw: list[bytes] = []
        cfg = FedBCDConfig(
            variant="sgd", rounds=4, batch_size=25, lr=0.4, model="mlp", representation_dim=8, hidden=6, top=top
        )
        res = run_fedbcd(split, part, cfg, seed=3, recorder=raw.append)
        shapes[top] = {s for _, _, s in training_arrays(raw)}
        per_round[top] = res.history[-1]["bytes"]
        server, parties, transport = build(split, part, cfg, seed=3)
        run_rounds(server, transport, cfg.rounds)
        feds[top] = parties
    assert shapes["party_slice"] == {(25, 1)}
    assert shapes["concat"] == {(25, 8)}
    assert per_round["concat"] > 3 * per_round["party_slice"]
    sliced, wide = feds["party_slice"], feds["concat"]
    fc = wide["party-1"].top.fc
    for i, cid in enumerate(order):
        for a, b in zip(sliced[cid].bottom.tower.parameters(), wide[cid].bottom.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sliced[cid].bottom.weight, fc.weight[:, 8 * i : 8 * (i + 1)], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sliced["party-1"].top.bias, fc.bias, rtol=1e-5, atol=1e-6)


def test_round_messages_are_checked_with_exact_widths():
    """The label party refuses an ``h.<j>`` of another width than its top model takes; a passive
    party refuses a ``curv`` that is negative, non-finite or of another shape, and a non-bool
    ``curvature`` is refused; nothing is changed."""
    from hybridfl.runtime.messages import SERVER
    from hybridfl.runtime.validate import PayloadError

    split = synthetic(seed=8)
    part = vertical(split, k=3, label_party=1)
    cfg = FedBCDConfig(variant="p", local_steps=2, rounds=1, model="mlp", representation_dim=4, hidden=5)
    server, parties, transport = build(split, part, cfg, seed=0)
    run_rounds(server, transport, 1)
    label, passive = parties["party-1"], parties["party-0"]
    assert label.in_dims == {"party-0": 1, "party-1": 1, "party-2": 1}
    B = len(server.batch)
    good = {f"h.{j}": np.zeros((B, 1), np.float32) for j in ("party-0", "party-2")}
    before = {k: v.copy() for k, v in label.state_dict().items()}
    saved = label.get_state()  # a refusal stops a party for the run: each check from this state
    with pytest.raises(PayloadError, match=rf"'h.party-2'.*expected \({B}, 1\)"):
        label.handle(Message("fedbcd.label", SERVER, "party-1", 2, {**good, "h.party-2": np.zeros((B, 4), np.float32)}))
    label.set_state(saved)
    with pytest.raises(PayloadError, match="'curvature'"):
        label.handle(Message("fedbcd.label", SERVER, "party-1", 2, {**good, "curvature": "yes"}))
    step = {"grad": np.zeros((B, 1), np.float32), "local_steps": 2, "lr": 0.1, "mu": 0.0, "l2": 0.0}
    before_p = {k: v.copy() for k, v in passive.state_dict().items()}
    saved_p = passive.get_state()
    for curv in (-np.ones((B, 1), np.float32), np.full((B, 1), np.nan, np.float32), np.zeros((B, 4), np.float32)):
        passive.set_state(saved_p)
        with pytest.raises(PayloadError, match="'curv'"):
            passive.handle(Message("fedbcd.party_step", SERVER, "party-0", 2, {**step, "curv": curv}))
    for p, ref in ((label, before), (passive, before_p)):
        sd = p.state_dict()
        assert all(np.array_equal(sd[k], ref[k]) for k in ref if not k.startswith("h."))


def test_linear_passive_q_local_steps_are_one_step_of_q_eta():
    """For the linear model a passive party's gradient ``X_k^T d`` does not depend on its own
    parameters once ``d = dL/dH_k`` is fixed (paper Alg. 2 with the received gradient), so its
    ``Q`` local steps of size eta are exactly one step of size ``Q * eta``: after round 1, FedBCD-p
    with ``Q = 4`` and eta_0 leaves every passive party where FedSGD with ``4 * eta_0`` does (the
    label party, which recomputes its loss, differs)."""
    split = synthetic(seed=10)
    part = vertical(split, k=3, label_party=1)
    out = {}
    for v, q, lr in (("p", 4, 0.3), ("sgd", 1, 1.2)):
        server, parties, transport = build(split, part, FedBCDConfig(variant=v, local_steps=q, rounds=1, lr=lr), seed=1)
        run_rounds(server, transport, 1)
        out[v] = {cid: p.bottom.theta.weight.detach().clone() for cid, p in parties.items()}
    for cid in ("party-0", "party-2"):
        assert out["p"][cid].abs().sum() > 0
        torch.testing.assert_close(out["p"][cid], out["sgd"][cid], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(out["p"]["party-1"], out["sgd"]["party-1"])


@pytest.mark.parametrize("variant", ["p", "s"])
def test_taylor_with_one_local_step_equals_fixed(variant):
    split = synthetic(seed=11)
    part = vertical(split, k=3, label_party=2)
    order = [c.client_id for c in part.clients]
    traj = {}
    for lg in ("fixed", "taylor"):
        cfg = FedBCDConfig(
            variant=variant,
            local_steps=1,
            rounds=4,
            batch_size=30,
            lr=0.5,
            model="mlp",
            representation_dim=5,
            hidden=6,
            local_gradient=lg,
        )
        server, parties, transport = build(split, part, cfg, seed=2)
        server.setup(transport, transport.client_ids)
        traj[lg] = []
        for r in range(1, 5):
            server.run_round(r, transport)
            traj[lg].append(params_of(parties, order))
    for a_round, b_round in zip(traj["fixed"], traj["taylor"]):
        assert all(torch.equal(a, b) for a, b in zip(a_round, b_round))


def numpy_taylor_reference(split, part, cfg, batches):
    """Linear FedBCD-p/-s with ``local_gradient: taylor`` from the rule: a passive party's local
    step ``q`` uses ``d + c * (X_k (w_k - w_k^0))`` with ``c = sigmoid'(H) / B`` at the exchange."""
    order = [c.client_id for c in part.clients]
    lab = next(c.client_id for c in part.clients if c.has_labels)
    X = {c.client_id: party_input(split.train, list(c.blocks)).astype(np.float64) for c in part.clients}
    y = split.train.y.astype(np.float64)
    w = {cid: np.zeros(X[cid].shape[1]) for cid in order}
    b = 0.0
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    Q = cfg.Q
    for t, S in enumerate(batches[: cfg.rounds]):
        lr, B = cfg.step_size(t), len(S)
        z = sum(X[j][S] @ w[j] for j in order) + b
        for k in [c for c in order if c != lab]:
            if cfg.variant == "s":
                z = sum(X[j][S] @ w[j] for j in order) + b
            d, c = (sig(z) - y[S]) / B, sig(z) * (1 - sig(z)) / B
            w0 = w[k].copy()
            for _ in range(Q):
                w[k] = w[k] - lr * (X[k][S].T @ (d + c * (X[k][S] @ (w[k] - w0))))
        stale = sum(X[j][S] @ w[j] for j in order if j != lab) if cfg.variant == "s" else z - b - X[lab][S] @ w[lab]
        for _ in range(Q):
            dK = (sig(X[lab][S] @ w[lab] + stale + b) - y[S]) / B
            w[lab], b = w[lab] - lr * (X[lab][S].T @ dK), b - lr * dK.sum()
    return w, b


@pytest.mark.parametrize("variant", ["p", "s"])
def test_linear_taylor_matches_numpy_reference(variant):
    split = synthetic(seed=12)
    part = vertical(split, k=3, label_party=1)
    cfg = FedBCDConfig(variant=variant, local_steps=5, rounds=6, batch_size=50, lr=0.8, local_gradient="taylor")
    server, parties, transport = build(split, part, cfg, seed=5)
    batches = record_batches(server)
    run_rounds(server, transport, cfg.rounds)
    w, b = numpy_taylor_reference(split, part, cfg, batches)
    for cid, p in parties.items():
        np.testing.assert_allclose(p.bottom.theta.weight.detach().numpy().ravel(), w[cid], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(parties["party-1"].top.bias.detach()), b, rtol=1e-4, atol=1e-5)
    # and it is not the fixed-gradient run
    fixed = numpy_reference(split, part, cfg.model_copy(update={"local_gradient": "fixed"}), batches)[0]
    assert not np.allclose(fixed["party-0"], w["party-0"])


@pytest.mark.parametrize(
    "algo,needle",
    [
        ({"model": "mlp", "top": "concat", "local_gradient": "taylor"}, "needs H_k of width 1"),
        ({"top": "wide"}, "algorithm.top"),
        ({"local_gradient": "exact"}, "algorithm.local_gradient"),
        ({"device": "tpu"}, "algorithm.device"),
    ],
)
def test_layout_gradient_and_device_errors(algo, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(
            {"dataset": {"name": "digits"}, "partition": {"kind": "vertical"}, "algorithm": {"name": "fedbcd", **algo}}
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_device_cuda_without_gpu_is_refused_and_auto_is_cpu():
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        parse_config(
            {
                "dataset": {"name": "digits"},
                "partition": {"kind": "vertical"},
                "algorithm": {"name": "fedbcd", "device": "cuda"},
            }
        )
    split = synthetic(seed=13)
    part = vertical(split)
    runs = []
    for dev in ("cpu", "auto"):
        cfg = FedBCDConfig(
            variant="p", local_steps=2, rounds=3, model="mlp", representation_dim=4, hidden=5, device=dev
        )
        server, parties, transport = build(split, part, cfg, seed=0)
        run_rounds(server, transport, 3)
        assert all(p.device.type == "cpu" for p in parties.values())
        runs.append(params_of(parties, [c.client_id for c in part.clients]))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
