"""HyFDCA segment mode: the batch Gram matrices of the setup (the partial Gram ``X_{k,B} diag(c)
X_{k,B}^T`` of each holder's block, packed as upper triangles for the secure sum, and the full
symmetric matrix rebuilt from the summed triangle), used by
:class:`~hybridfl.algorithms.hyfdca.segment_client.SegmentClientMixin`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.linalg import blas

from hybridfl.algorithms.convex import kernels

DENSE_GRAM_LIMIT = 1 << 22
"""A sparse batch ``(b, d_k)`` with at most this many entries (32 MiB as float64) has its Gram
matrix computed dense (BLAS; several times faster than a sparse product at MNIST's density)."""


def dense_batch(Xb: Any) -> np.ndarray:
    """The batch ``X_B`` ``(b, d_k)`` as a dense C-ordered float64 array ``(b, d')``: a sparse
    batch without its all-zero columns (``d'`` the columns with an entry in the batch; they add
    nothing to any inner product, and BLAS's work is proportional to ``d'``: on MNIST's pixel tiles
    about a quarter of a block's columns are empty in a batch of 512), a dense one as it is."""
    if not sp.issparse(Xb):
        return np.ascontiguousarray(Xb, dtype=np.float64)
    Xb = Xb.tocsr()
    used = np.bincount(Xb.indices, minlength=Xb.shape[1]) > 0
    colmap = np.cumsum(used) - 1  # column -> its place among the used columns
    D = np.zeros((Xb.shape[0], int(used.sum())))
    kernels.csr_scatter(Xb.indptr, Xb.indices, kernels.as_f64(Xb.data), colmap, D)
    return D


def partial_gram(Xb: Any, colw: np.ndarray | None) -> np.ndarray:
    """``X_B diag(colw) X_B^T`` ``(b, b)`` float64 for a batch ``X_B`` ``(b, d_k)`` (``colw``
    ``(d_k,)`` or None for ones): dense through BLAS (:func:`dense_batch`) when the batch has at
    most :data:`DENSE_GRAM_LIMIT` entries, else as a sparse product."""
    if sp.issparse(Xb) and Xb.shape[0] * Xb.shape[1] > DENSE_GRAM_LIMIT:
        Xw = Xb if colw is None else Xb.multiply(colw[None, :]).tocsr()
        return kernels.as_f64((Xb @ Xw.T).toarray())
    if colw is not None:
        D = kernels.as_f64(Xb.toarray() if sp.issparse(Xb) else Xb)
        return D @ (D * colw).T
    D = dense_batch(Xb)
    return D @ D.T


def pack_gram(Xb: Any, colw: np.ndarray | None, out: np.ndarray, pos: int, scratch: dict) -> int:
    """Write the upper triangle (row by row) of the partial Gram matrix ``X_B diag(colw) X_B^T``
    of a batch ``X_B`` ``(b, d_k)`` into ``out[pos : pos + b (b + 1) / 2]`` and return the end.
    Without column weights, a dense batch (:data:`DENSE_GRAM_LIMIT`; :func:`dense_batch`) goes
    through BLAS ``dsyrk`` straight into one triangle (NumPy's ``D @ D.T`` in :func:`partial_gram`
    calls ``syrk`` too, then mirrors the triangle and packs it again; the same bits in
    ``tests/test_segment_setup.py``), with the ``(b, b)`` work array kept in ``scratch`` per size
    (reused batch after batch, not allocated each time); otherwise :func:`partial_gram`."""
    b, d = Xb.shape
    if colw is not None or d == 0 or (sp.issparse(Xb) and b * d > DENSE_GRAM_LIMIT):
        tri = kernels.upper_triangle(partial_gram(Xb, colw))
        out[pos : pos + tri.size] = tri
        return pos + tri.size
    if b not in scratch:
        scratch[b] = np.empty((b, b), order="F")
    D = dense_batch(Xb)
    # C = (D^T)^T D^T = D D^T, its lower triangle (column-major: row-major D^T is Fortran-ordered)
    C = blas.dsyrk(1.0, D.T, trans=1, lower=1, c=scratch[b], overwrite_c=1)
    return int(kernels.pack_lower_columns(C, out, pos))


def symmetric_gram(upper: np.ndarray, b: int) -> np.ndarray:
    """The ``(b, b)`` symmetric matrix whose upper triangle (row by row) is ``upper``, its diagonal
    (squared norms) projected onto ``>= 0``: a crafted negative one gives a step a negative
    curvature, whose logistic Newton iteration can fail on one label's dual only (a refusal that
    would tell the server a label); an honest one is ``>= 0`` up to the encoding noise."""
    g = kernels.symmetric_from_upper(kernels.as_f64(upper), b)
    np.fill_diagonal(g, np.maximum(np.diagonal(g), 0.0))
    return g
