"""The centralised reference optimum ``P*`` of a problem, computed once and cached.

Two solvers of the same problem (HyFDCA converges to the solution trained centrally, Sec. 2, and
Sec. 5.1 measures the relative loss against that optimum ``P*``):

- liblinear through scikit-learn (tolerance 1e-6, at most 5,000 iterations): ``LinearSVC(loss="hinge", C=1/(lambda N), fit_intercept=False)``
  for hinge, ``LogisticRegression(solver="liblinear", C=1/(lambda N), fit_intercept=False)`` for
  logistic; for squared loss the exact normal equations ``(X^T X / N + lambda I) w = X^T y / N``;
- a long centralised SDCA run (:func:`hybridfl.algorithms.convex.losses.sdca`) until its duality
  gap is below ``1e-9 * P`` or ``sdca_epochs`` passes.

The tighter one (smaller ``P(w)``) is the reference; :class:`Reference` says which
(``solver``) and carries the certified lower bound ``D(alpha)`` from SDCA. Cached as ``.npz`` under
``cache_dir`` (default ``$HYBRIDFL_CACHE`` or ``~/.cache/hybridfl``) by a SHA-256 of the data,
labels, ``lambda`` and loss.

With ``fit_intercept`` (:mod:`hybridfl.algorithms.convex.intercept`) the intercept is a column of
ones inside ``X``, so liblinear's ``fit_intercept=False`` still solves the same problem, its
intercept regularised like every weight.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hybridfl.algorithms.convex.losses import dual, primal, sdca


@dataclass
class Reference:
    """Reference optimum of one problem.

    Attributes:
        objective: ``P*`` (the smaller of the two solvers' primal values).
        w: ``(d,)`` the reference weights.
        solver: ``"liblinear"``, ``"normal_equations"`` or ``"sdca"``: which reached ``objective``.
        lower_bound: best dual value seen (SDCA), so ``objective - lower_bound`` bounds the error.
        liblinear_objective, sdca_objective: both primal values (liblinear: the better of its
            tight and default runs).
        liblinear_seconds: liblinear (or normal equations) solve time at its tight tolerance.
        liblinear_default_seconds, liblinear_default_objective: solve time and ``P`` at
            scikit-learn's default tolerance (the fair "centralised solve time").
        sdca_seconds, sdca_epochs: the long SDCA run.
    """

    objective: float
    w: np.ndarray
    solver: str
    lower_bound: float
    liblinear_objective: float
    sdca_objective: float
    liblinear_seconds: float
    liblinear_default_seconds: float
    liblinear_default_objective: float
    sdca_seconds: float
    sdca_epochs: int

    def meta(self) -> dict:
        """Every field except ``w``, as a JSON-able dict (the ``meta`` entry of the cached ``.npz``)."""
        d = asdict(self)
        d.pop("w")
        return d


def _key(X, y: np.ndarray, lam: float, loss: str) -> str:
    h = hashlib.sha256()
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        for a in (X.indptr, X.indices, X.data.astype(np.float64)):
            h.update(np.ascontiguousarray(a).tobytes())
    else:
        h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.asarray(y, dtype=np.float64).tobytes())
    h.update(f"{lam!r}|{loss}|{X.shape}|v2".encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    """The default cache directory of reference optima: ``$HYBRIDFL_CACHE/reference`` (default
    ``~/.cache/hybridfl/reference``); not created here."""
    return Path(os.environ.get("HYBRIDFL_CACHE", Path.home() / ".cache" / "hybridfl")) / "reference"


def liblinear_solve(X, y: np.ndarray, lam: float, loss: str, tol: float = 1e-4, max_iter: int = 1000) -> np.ndarray:
    """liblinear's solution ``w`` (``(d,)``) of the same problem (normal equations for squared)."""
    n = X.shape[0]
    C = 1.0 / (lam * n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if loss == "hinge":
            from sklearn.svm import LinearSVC

            m = LinearSVC(loss="hinge", C=C, fit_intercept=False, dual=True, tol=tol, max_iter=max_iter).fit(X, y)
            return m.coef_.ravel().astype(np.float64)
        if loss == "logistic":
            from sklearn.linear_model import LogisticRegression

            m = LogisticRegression(solver="liblinear", C=C, fit_intercept=False, tol=tol, max_iter=max_iter).fit(X, y)
            return m.coef_.ravel().astype(np.float64)
    d = X.shape[1]
    G = (X.T @ X) / n
    G = G.toarray() if sp.issparse(G) else G
    b = np.asarray(X.T @ y).ravel() / n
    return np.linalg.solve(G + lam * np.eye(d), b)


def reference_optimum(
    X,
    y: np.ndarray,
    lam: float,
    loss: str,
    sdca_epochs: int = 300,
    use_cache: bool = True,
    directory: Path | None = None,
) -> Reference:
    """Compute (or load from the cache) the reference optimum of ``P`` for ``(X, y, lambda, loss)``.

    Args:
        X: ``(N, d)`` dense or CSR; y: ``(N,)`` in {-1, +1}; lam: ``lambda`` > 0; loss: see LOSSES.
    """
    directory = directory or cache_dir()
    path = directory / f"{_key(X, y, lam, loss)}.npz"
    if use_cache and path.is_file():
        z = np.load(path, allow_pickle=False)
        meta = json.loads(str(z["meta"]))
        return Reference(w=z["w"], **meta)
    t = time.perf_counter()
    w_def = liblinear_solve(X, y, lam, loss, tol=1e-4, max_iter=1000)
    t_def = time.perf_counter() - t
    t = time.perf_counter()
    w_ll = liblinear_solve(X, y, lam, loss, tol=1e-6, max_iter=5000) if loss != "squared" else w_def
    t_ll = time.perf_counter() - t if loss != "squared" else t_def
    p_ll = primal(X, y, w_ll, lam, loss)
    t = time.perf_counter()
    p_target = p_ll
    w_s, a_s, ep = sdca(X, y, lam, loss, epochs=sdca_epochs, seed=12345, tol=1e-9 * abs(p_target))
    t_s = time.perf_counter() - t
    p_s = primal(X, y, w_s, lam, loss)
    d_s = dual(X, y, a_s, lam, loss)
    p_def = primal(X, y, w_def, lam, loss)
    if p_def < p_ll:  # liblinear's tight run can stop at its iteration cap above the default run
        p_ll, w_ll = p_def, w_def
    if p_s < p_ll:
        obj, w, solver = p_s, w_s, "sdca"
    else:
        obj, w, solver = p_ll, w_ll, "liblinear" if loss != "squared" else "normal_equations"
    ref = Reference(obj, w, solver, d_s, p_ll, p_s, t_ll, t_def, p_def, t_s, ep)
    if use_cache:
        import io

        from hybridfl.files import atomic_write

        buf = io.BytesIO()
        np.savez(buf, w=w, meta=np.array(json.dumps(ref.meta())))
        atomic_write(path, buf.getvalue())
    return ref
