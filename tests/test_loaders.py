"""Loaders on the real files in ../shared/data and on small generated tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hybridfl.data import (
    HybridDataset,
    load_adult,
    load_credit_default,
    load_digits,
    load_mfeat,
    load_mnist,
    load_table,
    tile_images,
)
from hybridfl.errors import DataError


def test_mnist_from_idx_files(mnist_dir):
    s = load_mnist(mnist_dir, layout="quadrants")
    assert (s.train.n_samples, s.test.n_samples) == (60000, 10000)
    assert s.train.block_shapes == {b: (1, 14, 14) for b in ("top_left", "top_right", "bottom_left", "bottom_right")}
    assert s.train.blocks["top_left"].max() <= 1.0 and s.train.blocks["top_left"].min() >= 0.0
    assert np.array_equal(np.bincount(s.test.y), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    h = load_mnist(mnist_dir, layout="halves", flatten=True, classes=[3, 8])
    assert h.train.block_shapes == {"left": (392,), "right": (392,)}
    assert set(h.train.y.tolist()) == {0, 1} and h.train.classes == ["3", "8"]
    t = load_mnist(mnist_dir, layout="tiles", tiles=4)
    assert len(t.train.block_names) == 16 and t.train.block_shapes["r0c0"] == (1, 7, 7)


def test_tiles_reassemble_the_image():
    img = np.arange(2 * 8 * 8, dtype=np.float32).reshape(2, 8, 8)
    q = tile_images(img, "quadrants")
    top = np.concatenate([q["top_left"][:, 0], q["top_right"][:, 0]], axis=2)
    bottom = np.concatenate([q["bottom_left"][:, 0], q["bottom_right"][:, 0]], axis=2)
    assert np.array_equal(np.concatenate([top, bottom], axis=1), img)
    with pytest.raises(DataError, match="do not divide"):
        tile_images(img, "tiles", tiles=3)


def test_mfeat_views(mfeat_dir):
    s = load_mfeat(mfeat_dir)
    assert s.train.n_samples + s.test.n_samples == 2000
    assert s.train.block_shapes == {"fou": (76,), "fac": (216,), "kar": (64,), "pix": (240,), "zer": (47,), "mor": (6,)}
    # label order: row r has label r // 200
    rows = np.array([int(i.split("-")[1]) for i in s.test.ids])
    assert np.array_equal(s.test.y, rows // 200)


def test_credit_default(credit_dir):
    s = load_credit_default(credit_dir)
    assert s.train.n_samples + s.test.n_samples == 30000
    assert int(s.train.class_counts()[1] + s.test.class_counts()[1]) == 6636
    assert s.train.block_shapes["repayment"] == (6,) and s.train.block_shapes["bill"] == (6,)


def test_adult(adult_dir):
    s = load_adult(adult_dir)
    assert (s.train.n_samples, s.test.n_samples) == (32561, 16281)
    assert s.train.classes == ["<=50K", ">50K"]
    assert int(s.test.class_counts()[1]) == 3846  # test labels end in '.' in the file
    assert s.train.block_shapes == s.test.block_shapes


def test_digits_default():
    s = load_digits()
    assert s.train.n_samples + s.test.n_samples == 1797
    assert s.train.block_shapes == {b: (16,) for b in ("top_left", "top_right", "bottom_left", "bottom_right")}


def _csv(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_table_csv_with_categorical_and_ids(tmp_path):
    p = _csv(tmp_path, "id,a,b,color,y\nr1,1,2,red,yes\nr2,3,4,blue,no\nr3,5,6,red,yes\nr4,7,8,blue,no\n")
    s = load_table(
        p, label_column="y", id_column="id", blocks={"num": ["a", "b"], "cat": ["color"]}, test_fraction=0.5, seed=0
    )
    assert s.train.block_shapes == {"num": (2,), "cat": (2,)}  # color one-hot: blue, red
    assert s.train.classes == ["no", "yes"]
    full = np.concatenate([s.train.ids, s.test.ids])
    assert sorted(full.tolist()) == ["r1", "r2", "r3", "r4"]


def test_table_parquet(tmp_path):
    df = pd.DataFrame({"a": [1.0, 2, 3, 4], "b": [0.5, 0.1, 0.2, 0.3], "y": [0, 1, 0, 1]})
    p = tmp_path / "t.parquet"
    df.to_parquet(p)
    s = load_table(p, label_column="y", blocks={"x": ["a"], "z": ["b"]}, test_fraction=0.5)
    assert s.train.n_samples == 2 and s.train.block_names == ["x", "z"]


@pytest.mark.parametrize(
    "text,kwargs,needle",
    [
        ("a,b,y\n1,,0\n2,3,1\n", {}, "column 'b' of t.csv has a missing \\(NaN\\) value at row 1"),
        ("a,b,y\n1,2,0\n", {"label_column": "label"}, "label column 'label' is not in t.csv"),
        ("a,b,y\n1,2,0\n", {"blocks": {"x": ["a"], "z": ["nope"]}}, "column 'nope' of block 'z' is not in t.csv"),
        ("a,b,y\n1,2,0\n", {"blocks": {"x": ["a", "b"], "z": ["b"]}}, "column 'b' is in both block 'x' and block 'z'"),
        ("a;b;y\n1;2;0\n", {}, "label column 'y' is not in t.csv"),
        ("", {}, "is empty"),
        ("a,b,y\n1,inf,0\n2,3,1\n", {}, "infinite value at row 1"),
        (
            "a,b,y\n" + "".join(f"{i},{i},0\n" for i in range(20)) + "7,abc,1\n",
            {},
            "column 'b' of t.csv has a non-numeric value 'abc' at row 21",
        ),
    ],
)
def test_table_errors_are_one_sentence(tmp_path, text, kwargs, needle):
    p = _csv(tmp_path, text)
    args = {"label_column": "y", "blocks": {"x": ["a"], "z": ["b"]}, **kwargs}
    with pytest.raises(DataError, match=needle) as e:
        load_table(p, **args)
    assert "\n" not in str(e.value)


def test_dataset_checks():
    x = {"b": np.zeros((3, 2))}
    with pytest.raises(DataError, match="occurs more than once"):
        HybridDataset("d", ["a", "a", "b"], [0, 1, 0], x, ["0", "1"])
    with pytest.raises(DataError, match="outside the 2 classes"):
        HybridDataset("d", ["a", "b", "c"], [0, 2, 0], x, ["0", "1"])
    with pytest.raises(DataError, match="NaN or infinite"):
        HybridDataset("d", ["a", "b", "c"], [0, 1, 0], {"b": np.array([[0, 1], [np.nan, 0], [0, 0]])}, ["0", "1"])
    with pytest.raises(DataError, match="has 2 rows for 3 samples"):
        HybridDataset("d", ["a", "b", "c"], [0, 1, 0], {"b": np.zeros((2, 2))}, ["0", "1"])


def test_missing_files_name_the_path(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_mfeat(tmp_path / "nope")
    with pytest.raises(DataError, match="mfeat-fou"):
        load_mfeat(tmp_path)
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DataError, match="not an IDX file"):
        load_mnist(tmp_path)
