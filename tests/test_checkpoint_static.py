"""Checkpoints with a static side file (``hybridfl.runtime.checkpoint.STATIC_MARK``): setup state is
written once, merged back on load, rewritten when replaced, and a missing side file is refused."""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.errors import HybridFLError
from hybridfl.runtime.checkpoint import STATIC_MARK, load_checkpoint, save_checkpoint


def test_static_values_are_written_once_and_merged_back(tmp_path):
    ck = tmp_path / "checkpoint.hfl"
    gram = np.arange(12.0)
    vals = {"client.a.w": np.ones(3), f"client.a.{STATIC_MARK}gram.0.0": gram}
    save_checkpoint(ck, 1, vals, {"round": 1})
    sides = sorted(tmp_path.glob("checkpoint.hfl.static-*"))
    assert len(sides) == 1
    first = sides[0].stat().st_mtime_ns
    vals["client.a.w"] = np.full(3, 2.0)
    save_checkpoint(ck, 2, vals, {"round": 2})
    assert sorted(tmp_path.glob("checkpoint.hfl.static-*")) == sides
    assert sides[0].stat().st_mtime_ns == first  # not rewritten: the same object
    rnd, values, meta = load_checkpoint(ck)
    assert rnd == 2 and meta == {"round": 2}
    np.testing.assert_array_equal(values["client.a.w"], np.full(3, 2.0))
    np.testing.assert_array_equal(values[f"client.a.{STATIC_MARK}gram.0.0"], gram)
    # a replaced static value: a new side file, the old one removed
    vals[f"client.a.{STATIC_MARK}gram.0.0"] = gram + 1.0
    save_checkpoint(ck, 3, vals, {"round": 3})
    now = sorted(tmp_path.glob("checkpoint.hfl.static-*"))
    assert len(now) == 1 and now != sides
    np.testing.assert_array_equal(load_checkpoint(ck)[1][f"client.a.{STATIC_MARK}gram.0.0"], gram + 1.0)
    # no static values: no side file left behind
    save_checkpoint(ck, 4, {"client.a.w": np.ones(3)}, {})
    assert not list(tmp_path.glob("checkpoint.hfl.static-*"))
    assert f"client.a.{STATIC_MARK}gram.0.0" not in load_checkpoint(ck)[1]


def test_a_missing_static_side_file_is_refused(tmp_path):
    ck = tmp_path / "checkpoint.hfl"
    save_checkpoint(ck, 1, {f"x.{STATIC_MARK}g": np.ones(2)}, {})
    for side in tmp_path.glob("checkpoint.hfl.static-*"):
        side.unlink()
    with pytest.raises(HybridFLError, match="is unreadable"):
        load_checkpoint(ck)


def test_a_long_runs_history_fits_a_checkpoint(tmp_path):
    """A run's JSON state (its per-round history) of more values than a message header may hold
    (``MAX_HEADER_ITEMS``: 650 HyFDCA rounds crossed it) is written and read back whole."""
    from hybridfl.runtime.messages import MAX_HEADER_ITEMS

    ck = tmp_path / "checkpoint.hfl"
    meta = {"history": [{"round": r, "gap": r * 1e-3} for r in range(MAX_HEADER_ITEMS // 2 + 10)]}
    save_checkpoint(ck, 7, {"server.w": np.ones(2)}, meta)
    rnd, values, back = load_checkpoint(ck)
    assert rnd == 7 and back == meta
    np.testing.assert_array_equal(values["server.w"], np.ones(2))
