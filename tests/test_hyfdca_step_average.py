"""HyFDCA ``step_average`` (segment mode; :mod:`hybridfl.algorithms.hyfdca.output`): each round's
output model is the mean of the iterates after every SDCA step of the round. Checked against a
brute force that records every step the holders make and averages the iterates itself, under
both schedules, with and without secure aggregation, over overlapping holdings, over a rebuild
before every message and a resumed checkpoint; and by playing a server that lies in ``avg_segs``
and a client whose position share is malformed. Real UCI credit rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.algorithms.hyfdca.protocol import SETUP, ClientProtocol
from hybridfl.algorithms.hyfdca.segment_client import SegmentClientMixin
from hybridfl.algorithms.hyfdca.segment_pass import SegmentPass
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE
from tests.rebuild import reference_and_rebuilt

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _cfg(**kw) -> HyFDCAConfig:
    base = dict(
        HYFDCA_BEFORE,
        lam=1e-2,
        rounds=3,
        eval_every=0,
        reference=False,
        dual_mode="segment",
        batch_size=64,
        output="step_average",
        fit_intercept=False,  # the paper's problem: the brute force rebuilds it by hand (build_problem)
    )
    base.update(kw)
    return HyFDCAConfig(**base)


class StepRecorder:
    """Records every SDCA step of the segment passes, once per segment (at its first holder in
    holder to sweep it): ``(round, global segment, sample ID, change of alpha)`` in the order the
    steps were made."""

    def __init__(self, monkeypatch):
        self.steps: list[tuple[int, int, str, float]] = []
        self.first: dict[int, str] = {}  # global segment -> the holder that records it
        self.round = 0
        orig_start, orig_step = SegmentClientMixin.segment_start, SegmentClientMixin._step
        orig_visit = SegmentClientMixin._visit_order
        rec = self

        def visit(client, s):
            order = orig_visit(client, s)
            client.__dict__.setdefault("_seen_visits", {})[s] = order
            return order

        def start(client, msg):  # every pass starts here (a solo pass also ends here)
            rec.round = int(msg.round)
            return orig_start(client, msg)

        def step(client, s, u0):  # one batch's steps, in an ordinary sweep or a solo pass
            st = client.sweep[s]
            rows = client.seg_batches[s][st["order"][st["j"]]]
            delta0 = st["delta"].copy()
            orig_step(client, s, u0)
            g = client.seg_global[s]
            if rec.first.setdefault(g, client.client_id) != client.client_id:
                return
            d = st["delta"][rows] - delta0[rows]
            for local in client._seen_visits[s]:
                rec.steps.append((rec.round, g, str(client.ids[rows[local]]), float(d[local])))

        monkeypatch.setattr(SegmentClientMixin, "_visit_order", visit)
        monkeypatch.setattr(SegmentClientMixin, "segment_start", start)
        monkeypatch.setattr(SegmentClientMixin, "_step", step)


def _brute_force(split, part, cfg, steps, rnd, w_start):
    """The mean of the iterates after each recorded step of round ``rnd`` from ``w_start``, and
    the last iterate. Sequential schedule: the steps one after another in the order they were made;
    parallel: each segment's own steps from ``w_start``, their changes added, each segment's mean
    over its own pass (the segments step at the same time)."""
    prob = build_problem(split, part, cfg.loss, cfg.lam, cfg.positive_classes or [1])
    X = prob.X.toarray() if hasattr(prob.X, "toarray") else np.asarray(prob.X)
    lam_n = cfg.lam * X.shape[0]
    mine = [(g, sid, d) for r, g, sid, d in steps if r == rnd]
    if cfg.segment_schedule == "sequential":
        runs = [mine]
    else:
        runs = [[x for x in mine if x[0] == g] for g in sorted({x[0] for x in mine})]
    mean, last = w_start.copy(), w_start.copy()
    for run in runs:
        w, total = np.zeros_like(w_start), np.zeros_like(w_start)
        for _, sid, d in run:
            w = w + d * X[prob.row[sid]] / lam_n
            total += w
        mean += total / len(run)
        last += w
    return mean, last


def _check_rounds(fed, split, part, cfg, rec, rounds=3):
    """Each round's own mean iterate ``w_step`` is the brute force's; the output model is the mean
    of the iterates of the round and the round before (``STEP_WINDOW``), each round's mean weighted
    by its steps."""
    server = fed.server
    fed.setup()
    before = None  # the round before: (its brute-force mean, its steps)
    for rnd in range(1, rounds + 1):
        w0 = server.w.copy()
        server.run_round(rnd, fed.transport)
        mean, last = _brute_force(split, part, cfg, rec.steps, rnd, w0)
        steps = sum(1 for x in rec.steps if x[0] == rnd)
        assert server.w_step is not None
        np.testing.assert_allclose(server.w, last, atol=1e-7)
        np.testing.assert_allclose(server.w_step, mean, atol=1e-7)
        assert np.abs(server.w_step - server.w).max() > 1e-3  # a different model, not the last iterate
        if before is None:
            np.testing.assert_array_equal(server.output_w(), server.w_step)
        else:
            window = (before[1] * before[0] + steps * mean) / (before[1] + steps)
            np.testing.assert_allclose(server.output_w(), window, atol=1e-7)
            assert np.abs(server.output_w() - server.w_step).max() > 1e-4  # not the round's own mean
        before = (mean, steps)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
@pytest.mark.parametrize("secure", [True, False])
def test_step_average_equals_the_brute_force_mean_of_the_iterates(credit_small, monkeypatch, secure, schedule):
    """3 x 3 grid: the server's step average of every round equals the mean of the iterates
    rebuilt from every recorded step, and its last iterate the last rebuilt one."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(secure_aggregation=secure, segment_schedule=schedule)
    rec = StepRecorder(monkeypatch)
    _check_rounds(build_federation("hyfdca", credit_small, part, cfg), credit_small, part, cfg, rec)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_step_average_of_rounds_that_lose_a_pass(credit_small, monkeypatch, schedule):
    """A holder fails in round 2 (its replies lost): its segment's pass is dropped, and the round's
    step average is still the brute-force mean over the steps of the passes that were added."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(segment_schedule=schedule)
    rec = StepRecorder(monkeypatch)
    fed = build_federation("hyfdca", credit_small, part, cfg, fail_at=[(2, "client-s1-f1")])
    server = fed.server
    fed.setup()
    for rnd in (1, 2, 3):
        w0, before = server.w.copy(), list(server.enc_alpha)
        out = server.run_round(rnd, fed.transport)
        added = {g for g, c in enumerate(before) if server.enc_alpha[g] != c}
        assert len(added) == (2 if rnd == 2 else 3) and out["step_average"] == 1.0
        steps = [x for x in rec.steps if x[0] != rnd or x[1] in added]
        mean, last = _brute_force(credit_small, part, cfg, steps, rnd, w0)
        np.testing.assert_allclose(server.w, last, atol=1e-7)
        np.testing.assert_allclose(server.w_step, mean, atol=1e-7)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_step_average_over_overlapping_holdings(monkeypatch, schedule):
    """Four clients with random overlapping holdings (several segments per client, blocks held
    twice weighted 1/c), PSI alignment, two local epochs (every sample stepped twice per pass)."""
    from tests.test_hyfdca_psi import POS, _overlapping, _split

    split = _split(200)
    part = _overlapping(split, seed=3)
    cfg = _cfg(lam=0.1, batch_size=16, alignment="psi", positive_classes=POS, segment_schedule=schedule, local_epochs=2)
    rec = StepRecorder(monkeypatch)
    fed = build_federation("hyfdca", split, part, cfg)
    _check_rounds(fed, split, part, cfg, rec, rounds=2)
    assert max(len(s) for s in fed.server.client_segs.values()) > 2


def test_step_average_survives_a_rebuild_before_every_message_and_a_resume(credit_small, tmp_path):
    """Flower rebuilds a client from its state before every message; a checkpointed run resumes:
    both end at the uninterrupted run's output model, bit for bit."""
    from hybridfl.runtime.checkpoint import CHECKPOINT_NAME

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=3)
    ref, fed = reference_and_rebuilt(credit_small, part, cfg)
    np.testing.assert_array_equal(fed.server.w_step, ref.server.w_step)

    full = run_hyfdca(credit_small, part, cfg, seed=1)
    ck = tmp_path / CHECKPOINT_NAME

    class Stop(Exception):
        pass

    def stop(rnd, total, row):
        if rnd == 2:
            raise Stop

    with pytest.raises(Stop):
        run_hyfdca(credit_small, part, cfg, seed=1, progress=stop, checkpoint=ck)
    resumed = run_hyfdca(credit_small, part, cfg, seed=1, checkpoint=ck, resume=True)
    np.testing.assert_array_equal(np.asarray(resumed.summary["w"]), np.asarray(full.summary["w"]))
    assert all(h["step_average"] == 1.0 for h in full.history)


def test_step_average_reaches_a_lower_objective_than_the_last_iterate(credit_small):
    """What the option is for (SDCA's averaged output for the hinge): after the same rounds, on
    the same steps, the step average's primal objective is below the last iterate's."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    res = run_hyfdca(credit_small, part, _cfg(rounds=4, eval_every=1, reference=True, reference_sdca_epochs=300))
    last = run_hyfdca(credit_small, part, _cfg(rounds=4, eval_every=1, reference=True, output="last"))
    np.testing.assert_allclose(res.history[-1]["dual"], last.history[-1]["dual"], rtol=1e-9)  # the same steps
    assert [h["primal"] < g["primal"] for h, g in zip(res.history, last.history)].count(True) >= 3


def _primal_messages(credit_small, **kw):
    """A federation after round 1 with no closing sweeps (every pass ends with the fallback
    ``hyfdca.primal``: PrimalAggregation with ``enc(alpha)``), and those messages."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(**kw))
    fed.setup()
    sent: list[Message] = []
    orig = fed.transport.send_and_receive

    def spy(msgs, *a, **k):
        sent.extend(msgs)
        return orig(msgs, *a, **k)

    fed.transport.send_and_receive = spy
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SegmentPass, "_closing", lambda self, *a: {})
        fed.server.run_round(1, fed.transport)
    return fed, [m for m in sent if m.kind == "hyfdca.primal"]


@pytest.mark.parametrize(
    "avg_segs,why",
    [([1], "no finished pass"), ([0, 0], "twice"), ([7], "no finished pass"), ("0", "not a list")],
    ids=["not-held", "repeat", "unknown", "not-a-list"],
)
def test_client_refuses_a_lying_avg_segs_before_anything_changes(credit_small, avg_segs, why):
    """A server naming in ``avg_segs`` a segment without a finished pass at the client (or twice,
    or one it does not hold): refused by name, the client's state unchanged."""
    fed, primals = _primal_messages(credit_small)
    m = primals[-1]
    client = fed.clients[m.receiver]
    # the client answered ``m`` already: put its protocol state back where ``m`` comes (a pass under
    # way), else the replay is refused as a repeated request before ``avg_segs`` is read (issue 28)
    client.protocol.phase = "sweep"
    before = client.get_state()
    bad = Message(m.kind, SERVER, m.receiver, m.round, {**m.payload, "avg_segs": avg_segs, "tag": 10**6})
    with pytest.raises(PayloadError, match="avg_segs") as e:
        client.handle(bad)
    assert why.split()[0] in str(e.value) or why == "not a list"
    after = client.get_state()
    assert before.keys() == after.keys()
    assert json.loads(after["protocol"])["stopped"]  # fail closed: the only change is the stop
    for k in before:
        if k == "protocol":
            continue
        if isinstance(before[k], np.ndarray):
            np.testing.assert_array_equal(before[k], after[k])
        else:
            assert before[k] == after[k], k


@pytest.mark.parametrize(
    "secure,corrupt",
    [
        (True, lambda p: {**p, "masked": p["masked"][:-1]}),
        (True, lambda p: {**p, "masked": p["masked"][: p["masked"].size // 2]}),  # the share alone
        (False, lambda p: {**p, "position_share": p["position_share"][:-1]}),
        (False, lambda p: {**p, "position_share": np.full_like(p["position_share"], np.nan)}),
        (False, lambda p: {k: v for k, v in p.items() if k != "position_share"}),
    ],
    ids=["masked-length", "masked-width-1", "length", "nan", "missing"],
)
def test_a_malformed_position_share_costs_the_round_its_step_average(credit_small, secure, corrupt):
    """A holder's ``hyfdca.primal`` reply (PrimalAggregation after the passes were added; the
    closing sweeps are off here, so every pass ends with it) whose position share is of another
    length, NaN or missing (masked: words of another length, or the share without it): refused
    like a lost reply, the round has no step average (``step_average`` 0) and its output model
    falls back to the last iterate."""
    out, fed = _corrupted_round(credit_small, secure, corrupt, closing=False)
    assert out["step_average"] == 0.0 and fed.server.w_step is None
    np.testing.assert_array_equal(fed.server.output_w(), fed.server.w)


@pytest.mark.parametrize("secure", [True, False])
def test_a_malformed_closing_reply_costs_its_segment_the_pass(credit_small, secure):
    """The same corruption on a holder's closing sweep reply (the share beside its dual change):
    refused like a lost reply, so its segment's pass is not added (nothing of it counts; the
    fallback ``hyfdca.primal`` follows), and the round's step average is that of the passes added."""
    cut = (lambda p: {**p, "masked": p["masked"][:-1]}) if secure else (lambda p: {**p, "share": p["share"][:-1]})
    out, fed = _corrupted_round(credit_small, secure, cut, closing=True)
    assert out["segments_updated"] == out["segments_active"] - 1 and out["failed"] == 1
    assert out["step_average"] == 1.0 and fed.server.w_step is not None
    assert any(e.kind == "hyfdca.primal" for e in fed.transport.log.entries)


def _corrupted_round(credit_small, secure, corrupt, closing):
    """Round 1 on the 3 x 3 grid whose victim ``client-s1-f1`` corrupts its PrimalAggregation
    reply (``hyfdca.primal``, or with ``closing`` its closing sweep's) with ``corrupt``."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(secure_aggregation=secure))
    fed.setup()
    victim = fed.clients["client-s1-f1"]
    orig = victim.handle

    def lie(msg):
        r = orig(msg)
        if msg.payload.get("close") if closing else msg.kind == "hyfdca.primal":
            return Message(r.kind, r.sender, r.receiver, r.round, corrupt(dict(r.payload)))
        return r

    victim.handle = lie
    with pytest.MonkeyPatch.context() as mp:
        if not closing:
            mp.setattr(SegmentPass, "_closing", lambda self, *a: {})
        out = fed.server.run_round(1, fed.transport)
    return out, fed


def test_config_needs_segment_mode():
    with pytest.raises(ValueError, match="output 'step_average' needs dual_mode 'segment'"):
        HyFDCAConfig(output="step_average", dual_mode="consensus")


@pytest.mark.parametrize("schedule", ["parallel", "sequential"])
def test_what_an_honest_but_curious_server_learns_of_the_position_shares(credit_small, monkeypatch, schedule):
    """With secure aggregation the position shares (one weighted combination of a client's rows
    per pass) cross as masked words and the server learns their per-feature sum over the
    exchange's clients. Parallel schedule on the 3 x 3 grid: three clients hold each feature, no
    client's true position share appears in any reply (float64 or fixed point). Sequential: one
    pass's exchange has one client per feature, so the sum *is* that client's position share
    (pinned here; ``docs/privacy.md``), as its share change is; the closing sweep is a one-shot
    exchange (pair masks only, no unmasking round), so a coordinate no other client of the
    exchange holds has no mask and its masked word is that value too: what the sum gives."""
    from hybridfl.privacy.secagg import to_fixed
    from hybridfl.runtime.messages import decode

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    true: list[np.ndarray] = []
    orig = SegmentClientMixin.position_share_of

    def spy(client, segs):
        v = orig(client, segs)
        true.append(v)
        return v

    monkeypatch.setattr(SegmentClientMixin, "position_share_of", spy)
    from hybridfl.algorithms.hyfdca.secure import SecureSharesServerMixin

    sums: list[np.ndarray] = []  # the server's unmasked per-feature sums of the position shares
    collect = SecureSharesServerMixin._count  # every counted secure sum (one-shot or unmasked)

    def collect_spy(server, *a, **k):
        got = collect(server, *a, **k)
        if server.position_sum is not None:
            sums.append(server.position_sum.copy())
        return got

    monkeypatch.setattr(SecureSharesServerMixin, "_count", collect_spy)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=2, segment_schedule=schedule), recorder=raw.append)
    fed.setup()
    fed.loop(monitor=False).run()
    # the shares ride on the closing sweeps' replies, beside the encrypted dual changes
    replies = [m for m in map(decode, raw) if m.receiver == SERVER and "masked" in m.payload]
    assert {m.kind for m in replies} == {"hyfdca.sweep"}
    # a one-shot exchange: the masked words and no self-mask shares
    keys = {"masked", "client_seconds", "he_seconds", "ip", "ip_segs", "dalpha", "dalpha_segs"}
    assert replies and all(set(m.payload) <= keys for m in replies)
    words = np.concatenate([m.payload["masked"] for m in replies])
    assert words.dtype == np.uint64
    nonzero = [v for v in true if np.abs(v).max() > 0]
    assert len(nonzero) >= 9  # every client sent a position share that is not zero
    seen = [np.isin(to_fixed(v, "p").view(np.uint64)[np.abs(v) > 1e-6], words).mean() for v in nonzero]
    assert not any(np.isin(v[np.abs(v) > 1e-6], words.view(np.float64)).any() for v in nonzero)
    in_sums = np.concatenate(sums) if sums else np.zeros(0)
    # a sum that is one client's value is that value to the fixed point's grid (2^-32): nearest within it
    sums_sorted = np.sort(in_sums)

    def within_grid(vals: np.ndarray) -> np.ndarray:
        if not sums_sorted.size:
            return np.zeros(vals.size, dtype=bool)
        i = np.clip(np.searchsorted(sums_sorted, vals), 1, sums_sorted.size - 1)
        near = np.minimum(np.abs(sums_sorted[i] - vals), np.abs(sums_sorted[i - 1] - vals))
        return near <= 2.0**-32

    found = [within_grid(v[np.abs(v) > 1e-6]).mean() for v in nonzero]
    if schedule == "parallel":
        assert max(seen) < 0.01  # three holders per feature: the pair masks cover every word
        assert max(found) < 0.01  # and the sum hides each one
    else:
        assert min(found) == 1.0  # one holder per feature in an exchange: the sum is its share
        assert min(seen) == 1.0  # and so is its unmasked word (one-shot: no self-mask)


def test_client_refuses_step_average_fields_it_was_not_set_up_for(credit_small):
    """``avg_segs`` in a run set up without ``step_average``, and a ``seg_step_average`` that is
    not a bool at setup: refused by field name (the client computes nothing)."""
    from hybridfl.runtime.messages import decode

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", credit_small, part, _cfg(output="last"), recorder=raw.append)
    fed.setup()
    with pytest.MonkeyPatch.context() as mp:  # no closing sweeps: the fallback hyfdca.primal
        mp.setattr(SegmentPass, "_closing", lambda self, *a: {})
        fed.server.run_round(1, fed.transport)
    msgs = [decode(b) for b in raw]
    m = next(x for x in msgs if x.kind == "hyfdca.primal" and x.receiver != SERVER)
    bad = Message(m.kind, SERVER, m.receiver, m.round, {**m.payload, "avg_segs": [0], "tag": 10**6})
    fed.clients[m.receiver].protocol.phase = "sweep"  # replayed: its protocol where ``m`` comes (issue 28)
    with pytest.raises(PayloadError) as e:
        fed.clients[m.receiver].handle(bad)
    assert e.value.field == "avg_segs"
    init = next(x for x in msgs if x.kind == "hyfdca.init" and x.receiver != SERVER)
    bad = Message(init.kind, SERVER, init.receiver, init.round, {**init.payload, "seg_step_average": "yes"})
    fed.clients[init.receiver].protocol = ClientProtocol(init.receiver)  # a client where init comes
    fed.clients[init.receiver].protocol.setup = SETUP.index("hyfdca.init") - 1
    with pytest.raises(PayloadError) as e:
        fed.clients[init.receiver].handle(bad)
    assert e.value.field == "seg_step_average"


def test_step_average_under_ckks_equals_the_plaintext_run(credit_small):
    """Under CKKS (duals encrypted, decrypted duals put on their bounds) the step average is the
    plaintext run's to 1e-7, as ``w`` is."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    runs = {}
    for enc in ("none", "ckks"):
        fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=2, batch_size=100, encryption=enc))
        fed.setup()
        fed.loop(monitor=False).run()
        runs[enc] = fed.server
    assert np.abs(runs["none"].w_step - runs["none"].w).max() > 1e-2
    np.testing.assert_allclose(runs["ckks"].w_step, runs["none"].w_step, atol=1e-7, rtol=0)


def test_a_state_without_the_position_products_rebuilds_them_from_the_places(credit_small):
    """The holders add up ``pw = X_s^T (place * dalpha)`` batch by batch during the pass (one read
    of each batch's rows with ``dw``'s) instead of one product over the segment at its close; a
    state written before ``pw`` existed (``sweep_pdelta`` only) gets it back as that product, and
    the position shares agree with it."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1))
    fed.setup()
    fed.server.run_round(1, fed.transport)
    checked = 0
    for cid, c in fed.clients.items():
        state = c.get_state()
        old = {k: v for k, v in state.items() if not k.startswith("sweep_pw.")}
        assert len(old) < len(state)
        fresh = build_federation("hyfdca", credit_small, part, _cfg(rounds=1)).clients[cid]
        fresh.set_state(old)
        for s, st in c.sweep.items():
            np.testing.assert_allclose(fresh.sweep[s]["pw"], st["pw"], rtol=1e-12, atol=1e-12)
            assert np.abs(st["pw"]).max() > 0
            checked += 1
        segs = sorted(c.sweep)
        np.testing.assert_allclose(fresh.position_share_of(segs), c.position_share_of(segs), rtol=1e-12, atol=1e-12)
    assert checked >= 9


def test_the_output_window_weights_two_rounds_by_their_steps_and_restarts_after_a_round_without():
    """``OutputModelMixin``'s window (``STEP_WINDOW`` = 2): the output is the steps-weighted mean
    of the last two rounds' own mean iterates; a round without a step average outputs the last
    iterate and empties the window; a checkpoint restores it."""
    from types import SimpleNamespace

    from hybridfl.algorithms.hyfdca.output import STEP_WINDOW, OutputModelMixin

    class Stub(OutputModelMixin):
        def __init__(self):
            self.d, self.N, self.config = 3, 10, SimpleNamespace(lam=0.1)  # lambda N = 1
            self.w = np.zeros(3)
            self._output_reset()

    assert STEP_WINDOW == 2
    srv = Stub()
    rounds = []
    for steps, shift in [(10, 1.0), (30, 2.0), (20, 4.0)]:
        srv.w = srv.w + shift  # one pass that moved w by ``shift``, its position sum 0: its mean is w
        srv.set_step_average([(np.full(3, shift), np.zeros(3), steps)])
        rounds.append((srv.w_step.copy(), steps))
        np.testing.assert_array_equal(srv.w_step, srv.w)
    _, (b, tb), (c, tc) = rounds
    np.testing.assert_allclose(srv.round_output(), (tb * b + tc * c) / (tb + tc))  # the last two only
    arrays, meta = srv.output_state()
    again = Stub()
    again.set_output_state(arrays, meta)
    np.testing.assert_array_equal(again.round_output(), srv.round_output())
    srv.set_step_average([(np.ones(3), None, 5)])  # a pass without its position sum: no step average
    assert srv.w_step is None and srv.step_window == []
    np.testing.assert_array_equal(srv.round_output(), srv.w)
    srv.set_step_average([(np.ones(3), np.zeros(3), 8)])
    np.testing.assert_array_equal(srv.round_output(), srv.w_step)  # the window starts again
    old = Stub()  # a checkpoint from before the window: w_step alone
    old.set_output_state({"w_step": np.arange(3.0)}, {})
    np.testing.assert_array_equal(old.round_output(), np.arange(3.0))
