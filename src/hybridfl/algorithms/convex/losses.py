"""L2-regularised convex losses, their primal and dual objectives, and SDCA coordinate steps.

Problem (HyFDCA Sec. 3: the primal problem and its Fenchel dual), labels ``y_i`` in ``{-1, +1}``::

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
hinge ``a = y clip(y alpha_i + lambda N (1 - y u_i) / (sigma' q_i), 0, 1)`` (the maximiser of the
above; HyFDCA Sec. 5 states a closed form for Alg. 5 line 5 that the extracted text garbles); squared
``a = alpha_i + (y - u_i - alpha_i) / (1 + s)``, ``s = sigma' q_i / (lambda N)``; logistic: a
safeguarded 1-D Newton iteration on ``b = y a`` in ``(0, 1)``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.convex.kernels import LOSS_CODES

Loss = Literal["hinge", "logistic", "squared"]
LOSSES: tuple[str, ...] = ("hinge", "logistic", "squared")


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
    return float(kernels.step(_loss_code(loss), float(a), float(y), float(u), float(s), float(gamma)))


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
        """Sequential SDCA steps over local rows ``order`` (HyFDCA LocalDualMethod, Alg. 3 and Alg. 5).

        For each row ``i``: ``u = u0[i] + cross * x_i^T dw`` (the client's own changes since the
        last SecureInnerProduct, scaled by ``cross``), new ``alpha_i`` by :func:`coordinate_step`
        with ``s = sigma q_i / lam_n``, then ``dw += (delta alpha_i / lam_n) x_i``. Compiled
        (:func:`~hybridfl.algorithms.convex.kernels.csr_row_loop`, ``dense_row_loop``; the inner
        product is summed in index order).

        Args:
            order: ``(H,)`` row positions; alpha: ``(n,)`` (updated in place); y, u0, q: ``(n,)``;
            lam_n: ``lambda * N``; sigma: ``sigma'``; cross: weight of own changes in ``u``;
            dw: ``(d,)`` accumulated own change of ``w`` (updated in place);
            gamma: smoothing of the hinge (:func:`coordinate_step`).

        Returns:
            ``(n,)`` change of ``alpha`` (zero outside ``order``).
        """
        code = _loss_code(loss)
        args = (kernels.as_index(order), _inplace(alpha), kernels.as_f64(y), kernels.as_f64(u0), kernels.as_f64(q))
        work = _inplace(dw)
        tail = (code, float(lam_n), float(sigma), float(cross), work, float(gamma))
        if self.sparse:
            delta = kernels.csr_row_loop(*args, self.indptr, self.indices, self.data, *tail)
        else:
            delta = kernels.dense_row_loop(*args, self.X, *tail)
        _write_back(args[1], alpha)
        _write_back(work, dw)
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
    (HyFDCA ``dual_mode: segment``: LocalDualMethod, Alg. 3 and Alg. 5, with the inner products kept
    exact).

    For each position ``i`` in ``order``: ``u = u0[i] + (sigma / lam_n) sum_j dalpha_j G[i, j]``
    (the batch's own changes so far, with the CoCoA+ factor ``sigma'``), new ``alpha_i`` by
    :func:`coordinate_step` with ``s = sigma G[i, i] / lam_n``. Compiled
    (:func:`~hybridfl.algorithms.convex.kernels.gram_loop`): bit for bit the Python loop over the
    same operations, about 35x faster at ``b = 512``.

    Args:
        order: positions ``0..b-1``; alpha: ``(b,)`` (updated in place); y, u0: ``(b,)``;
        G: ``(b, b)`` symmetric; lam_n: ``lambda * N``; sigma: ``sigma'``; gamma: hinge smoothing.

    Raises:
        ValueError: an unknown ``loss``.

    Returns:
        ``(b,)`` change of ``alpha``.
    """
    work = _inplace(alpha)
    delta = kernels.gram_loop(
        kernels.as_index(order),
        work,
        kernels.as_f64(y),
        kernels.as_f64(u0),
        kernels.as_f64(G),
        _loss_code(loss),
        sigma / lam_n,
        float(gamma),
    )
    _write_back(work, alpha)
    return delta


def _loss_code(loss: str) -> int:
    """The kernels' code of ``loss``; raises ``ValueError`` for an unknown one."""
    if loss not in LOSS_CODES:
        raise ValueError(f"unknown loss {loss!r}")
    return LOSS_CODES[loss]


def _inplace(a: np.ndarray) -> np.ndarray:
    """``a`` itself when the kernels can update it in place (C-contiguous float64), else a copy
    that :func:`_write_back` copies back."""
    return a if a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable else kernels.as_f64(a).copy()


def _write_back(work: np.ndarray, a: np.ndarray) -> None:
    if work is not a:
        a[...] = work
