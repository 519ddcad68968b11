"""Issue 14 item 1: organisations each bring their own table.

``hybridfl federation init`` writes the federation schema from a config (no data read), and
``hybridfl client prepare`` turns each organisation's own table into a client directory that the
export's loader (:func:`load_client_dir`) reads. Bad tables give one sentence, exit status 2, and
nothing written. The CLI runs in-process, as in test_bad_input_corpus.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from hybridfl.data.export import load_client_dir
from hybridfl.data.federation import FederationSchema, load_schema, schema_from_config, schema_to_toml
from hybridfl.errors import ConfigError
from tests.cli_helpers import cli_in_process

CONFIG = """seed: 7
dataset:
  name: table
  id_column: ID
  label_column: default
  classes: ["no", "yes"]
  categorical: [region]
  levels: {region: [north, south, "east west"]}
  blocks:
    demo: [age, region]
    bank: [balance, loans]
    shop: [spend, visits]
partition: {kind: iid, num_clients: 3}
algorithm: {name: hybrid_fedavg, rounds: 4}
"""

# three organisations, each with its own IDs (partly overlapping) and its own columns; only the
# bank has the labels
BANK = "ID,balance,loans,default,branch_code\n" + "".join(
    f"c{i},{100.5 * i},{i % 3},{'yes' if i % 2 else 'no'},B{i}\n" for i in range(0, 8)
)
CENSUS = "ID,age,region\n" + "".join(f"c{i},{20 + i},{['north', 'south', 'east west'][i % 3]}\n" for i in range(4, 12))
SHOP = "ID,visits,spend\n" + "".join(f"c{i},{i},{2.5 * i}\n" for i in range(2, 10))


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``hybridfl <args>`` in this process: exit status, stdout, stderr."""
    proc = cli_in_process(monkeypatch, capsys, *args)
    return proc.returncode, proc.stdout, proc.stderr


def prepare_tables(tmp_path, schema, monkeypatch, capsys, tables: dict[str, str], *extra: str) -> list[Path]:
    """``client prepare`` of each organisation's table (written to ``<org>.csv``) into
    ``clients/<org>`` with ``--index`` its position; returns the client directories."""
    dirs = []
    for i, (org, text) in enumerate(tables.items()):
        t = tmp_path / f"{org}.csv"
        t.write_text(text)
        d = tmp_path / "clients" / org
        args = ["client", "prepare", "--table", str(t), *extra, "--schema", str(schema), "--out", str(d)]
        code, _, err = run_cli(monkeypatch, capsys, *args, "--index", str(i))
        assert code == 0, err
        dirs.append(d)
    return dirs


@pytest.fixture
def schema_file(tmp_path, monkeypatch, capsys) -> Path:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "federation.toml"
    code, _, err = run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(out))
    assert code == 0, err
    return out


def test_federation_init_writes_the_schema_without_data(schema_file):
    data = tomllib.loads(schema_file.read_text())
    assert list(data["blocks"]) == ["demo", "bank", "shop"]
    assert data["blocks"]["demo"] == ["age", "region"]
    assert data["categorical"] == {"region": ["north", "south", "east west"]}
    assert data["classes"] == ["no", "yes"] and data["label_column"] == "default" and data["id_column"] == "ID"
    assert data["seed"] == 7 and data["algorithm"]["name"] == "hybrid_fedavg" and data["algorithm"]["rounds"] == 4
    s = load_schema(schema_file)
    assert s.block_shapes == {"demo": (4,), "bank": (2,), "shop": (2,)}
    assert s.column_type("region") == "categorical" and s.column_type("age") == "numeric"


def test_schema_toml_round_trip_with_awkward_names():
    s = FederationSchema(
        name="n",
        id_column="the id",
        label_column='la"bel',
        classes=["a b", "c\\d"],
        blocks={"block one": ["x 1", "é"], "b2": ["z"]},
        categorical={"z": ["1", "2"]},
        means={"b2": [0.5, -1.0]},
        stds={"b2": [2.0, 1e-300]},
        algorithm={"name": "hyfem", "nested": {"a": [1, 2.5, True]}},
    )
    assert FederationSchema.model_validate(tomllib.loads(schema_to_toml(s))) == s


@pytest.mark.parametrize(
    "dataset, needle",
    [
        ("{name: table, id_column: ID, label_column: y, classes: [a]}", "'dataset.blocks'"),
        ("{name: table, blocks: {b: [x]}, id_column: ID, classes: [a]}", "'dataset.label_column'"),
        ("{name: table, blocks: {b: [x]}, label_column: y, classes: [a]}", "'dataset.id_column'"),
        ("{name: table, blocks: {b: [x]}, label_column: y, id_column: ID}", "'dataset.classes'"),
        (
            "{name: table, blocks: {b: [x]}, label_column: y, id_column: ID, classes: [a], categorical: [x]}",
            "'dataset.levels.x'",
        ),
        ("{name: digits}", "must be 'table'"),
    ],
)
def test_federation_init_names_the_missing_field(tmp_path, monkeypatch, capsys, dataset, needle):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"dataset: {dataset}\nalgorithm: {{name: hyfem}}\n")
    with pytest.raises(ConfigError, match=needle):
        schema_from_config(cfg)
    out = tmp_path / "f.toml"
    code, _, err = run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(out))
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not out.exists()


def test_three_organisations_prepare_their_own_client_directories(tmp_path, schema_file, monkeypatch, capsys):
    tables = {"bank": BANK, "census": CENSUS, "shop": SHOP}
    dirs = dict(zip(tables, prepare_tables(tmp_path, schema_file, monkeypatch, capsys, tables, "--id-column", "ID")))

    bank = load_client_dir(dirs["bank"])
    assert bank.client_id == "bank" and bank.index == 0 and bank.has_labels
    assert bank.data.block_names == ["bank"] and bank.classes == ["no", "yes"]
    assert list(bank.data.ids) == [f"c{i}" for i in range(8)]
    assert list(bank.data.y) == [i % 2 for i in range(8)]
    np.testing.assert_allclose(bank.data.blocks["bank"], [[100.5 * i, i % 3] for i in range(8)])
    assert bank.block_shapes == {"demo": (4,), "bank": (2,), "shop": (2,)}

    census = load_client_dir(dirs["census"])
    assert census.index == 1 and not census.has_labels and census.data.block_names == ["demo"]
    assert list(census.data.ids) == [f"c{i}" for i in range(4, 12)]
    x = census.data.blocks["demo"]
    assert x.shape == (8, 4) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, 0], [20 + i for i in range(4, 12)])
    np.testing.assert_array_equal(x[:, 1:].argmax(axis=1), [i % 3 for i in range(4, 12)])
    np.testing.assert_array_equal(x[:, 1:].sum(axis=1), 1)
    assert not (dirs["census"] / "labels.npy").exists()  # no labels exported for a party without them

    shop = load_client_dir(dirs["shop"])
    assert shop.data.block_names == ["shop"] and not shop.has_labels
    # the schema's column order, not the table's (visits before spend in the file)
    np.testing.assert_allclose(shop.data.blocks["shop"], [[2.5 * i, i] for i in range(2, 10)])

    # standardize: true -> local sums only, nothing pooled and nothing applied
    st = json.loads((dirs["shop"] / "stats.json").read_text())["blocks"]["shop"]
    assert st["count"] == 8
    np.testing.assert_allclose(st["sum"], [2.5 * sum(range(2, 10)), sum(range(2, 10))])
    np.testing.assert_allclose(st["sumsq"], [6.25 * sum(i * i for i in range(2, 10)), sum(i * i for i in range(2, 10))])
    assert json.loads((dirs["shop"] / "client.json").read_text())["standardized"] is False
    for d in dirs.values():
        assert (d.stat().st_mode & 0o777) == 0o700
        assert all((f.stat().st_mode & 0o777) == 0o600 for f in d.iterdir())
    assert not [p for p in (tmp_path / "clients").iterdir() if p.name.startswith(".")]  # no temporary left

    # the algorithms build their clients from these directories as from exported ones
    from hybridfl.algorithms.spec import get_algorithm

    schema = load_schema(schema_file)
    for name, cd in (("hybrid_fedavg", bank), ("hyfem", bank)):  # both need labels at the client
        spec = get_algorithm(name)
        spec.build_client(cd, spec.config_model.model_validate({"name": name}), schema.seed)


def test_extra_columns_are_ignored_and_reported(tmp_path, schema_file, monkeypatch, capsys):
    t = tmp_path / "bank.csv"
    t.write_text(BANK)
    d = tmp_path / "org"
    code, out, err = run_cli(
        monkeypatch, capsys, "client", "prepare", "--table", str(t), "--schema", str(schema_file), "--out", str(d)
    )
    assert code == 0, err
    assert "branch_code" in out
    cd = load_client_dir(d)
    assert cd.client_id == "org" and cd.data.block_names == ["bank"]


def test_client_id_option_and_npz_table(tmp_path, schema_file, monkeypatch, capsys):
    t = tmp_path / "shop.npz"
    np.savez(t, ids=np.array(["s1", "s2"]), spend=np.array([1.0, 2.0]), visits=np.array([3, 4]))
    d = tmp_path / "out-dir"
    d.mkdir()  # an existing empty directory is fine
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "client",
        "prepare",
        "--table",
        str(t),
        "--id-column",
        "ids",
        "--schema",
        str(schema_file),
        "--out",
        str(d),
        "--client-id",
        "shop-7",
    )
    assert code == 0, err
    cd = load_client_dir(d)
    assert cd.client_id == "shop-7" and list(cd.data.ids) == ["s1", "s2"]
    np.testing.assert_allclose(cd.data.blocks["shop"], [[1, 3], [2, 4]])


def test_parquet_table_with_its_own_label_column_name(tmp_path, schema_file):
    import pandas as pd

    from hybridfl.data.prepare import prepare_client

    t = tmp_path / "bank.parquet"
    pd.DataFrame({"cust": ["x", "y"], "balance": [1.0, 2.0], "loans": [0, 1], "target": ["yes", "no"]}).to_parquet(t)
    r = prepare_client(t, schema_file, tmp_path / "bank", id_column="cust", label_column="target")
    assert r.has_labels and r.ignored == []
    cd = load_client_dir(tmp_path / "bank")
    assert list(cd.data.ids) == ["x", "y"] and list(cd.data.y) == [1, 0]


def test_global_means_and_stds_in_the_schema_are_applied(tmp_path, schema_file):
    from hybridfl.data.prepare import prepare_client

    text = schema_file.read_text() + "\n[means]\nshop = [10.0, 4.0]\n\n[stds]\nshop = [2.0, 0.0]\n"
    schema_file.write_text(text)
    t = tmp_path / "shop.csv"
    t.write_text("ID,spend,visits\na,12,5\nb,8,3\n")
    r = prepare_client(t, schema_file, tmp_path / "c")
    assert r.standardized
    np.testing.assert_allclose(load_client_dir(tmp_path / "c").data.blocks["shop"], [[1, 1], [-1, -1]])


BAD = {
    "missing column of a block": (
        "ID,age,y\na,1,no\n",
        ["column 'region'", "block 'demo'"],
    ),
    "non-numeric value": ("ID,spend,visits\na,1,2\nb,lots,3\n", ["column 'spend'", "'lots'", "row 2"]),
    "missing value": ("ID,spend,visits\na,1,2\nb,,3\n", ["column 'spend'", "missing value", "row 2"]),
    "infinite value": ("ID,spend,visits\na,inf,2\n", ["column 'spend'", "not finite"]),
    "unknown level": ("ID,age,region\na,1,west\n", ["column 'region'", "'west'", "levels"]),
    "label not in classes": (
        "ID,balance,loans,default\na,1,2,no\nb,1,2,maybe\n",
        ["label column 'default'", "'maybe'", "row 2", "classes"],
    ),
    "empty table": ("ID,spend,visits\n", ["no data rows"]),
    "empty file": ("", ["is empty"]),
    "duplicate IDs": ("ID,spend,visits\na,1,2\nb,1,2\na,3,4\n", ["ID 'a'", "twice", "rows 1 and 3"]),
    "no ID column": ("key,spend,visits\na,1,2\n", ["ID column 'ID'"]),
    "ID column is a feature": (
        "ID,spend,visits\na,1,2\n",
        ["ID column 'spend'", "block 'shop'"],
        ["--id-column", "spend"],
    ),
    "no block at all": ("ID,colour\na,red\n", ["none of the schema's blocks"]),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_table_is_one_sentence_exit_2_nothing_written(name, tmp_path, schema_file, monkeypatch, capsys):
    text, needles, *extra = BAD[name]
    t = tmp_path / "t.csv"
    t.write_text(text)
    out = tmp_path / "clients" / "org"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "client",
        "prepare",
        "--table",
        str(t),
        "--schema",
        str(schema_file),
        "--out",
        str(out),
        *(extra[0] if extra else []),
    )
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not (tmp_path / "clients").exists()  # nothing written, not even the parent


def test_non_empty_out_is_refused_and_left_alone(tmp_path, schema_file, monkeypatch, capsys):
    t = tmp_path / "shop.csv"
    t.write_text(SHOP)
    out = tmp_path / "org"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(
        monkeypatch, capsys, "client", "prepare", "--table", str(t), "--schema", str(schema_file), "--out", str(out)
    )
    assert code == 2 and "not an empty directory" in err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("target", ["empty dir", "missing", "file"])
def test_out_onto_a_symlink_is_one_sentence_and_nothing_is_written(tmp_path, schema_file, monkeypatch, capsys, target):
    """``--out`` naming a symbolic link (to an empty directory, to nothing, to a file) is refused
    with one sentence and exit 2, and nothing is written through the link (before: a traceback,
    exit 1)."""
    t = tmp_path / "shop.csv"
    t.write_text(SHOP)
    dest = tmp_path / "elsewhere"
    if target == "empty dir":
        dest.mkdir()
    elif target == "file":
        dest.write_text("x")
    out = tmp_path / "org"
    out.symlink_to(dest)
    code, _, err = run_cli(
        monkeypatch, capsys, "client", "prepare", "--table", str(t), "--schema", str(schema_file), "--out", str(out)
    )
    assert code == 2 and "symbolic link" in err and "Traceback" not in err, err
    assert len([ln for ln in err.strip().splitlines() if ln.strip()]) == 1, err
    assert out.is_symlink()
    if target == "empty dir":
        assert list(dest.iterdir()) == []
    elif target == "missing":
        assert not dest.exists()


def test_bad_schema_file_is_one_sentence(tmp_path, monkeypatch, capsys):
    s = tmp_path / "f.toml"
    s.write_text(
        'format = 1\nname = "n"\nid_column = "ID"\nlabel_column = "y"\nclasses = ["a"]\n[blocks]\nb = ["ID"]\n'
    )
    t = tmp_path / "t.csv"
    t.write_text("ID,y\na,a\n")
    code, _, err = run_cli(
        monkeypatch, capsys, "client", "prepare", "--table", str(t), "--schema", str(s), "--out", str(tmp_path / "o")
    )
    assert code == 2 and "is invalid" in err and "ID or label column" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_federated_standardisation_from_the_organisations_sums(tmp_path, schema_file, monkeypatch, capsys):
    """Two shops hold the same block with different customers, the bank another block: ``federation
    stats`` combines their ``stats.json`` (sums, sums of squares, counts; no rows) into the pooled
    means and stds, and preparing again with that schema standardises each shop's block with them."""
    shop2 = "ID,visits,spend\n" + "".join(f"d{i},{3 * i},{7.0 - i}\n" for i in range(5))
    tables = {"bank": BANK, "shop": SHOP, "shop2": shop2}
    stats = [str(d / "stats.json") for d in prepare_tables(tmp_path, schema_file, monkeypatch, capsys, tables)]
    std_schema = tmp_path / "federation-std.toml"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "federation",
        "stats",
        "--schema",
        str(schema_file),
        "--stats",
        stats[0],
        "--stats",
        stats[1],
        "--stats",
        stats[2],
        "--out",
        str(std_schema),
    )
    assert code == 0, err
    pooled = np.array([[2.5 * i, i] for i in range(2, 10)] + [[7.0 - i, 3 * i] for i in range(5)])
    schema = load_schema(std_schema)
    np.testing.assert_allclose(schema.means["shop"], pooled.mean(axis=0))
    np.testing.assert_allclose(schema.stds["shop"], pooled.std(axis=0))
    assert set(schema.means) == {"bank", "shop"}  # nobody holds demo: no statistics for it
    parts = []
    for org in ("shop", "shop2"):
        d = tmp_path / "std" / org
        code, _, err = run_cli(
            monkeypatch,
            capsys,
            "client",
            "prepare",
            "--table",
            str(tmp_path / f"{org}.csv"),
            "--schema",
            str(std_schema),
            "--out",
            str(d),
        )
        assert code == 0, err
        parts.append(load_client_dir(d).data.blocks["shop"])
    z = np.concatenate(parts).astype(np.float64)
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(z.std(axis=0), 1, atol=1e-5)
    # bad statistics: one sentence, exit 2, nothing written; an existing --out is refused
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"blocks": {"colour": {"count": 3, "sum": [1], "sumsq": [1]}}}))
    for args, needle in (
        (["--stats", str(bad), "--out", str(tmp_path / "x.toml")], "block 'colour', which is not in the schema"),
        (["--stats", stats[0], "--out", str(std_schema)], "exists"),
    ):
        code, _, err = run_cli(monkeypatch, capsys, "federation", "stats", "--schema", str(schema_file), *args)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "x.toml").exists()


def test_prepared_clients_assemble_into_a_federation_that_trains(tmp_path, schema_file, monkeypatch, capsys):
    """Two organisations with their own labelled tables (horizontal: the same block, different
    customers) prepare their directories; ``federation assemble`` writes the server directory from
    the schema and their public client.json; the deployment's client steps (what the Flower
    ClientApp runs) train hybrid FedAvg on them for the schema's rounds. A client.json prepared
    against another schema, and repeated indices, are refused in one sentence."""
    from tests.test_flower import StepTransport, run_steps

    bank2 = "ID,balance,loans,default\n" + "".join(
        f"k{i},{50.0 * i},{i % 2},{'no' if i % 3 else 'yes'}\n" for i in range(9)
    )
    dirs = prepare_tables(tmp_path, schema_file, monkeypatch, capsys, {"bank": BANK, "bank2": bank2})
    server = tmp_path / "server"
    args = ["federation", "assemble", "--schema", str(schema_file)]
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        *args,
        "--client",
        str(dirs[0] / "client.json"),
        "--client",
        str(dirs[1] / "client.json"),
        "--out",
        str(server),
    )
    assert code == 0, err
    srv, hist, _ = run_steps(StepTransport(dirs), server)
    assert len(hist) == 4  # the schema's rounds
    assert np.isfinite(srv.w).all() and np.abs(srv.w).sum() > 0  # it trained on the prepared data
    assert (server.stat().st_mode & 0o777) == 0o700
    # refused: the same index twice; a client.json of another schema (other data: one more level)
    other = tmp_path / "other.toml"
    other.write_text(schema_file.read_text().replace('"east west"]', '"east west", "west"]'))
    for extra, needle in (
        (["--client", str(dirs[0] / "client.json"), "--client", str(dirs[0] / "client.json")], "same client name"),
    ):
        code, _, err = run_cli(monkeypatch, capsys, *args, *extra, "--out", str(tmp_path / "s2"))
        assert code == 2 and needle in err and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "federation",
        "assemble",
        "--schema",
        str(other),
        "--client",
        str(dirs[0] / "client.json"),
        "--out",
        str(tmp_path / "s3"),
    )
    assert code == 2 and "another federation schema" in err, err
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()
