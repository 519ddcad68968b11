"""Property-based fuzzing: the config parser and the loaders either succeed or raise our one-
sentence errors (ConfigError / DataError), never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridfl.config import RunConfig, load_config, parse_config
from hybridfl.data.loaders import load_table, read_idx
from hybridfl.errors import ConfigError, DataError

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 1000), st.floats(allow_nan=True), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=6), kids, max_size=3)),
    max_leaves=8,
)
known = {
    "seed": st.one_of(st.integers(-3, 10), scalars),
    "dataset": st.one_of(
        values,
        st.fixed_dictionaries(
            {"name": st.sampled_from(["digits", "mnist", "mfeat", "nope", 3])},
            optional={"test_fraction": scalars, "layout": scalars, "tiles": scalars},
        ),
    ),
    "partition": st.one_of(
        values,
        st.fixed_dictionaries(
            {"kind": st.sampled_from(["iid", "grid", "class_block", "bad"])},
            optional={"num_clients": scalars, "classes_per_client": values},
        ),
    ),
    "algorithm": st.one_of(
        values,
        st.fixed_dictionaries(
            {"name": st.sampled_from(["hyfem", "zzz", 1])},
            optional={"rounds": scalars, "lr": scalars, "matching": values, "variant": scalars},
        ),
    ),
}
configs = st.one_of(
    values, st.fixed_dictionaries({}, optional=known), st.dictionaries(st.text(max_size=8), values, max_size=4)
)


@FUZZ
@given(data=configs)
def test_config_parser_accepts_or_raises_config_error(data):
    try:
        cfg = parse_config(data)
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg and msg.endswith(".")
    else:
        assert isinstance(cfg, RunConfig)


@FUZZ
@given(text=st.text(max_size=200), suffix=st.sampled_from([".yaml", ".toml", ".yml", ".txt"]))
def test_config_files_accept_or_raise_config_error(text, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"c{suffix}"
        p.write_text(text)
        try:
            load_config(p)
        except ConfigError as e:
            assert "\n" not in str(e)


cells = st.one_of(
    st.integers(-100, 100).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text('ab,;"\n ', max_size=4),
    st.just(""),
)


@FUZZ
@given(
    rows=st.lists(st.lists(cells, min_size=1, max_size=4), max_size=8),
    header=st.lists(st.sampled_from(["a", "b", "y", "id", "a"]), min_size=0, max_size=4),
)
def test_table_loader_accepts_or_raises_data_error(rows, header):
    text = ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.csv"
        p.write_text(text)
        try:
            s = load_table(p, label_column="y", blocks={"x": ["a"], "z": ["b"]}, test_fraction=0.5)
        except DataError as e:
            assert "\n" not in str(e)
        else:
            for ds in (s.train, s.test):
                for x in ds.blocks.values():
                    assert np.isfinite(x).all()


@FUZZ
@given(
    raw=st.binary(max_size=64),
    header=st.sampled_from([b"", b"\x00\x00\x08\x01", b"\x00\x00\x08\x03", b"\x00\x00\x0d\x02"]),
)
def test_idx_reader_accepts_or_raises_data_error(raw, header):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f-idx1-ubyte"
        p.write_bytes(header + raw)
        try:
            a = read_idx(p)
        except DataError as e:
            assert "\n" not in str(e)
        else:
            assert a.size * a.dtype.itemsize + 4 + 4 * a.ndim == len(header + raw)


@FUZZ
@given(frame=st.data())
def test_parquet_tables_with_random_columns(frame):
    n = frame.draw(st.integers(2, 12))
    cols = {
        "a": frame.draw(st.lists(st.floats(allow_nan=True, allow_infinity=False, width=32), min_size=n, max_size=n)),
        "b": frame.draw(st.lists(st.sampled_from(["x", "y", "z"]), min_size=n, max_size=n)),
        "y": frame.draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)),
    }
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.parquet"
        pd.DataFrame(cols).to_parquet(p)
        try:
            s = load_table(p, label_column="y", blocks={"x": ["a"], "z": ["b"]}, test_fraction=0.5)
        except DataError as e:
            assert "\n" not in str(e)
        else:
            assert s.train.block_shapes["z"][0] == len(set(cols["b"]))
