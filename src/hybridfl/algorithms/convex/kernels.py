"""The SDCA inner loops, compiled (numba): the coordinate step of every loss and the two sequential
loops that call it once per sample, the Gram-matrix loop of HyFDCA ``dual_mode: segment`` and the
row loop of the other modes and of centralised SDCA.

These loops are the part of a HyFDCA round that is a Python ``for`` per sample (the holders of a
segment each repeat it), so they are written once here, over NumPy arrays and floats, and compiled
on first use (``cache=True``: the machine code is kept in ``__pycache__`` beside this file, so later
processes load it instead of compiling). :mod:`hybridfl.algorithms.convex.losses` wraps them with
the documented signatures (loss names, checks); the formulas and their sources are there.

Floating point: every operation is the one the NumPy/Python loop made, in the same order, without
fast-math (no reassociation, no fused multiply-add), so the Gram loop is bit for bit the loop it
replaced (``tests/test_sdca_kernels.py`` checks this against a plain-Python reference). The row
loop's inner product ``x_i^T dw`` is summed in index order (BLAS sums in blocks), which can differ
from the NumPy loop in the last bits.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from numba import njit

HINGE, LOGISTIC, SQUARED = 0, 1, 2
LOSS_CODES = {"hinge": HINGE, "logistic": LOGISTIC, "squared": SQUARED}
_EPS = 1e-12


@njit(cache=True, nogil=True)
def step(loss: int, a: float, y: float, u: float, s: float, gamma: float) -> float:  # pragma: no cover - compiled
    """The SDCA coordinate step (:func:`hybridfl.algorithms.convex.losses.coordinate_step`, whose
    docstring gives the formulas), ``loss`` one of :data:`LOSS_CODES`' values."""
    if loss == HINGE:
        sg = s + gamma
        if sg <= 0:
            if y * u < 1:
                return y
            if y * u > 1:
                return 0.0
            return a
        b = y * a + (1.0 - y * u - gamma * y * a) / sg
        if b < 0:
            b = 0.0
        elif b > 1:
            b = 1.0
        return y * b
    if loss == SQUARED:
        return a + (y - u - a) / (1.0 + s)
    # logistic: solve g(b) = log((1-b)/b) - y u - s (b - b0) = 0 on (0, 1); g is decreasing.
    b0 = y * a
    yu = y * u
    lo, hi = _EPS, 1.0 - _EPS
    b = min(max(b0, 1e-3), 1 - 1e-3)
    for _ in range(60):
        g = math.log((1.0 - b) / b) - yu - s * (b - b0)
        if g > 0:
            lo = b
        else:
            hi = b
        if abs(g) < 1e-13:
            break
        gp = -1.0 / (b * (1.0 - b)) - s
        nb = b - g / gp
        if not (lo < nb < hi):
            nb = 0.5 * (lo + hi)
        if abs(nb - b) < 1e-15:
            b = nb
            break
        b = nb
    return y * b


@njit(cache=True, nogil=True)
def _move(i, u, s, alpha, delta, y, loss, gamma):  # pragma: no cover - compiled
    """One coordinate step on sample ``i`` (estimate ``u``, curvature ``s``): ``alpha[i]`` and
    ``delta[i]`` updated in place; returns the change ``d`` (0.0 when the step stays)."""
    a = alpha[i]
    new = step(loss, a, y[i], u, s, gamma)
    d = new - a
    if d != 0.0:
        alpha[i] = new
        delta[i] += d
    return d


@njit(cache=True, nogil=True)
def gram_loop(order, alpha, y, u0, G, loss, c, gamma):  # pragma: no cover - compiled
    """Sequential steps on a mini-batch with Gram matrix ``G`` ``(b, b)`` (float64 or float32; the
    sums are float64 either way): for each ``i`` in
    ``order``, ``u = u0[i] + c sum_j delta_j G[i, j]``, the step with ``s = c G[i, i]``; ``alpha``
    ``(b,)`` is updated in place; returns the ``(b,)`` change (``losses.gram_steps``)."""
    n = u0.shape[0]
    corr = np.zeros(n)
    delta = np.zeros(n)
    for t in range(order.shape[0]):
        i = order[t]
        d = _move(i, u0[i] + corr[i], c * G[i, i], alpha, delta, y, loss, gamma)
        if d != 0.0:
            cd = c * d
            for j in range(n):
                corr[j] += cd * G[i, j]
    return delta


@njit(cache=True, nogil=True)
def csr_row_loop(
    order, alpha, y, u0, q, indptr, indices, data, loss, lam_n, sigma, cross, dw, gamma
):  # pragma: no cover - compiled
    """Sequential steps over CSR rows ``order``: ``u = u0[i] + cross x_i^T dw``, the step with
    ``s = sigma q_i / lam_n``, ``dw += (delta_i / lam_n) x_i`` (``RowData.dot_and_add``)."""
    delta = np.zeros(alpha.shape[0])
    for t in range(order.shape[0]):
        i = order[t]
        s0, e0 = indptr[i], indptr[i + 1]
        u = u0[i]
        if cross != 0.0:
            acc = 0.0
            for p in range(s0, e0):
                acc += data[p] * dw[indices[p]]
            u = u + cross * acc
        d = _move(i, u, sigma * q[i] / lam_n, alpha, delta, y, loss, gamma)
        if d != 0.0:
            f = d / lam_n
            for p in range(s0, e0):
                dw[indices[p]] += f * data[p]
    return delta


@njit(cache=True, nogil=True)
def dense_row_loop(order, alpha, y, u0, q, X, loss, lam_n, sigma, cross, dw, gamma):  # pragma: no cover - compiled
    """:func:`csr_row_loop` for a dense C-ordered ``X`` ``(n, d)``."""
    delta = np.zeros(alpha.shape[0])
    d_ = X.shape[1]
    for t in range(order.shape[0]):
        i = order[t]
        u = u0[i]
        if cross != 0.0:
            acc = 0.0
            for j in range(d_):
                acc += X[i, j] * dw[j]
            u = u + cross * acc
        d = _move(i, u, sigma * q[i] / lam_n, alpha, delta, y, loss, gamma)
        if d != 0.0:
            f = d / lam_n
            for j in range(d_):
                dw[j] += f * X[i, j]
    return delta


def as_f64(v) -> np.ndarray:
    """``v`` as a C-contiguous float64 array (no copy when it already is one)."""
    return np.ascontiguousarray(v, dtype=np.float64)


def rmatvec(X, d) -> np.ndarray:
    """``X^T d`` ``(m,)`` for ``X`` ``(n, m)`` (CSR: compiled, rows with ``d_i = 0`` skipped, the
    same values as scipy's product: :func:`csr_rmatvec`; dense: NumPy's)."""
    if sp.issparse(X):
        return csr_rmatvec(X.indptr, X.indices, X.data, as_f64(d), X.shape[1])
    return np.asarray(X.T @ d, dtype=np.float64).ravel()


def matvec(X, v) -> np.ndarray:
    """``X v`` ``(n,)`` for ``X`` ``(n, m)`` (CSR: compiled, :func:`csr_matvec`, the same values as
    scipy's product; dense: NumPy's)."""
    if sp.issparse(X):
        return csr_matvec(X.indptr, X.indices, X.data, as_f64(v))
    return np.asarray(X @ v, dtype=np.float64).ravel()


def as_index(v) -> np.ndarray:
    """``v`` as a C-contiguous int64 index array."""
    return np.ascontiguousarray(v, dtype=np.int64)


@njit(cache=True, nogil=True)
def csr_rmatvec(indptr, indices, data, d, width):  # pragma: no cover - compiled
    """``X^T d`` ``(width,)`` for CSR ``X`` ``(n, width)``, rows added in order and rows with
    ``d_i = 0`` skipped (they add exact zeros; scipy's ``csc_matvec`` of ``X^T`` adds them in
    the same order, so the same values)."""
    out = np.zeros(width)
    for i in range(indptr.shape[0] - 1):
        di = d[i]
        if di != 0.0:
            for p in range(indptr[i], indptr[i + 1]):
                out[indices[p]] += data[p] * di
    return out


@njit(cache=True, nogil=True)
def upper_triangle(G):  # pragma: no cover - compiled
    """The upper triangle (diagonal included) of a square ``G`` ``(b, b)``, row by row:
    ``(b (b + 1) / 2,)`` (the order of ``G[np.triu_indices(b)]``)."""
    b = G.shape[0]
    out = np.empty(b * (b + 1) // 2)
    k = 0
    for i in range(b):
        for j in range(i, b):
            out[k] = G[i, j]
            k += 1
    return out


@njit(cache=True, nogil=True)
def pack_lower_columns(C, out, start):  # pragma: no cover - compiled
    """Write the lower triangle (diagonal included) of a square ``C`` ``(b, b)``, column by column,
    into ``out[start : start + b (b + 1) / 2]`` and return the end. For a symmetric ``C`` this is
    :func:`upper_triangle`'s order (column ``i`` of the lower triangle is row ``i`` of the upper
    one), read contiguously from a Fortran-ordered ``C``: BLAS ``syrk``'s output, whose upper
    triangle is not set."""
    b = C.shape[0]
    k = start
    for i in range(b):
        for j in range(i, b):
            out[k] = C[j, i]
            k += 1
    return k


@njit(cache=True, nogil=True)
def symmetric_from_upper(upper, G):  # pragma: no cover - compiled
    """Fill the square ``G`` ``(b, b)`` (float64 or float32: each value rounded to its dtype) with
    the symmetric matrix whose upper triangle, row by row, is ``upper`` (:func:`upper_triangle`'s
    inverse); returns ``G``."""
    b = G.shape[0]
    k = 0
    for i in range(b):
        for j in range(i, b):
            G[i, j] = upper[k]
            G[j, i] = upper[k]
            k += 1
    return G


@njit(cache=True, nogil=True)
def checked_symmetric_from_upper(upper, start, G, bound):  # pragma: no cover - compiled
    """:func:`symmetric_from_upper` of ``upper[start : start + b (b + 1) / 2]`` into ``G`` ``(b, b)``,
    checking each value on the way (one pass over ``upper`` instead of a check and a fill): returns
    False at the first value that is not finite or over ``bound`` in magnitude (``G`` then partly
    written), True otherwise."""
    b = G.shape[0]
    k = start
    for i in range(b):
        for j in range(i, b):
            x = upper[k]
            if not np.isfinite(x) or abs(x) > bound:
                return False
            G[i, j] = x
            G[j, i] = x
            k += 1
    return True


@njit(cache=True, nogil=True)
def csr_scatter(indptr, indices, data, colmap, D):  # pragma: no cover - compiled
    """Add a CSR matrix ``(r, c)`` (``indptr``, ``indices``, ``data``) into the dense ``D``
    ``(r, c')``, column ``j`` into column ``colmap[j]`` (``gram.dense_batch``)."""
    for r in range(indptr.shape[0] - 1):
        for p in range(indptr[r], indptr[r + 1]):
            D[r, colmap[indices[p]]] += data[p]


@njit(cache=True, nogil=True)
def all_finite(v, bound=np.inf):  # pragma: no cover - compiled
    """Whether every value of the 1-D ``v`` is finite and at most ``bound`` in magnitude
    (``np.isfinite(v).all()`` without its temporary array; ``bound`` float32's largest value for
    values that must stay finite in float32)."""
    for x in v:
        if not np.isfinite(x) or abs(x) > bound:
            return False
    return True


@njit(cache=True, nogil=True)
def _batch_duals(order, rows, alpha, delta, y, u0, G, loss, c, gamma, pdelta, steps):  # pragma: no cover - compiled
    """The part of :func:`csr_batch_steps` and :func:`dense_batch_steps` before the products: the
    batch's steps ``d`` ``(b,)`` (``delta[rows] += d``) and, when ``pdelta`` is not empty, each
    step's change times its place, ``placed`` ``(b,)`` (``pdelta[rows] += placed``)."""
    b = rows.shape[0]
    a = np.empty(b)
    for k in range(b):
        a[k] = alpha[rows[k]] + delta[rows[k]]
    d = gram_loop(order, a, y, u0, G, loss, c, gamma)
    for k in range(b):
        delta[rows[k]] += d[k]
    placed = np.zeros(b)
    if pdelta.shape[0] > 0:
        for t in range(b):
            i = order[t]
            placed[i] = (steps + t) * d[i]
            pdelta[rows[i]] += placed[i]
    return d, placed


@njit(cache=True, nogil=True)
def csr_batch_steps(
    order, rows, alpha, delta, y, u0, G, loss, c, gamma, indptr, indices, data, lam_n, dw, pdelta, pw, steps
):  # pragma: no cover - compiled
    """A holder's exact steps on one mini-batch of a segment pass (HyFDCA ``dual_mode: segment``,
    ``SegmentClientMixin._step`` with a CSR batch), in one call: the batch's current duals
    ``alpha[rows] + delta[rows]``, :func:`gram_loop` over ``order`` with ``c = sigma / lam_n``, then
    ``delta[rows] += d`` and ``dw += (X_B^T d) / lam_n`` (:func:`csr_rmatvec`'s sums). When
    ``pdelta`` is not empty (``output: step_average``), the ``t``-th step ``i`` also adds its change
    times its place, ``(steps + t) d_i``, to ``pdelta[rows[i]]``, and ``pw`` ``(d_k,)`` gets the
    batch's part of the position share, ``X_B^T`` of those values (:func:`csr_rmatvec`'s sums, from
    the same pass over the batch's rows as ``dw``'s). The same operations in the same order as the
    NumPy calls they replace."""
    d, placed = _batch_duals(order, rows, alpha, delta, y, u0, G, loss, c, gamma, pdelta, steps)
    average = pdelta.shape[0] > 0
    change = np.zeros(dw.shape[0])
    pchange = np.zeros(pw.shape[0] if average else 0)
    for k in range(rows.shape[0]):
        dk = d[k]
        if dk != 0.0:
            pk = placed[k]
            for p in range(indptr[k], indptr[k + 1]):
                change[indices[p]] += data[p] * dk
                if average and pk != 0.0:
                    pchange[indices[p]] += data[p] * pk
    _add_products(dw, change, lam_n, pw, pchange)


@njit(cache=True, nogil=True)
def dense_batch_steps(
    order, rows, alpha, delta, y, u0, G, loss, c, gamma, X, lam_n, dw, pdelta, pw, steps
):  # pragma: no cover - compiled
    """:func:`csr_batch_steps` for a dense C-ordered float64 batch ``X`` ``(b, d_k)``: the same
    steps, ``delta``, ``pdelta`` and ``pw``; ``X_B^T d`` and ``X_B^T placed`` added row by row in
    one pass over the rows that changed (their sums in another order than NumPy's BLAS product,
    equal to it up to rounding)."""
    d, placed = _batch_duals(order, rows, alpha, delta, y, u0, G, loss, c, gamma, pdelta, steps)
    average = pdelta.shape[0] > 0
    width = X.shape[1]
    change = np.zeros(width)
    pchange = np.zeros(width if average else 0)
    for k in range(rows.shape[0]):
        dk = d[k]
        if dk != 0.0:
            for j in range(width):
                change[j] += X[k, j] * dk
            pk = placed[k]
            if average and pk != 0.0:
                for j in range(width):
                    pchange[j] += X[k, j] * pk
    _add_products(dw, change, lam_n, pw, pchange)


@njit(cache=True, nogil=True)
def _add_products(dw, change, lam_n, pw, pchange):  # pragma: no cover - compiled
    """The end of :func:`csr_batch_steps` and :func:`dense_batch_steps`: ``dw += change / lam_n``
    and ``pw += pchange`` (``pchange`` empty without the step average)."""
    for j in range(dw.shape[0]):
        dw[j] += change[j] / lam_n
    for j in range(pchange.shape[0]):
        pw[j] += pchange[j]


@njit(cache=True, nogil=True)
def csr_matvec(indptr, indices, data, v):  # pragma: no cover - compiled
    """``X v`` ``(n,)`` for CSR ``X`` ``(n, m)``: each row's products added in index order from
    0.0 (scipy's ``csr_matvec``, the same values)."""
    n = indptr.shape[0] - 1
    out = np.empty(n)
    for i in range(n):
        acc = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            acc += data[p] * v[indices[p]]
        out[i] = acc
    return out
