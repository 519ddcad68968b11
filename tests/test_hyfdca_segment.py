"""HyFDCA ``dual_mode: segment``: the holders of a sample segment make the same exact SDCA steps
(mini-batch inner-product exchanges plus batch Gram matrices), so there is one dual variable per
sample, ``w = w(alpha)`` and the duality gap is a real certificate. Real UCI credit rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hybridfl.algorithms.convex.losses import (
    RowData,
    dual,
    gram_steps,
    primal,
    row_norms_sq,
    w_of_alpha,
)
from hybridfl.algorithms.convex.reference import reference_optimum
from hybridfl.algorithms.hyfdca import HyFDCAClient, HyFDCAConfig, Monitor, build_problem, dealer_of, run_hyfdca
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import build_federation
from tests.conftest import HYFDCA_BEFORE

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _cfg(**kw) -> HyFDCAConfig:
    # the paper's problem (no intercept): the tests rebuild it by hand (build_problem)
    base = dict(
        HYFDCA_BEFORE,
        lam=1e-2,
        rounds=30,
        eval_every=0,
        reference_sdca_epochs=100,
        dual_mode="segment",
        batch_size=64,
        fit_intercept=False,
    )
    base.update(kw)
    return HyFDCAConfig(**base)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared"])
def test_gram_steps_equal_sequential_sdca(loss):
    """Batches with their Gram matrix and exact inner products between batches = one SDCA pass."""
    rng = np.random.default_rng(1)
    n, d = 600, 12
    X, y = rng.normal(size=(n, d)), np.sign(rng.normal(size=n))
    lam_n = 1e-2 * n
    order = rng.permutation(n)
    a1, dw = np.zeros(n), np.zeros(d)
    RowData(X).dot_and_add(order, a1, y, np.zeros(n), row_norms_sq(X), loss, lam_n, 1.0, 1.0, dw)
    a2, w = np.zeros(n), np.zeros(d)
    for m in range(0, n, 50):
        b = order[m : m + 50]
        dd = gram_steps(np.arange(b.size), a2[b].copy(), y[b], X[b] @ w, X[b] @ X[b].T, loss, lam_n, 1.0)
        a2[b] += dd
        w += X[b].T @ dd / lam_n
    np.testing.assert_allclose(a1, a2, atol=1e-12)


def test_vertical_split_with_one_batch_is_centralised_sdca(credit_small):
    """One sample segment held by 3 block clients, one batch: every round is an exact SDCA pass on
    the whole problem, although no client sees more than its own block."""
    part = GridPartitioner(1, 3, 1, 0).partition(credit_small.train)
    res = run_hyfdca(credit_small, part, _cfg(rounds=40, batch_size=5000))
    s = res.summary
    assert s["sigma"] == 1.0
    assert s["relative_suboptimality"] < 2e-3  # as test_hyfdca's single client (hinge)
    assert -1e-9 <= s["primal_objective"] - s["reference_objective"] <= s["duality_gap"] + 1e-12


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_grid_holders_agree_and_w_is_w_of_alpha_and_dual_ascends(credit_small, schedule):
    """3 x 3 grid, both schedules: every holder of a sample keeps the same alpha, w = w(alpha)
    exactly, the dual never decreases (exact steps; parallel with the CoCoA+ factor sigma' = 3
    segments), and the duality gap of the shared alpha certifies the model and shrinks."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=30, eval_every=1, segment_schedule=schedule)
    fed = build_federation("hyfdca", credit_small, part, cfg)
    server, clients = fed.server, fed.clients
    prob = build_problem(credit_small, part, "hinge", cfg.lam, [1])
    ref = reference_optimum(prob.X, prob.y, cfg.lam, "hinge", sdca_epochs=100)
    mon = fed.monitor = Monitor(prob, ref, dealer_of(fed.secrets))
    fed.setup()
    hist = fed.loop().run()
    alpha = mon.alpha(server)
    np.testing.assert_allclose(server.w, w_of_alpha(prob.X, alpha, cfg.lam), atol=1e-10)
    for c in clients.values():
        np.testing.assert_allclose(c.alpha, alpha[[prob.row[s] for s in c.ids]], atol=1e-12)
    duals = [h["dual"] for h in hist]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(duals)), duals
    assert all(h["primal"] - ref.objective <= h["duality_gap"] + 1e-12 for h in hist)
    assert hist[-1]["duality_gap"] < 0.05 * hist[0]["duality_gap"], (hist[0]["duality_gap"], hist[-1]["duality_gap"])
    assert hist[-1]["relative_suboptimality"] < 5e-3, hist[-1]


def test_sequential_schedule_uses_the_exact_centralised_inner_products(credit_small, monkeypatch):
    """segment_schedule: sequential is centralised SDCA: before every mini-batch, the inner
    products a holder decrypts equal x_i^T w(alpha) of the whole problem at that moment (the other
    segments' committed alpha plus this segment's changes so far), on a 3 x 3 grid where no client
    holds more than a third of the samples and a third of the features."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=3, batch_size=100, segment_schedule="sequential")
    fed = build_federation("hyfdca", credit_small, part, cfg)
    server = fed.server
    prob = build_problem(credit_small, part, "hinge", cfg.lam, [1])
    mon = Monitor(prob, None, dealer_of(fed.secrets))
    original = HyFDCAClient.segment_sweep
    checked = []

    def checking_sweep(self, msg):
        p = msg.payload
        for s, ct in zip([int(v) for v in p["segs"]], p["u"]):
            st = self.sweep[s]
            alpha = mon.alpha(server)  # committed alpha of every segment
            rows = self.seg_rows[s]
            alpha[[prob.row[i] for i in self.ids[rows]]] = self.alpha[rows] + st["delta"][rows]
            batch = self.seg_batches[s][st["order"][st["j"]]]
            exact = prob.X[[prob.row[i] for i in self.ids[batch]]] @ w_of_alpha(prob.X, alpha, cfg.lam)
            np.testing.assert_allclose(
                self.he.decrypt(ct), exact, rtol=1e-10, atol=1e-9
            )  # fixed-point shares: 2^-32 each
            checked.append(len(batch))
        return original(self, msg)

    monkeypatch.setattr(HyFDCAClient, "segment_sweep", checking_sweep)
    fed.setup()
    hist = fed.loop(monitor=False).run()
    assert all(h["sigma"] == 1.0 and h["segments_updated"] == 3 for h in hist)
    assert sum(checked) == 9 * prob.X.shape[0]  # 3 rounds x 3 holders x every sample once


def test_segment_waits_for_all_its_holders(credit_small):
    """With half the clients per round, only segments whose holders are all present step; the
    dual still never decreases and no partial segment update is ever added."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=20, participation=0.5, eval_every=1)
    fed = build_federation("hyfdca", credit_small, part, cfg)
    server = fed.server
    prob = build_problem(credit_small, part, "hinge", cfg.lam, [1])
    mon = fed.monitor = Monitor(prob, None, dealer_of(fed.secrets))
    fed.setup()
    hist = fed.loop().run()
    duals = [h["dual"] for h in hist]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(duals))
    updated = [h.get("segments_updated", 0) for h in hist]
    assert sum(updated) > 0 and max(updated) < 3  # 5 of 9 clients never cover all 3 segments
    np.testing.assert_allclose(server.w, w_of_alpha(prob.X, mon.alpha(server), cfg.lam), atol=1e-10)


def test_ckks_segment_run_matches_plaintext(credit_small):
    """Also with suffix averaging: the server's encrypted running sums of alpha decrypt to the
    plaintext run's averaged dual (same gap)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    plain = run_hyfdca(credit_small, part, _cfg(rounds=4, batch_size=200, output="average_last", eval_every=1))
    enc = run_hyfdca(
        credit_small, part, _cfg(rounds=4, batch_size=200, encryption="ckks", output="average_last", eval_every=1)
    )
    w0, w1 = np.array(plain.summary["w"]), np.array(enc.summary["w"])
    assert np.linalg.norm(w1 - w0) <= 1e-6 * np.linalg.norm(w0)
    assert plain.summary["averaged_rounds"] == enc.summary["averaged_rounds"] == 2
    assert abs(enc.summary["dual_objective"] - plain.summary["dual_objective"]) <= 1e-6 * abs(
        plain.summary["dual_objective"]
    )


def test_suffix_average_is_the_mean_of_the_iterates_and_no_worse(credit_small):
    """average_last: the output model and its dual are the means of the last rounds' w and alpha
    (w_out = w(alpha_out), so the gap still certifies it), and by convexity P(w_out) <= mean P(w_t)
    and D(alpha_out) >= mean D(alpha_t). Under 50 % participation, where the last iterate wanders."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=16, participation=0.5, participation_mode="probability", output="average_last")
    fed = build_federation("hyfdca", credit_small, part, cfg)
    server = fed.server
    prob = build_problem(credit_small, part, "hinge", cfg.lam, [1])
    mon = Monitor(prob, None, dealer_of(fed.secrets))
    iterates = []

    def record(rnd, total, row):  # after every round
        a = mon.alpha_of(server.alpha_ciphertexts())  # per segment holder set -> its sorted IDs
        iterates.append((rnd, server.w.copy(), a))

    fed.setup()
    fed.loop(progress=record, monitor=False).run()
    assert server.average_start == 9 and server.avg_count == 8
    tail = [(w, a) for r, w, a in iterates if r >= 9]
    w_mean = np.mean([w for w, _ in tail], axis=0)
    a_mean = np.mean([a for _, a in tail], axis=0)
    np.testing.assert_allclose(server.output_w(), w_mean, atol=1e-12)
    np.testing.assert_allclose(mon.alpha(server), a_mean, atol=1e-12)
    np.testing.assert_allclose(server.output_w(), w_of_alpha(prob.X, a_mean, cfg.lam), atol=1e-10)
    assert not np.allclose(server.output_w(), server.w)  # something was averaged
    P = [primal(prob.X, prob.y, w, cfg.lam, "hinge") for w, _ in tail]
    D = [dual(prob.X, prob.y, a, cfg.lam, "hinge") for _, a in tail]
    row = mon(server)
    assert row["primal"] <= np.mean(P) + 1e-12 and row["dual"] >= np.mean(D) - 1e-12
    assert row["averaged_rounds"] == 8 and row["duality_gap"] >= 0


def test_failed_holder_loses_its_segment_round_not_the_run(credit_small):
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    res = run_hyfdca(credit_small, part, _cfg(rounds=30, failure_rate=0.3, eval_every=5))
    s = res.summary
    assert s["client_failures"] > 0
    assert s["relative_suboptimality"] < 2e-2, s["relative_suboptimality"]
    assert s["duality_gap"] >= s["primal_objective"] - s["reference_objective"] - 1e-12


def test_segment_server_receives_only_ciphertexts(credit_small):
    """Segment mode under CKKS: every inner-product share, dual change, squared norm and partial
    Gram matrix a client sends the server is a ciphertext (the only plaintext array is the primal
    share: w is public); the server holds no key; no dual value or batch Gram entry appears in the
    clear in any message."""
    from hybridfl.runtime.messages import decode

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    cfg = _cfg(rounds=2, batch_size=100, encryption="ckks", output="average_last")
    fed = build_federation("hyfdca", credit_small, part, cfg, recorder=raw.append)
    server, clients = fed.server, fed.clients
    assert not server.he.can_decrypt
    fed.setup()
    fed.loop(monitor=False).run()
    key = dealer_of(fed.secrets).client_backend()
    kinds = set()
    for m in (decode(b) for b in raw):
        if m.receiver != "server":
            continue
        for k in ("ip", "dalpha", "norms", "gram"):
            for c in m.payload.get(k, []):
                assert isinstance(c, bytes) and key.decrypt(c).size > 0
                kinds.add(k)
        arrays = {k for k, v in m.payload.items() if isinstance(v, np.ndarray)}
        # the masked change of the primal share (uint64); the PSI alignment's holder sets and sizes
        # the unmasking round's pair masks with dropped clients (uint64 keystream words) are arrays too
        allowed = {"hyfdca.psi_tags": {"sets", "counts"}, "hyfdca.unmask": {"correction"}}.get(m.kind, {"masked"})
        assert arrays <= allowed, (m.kind, arrays)
    assert kinds == {"ip", "dalpha", "gram"}  # no squared norms: the steps read the Gram diagonals
    blob = b"".join(raw)
    c = next(iter(clients.values()))
    G = c.gram[0][0]
    inner = c.alpha[(c.alpha != 0) & (np.abs(c.alpha) != 1)]  # not on a bound: +-1.0 is in public arrays too
    secrets_ = np.concatenate([inner[:20], G[np.triu_indices(G.shape[0], 1)][:20]]).astype("<f8")
    assert secrets_.size == 40
    assert not any(v.tobytes() in blob for v in secrets_)


def test_setup_adds_each_segments_gram_shares_once(credit_small, monkeypatch):
    """Setup, 3 x 3 grid: the server adds the holders' Gram vectors once per segment, not once per
    holder that receives the sum (and no squared norms: the steps read the Gram diagonals); every
    holder still gets its segments' full batch Gram matrices."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1, batch_size=300))
    calls = []
    add = fed.server.he.add
    monkeypatch.setattr(fed.server.he, "add", lambda items: calls.append(len(items)) or add(items))
    fed.setup()
    assert calls == [3] * 3  # 3 segments' Gram vectors, 3 holders each
    prob = build_problem(credit_small, part, "hinge", 1e-2, [1])
    for c in fed.clients.values():
        for s, batches in enumerate(c.seg_batches):
            for m, rows in enumerate(batches):
                ids = c.ids[rows]
                X = prob.X[[prob.row[i] for i in ids]]
                G = np.asarray(X @ X.T)  # float32 matrices: the float64 product to float32's rounding
                assert c.gram[s][m].dtype == np.float32
                np.testing.assert_allclose(c.gram[s][m], G, rtol=0, atol=1e-6 * np.abs(G).max())


def test_setup_frees_the_holders_gram_shares_before_it_sends_the_sums(credit_small, monkeypatch):
    """Setup, 3 x 3 grid: the ``hyfdca.init`` replies (every holder's packed Gram vectors: 378 MB
    on MNIST at ``b = 512``) are gone when the server sends the sums in ``hyfdca.norms``, so the
    process's peak memory is the sums and the holders' full matrices, not the shares as well."""
    import gc
    import weakref

    from hybridfl.algorithms.hyfdca import kinds

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1, batch_size=300))
    send = fed.transport.send_and_receive
    init_replies: list = []
    alive_at_norms: list[int] = []

    def spy(msgs):
        msgs = list(msgs)
        if msgs and msgs[0].kind == kinds.NORMS:
            gc.collect()
            alive_at_norms.append(sum(ref() is not None for ref in init_replies))
        replies = send(msgs)
        if msgs and msgs[0].kind == kinds.INIT:
            init_replies.extend(weakref.ref(r) for r in replies)
            assert all(len(r.payload["gram"]) == len(fed.server.client_segs[r.sender]) for r in replies)
        return replies

    monkeypatch.setattr(fed.transport, "send_and_receive", spy)
    fed.setup()
    assert len(init_replies) == 9 and alive_at_norms == [0]
