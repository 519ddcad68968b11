"""Shared fixtures. Real datasets are read from ``../shared/data`` (relative to the project root)
or from ``$HYBRIDFL_DATA``; a test that needs them fails loudly when they are missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings as _hsettings

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HYBRIDFL_DATA", ROOT.parent / "shared" / "data")).resolve()

torch.set_num_threads(1)


def data_dir(name: str) -> Path:
    d = DATA / name
    if not d.is_dir():
        pytest.fail(
            f"real dataset {name!r} not found at {d}: put the shared data there or set HYBRIDFL_DATA", pytrace=False
        )
    return d


@pytest.fixture(scope="session", autouse=True)
def allow_weak_keys():
    """Tests run HyFDCA with small keys (512-bit Paillier) for speed: set the test-only
    ``HYBRIDFL_ALLOW_WEAK_KEYS=1`` for the whole session (subprocesses inherit it). A test of the
    refusal removes it with ``monkeypatch.delenv``."""
    from hybridfl.privacy.he import WEAK_KEYS_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(WEAK_KEYS_ENV, "1")
        yield


@pytest.fixture(scope="session")
def mfeat_dir() -> Path:
    return data_dir("mfeat")


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    return data_dir("mnist")


@pytest.fixture(scope="session")
def credit_dir() -> Path:
    return data_dir("default_credit_card")


@pytest.fixture(scope="session")
def adult_dir() -> Path:
    return data_dir("adult")


@pytest.fixture(scope="session")
def mfeat_split(mfeat_dir):
    from hybridfl.data import load_mfeat, standardize

    return standardize(load_mfeat(mfeat_dir))


@pytest.fixture(scope="session")
def digits_split():
    from hybridfl.data import load_digits

    return load_digits()


@pytest.fixture(scope="module")
def tiny(digits_split):
    """80 training / 40 test digits on a 2 x 2 grid (four clients, two holders per sample): the
    small HyFDCA federation of the adversary and security tests."""
    import numpy as np

    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.partitioners import GridPartitioner

    split = DatasetSplit(digits_split.train.take(np.arange(80)), digits_split.test.take(np.arange(40)))
    return split, GridPartitioner(2, 2, 1, 0).partition(split.train)


# CI runs the property tests derandomized (the same examples every run, so a red CI is
# reproducible); local runs explore new random examples each time.
_hsettings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hsettings.load_profile("ci")


@pytest.fixture(scope="module")
def credit_small(credit_dir):
    """1,200 training / 400 test rows of the real UCI credit default data, z-scored (HyFDCA tests)."""
    import numpy as np

    from hybridfl.data import load_credit_default, standardize
    from hybridfl.data.dataset import DatasetSplit

    s = standardize(load_credit_default(credit_dir))
    rng = np.random.default_rng(0)
    tr = s.train.take(np.sort(rng.choice(s.train.n_samples, 1200, replace=False)))
    return DatasetSplit(tr, s.test.take(np.arange(400)))


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A fresh reference-optimum cache for one test (the cache must not leak between tests or
    from earlier runs)."""
    monkeypatch.setenv("HYBRIDFL_CACHE", str(tmp_path / "cache"))


HYFDCA_BEFORE = {
    "dual_mode": "block",
    "encryption": "none",
    "output": "last",
    "segment_inner_products": "encrypted",
    "batch_size": 512,
}
"""HyFDCA's defaults before the measured best settings became the defaults (plaintext block mode,
the last iterate, encrypted inner products, batch 512, float64 batch Gram matrices): the settings
the tests that use them were written for, given explicitly (each valid in every dual mode)."""
