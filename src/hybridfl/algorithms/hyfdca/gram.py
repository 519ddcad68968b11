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


def partial_gram(Xb: Any, colw: np.ndarray | None) -> np.ndarray:
    """``X_B diag(colw) X_B^T`` ``(b, b)`` float64 for a batch ``X_B`` ``(b, d_k)`` (``colw``
    ``(d_k,)`` or None for ones): dense through BLAS when the batch has at most
    :data:`DENSE_GRAM_LIMIT` entries, else as a sparse product."""
    if sp.issparse(Xb) and Xb.shape[0] * Xb.shape[1] > DENSE_GRAM_LIMIT:
        Xw = Xb if colw is None else Xb.multiply(colw[None, :]).tocsr()
        return kernels.as_f64((Xb @ Xw.T).toarray())
    D = kernels.as_f64(Xb.toarray() if sp.issparse(Xb) else Xb)
    return D @ (D if colw is None else D * colw).T


def pack_gram(Xb: Any, colw: np.ndarray | None, out: np.ndarray, pos: int, scratch: dict) -> int:
    """Write the upper triangle (row by row) of the partial Gram matrix ``X_B diag(colw) X_B^T``
    of a batch ``X_B`` ``(b, d_k)`` into ``out[pos : pos + b (b + 1) / 2]`` and return the end.
    Without column weights, a dense batch (:data:`DENSE_GRAM_LIMIT`) goes through BLAS ``dsyrk``
    straight into one triangle (NumPy's ``D @ D.T`` in :func:`partial_gram` calls ``syrk`` too,
    then mirrors the triangle and packs it again; the same bits in ``tests/test_segment_setup.py``),
    with the ``(b, d_k)`` and ``(b, b)`` work arrays kept in ``scratch`` per shape (reused batch
    after batch, not allocated each time); otherwise :func:`partial_gram`."""
    b, d = Xb.shape
    if colw is not None or d == 0 or (sp.issparse(Xb) and b * d > DENSE_GRAM_LIMIT):
        tri = kernels.upper_triangle(partial_gram(Xb, colw))
        out[pos : pos + tri.size] = tri
        return pos + tri.size
    if (b, d) not in scratch:
        scratch[(b, d)] = (np.empty((b, d)), np.empty((b, b), order="F"))
    D, C = scratch[(b, d)]
    if sp.issparse(Xb):
        D.fill(0.0)
        Xb.toarray(out=D)  # adds the entries into D
    else:
        D[...] = Xb
    # C = (D^T)^T D^T = D D^T, its lower triangle (column-major: row-major D^T is Fortran-ordered)
    C = blas.dsyrk(1.0, D.T, trans=1, lower=1, c=C, overwrite_c=1)
    return int(kernels.pack_lower_columns(C, out, pos))


def symmetric_gram(upper: np.ndarray, b: int) -> np.ndarray:
    """The ``(b, b)`` symmetric matrix whose upper triangle (row by row) is ``upper``, its diagonal
    (squared norms) projected onto ``>= 0``: a crafted negative one gives a step a negative
    curvature, whose logistic Newton iteration can fail on one label's dual only (a refusal that
    would tell the server a label); an honest one is ``>= 0`` up to the encoding noise."""
    g = kernels.symmetric_from_upper(kernels.as_f64(upper), b)
    np.fill_diagonal(g, np.maximum(np.diagonal(g), 0.0))
    return g
