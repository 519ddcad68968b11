"""L2-regularised convex losses, their primal and dual objectives, and SDCA coordinate steps.

Problem (SPEC.md "HyFDCA", HyFDCA eq. (1)-(2)), labels ``y_i`` in ``{-1, +1}``::

    P(w)     = (lambda/2) ||w||^2 + (1/N) sum_i l_i(x_i^T w)
    D(alpha) = -(lambda/2) ||A alpha||^2 - (1/N) sum_i l_i*(-alpha_i),   A alpha = X^T alpha / (lambda N)

with ``w(alpha) = A alpha``. Losses (Shalev-Shwartz & Zhang 2013, "SDCA", Sec. 5-6):

- ``hinge``: ``l(z) = max(0, 1 - y z)``; ``l*(-a) = -y a`` for ``y a`` in ``[0, 1]``;
- ``logistic``: ``l(z) = log(1 + exp(-y z))``; ``l*(-a) = b log b + (1 - b) log(1 - b)``, ``b = y a`` in ``[0, 1]``;
- ``squared``: ``l(z) = (z - y)^2 / 2``; ``l*(-a) = a^2 / 2 - a y``.

An SDCA coordinate step maximises, over the new value ``a`` of ``alpha_i`` (SDCA eq. (4) with the
CoCoA+ local subproblem's safety factor ``sigma'``, Smith et al. 2017)::

    -l*(-a) - (a - alpha_i) u_i - (sigma' q_i / (2 lambda N)) (a - alpha_i)^2

where ``u_i`` is the current estimate of ``x_i^T w`` and ``q_i = ||x_i||^2``. Closed forms:
hinge ``a = y clip(y alpha_i + lambda N (1 - y u_i) / (sigma' q_i), 0, 1)`` (SPEC.md); squared
``a = alpha_i + (y - u_i - alpha_i) / (1 + s)``, ``s = sigma' q_i / (lambda N)``; logistic: a
safeguarded 1-D Newton iteration on ``b = y a`` in ``(0, 1)``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import scipy.sparse as sp

Loss = Literal["hinge", "logistic", "squared"]
LOSSES: tuple[str, ...] = ("hinge", "logistic", "squared")
_EPS = 1e-12


def loss_values(z: np.ndarray, y: np.ndarray, loss: str) -> np.ndarray:
    """``l_i(z_i)`` for margins/predictions ``z`` (``(N,)``) and labels ``y`` in {-1, +1}."""
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - y * z)
    if loss == "logistic":
        return np.logaddexp(0.0, -y * z)
    if loss == "squared":
        return 0.5 * (z - y) ** 2
    raise ValueError(f"unknown loss {loss!r}")


def conjugate_values(alpha: np.ndarray, y: np.ndarray, loss: str) -> np.ndarray:
    """``l_i*(-alpha_i)`` (``+inf`` outside the domain; values within 1e-6 of the box, e.g. from
    CKKS noise, are clipped onto it)."""
    if loss == "squared":
        return 0.5 * alpha**2 - alpha * y
    b = y * alpha
    if np.any(b < -1e-6) or np.any(b > 1 + 1e-6):
        return np.full_like(alpha, np.inf)
    b = np.clip(b, 0.0, 1.0)
    if loss == "hinge":
        return -b
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0) + np.where(
            b < 1, (1 - b) * np.log(np.where(b < 1, 1 - b, 1.0)), 0.0
        )
    return ent


def primal(X, y: np.ndarray, w: np.ndarray, lam: float, loss: str) -> float:
    """``P(w)`` for ``X`` of shape ``(N, d)`` (dense or CSR), ``w`` of shape ``(d,)``."""
    z = X @ w
    return float(0.5 * lam * (w @ w) + loss_values(np.asarray(z).ravel(), y, loss).mean())


def dual(X, y: np.ndarray, alpha: np.ndarray, lam: float, loss: str) -> float:
    """``D(alpha)`` (``-inf`` if ``alpha`` is outside the conjugate's domain)."""
    w = w_of_alpha(X, alpha, lam)
    return float(-0.5 * lam * (w @ w) - conjugate_values(alpha, y, loss).mean())


def w_of_alpha(X, alpha: np.ndarray, lam: float) -> np.ndarray:
    """``w(alpha) = X^T alpha / (lambda N)``, shape ``(d,)``."""
    n = X.shape[0]
    return np.asarray(X.T @ alpha).ravel() / (lam * n)


def row_norms_sq(X) -> np.ndarray:
    """``||x_i||^2`` per row, shape ``(N,)``."""
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", X, X)


def coordinate_step(loss: str, a: float, y: float, u: float, s: float, gamma: float = 0.0) -> float:
    """The maximiser ``a_new`` of the SDCA coordinate subproblem (module docstring).

    Args:
        a: current ``alpha_i``; y: label in {-1, +1}; u: estimate of ``x_i^T w``;
        s: curvature ``sigma' q_i / (lambda N)`` (> 0; ``q_i = 0`` gives ``s = 0``);
        gamma: hinge only: step for the smoothed hinge ``l_gamma`` (SDCA paper Sec. 5.3:
            ``l*(-a) = -b + gamma b^2 / 2``, ``b = y a`` in ``[0, 1]``), which gives
            ``b = y a + (1 - y u - gamma y a) / (s + gamma)``; 0 is the plain hinge.
    """
    if loss == "hinge":
        if s + gamma <= 0:
            return y if y * u < 1 else 0.0 if y * u > 1 else a
        b = y * a + (1.0 - y * u - gamma * y * a) / (s + gamma)
        return y * (0.0 if b < 0 else 1.0 if b > 1 else b)
    if loss == "squared":
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


class RowData:
    """Fast row access for the SDCA inner loop: a dense ``(n, d)`` float64 array or CSR rows."""

    def __init__(self, X):
        self.sparse = sp.issparse(X)
        if self.sparse:
            X = sp.csr_matrix(X, dtype=np.float64)
            X.sort_indices()
            self.indptr, self.indices, self.data = X.indptr, X.indices, X.data
            self.X = X
        else:
            self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.shape = self.X.shape

    def dot_and_add(
        self,
        order: np.ndarray,
        alpha: np.ndarray,
        y: np.ndarray,
        u0: np.ndarray,
        q: np.ndarray,
        loss: str,
        lam_n: float,
        sigma: float,
        cross: float,
        dw: np.ndarray,
        gamma: float = 0.0,
    ) -> np.ndarray:
        """Sequential SDCA steps over local rows ``order`` (HyFDCA Alg. 3; SPEC.md LocalDualMethod).

        For each row ``i``: ``u = u0[i] + cross * x_i^T dw`` (the client's own changes since the
        last SecureInnerProduct, scaled by ``cross``), new ``alpha_i`` by :func:`coordinate_step`
        with ``s = sigma q_i / lam_n``, then ``dw += (delta alpha_i / lam_n) x_i``.

        Args:
            order: ``(H,)`` row positions; alpha: ``(n,)`` (updated in place); y, u0, q: ``(n,)``;
            lam_n: ``lambda * N``; sigma: ``sigma'``; cross: weight of own changes in ``u``;
            dw: ``(d,)`` accumulated own change of ``w`` (updated in place);
            gamma: smoothing of the hinge (:func:`coordinate_step`).

        Returns:
            ``(n,)`` change of ``alpha`` (zero outside ``order``).
        """
        delta = np.zeros_like(alpha)
        sparse, X, everything = self.sparse, self.X, slice(None)
        if sparse:
            indptr, indices, data = self.indptr, self.indices, self.data
        for i in order.tolist():
            if sparse:  # the row's non-zeros (inlined: the loop's hot path)
                s0, e0 = indptr[i], indptr[i + 1]
                idx, val = indices[s0:e0], data[s0:e0]
            else:
                idx, val = everything, X[i]
            u = u0[i] + (cross * float(val @ dw[idx]) if cross else 0.0)
            a = alpha[i]
            new = coordinate_step(loss, a, y[i], u, sigma * q[i] / lam_n, gamma)
            d = new - a
            if d != 0.0:
                alpha[i] = new
                delta[i] += d
                dw[idx] += (d / lam_n) * val
        return delta


def sdca(
    X,
    y: np.ndarray,
    lam: float,
    loss: str,
    epochs: int = 50,
    seed: int = 0,
    tol: float = 0.0,
    alpha0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Centralised SDCA with random permutations (Shalev-Shwartz & Zhang 2013, "SDCA-Perm").

    Stops after ``epochs`` passes or once the duality gap is ``<= tol`` (checked every epoch).

    Returns:
        ``(w, alpha, epochs_run)`` with ``w = w(alpha)`` of shape ``(d,)``.
    """
    rows = RowData(X)
    n, d = rows.shape
    lam_n = lam * n
    alpha = np.zeros(n) if alpha0 is None else alpha0.astype(np.float64).copy()
    w = w_of_alpha(rows.X, alpha, lam)
    q = row_norms_sq(rows.X)
    rng = np.random.default_rng(seed)
    ep = 0
    for ep in range(1, epochs + 1):
        order = rng.permutation(n)
        # Centralised: one worker, exact u from the running w (u0 = x^T w at the start, cross = 1).
        u0 = np.asarray(rows.X @ w).ravel()
        dw = np.zeros(d)
        rows.dot_and_add(order, alpha, y, u0, q, loss, lam_n, 1.0, 1.0, dw)
        w = w + dw
        if tol > 0 and primal(rows.X, y, w, lam, loss) - dual(rows.X, y, alpha, lam, loss) <= tol:
            break
    w = w_of_alpha(rows.X, alpha, lam)
    return w, alpha, ep


def gram_steps(
    order: np.ndarray,
    alpha: np.ndarray,
    y: np.ndarray,
    u0: np.ndarray,
    G: np.ndarray,
    loss: str,
    lam_n: float,
    sigma: float,
    gamma: float = 0.0,
) -> np.ndarray:
    """Exact sequential SDCA steps on a mini-batch whose Gram matrix ``G = X_B X_B^T`` is known
    (HyFDCA ``dual_mode: segment``; SPEC.md LocalDualMethod with the inner products kept exact).

    For each position ``i`` in ``order``: ``u = u0[i] + (sigma / lam_n) sum_j dalpha_j G[i, j]``
    (the batch's own changes so far, with the CoCoA+ factor ``sigma'``), new ``alpha_i`` by
    :func:`coordinate_step` with ``s = sigma G[i, i] / lam_n``.

    Args:
        order: positions ``0..b-1``; alpha: ``(b,)`` (updated in place); y, u0: ``(b,)``;
        G: ``(b, b)`` symmetric; lam_n: ``lambda * N``; sigma: ``sigma'``; gamma: hinge smoothing.

    Returns:
        ``(b,)`` change of ``alpha``.
    """
    c = sigma / lam_n
    corr = np.zeros(len(u0))
    delta = np.zeros(len(u0))
    if loss != "hinge":
        for i in order.tolist():
            a = alpha[i]
            new = coordinate_step(loss, a, y[i], u0[i] + corr[i], c * G[i, i], gamma)
            d = new - a
            if d != 0.0:
                alpha[i] = new
                delta[i] += d
                corr += (c * d) * G[i]
        return delta
    # hinge: coordinate_step inlined on Python floats (the same operations in the same order, so
    # the same values), which takes the per-sample overhead of the loop down by about half; the
    # products ``c * G[i, i]`` are taken once (the same values as in the loop) and ``corr`` is
    # updated in place by two ufunc calls (the same elementwise rounding as ``corr += c d G[i]``)
    al, yl, ul = alpha.tolist(), np.asarray(y, dtype=np.float64).tolist(), np.asarray(u0, dtype=np.float64).tolist()
    sl = (c * np.diagonal(G)).tolist()
    tmp = np.empty(len(u0))
    corr_at, mul, add = corr.item, np.multiply, np.add
    for i in order.tolist():
        a, yi = al[i], yl[i]
        u = ul[i] + corr_at(i)
        sg = sl[i] + gamma
        if sg <= 0:
            new = yi if yi * u < 1 else 0.0 if yi * u > 1 else a
        else:
            b = yi * a + (1.0 - yi * u - gamma * yi * a) / sg
            new = yi * (0.0 if b < 0 else 1.0 if b > 1 else b)
        d = new - a
        if d != 0.0:
            al[i] = new
            delta[i] += d
            mul(G[i], c * d, out=tmp)
            add(corr, tmp, out=corr)
    alpha[:] = al
    return delta
