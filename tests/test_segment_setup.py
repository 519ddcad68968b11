"""The setup helpers of HyFDCA ``dual_mode: segment`` that avoid work, against the plain
operations they replace: the packed batch Gram triangles through BLAS ``dsyrk``
(``gram.pack_gram`` against ``partial_gram`` and ``upper_triangle``) and the masks'
pads made piece by piece (``segmask.add_pads`` against ``secagg.keystream``): the same bits."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.hyfdca.gram import pack_gram, partial_gram
from hybridfl.privacy.secagg import keystream
from hybridfl.privacy.segmask import PAD_CHUNK, add_pads


def _batches(rng: np.random.Generator) -> list:
    """Sparse (CSR, about 20% filled, like MNIST's pixels) and dense batches of several shapes,
    a single row and a batch with an empty column among them."""
    out = []
    for b, d in [(1, 5), (7, 3), (64, 40), (130, 97), (512, 272)]:
        X = rng.random((b, d)) * (rng.random((b, d)) < 0.2)
        X[:, 0] = 0.0
        out += [sp.csr_matrix(X), X]
    return out


def test_packed_gram_is_the_upper_triangle_of_the_partial_gram_bit_for_bit():
    rng = np.random.default_rng(3)
    batches = _batches(rng)
    want = np.concatenate([kernels.upper_triangle(partial_gram(Xb, None)) for Xb in batches])
    got = np.full(want.size + 2, np.nan)
    pos, scratch = 1, {}
    for Xb in batches:  # into one vector, the work arrays reused across batches of a shape
        pos = pack_gram(Xb, None, got, pos, scratch)
    assert pos == want.size + 1
    np.testing.assert_array_equal(got[1:-1].view(np.uint64), want.view(np.uint64))
    assert np.isnan(got[0]) and np.isnan(got[-1])  # nothing written outside its place
    again = np.empty(want.size)
    pos = 0
    for Xb in batches:
        pos = pack_gram(Xb, None, again, pos, scratch)
    np.testing.assert_array_equal(again, want)


def test_packed_gram_with_column_weights_is_the_weightedpartial_gram():
    rng = np.random.default_rng(4)
    colw = rng.random(40) + 0.5
    for Xb in _batches(rng)[4:6]:  # the (64, 40) batches, sparse and dense
        got = np.empty(64 * 65 // 2)
        assert pack_gram(Xb, colw, got, 0, {}) == got.size
        np.testing.assert_array_equal(got, kernels.upper_triangle(partial_gram(Xb, colw)))
        D = Xb.toarray() if sp.issparse(Xb) else Xb
        np.testing.assert_allclose(got, (D @ np.diag(colw) @ D.T)[np.triu_indices(64)], rtol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 16, PAD_CHUNK - 1, PAD_CHUNK, 2 * PAD_CHUNK + 5])
@pytest.mark.parametrize("sign", [1, -1])
def test_pads_made_piece_by_piece_are_the_keystreams(n, sign):
    rng = np.random.default_rng(n)
    keys = [os.urandom(32) for _ in range(3)]
    start = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    want = start.copy()
    for key in keys:
        if sign > 0:
            want += keystream(key, 11, n)
        else:
            want -= keystream(key, 11, n)
    got = start.copy()
    add_pads(got, keys, 11, sign)
    np.testing.assert_array_equal(got, want)
    if n:
        assert not np.array_equal(got, start)
