"""The setup helpers of HyFDCA ``dual_mode: segment`` that avoid work, against the plain
operations they replace: the packed batch Gram triangles through BLAS ``dsyrk`` on the batch
without its empty columns (``gram.pack_gram`` and ``dense_batch`` against ``partial_gram``,
``upper_triangle`` and the full product), the masks' pads made piece by piece
(``segmask.add_pads`` against ``secagg.keystream``): the same bits; the Gram sums read in
place (``HEBackend.decrypt(copy=False)``) and checked without a temporary (``kernels.all_finite``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

from hybridfl.algorithms.convex import kernels
from hybridfl.algorithms.hyfdca.gram import dense_batch, pack_gram, partial_gram
from hybridfl.privacy import KeyDealer
from hybridfl.privacy.he import PlainBackend
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


def test_a_sparse_batch_drops_its_empty_columns_and_keeps_its_gram():
    rng = np.random.default_rng(5)
    for Xb in _batches(rng)[::2]:  # the sparse ones; column 0 is empty in each
        D = dense_batch(Xb)
        full = Xb.toarray()
        used = np.flatnonzero(np.abs(full).sum(axis=0) > 0)
        assert D.flags.c_contiguous and D.dtype == np.float64
        np.testing.assert_array_equal(D, full[:, used])  # the used columns, in order
        np.testing.assert_allclose(partial_gram(Xb, None), full @ full.T, rtol=1e-13, atol=1e-13)
    dup = sp.csr_matrix((np.array([1.0, 2.0, 4.0]), np.array([3, 3, 1]), np.array([0, 2, 3])), shape=(2, 5))
    np.testing.assert_array_equal(dense_batch(dup), dup.toarray()[:, [1, 3]])  # duplicate entries add up
    dense = rng.random((6, 4))
    assert np.array_equal(dense_batch(dense), dense)  # a dense batch keeps every column


def test_plaintext_gram_sums_are_read_in_place_and_checked_without_a_temporary():
    he = PlainBackend()
    v = np.arange(7.0) - 3.0
    ct = he.encrypt(v)
    view = he.decrypt(ct, copy=False)
    np.testing.assert_array_equal(view, v)
    assert not view.flags.writeable  # the message's bytes: read, never changed
    copied = he.decrypt(ct)
    assert copied.flags.writeable and np.array_equal(copied, v)
    assert kernels.all_finite(v) and kernels.all_finite(np.zeros(0))
    for bad in (np.nan, np.inf, -np.inf):
        assert not kernels.all_finite(np.r_[v, bad])
    ckks = KeyDealer("ckks").client_backend()  # another scheme decodes into a new array either way
    np.testing.assert_allclose(ckks.decrypt(ckks.encrypt(v), copy=False), v, atol=1e-6)
