"""HyFDCA segment mode's batch Gram precision (``gram_dtype`` of ``hyfdca.init``,
:mod:`hybridfl.algorithms.hyfdca.gram`): the float32 matrices against float64 ones. The products and the kept matrices are float32;
the holders of a sample still make the same steps; ``w = w(alpha)`` and the duality gap stay exact;
the run follows the float64 run to float32's rounding; a rebuilt client keeps its float32
matrices bit for bit; a client computes in its own precision and refuses an init declaring
another (a malicious server splitting a segment's holders between float32 and float64) by name."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.convex.losses import w_of_alpha
from hybridfl.algorithms.convex.reference import reference_optimum
from hybridfl.algorithms.hyfdca import HyFDCAConfig, Monitor, build_problem, dealer_of, gram
from hybridfl.algorithms.hyfdca.gram import pack_gram, partial_gram, symmetric_gram
from hybridfl.algorithms.hyfdca.protocol import SETUP, ClientProtocol
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message, decode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE
from tests.rebuild import reference_and_rebuilt

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _cfg(**kw) -> HyFDCAConfig:
    base = dict(HYFDCA_BEFORE, lam=1e-2, rounds=6, eval_every=1, dual_mode="segment", batch_size=100)
    base["fit_intercept"] = False  # the tests rebuild the problem by hand (build_problem)
    base.update(kw)
    return HyFDCAConfig(**base)


def test_the_server_sends_float32_and_it_is_not_an_option():
    assert gram.GRAM_DTYPE == "float32"
    assert "gram_dtype" not in HyFDCAConfig.model_fields


@pytest.mark.parametrize("sparse", [True, False])
def test_float32_packed_gram_is_the_single_precision_product(sparse):
    """``pack_gram`` in float32: float32 values (``ssyrk`` of the rounded batch), within float32's
    rounding of the float64 product; float64 is the float64 product bit for bit."""
    rng = np.random.default_rng(5)
    X = rng.random((200, 90)) * (rng.random((200, 90)) < 0.2)
    Xb = sp.csr_matrix(X) if sparse else X
    tri = 200 * 201 // 2
    got32, got64 = np.empty(tri), np.empty(tri)
    assert pack_gram(Xb, None, got32, 0, {}, np.float32) == tri
    assert pack_gram(Xb, None, got64, 0, {}, np.float64) == tri
    want = kernels.upper_triangle(partial_gram(Xb, None))
    np.testing.assert_array_equal(got64, want)
    assert np.array_equal(got32.astype(np.float32).astype(np.float64), got32)  # float32 values
    assert not np.array_equal(got32, got64)
    np.testing.assert_allclose(got32, got64, rtol=0, atol=1e-6 * np.abs(got64).max())


def test_symmetric_gram_rounds_to_its_dtype_and_clips_the_diagonal():
    up = np.array([-1e-9, 0.1, 1 / 3, 2.0, 0.7, 5.0])  # 3 x 3, a slightly negative first diagonal
    g = symmetric_gram(up, 3, np.float32)
    assert g.dtype == np.float32
    want = np.array([[0.0, 0.1, 1 / 3], [0.1, 2.0, 0.7], [1 / 3, 0.7, 5.0]], dtype=np.float32)
    np.testing.assert_array_equal(g, want)
    assert symmetric_gram(up, 3).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_checked_grams_are_the_symmetric_grams_or_none(dtype):
    """``checked_symmetric_grams`` (the holder's setup: check and fill in one pass) gives
    ``symmetric_gram`` of each batch's triangle bit for bit, and ``None`` for a NaN, an infinity or
    (float32) a value over float32's range anywhere, or a vector of another length."""
    rng = np.random.default_rng(3)
    sizes = [4, 1, 3]
    ends = np.cumsum([b * (b + 1) // 2 for b in sizes])
    packed = rng.standard_normal(int(ends[-1])) * 10
    got = gram.checked_symmetric_grams(packed, sizes, dtype)
    starts = np.r_[0, ends[:-1]]
    for g, b, s0, e in zip(got, sizes, starts, ends):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, symmetric_gram(packed[s0:e], b, dtype))
    for bad in [np.nan, np.inf, -np.inf] + ([1e39] if dtype == np.float32 else []):
        for where in (0, 7, int(ends[-1]) - 1):
            v = packed.copy()
            v[where] = bad
            assert gram.checked_symmetric_grams(v, sizes, dtype) is None
    assert gram.checked_symmetric_grams(packed[:-1], sizes, dtype) is None
    assert gram.checked_symmetric_grams(np.r_[packed, 1.0], sizes, dtype) is None


def _run(split, part, cfg, dtype, monkeypatch):
    monkeypatch.setattr(gram, "GRAM_DTYPE", dtype)
    fed = build_federation("hyfdca", split, part, cfg)
    prob = build_problem(split, part, "hinge", cfg.lam, [1])
    ref = reference_optimum(prob.X, prob.y, cfg.lam, "hinge", sdca_epochs=100)
    mon = fed.monitor = Monitor(prob, ref, dealer_of(fed.secrets))
    fed.setup()
    hist = fed.loop().run()
    return fed, prob, ref, mon, hist


def test_float32_holders_agree_w_is_w_of_alpha_and_the_run_follows_float64(credit_small, monkeypatch):
    """3 x 3 grid, 6 rounds, each run from its own setup: with float32 matrices every holder keeps
    the same ``alpha`` bit for bit (they round the same sums), ``w = w(alpha)``, the gap bounds the
    suboptimality every round, and ``w`` and the objectives are the float64 run's to float32's
    rounding (the steps differ: the matrices are not the same)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    runs = {dt: _run(credit_small, part, _cfg(), dt, monkeypatch) for dt in ("float32", "float64")}
    fed, prob, ref, mon, hist = runs["float32"]
    alpha = mon.alpha(fed.server)
    for c in fed.clients.values():
        assert all(g.dtype == np.float32 for gs in c.gram for g in gs)
        assert np.array_equal(c.alpha, alpha[[prob.row[s] for s in c.ids]])
    np.testing.assert_allclose(fed.server.w, w_of_alpha(prob.X, alpha, 1e-2), atol=1e-10)
    assert all(h["primal"] - ref.objective <= h["duality_gap"] + 1e-12 for h in hist)
    fed64, _, _, _, hist64 = runs["float64"]
    assert all(g.dtype == np.float64 for c in fed64.clients.values() for gs in c.gram for g in gs)
    assert not np.array_equal(fed.server.w, fed64.server.w)
    np.testing.assert_allclose(fed.server.w, fed64.server.w, rtol=0, atol=1e-5 * np.abs(fed64.server.w).max())
    for h, h64 in zip(hist, hist64):
        assert abs(h["primal"] - h64["primal"]) <= 1e-6 * abs(h64["primal"])


def test_a_rebuilt_client_keeps_its_float32_matrices(credit_small):
    """Flower rebuilds a client from its state before every message: the float32 run ends where the
    uninterrupted one does, bit for bit (the matrices cross the state as float64 copies of float32
    values and come back as float32)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=2, eval_every=0, reference=False)
    ref, fed = reference_and_rebuilt(credit_small, part, cfg)
    np.testing.assert_array_equal(fed.server.w, ref.server.w)
    np.testing.assert_array_equal(fed.server.w_step, ref.server.w_step)


def _init_and_client(split):
    """A recorded run's first ``hyfdca.init`` to a client and that client, set back to where the
    init comes."""
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, _cfg(rounds=1), recorder=raw.append)
    fed.setup()
    init = next(m for m in map(decode, raw) if m.kind == "hyfdca.init" and m.receiver != SERVER)
    assert init.payload["gram_dtype"] == "float32"
    client = fed.clients[init.receiver]
    client.protocol = ClientProtocol(init.receiver)
    client.protocol.setup = SETUP.index("hyfdca.init") - 1
    return init, client


@pytest.mark.parametrize("bad", ["float64", "float16", "", 32, None, float("nan"), ["float32"], np.array([1.0, 2.0])])
def test_client_refuses_a_gram_dtype_other_than_its_own_by_name(credit_small, bad):
    """A float32 client refuses an init declaring anything else, a valid ``"float64"`` included: a
    server sending float32 to one holder of a segment and float64 to another (whose steps would
    then differ) is refused by the second before it computes anything, and the refusal stops that
    client for the run (fail closed: it depends on the server's message only)."""
    init, client = _init_and_client(credit_small)
    with pytest.raises(PayloadError) as e:
        client.handle(Message(init.kind, SERVER, init.receiver, init.round, {**init.payload, "gram_dtype": bad}))
    assert e.value.field == "gram_dtype"
    assert "float32" in str(e.value)
    assert client.protocol.stopped
    with pytest.raises(ProtocolError):
        client.handle(init)  # the honest init afterwards: still refused


def test_client_without_a_declared_gram_dtype_uses_its_own(credit_small, monkeypatch):
    """An init without ``gram_dtype`` (a server from before it): the client computes in its own
    precision, float32, or float64 where it is set so."""
    for own in ("float32", "float64"):
        init, client = _init_and_client(credit_small)
        monkeypatch.setattr(gram, "GRAM_DTYPE", own)
        payload = {k: v for k, v in init.payload.items() if k != "gram_dtype"}
        client.handle(Message(init.kind, SERVER, init.receiver, init.round, payload))
        assert client.params["gram_dtype"] == own
        monkeypatch.undo()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_client_refuses_gram_sums_that_overflow_its_dtype(credit_small, dtype, monkeypatch):
    """A server's ``hyfdca.norms`` whose Gram sums hold 1e39 (finite in float64, infinite in
    float32): a float32 client refuses it by name before keeping anything; a float64 one keeps it."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    monkeypatch.setattr(gram, "GRAM_DTYPE", dtype)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1), recorder=raw.append)
    fed.setup()
    norms = next(m for m in map(decode, raw) if m.kind == "hyfdca.norms" and m.receiver != SERVER)
    client = fed.clients[norms.receiver]
    he = fed.server.he
    sums = [np.array(he.decrypt(ct)) for ct in norms.payload["gram"]]
    sums[0][1] = 1e39
    crafted = Message(norms.kind, SERVER, norms.receiver, 0, {**norms.payload, "gram": [he.encrypt(v) for v in sums]})
    kept = client.gram
    client.protocol = ClientProtocol(norms.receiver)  # a client where the norms come
    client.protocol.setup = SETUP.index("hyfdca.norms") - 1
    if dtype == "float32":
        with pytest.raises(PayloadError, match="not finite in float32") as e:
            client.handle(crafted)
        assert e.value.field == "gram" and client.gram is kept
    else:
        client.handle(crafted)
        assert client.gram[0][0][0, 1] == 1e39
