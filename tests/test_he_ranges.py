"""Value ranges of the HE backends (issue "Reliability", bad input): values CKKS cannot encode and
non-finite values are refused before encrypting with one sentence (a DataError: the CLI prints it
and exits with status 2) instead of TenSEAL's "encoded values are too large" traceback. The CKKS
limit 2**(T - 2) / scale is checked against what TenSEAL itself accepts."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from hybridfl.errors import ConfigError, DataError
from hybridfl.privacy.he import KeyDealer, server_backend


@pytest.fixture(scope="module")
def ckks():
    d = KeyDealer("ckks")
    return d, d.client_backend()


def raw_tenseal_accepts(backend, values) -> bool:
    try:
        ts.ckks_vector(backend.ctx, [float(x) for x in values])
        return True
    except ValueError as e:
        assert "encoded values are too large" in str(e)
        return False


@pytest.mark.parametrize("scale_bits,limit", [(40, 2.0**18), (30, 2.0**28), (20, 2.0**38)])
def test_limit_follows_scale_and_modulus_and_is_tight_for_tenseal(scale_bits, limit):
    d = KeyDealer("ckks", ckks_scale_bits=scale_bits)
    be, srv = d.client_backend(), server_backend("ckks", d.public_material())
    assert be.modulus_bits == 60 and be.limit == limit and srv.limit == limit
    n = be.slots
    at, above = np.full(n, limit), np.full(n, limit * (1 + 1e-9))
    # TenSEAL itself: a constant vector at the limit is accepted, just above it is refused
    assert raw_tenseal_accepts(be, at) and raw_tenseal_accepts(be, -at)
    assert not raw_tenseal_accepts(be, above) and not raw_tenseal_accepts(be, -above)
    # the backend: encrypts (and decrypts) at the limit, refuses above it with our error
    assert np.allclose(be.decrypt(be.encrypt(at)), at, rtol=1e-9)
    assert np.allclose(be.decrypt(srv.add([be.encrypt(-at)])), -at, rtol=1e-9)
    for v in (above, -above, np.r_[np.zeros(n - 1), limit * 1.5]):
        with pytest.raises(DataError):
            be.encrypt(v)
    with pytest.raises(DataError):  # the server's backend (it encrypts zeros) checks too
        srv.encrypt(above)


def test_everything_within_the_limit_is_encodable(ckks):
    """Whatever the shape of a vector with max |v| = limit, TenSEAL accepts it (the bound
    max coefficient <= max|v| * scale holds for any vector, not only constant ones)."""
    _, be = ckks
    rng = np.random.default_rng(0)
    n = be.slots
    shapes = [
        np.ones(n),
        -np.ones(n),
        np.ones(7),
        np.r_[1.0, np.zeros(n - 1)],
        np.sign(rng.normal(size=n)),
        rng.uniform(-1, 1, n),
        np.cos(np.arange(n)),
        (-1.0) ** np.arange(n),
        rng.standard_cauchy(n),
        np.linspace(-1, 1, 3 * n + 5),
    ]
    for v in shapes:
        v = v / np.max(np.abs(v)) * be.limit
        out = be.decrypt(be.encrypt(v))
        assert np.allclose(out, v, rtol=0, atol=1e-6 * be.limit)


def test_error_is_one_sentence_with_magnitude_limit_and_remedies(ckks):
    _, be = ckks
    x = np.r_[np.zeros(4100), 3.2e10]  # e.g. a squared norm of raw bill amounts, in the second ciphertext
    with pytest.raises(DataError) as e:
        be.encrypt(x)
    msg = str(e.value)
    assert "3.2e+10" in msg and "262144" in msg and "2**18" in msg and "ckks_scale_bits 40" in msg and "60-bit" in msg
    assert "standardize: true" in msg and "ckks_scale_bits to 23 or less" in msg  # 2**(58 - 35) fits 3.2e10
    assert msg.endswith(".") and msg.count(". ") == 0 and "\n" not in msg
    # so large that no allowed scale (>= 20 bits) helps: only standardising is suggested
    with pytest.raises(DataError) as e:
        be.encrypt(np.array([1e20]))
    assert "standardize: true" in str(e.value) and "ckks_scale_bits to" not in str(e.value)
    # lowering the scale as suggested makes the same value encodable
    low = KeyDealer("ckks", ckks_scale_bits=23).client_backend()
    assert np.allclose(low.decrypt(low.encrypt(x)), x, rtol=1e-6, atol=1e-2)  # coarser: absolute error ~1e-4 at 2**23


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_by_the_encrypted_schemes(bad, ckks):
    _, be = ckks
    v = np.array([0.5, 1.0, bad])
    with pytest.raises(DataError) as e:
        be.encrypt(v)
    assert f"non-finite value {bad}" in str(e.value) and "entry 2 of 3" in str(e.value) and "CKKS" in str(e.value)
    pai = KeyDealer("paillier", paillier_bits=512).client_backend()
    with pytest.raises(DataError) as e:
        pai.encrypt(v)
    assert "Paillier" in str(e.value) and "non-finite" in str(e.value)
    # the plaintext baseline carries them unchanged, as before
    plain = KeyDealer("none").client_backend()
    assert np.array_equal(plain.decrypt(plain.encrypt(v)), v, equal_nan=True)


def test_paillier_range():
    d = KeyDealer("paillier", paillier_bits=512, precision_bits=40)
    be = d.client_backend()
    ok = np.array([2.0**400, -(2.0**400)])  # * 2**40 < n / 2 ~ 2**511
    assert np.allclose(be.decrypt(be.encrypt(ok)), ok, rtol=1e-12)
    with pytest.raises(DataError) as e:
        be.encrypt(np.array([1.0, -(2.0**480)]))
    assert "magnitude" in str(e.value) and "512-bit modulus" in str(e.value)


def test_ckks_degree_too_small_for_the_modulus_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        KeyDealer("ckks", ckks_degree=2048)
    assert "ckks_degree 2048" in str(e.value) and "4096" in str(e.value)


def test_hyfdca_ckks_on_unscaled_features_fails_with_the_range_error(credit_dir):
    """The reported case: HyFDCA, encryption ckks, credit default without standardisation: the
    first encrypted message (the clients' squared norms) is refused with the one-sentence error."""
    from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
    from hybridfl.config import GridPartitionConfig
    from hybridfl.data import load_credit_default
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.from_config import build_partition

    raw = load_credit_default(credit_dir)
    small = DatasetSplit(raw.train.take(np.arange(300)), raw.test.take(np.arange(100)))
    assert np.max(np.abs(small.train.blocks["bill"])) > 1e4  # not standardised
    part = build_partition(GridPartitionConfig(kind="grid", sample_groups=2, block_groups=2), small.train, 0)
    cfg = HyFDCAConfig(lam=1e-2, rounds=2, eval_every=0, reference_sdca_epochs=5, encryption="ckks", dual_mode="block")
    with pytest.raises(DataError) as e:
        run_hyfdca(small, part, cfg)
    assert "CKKS cannot encrypt a value of magnitude" in str(e.value) and "standardize: true" in str(e.value)
