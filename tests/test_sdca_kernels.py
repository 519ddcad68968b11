"""The compiled SDCA loops (``algorithms/convex/kernels.py``, issue 17) against plain-Python
references written here: the coordinate step of every loss, the Gram loop of ``dual_mode:
segment`` (bit for bit), a holder's whole batch step in one call against the NumPy calls it
replaces (bit for bit), the row loops (sparse and dense), the batch products ``X_B^T dalpha`` and
``X_B w`` (bit for bit with scipy), and the per-pass visit orders after a restored state."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.convex.losses import LOSSES, RowData, coordinate_step, gram_steps, row_norms_sq
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import build_federation
from tests.conftest import HYFDCA_BEFORE

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _step_reference(loss, a, y, u, s, gamma=0.0):
    """The coordinate step as the Python code before compiling (losses module docstring)."""
    if loss == "hinge":
        if s + gamma <= 0:
            return y if y * u < 1 else 0.0 if y * u > 1 else a
        b = y * a + (1.0 - y * u - gamma * y * a) / (s + gamma)
        return y * (0.0 if b < 0 else 1.0 if b > 1 else b)
    if loss == "squared":
        return a + (y - u - a) / (1.0 + s)
    b0, yu = y * a, y * u
    lo, hi = 1e-12, 1.0 - 1e-12
    b = min(max(b0, 1e-3), 1 - 1e-3)
    for _ in range(60):
        g = math.log((1.0 - b) / b) - yu - s * (b - b0)
        if g > 0:
            lo = b
        else:
            hi = b
        if abs(g) < 1e-13:
            break
        nb = b - g / (-1.0 / (b * (1.0 - b)) - s)
        if not (lo < nb < hi):
            nb = 0.5 * (lo + hi)
        if abs(nb - b) < 1e-15:
            b = nb
            break
        b = nb
    return y * b


def _gram_reference(order, alpha, y, u0, G, loss, lam_n, sigma, gamma):
    c = sigma / lam_n
    corr, delta = np.zeros(len(u0)), np.zeros(len(u0))
    for i in order.tolist():
        a = alpha[i]
        new = _step_reference(loss, a, y[i], u0[i] + corr[i], c * G[i, i], gamma)
        d = new - a
        if d != 0.0:
            alpha[i] = new
            delta[i] += d
            corr += (c * d) * G[i]
    return delta


def _rows_reference(X, order, alpha, y, u0, q, loss, lam_n, sigma, cross, dw):
    delta = np.zeros_like(alpha)
    for i in order.tolist():
        x = np.asarray(X[i].toarray()).ravel() if sp.issparse(X) else X[i]
        u = u0[i] + cross * float(sum(x[j] * dw[j] for j in range(x.size)))
        a = alpha[i]
        new = _step_reference(loss, a, y[i], u, sigma * q[i] / lam_n)
        d = new - a
        if d != 0.0:
            alpha[i] = new
            delta[i] += d
            dw += (d / lam_n) * x
    return delta


def _problem(seed, b, d, density=0.3):
    rng = np.random.default_rng(seed)
    X = (rng.random((b, d)) < density) * rng.normal(size=(b, d))
    X[: max(1, b // 10)] = 0.0  # zero rows: s = 0 (the unsmoothed hinge's jump branch)
    y = np.where(rng.random(b) < 0.5, -1.0, 1.0)
    alpha = y * np.clip(rng.random(b) * 1.6 - 0.3, 0.0, 1.0)
    u0 = X @ rng.normal(size=d) * 0.3 + y * rng.choice([0.0, 1.0, 2.0], size=b)
    return rng, X, y, alpha, u0


@pytest.mark.parametrize("loss", LOSSES)
def test_compiled_step_is_the_python_step(loss):
    rng = np.random.default_rng(0)
    for _ in range(300):
        y = float(rng.choice([-1.0, 1.0]))
        a = y * float(rng.random()) if loss != "squared" else float(rng.normal())
        u, s = float(rng.normal() * 3), float(rng.choice([0.0, rng.random() * 5]))
        gamma = float(rng.choice([0.0, 0.5])) if loss == "hinge" else 0.0
        assert coordinate_step(loss, a, y, u, s, gamma) == _step_reference(loss, a, y, u, s, gamma)


def test_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="unknown loss"):
        coordinate_step("huber", 0.0, 1.0, 0.0, 1.0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 60),
    loss=st.sampled_from(LOSSES),
    gamma=st.sampled_from([0.0, 0.3]),
    sigma=st.sampled_from([1.0, 2.5]),
)
def test_gram_loop_is_bitwise_the_python_loop(seed, b, loss, gamma, sigma):
    """Same alpha (updated in place) and delta bit for bit, for every loss, with smoothing, zero
    rows and samples at both ends of the box."""
    rng, X, y, alpha0, u0 = _problem(seed, b, 7)
    G = X @ X.T
    order = rng.permutation(b)
    gamma = gamma if loss == "hinge" else 0.0
    a1, a2 = alpha0.copy(), alpha0.copy()
    d1 = gram_steps(order, a1, y, u0, G, loss, 3.0, sigma, gamma)
    d2 = _gram_reference(order, a2, y, u0, G, loss, 3.0, sigma, gamma)
    assert np.array_equal(d1, d2) and np.array_equal(a1, a2)


def test_gram_loop_takes_both_branches_and_other_dtypes():
    """Some steps move and others stay; integer orders of another width, float32 labels and a
    non-contiguous alpha give the same result (alpha still updated in place)."""
    rng, X, y, alpha0, u0 = _problem(5, 80, 30)
    G = X @ X.T
    order = rng.permutation(80)
    a1 = alpha0.copy()
    d1 = gram_steps(order, a1, y, u0, G, "hinge", 4.0, 1.5)
    assert 0 < np.count_nonzero(d1) < 80
    holder = np.zeros((80, 2))
    holder[:, 0] = alpha0
    a2 = holder[:, 0]  # a strided view
    d2 = gram_steps(order.astype(np.int32), a2, y.astype(np.float32), u0, G, "hinge", 4.0, 1.5)
    assert np.array_equal(d1, d2) and np.array_equal(holder[:, 0], a1)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
def test_row_loops_equal_the_python_loop(loss, sparse):
    """Centralised-style rows with own changes (``cross``) and a partial order: the same alpha,
    delta and ``dw`` up to the order of one inner product's sum."""
    rng, X, y, alpha0, u0 = _problem(7, 120, 15)
    Xm = sp.csr_matrix(X) if sparse else X
    q = row_norms_sq(X)
    order = rng.permutation(120)[:90]
    a1, a2 = alpha0.copy(), alpha0.copy()
    dw1 = rng.normal(size=15) * 0.1
    dw2 = dw1.copy()
    d1 = RowData(Xm).dot_and_add(order, a1, y, u0, q, loss, 6.0, 1.3, 0.7, dw1)
    d2 = _rows_reference(Xm, order, a2, y, u0, q, loss, 6.0, 1.3, 0.7, dw2)
    np.testing.assert_allclose(d1, d2, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a1, a2, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dw1, dw2, rtol=0, atol=1e-12)
    assert np.count_nonzero(d1) > 0 and np.all(d1[np.setdiff1d(np.arange(120), order)] == 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), d=st.integers(1, 30))
def test_batch_transpose_product_is_bitwise_scipy(seed, n, d):
    """``X_B^T dalpha`` with most entries of ``dalpha`` zero: the compiled product skips those
    rows and still equals scipy's bit for bit; dense batches go through NumPy."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.3, format="csr", random_state=rng)
    X.sort_indices()
    dal = rng.normal(size=n) * (rng.random(n) < 0.3)
    assert np.array_equal(kernels.rmatvec(X, dal), np.asarray(X.T @ dal).ravel())
    Xd = X.toarray()
    np.testing.assert_allclose(kernels.rmatvec(Xd, dal), Xd.T @ dal, rtol=1e-12, atol=1e-15)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 30), d=st.integers(1, 12), average=st.booleans())
@pytest.mark.parametrize("loss", LOSSES)
def test_a_whole_batch_step_in_one_call_is_the_numpy_sequence_bit_for_bit(loss, seed, b, d, average):
    """``kernels.csr_batch_steps`` (``SegmentClientMixin._step`` on a CSR batch) against the
    NumPy calls it replaced: the batch's duals gathered, ``gram_steps``, ``delta[rows] += d``,
    ``dw += X_B^T d / lam_n`` and (step average) ``pdelta[rows] += place * d`` and
    ``pw += X_B^T (place * d)``; ``kernels.dense_batch_steps`` on the same batch dense: the same
    steps, its products equal up to rounding."""
    rng = np.random.default_rng(seed)
    n = b + 7
    rows = rng.permutation(n)[:b]
    Xb = sp.random(b, d, density=0.5, format="csr", random_state=rng)
    Xb.sort_indices()
    y = rng.choice([-1.0, 1.0], size=b)
    alpha, delta0 = rng.normal(size=n), np.zeros(n)  # feasible duals: y_i alpha_i in (0, 1) but squared's
    if loss == "squared":
        delta0 = rng.normal(size=n) * 0.01
    else:
        alpha[rows] = y * rng.uniform(0.05, 0.95, size=b)
    G = Xb.toarray() @ Xb.toarray().T
    u0, visit = rng.normal(size=b), rng.permutation(b)
    lam_n, sigma, steps = 3.0, 1.0, int(rng.integers(0, 50))
    dw1 = rng.normal(size=d)
    dw2, delta1, delta2 = dw1.copy(), delta0.copy(), delta0.copy()
    pd1 = rng.normal(size=n) if average else np.zeros(0)
    pd2 = pd1.copy()
    pw1 = rng.normal(size=d) if average else np.zeros(0)
    pw2 = pw1.copy()
    # the NumPy sequence
    a = alpha[rows] + delta2[rows]
    dd = gram_steps(visit, a, y, u0, G, loss, lam_n, sigma, 0.0)
    delta2[rows] += dd
    dw2 += kernels.rmatvec(Xb, dd) / lam_n
    if average:
        place = np.empty(b)
        place[visit] = steps + np.arange(b)
        pd2[rows] += place * dd
        pw2 += kernels.rmatvec(Xb, place * dd)
    kernels.csr_batch_steps(
        visit, rows, alpha, delta1, y, u0, G, kernels.LOSS_CODES[loss], sigma / lam_n, 0.0,
        Xb.indptr, Xb.indices, Xb.data, lam_n, dw1, pd1, pw1, steps,
    )  # fmt: skip
    for got, want in ((delta1, delta2), (dw1, dw2), (pd1, pd2), (pw1, pw2)):
        assert np.array_equal(got, want)
    # a dense block: the same steps; its products summed row by row (not BLAS's order)
    dw3, delta3, pd3, pw3 = dw2 - kernels.rmatvec(Xb, dd) / lam_n, delta0.copy(), pd2.copy(), pw2.copy()
    if average:
        pd3[rows] -= place * dd
        pw3 -= kernels.rmatvec(Xb, place * dd)
    kernels.dense_batch_steps(
        visit, rows, alpha, delta3, y, u0, G, kernels.LOSS_CODES[loss], sigma / lam_n, 0.0,
        Xb.toarray(), lam_n, dw3, pd3, pw3, steps,
    )  # fmt: skip
    assert np.array_equal(delta3, delta2) and np.array_equal(pd3, pd2)
    np.testing.assert_allclose(dw3, dw2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pw3, pw2, rtol=1e-12, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(0, 40), d=st.integers(1, 30))
def test_batch_product_with_the_weights_is_bitwise_scipy(seed, n, d):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.3, format="csr", random_state=rng)
    w = rng.normal(size=d)
    assert np.array_equal(kernels.matvec(X, w), np.asarray(X @ w).ravel())
    np.testing.assert_allclose(kernels.matvec(X.toarray(), w), X.toarray() @ w, rtol=1e-12, atol=1e-15)


def test_visit_orders_continue_after_a_restored_state(credit_small):
    """A holder restored mid-pass (its state saved after two sweeps) draws the same visit orders
    for the rest of the pass as the holder that went on; the orders of one pass differ between
    batches, and a new pass (another seed) draws others."""
    part = GridPartitioner(2, 2, 1, 0).partition(credit_small.train)
    cfg = HyFDCAConfig(
        **{**HYFDCA_BEFORE, "dual_mode": "segment", "batch_size": 40}, lam=1e-2, rounds=1, eval_every=0, reference=False
    )
    fed = build_federation("hyfdca", credit_small, part, cfg)
    fed.setup()
    c = next(iter(fed.clients.values()))
    twin = build_federation("hyfdca", credit_small, part, cfg).clients[c.client_id]
    n_b = len(c.seg_batches[0])
    blank = {"dw": np.zeros(c.X.shape[1]), "delta": np.zeros(c.ids.size), "sigma": 1.0}
    c.sweep = {0: {"order": list(range(n_b)), "j": 0, "seed": 11, **blank}}
    first = []
    for j in range(n_b):
        first.append(c._visit_order(0))
        c.sweep[0]["j"] += 1
        if j == 1:
            twin.set_state(c.get_state())
    for j in range(2, n_b):
        assert np.array_equal(twin._visit_order(0), first[j])
        twin.sweep[0]["j"] += 1
    assert n_b >= 3 and not np.array_equal(first[0], first[1])
    c.sweep = {0: {"order": list(range(n_b)), "j": 0, "seed": 12, **blank}}
    assert not np.array_equal(c._visit_order(0), first[0])


def test_kernels_module_names_every_loss():
    assert set(kernels.LOSS_CODES) == set(LOSSES)


@pytest.mark.parametrize("b", [1, 2, 7, 64])
def test_gram_triangles_pack_and_unpack_like_numpy(b):
    """The packed upper triangle is ``G[np.triu_indices(b)]`` and unpacking gives the symmetric
    matrix back, bit for bit (into float32: each value rounded as NumPy rounds it)."""
    rng = np.random.default_rng(b)
    X = rng.normal(size=(b, 5))
    G = X @ X.T
    up = kernels.upper_triangle(G)
    assert np.array_equal(up, G[np.triu_indices(b)])
    S = kernels.symmetric_from_upper(up, np.empty((b, b)))
    assert np.array_equal(S, np.triu(G) + np.triu(G, 1).T)
    S32 = kernels.symmetric_from_upper(up, np.empty((b, b), dtype=np.float32))
    assert S32.dtype == np.float32
    assert np.array_equal(S32, (np.triu(G) + np.triu(G, 1).T).astype(np.float32))


def test_gram_steps_refuse_an_unknown_loss():
    with pytest.raises(ValueError, match="unknown loss"):
        gram_steps(np.arange(2), np.zeros(2), np.ones(2), np.zeros(2), np.eye(2), "huber", 1.0, 1.0)
