"""HyFDCA segment mode: the batch Gram matrices of the setup (the partial Gram ``X_{k,B} diag(c)
X_{k,B}^T`` of each holder's block, packed as upper triangles for the secure sum, and the full
symmetric matrix rebuilt from the summed triangle), used by
:class:`~hybridfl.algorithms.hyfdca.segment_client.SegmentClientMixin`.

The precision of the holders' Gram products (BLAS ``ssyrk`` or ``dsyrk``) and of the full
matrices they keep is each client's own :data:`GRAM_DTYPE` (float32), which the server declares
as the ``gram_dtype`` of its ``hyfdca.init``; a client refuses an init that declares another, so a
server cannot put a segment's holders on different precisions. The packed triangles of float32
``ssyrk`` products cross as float32 in plaintext (:func:`packed_vector`; the server's sum is the
float32 rounding of the exact float64 sum, which is what the holder rounds it to anyway: the same
matrices as float64 triangles, in half the bytes), as float64 otherwise, and under CKKS or
masking in their own encodings; the steps' sums are float64. The Gram matrices only carry the changes
*within* a batch into the inner products (the inner products between batches are exact, from
``w``), so float32 perturbs each step by about float32's rounding (relative 1e-7) and never the
pair ``(w, alpha)``: ``w = w(alpha)`` and the duality gap stay exact. Every holder of a segment
rounds the same summed vector, so the holders still make the same steps. Against float64, on
MNIST binary (3 x 3 grid, batch 512): the setup 0.29 s CPU faster (0.86 s against 1.14 s), each
round 0.02 s (0.167 s against 0.187 s), and the same relative suboptimality to four digits every
round (``tests/test_gram_dtype.py`` pins the agreement on credit). Not an option (a setting with one
right value): float64 is for the tests that check the steps against sequential SDCA bit for bit.
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


GRAM_DTYPES = {"float32": np.float32, "float64": np.float64}
"""``gram_dtype`` -> the NumPy dtype of the Gram products and of the matrices kept."""

GRAM_DTYPE = "float32"
"""The precision every client computes and keeps its batch Gram matrices in, and the ``gram_dtype``
the server declares in ``hyfdca.init`` (read at each setup, by both; the tests that compare with
sequential SDCA bit for bit set ``"float64"``)."""


def dense_batch(Xb: Any, dtype: Any = np.float64) -> np.ndarray:
    """The batch ``X_B`` ``(b, d_k)`` as a dense C-ordered ``dtype`` array ``(b, d')``: a sparse
    batch without its all-zero columns (``d'`` the columns with an entry in the batch; they add
    nothing to any inner product, and BLAS's work is proportional to ``d'``: on MNIST's pixel tiles
    about a quarter of a block's columns are empty in a batch of 512), a dense one as it is."""
    if not sp.issparse(Xb):
        return np.ascontiguousarray(Xb, dtype=dtype)
    Xb = Xb.tocsr()
    used = np.bincount(Xb.indices, minlength=Xb.shape[1]) > 0
    colmap = np.cumsum(used) - 1  # column -> its place among the used columns
    D = np.zeros((Xb.shape[0], int(used.sum())), dtype=dtype)
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


def packed_vector(X: Any, sizes: list[int], colw: np.ndarray | None, dtype: Any) -> np.ndarray:
    """The empty packed Gram vector ``(sum_B b_B (b_B + 1) / 2,)`` of a holder's segment of
    ``X``'s rows ``(n, d_k)`` cut into batches of ``sizes``: float32 when ``dtype`` is float32 and
    every batch's product is a float32 ``ssyrk`` (:func:`pack_gram`: no column weights, no sparse
    batch over :data:`DENSE_GRAM_LIMIT`), so each packed value is a float32 exactly and the
    plaintext backend sends it in 4 bytes; float64 otherwise (a float64 product kept exact until
    the holder rounds the summed value to its ``dtype``)."""
    big = sp.issparse(X) and max(sizes, default=0) * X.shape[1] > DENSE_GRAM_LIMIT
    single = np.dtype(dtype) == np.float32 and colw is None and not big
    return np.empty(sum(b * (b + 1) // 2 for b in sizes), dtype=np.float32 if single else np.float64)


def pack_gram(
    Xb: Any, colw: np.ndarray | None, out: np.ndarray, pos: int, scratch: dict, dtype: Any = np.float64
) -> int:
    """Write the upper triangle (row by row) of the partial Gram matrix ``X_B diag(colw) X_B^T``
    of a batch ``X_B`` ``(b, d_k)`` into ``out[pos : pos + b (b + 1) / 2]`` (float64) and return the end.
    Without column weights, a dense batch (:data:`DENSE_GRAM_LIMIT`; :func:`dense_batch`) goes
    through BLAS ``syrk`` in ``dtype`` (``ssyrk`` for float32, ``dsyrk`` for float64) straight into
    one triangle (NumPy's ``D @ D.T`` in :func:`partial_gram` calls ``syrk`` too, then mirrors the
    triangle and packs it again; the same bits in ``tests/test_segment_setup.py``), with the
    ``(b, b)`` work array kept in ``scratch`` per size and dtype (reused batch after batch, not
    allocated each time); otherwise :func:`partial_gram` (float64)."""
    b, d = Xb.shape
    if colw is not None or d == 0 or (sp.issparse(Xb) and b * d > DENSE_GRAM_LIMIT):
        tri = kernels.upper_triangle(partial_gram(Xb, colw))
        out[pos : pos + tri.size] = tri
        return pos + tri.size
    single = np.dtype(dtype) == np.float32
    dt = np.float32 if single else np.float64
    if (b, single) not in scratch:
        scratch[(b, single)] = np.empty((b, b), order="F", dtype=dt)
    D = dense_batch(Xb, dt)
    # C = (D^T)^T D^T = D D^T, its lower triangle (column-major: row-major D^T is Fortran-ordered)
    syrk = blas.ssyrk if single else blas.dsyrk
    C = syrk(1.0, D.T, trans=1, lower=1, c=scratch[(b, single)], overwrite_c=1)
    return int(kernels.pack_lower_columns(C, out, pos))


def symmetric_gram(upper: np.ndarray, b: int, dtype: Any = np.float64) -> np.ndarray:
    """The ``(b, b)`` symmetric ``dtype`` matrix whose upper triangle (row by row) is ``upper``
    (each value rounded to ``dtype``), its diagonal (squared norms) projected onto ``>= 0``: a
    crafted negative one gives a step a negative curvature, whose logistic Newton iteration can
    fail on one label's dual only (a refusal that would tell the server a label); an honest one is
    ``>= 0`` up to the encoding noise."""
    g = kernels.symmetric_from_upper(kernels.as_f64(upper), np.empty((b, b), dtype=dtype))
    np.fill_diagonal(g, np.maximum(np.diagonal(g), 0.0))
    return g


def checked_symmetric_grams(packed: np.ndarray, sizes: list[int], dtype: Any = np.float64) -> list[np.ndarray] | None:
    """:func:`symmetric_gram` of each batch's triangle in ``packed`` ``(sum_B b_B (b_B + 1) / 2,)``
    (float64 or float32, read as it is; the batches' upper triangles one after another, batch ``B`` of ``sizes[B]`` samples),
    each value checked finite and within ``dtype``'s range on the way (one pass over the 42 MB
    vector of a MNIST client at batch 512, not a check and then a fill). Returns the ``(b_B, b_B)``
    matrices, or ``None`` if a value fails (or ``packed`` is not of that length)."""
    v = np.asarray(packed)
    v = np.ascontiguousarray(v) if v.dtype in (np.float32, np.float64) else kernels.as_f64(v)
    if v.ndim != 1 or v.size != sum(b * (b + 1) // 2 for b in sizes):
        return None
    bound = float(np.finfo(dtype).max)
    out, pos = [], 0
    for b in sizes:
        g = np.empty((b, b), dtype=dtype)
        if not kernels.checked_symmetric_from_upper(v, pos, g, bound):
            return None
        np.fill_diagonal(g, np.maximum(np.diagonal(g), 0.0))
        out.append(g)
        pos += b * (b + 1) // 2
    return out
