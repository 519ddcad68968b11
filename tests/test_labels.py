"""Issue 27 items 6, 7 and part of 9: the organisations' path as organisations hold their data.

- labels: a table without the label column, or with empty label cells (unlabelled rows); each
  algorithm's rule of who must hold labels, checked before training with one sentence naming the
  algorithm that fits; unlabelled rows left out of training (the same ``w`` as the tables without
  those rows);
- the schema digest covers the data only: training settings change without preparing again, other
  data is refused;
- ``sep`` kept by ``federation init`` and ``client prepare --sep``: a semicolon CSV end to end;
- ``missing = "error" | "impute_mean"``;
- nothing written on bad input (a missing ``he_secret.key``);
- the README's walkthrough of three organisations, run as written.

The CLI runs in process (``run_cli``), on tables of at most 72 rows.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from hybridfl.data.export import load_client_dir
from hybridfl.data.federation import DATA_FIELDS, load_schema, schema_digest
from tests.test_prepare import CONFIG, run_cli
from tests.test_run_federation import BLOCKS, _config, _csv, _rows

README = Path(__file__).resolve().parents[1] / "README.md"


def _one_error(code: int, err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _init(tmp_path: Path, monkeypatch, capsys, config: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(config)
    schema = tmp_path / "federation.toml"
    code, _, err = run_cli(monkeypatch, capsys, "federation", "init", "--config", str(cfg), "--out", str(schema))
    assert code == 0, err
    return schema


def _prepare(monkeypatch, capsys, table: Path, schema: Path, out: Path, *extra: str) -> str:
    code, stdout, err = run_cli(
        monkeypatch,
        capsys,
        "client",
        "prepare",
        "--table",
        str(table),
        "--schema",
        str(schema),
        "--out",
        str(out),
        *extra,
    )
    assert code == 0, err
    return stdout


ROWS = _rows()
# organisation -> (its customers, its blocks); hybrid holdings as in test_run_federation
ORGS = {
    "bank": (range(0, 48), ["bank", "demo"]),
    "census": (range(24, 72), ["demo", "shop"]),
    "shop": (range(0, 72, 2), ["shop", "bank"]),
}


def _tables(
    tmp_path: Path, schema: Path, monkeypatch, capsys, labels: dict, *, drop: dict | None = None, sep: str = ","
) -> list[Path]:
    """Each organisation's CSV and client directory. ``labels[org]``: ``True`` (every row labelled),
    ``False`` (no label column) or a set of row IDs whose label cell is empty. ``drop[org]``: IDs
    left out of its table altogether."""
    dirs = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for i, (org, (ids, blocks)) in enumerate(ORGS.items()):
        keep = [f"c{k:03d}" for k in ids if f"c{k:03d}" not in (drop or {}).get(org, set())]
        lab = labels[org]
        cols = [c for b in blocks for c in BLOCKS[b]] + (["default"] if lab is not False else [])
        text = _csv(keep, cols, ROWS)
        if isinstance(lab, set):  # empty the label cell (the last column) of those rows
            text = "\n".join(
                ln.rsplit(",", 1)[0] + "," if ln.split(",", 1)[0] in lab else ln for ln in text.split("\n")
            )
        table = tmp_path / f"{org}.csv"
        table.write_text(text.replace(",", sep))
        d = tmp_path / "clients" / org
        _prepare(monkeypatch, capsys, table, schema, d, "--index", str(i))
        dirs.append(d)
    return dirs


def _run(monkeypatch, capsys, schema: Path, dirs: list[Path], out: Path, *extra: str) -> tuple[int, str, str]:
    args = ["run", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "--out", str(out), "-q"]
    return run_cli(monkeypatch, capsys, *args, *extra)


# ------------------------------------------------------------------------------------ labels


def test_a_table_with_empty_label_cells_keeps_its_rows_unlabelled(tmp_path, monkeypatch, capsys):
    """Empty label cells (also in an integer label column, which pandas then reads as float) are
    unlabelled rows: written with -1 in labels.npy, counted in client.json, left out of the data
    the loader gives the algorithms; a label column without any value is no labels at all."""
    cfg = CONFIG.replace('classes: ["no", "yes"]', 'classes: ["0", "1"]')
    schema = _init(tmp_path, monkeypatch, capsys, cfg)
    t = tmp_path / "bank.csv"
    t.write_text("ID,balance,loans,default\na,1,2,1\nb,3,4,\nc,5,6,0\nd,7,8,\n")
    stdout = _prepare(monkeypatch, capsys, t, schema, tmp_path / "bank")
    assert "labels 2 of 4 rows" in stdout and "2 rows have no label" in stdout
    np.testing.assert_array_equal(np.load(tmp_path / "bank" / "labels.npy"), [1, -1, 0, -1])
    meta = json.loads((tmp_path / "bank" / "client.json").read_text())
    assert meta["has_labels"] and meta["n_labelled"] == 2 and meta["n_samples"] == 4
    cd = load_client_dir(tmp_path / "bank")
    assert cd.has_labels and cd.unlabelled == 2
    assert list(cd.data.ids) == ["a", "c"] and list(cd.data.y) == [1, 0]
    np.testing.assert_array_equal(cd.data.blocks["bank"], [[1, 2], [5, 6]])
    # a label column with no value: the organisation holds no labels
    t.write_text("ID,balance,loans,default\na,1,2,\nb,3,4,\n")
    stdout = _prepare(monkeypatch, capsys, t, schema, tmp_path / "none")
    assert "labels no" in stdout and not (tmp_path / "none" / "labels.npy").exists()
    assert not load_client_dir(tmp_path / "none").has_labels


@pytest.mark.parametrize("algorithm", ["hybrid_fedavg", "hyfdca"])
def test_unlabelled_rows_are_left_out_of_training(tmp_path, monkeypatch, capsys, algorithm):
    """Some of the bank's and the shop's rows have no label: the run trains on the labelled rows
    only, says so per client, and ends with the same ``w`` as the federation whose tables lack
    those rows altogether."""
    algo = {
        "hybrid_fedavg": "{name: hybrid_fedavg, rounds: 3, loss: logistic}",
        "hyfdca": "{name: hyfdca, rounds: 2, encryption: none, local_fraction: 0.1, dual_mode: block}",
    }[algorithm]
    schema = _init(tmp_path, monkeypatch, capsys, _config(algo))
    gaps = {"bank": {"c001", "c007", "c030"}, "shop": {"c002", "c040"}}
    dirs = _tables(
        tmp_path / "a", schema, monkeypatch, capsys, {"bank": gaps["bank"], "census": True, "shop": gaps["shop"]}
    )
    code, _, err = _run(monkeypatch, capsys, schema, dirs, tmp_path / "run-a")
    assert code == 0, err
    assert "client 'bank' holds 3 rows without a label" in err and "trains on its 45 labelled rows" in err
    assert "client 'shop' holds 2 rows without a label" in err and "'census'" not in err
    ref = _tables(tmp_path / "b", schema, monkeypatch, capsys, dict.fromkeys(ORGS, True), drop=gaps)
    code, _, err = _run(monkeypatch, capsys, schema, ref, tmp_path / "run-b")
    assert code == 0, err
    w = np.load(tmp_path / "run-a" / "final.npz")["w"]
    assert np.abs(w).sum() > 0
    np.testing.assert_array_equal(w, np.load(tmp_path / "run-b" / "final.npz")["w"])


@pytest.mark.parametrize(
    "algorithm, labels, needles",
    [
        (
            "{name: hyfdca, rounds: 1, encryption: none, dual_mode: block}",
            {"bank": True, "census": False, "shop": True},
            [
                "HyFDCA needs labels at every client",
                "client 'census' holds none",
                "FedBCD trains with labels at one party",
            ],
        ),
        (
            "{name: hybrid_fedavg, rounds: 1}",
            {"bank": True, "census": True, "shop": False},
            ["hybrid FedAvg needs labels at every client", "client 'shop'", "FedBCD"],
        ),
        (
            "{name: hyfem, rounds: 1}",
            {"bank": False, "census": True, "shop": True},
            ["HyFEM needs labels at every client", "client 'bank'", "FedBCD"],
        ),
        (
            "{name: fedbcd, rounds: 1, model: linear}",
            {"bank": True, "census": {"c030"}, "shop": False},
            ["FedBCD needs exactly one label party", "clients 'bank', 'census' hold labels", "HyFDCA"],
        ),
        (
            "{name: fedbcd, rounds: 1, model: linear}",
            dict.fromkeys(ORGS, False),
            ["FedBCD needs exactly one label party", "no client holds labels"],
        ),
    ],
)
def test_who_must_hold_labels_is_checked_before_anything_is_written(
    tmp_path, monkeypatch, capsys, algorithm, labels, needles
):
    schema = _init(tmp_path, monkeypatch, capsys, _config(algorithm))
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, labels)
    out = tmp_path / "run"
    _one_error(*_run(monkeypatch, capsys, schema, dirs, out)[::2], *needles)
    assert not out.exists()


def test_deploy_local_and_the_flower_server_check_who_holds_labels(tmp_path, monkeypatch, capsys):
    """The same rule before any Flower process starts (``deploy-local --federation``) and in the
    ServerApp (``run_server``, from the assembled server directory) before any node is asked."""
    from hybridfl.data.federation import assemble_server
    from hybridfl.errors import PartitionError
    from hybridfl.runtime.flower.node import run_server

    schema = _init(
        tmp_path, monkeypatch, capsys, _config("{name: hyfdca, rounds: 1, encryption: none, dual_mode: block}")
    )
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, {"bank": True, "census": False, "shop": True})
    out = tmp_path / "deploy"
    code, _, err = run_cli(
        monkeypatch, capsys, "deploy-local", "--federation", str(schema), "--clients", ",".join(map(str, dirs)),
        "--out", str(out),
    )  # fmt: skip
    _one_error(code, err, "HyFDCA needs labels at every client", "'census'")
    assert not out.exists()
    infos = [(str(d / "client.json"), json.loads((d / "client.json").read_text())) for d in dirs]
    server = assemble_server(schema, infos, tmp_path / "server")
    with pytest.raises(PartitionError, match="HyFDCA needs labels at every client"):
        run_server(None, server)  # no grid needed: refused before any message


def test_fedbcd_trains_with_a_label_party_missing_some_labels(tmp_path, monkeypatch, capsys):
    """FedBCD: the bank is the label party with some empty label cells, the others hold no label
    column; the run trains (the unlabelled samples are not in the aligned set)."""
    algo = "{name: fedbcd, rounds: 2, variant: p, local_steps: 2, model: linear, lr: 0.01, batch_size: 8}"
    schema = _init(tmp_path, monkeypatch, capsys, _config(algo))
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, {"bank": {"c024", "c026"}, "census": False, "shop": False})
    code, _, err = _run(monkeypatch, capsys, schema, dirs, tmp_path / "run")
    assert code == 0, err
    assert "client 'bank' holds 2 rows without a label" in err
    assert json.loads((tmp_path / "run" / "results.json").read_text())["rounds"] == 2


# ------------------------------------------------------------------------------------ schema digest


def test_the_schema_digest_covers_the_data_only(tmp_path, monkeypatch, capsys):
    """Changing rounds, lr, the seed or even the algorithm needs no new ``client prepare``; a
    change of any data field makes another digest, and such a directory is refused."""
    schema = _init(tmp_path, monkeypatch, capsys, _config("{name: hybrid_fedavg, rounds: 2, lr: 0.1}"))
    s = load_schema(schema)
    base = schema_digest(schema)
    assert base == schema_digest(s) == schema_digest(s.model_copy(update={"seed": 9, "algorithm": {"name": "hyfem"}}))
    changed = {
        "format": 1,
        "name": "other",
        "id_column": "key",
        "label_column": "y",
        "classes": ["yes", "no"],
        "standardize": True,
        "sep": ";",
        "missing": "impute_mean",
        "blocks": dict(reversed(s.blocks.items())),
        "categorical": {"region": ["north", "south", "east west"]},
        "means": {"shop": [0.0, 0.0]},
        "stds": {"shop": [1.0, 1.0]},
    }
    for field in DATA_FIELDS:
        if field in ("format", "means", "stds"):
            continue
        assert schema_digest(s.model_copy(update={field: changed[field]})) != base, field
    assert schema_digest(s.model_copy(update={"means": changed["means"], "stds": changed["stds"]})) != base
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, dict.fromkeys(ORGS, True))
    text = schema.read_text()
    edited = tmp_path / "edited.toml"  # more rounds, another lr and seed: the same directories run
    edited.write_text(
        text.replace("rounds = 2", "rounds = 3").replace("lr = 0.1", "lr = 0.05").replace("seed = 5", "seed = 6")
    )
    code, _, err = _run(monkeypatch, capsys, edited, dirs, tmp_path / "run")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "results.json").read_text())["rounds"] == 3
    other = tmp_path / "other.toml"  # other data (another missing-value policy): refused, nothing written
    other.write_text(text.replace('missing = "error"', 'missing = "impute_mean"'))
    _one_error(*_run(monkeypatch, capsys, other, dirs, tmp_path / "run2")[::2], "another federation schema")
    assert not (tmp_path / "run2").exists()


# ------------------------------------------------------------------------------------ sep


def test_a_semicolon_csv_end_to_end(tmp_path, monkeypatch, capsys):
    """``dataset.sep: ";"`` survives ``federation init``; the organisations' semicolon CSVs prepare
    with it and train the same ``w`` as comma CSVs; ``--sep`` overrides the schema's."""
    cfg = _config("{name: hybrid_fedavg, rounds: 2, loss: logistic}").replace(
        "  id_column: ID\n", '  id_column: ID\n  sep: ";"\n'
    )
    schema = _init(tmp_path, monkeypatch, capsys, cfg)
    assert load_schema(schema).sep == ";" and 'sep = ";"' in schema.read_text()
    dirs = _tables(tmp_path / "semi", schema, monkeypatch, capsys, dict.fromkeys(ORGS, True), sep=";")
    code, _, err = _run(monkeypatch, capsys, schema, dirs, tmp_path / "run-semi")
    assert code == 0, err
    comma = tmp_path / "comma.csv"
    comma.write_text((tmp_path / "semi" / "bank.csv").read_text().replace(";", ","))
    _prepare(monkeypatch, capsys, comma, schema, tmp_path / "comma-bank", "--sep", ",")
    a, b = load_client_dir(tmp_path / "comma-bank"), load_client_dir(dirs[0])
    assert list(a.data.ids) == list(b.data.ids)
    np.testing.assert_array_equal(a.data.blocks["bank"], b.data.blocks["bank"])
    # without --sep the comma CSV is one column: one sentence, nothing written
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "client",
        "prepare",
        "--table",
        str(comma),
        "--schema",
        str(schema),
        "--out",
        str(tmp_path / "x"),
    )
    _one_error(code, err, "ID column 'ID' is not in comma.csv")
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------ missing values


def test_missing_values_error_by_default_and_impute_mean_after_stats(tmp_path, monkeypatch, capsys):
    """``missing = "error"``: one sentence naming column and row. ``missing = "impute_mean"``:
    before the federation's means exist the directory only serves its stats.json (over the
    observed cells) and is refused by the loader; ``federation stats`` then makes the means and
    preparing again fills each missing cell with its feature's mean."""
    schema = _init(tmp_path, monkeypatch, capsys, CONFIG)
    t = tmp_path / "shop.csv"
    t.write_text("ID,spend,visits\na,1.5,2\nb,,3\n")
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "client",
        "prepare",
        "--table",
        str(t),
        "--schema",
        str(schema),
        "--out",
        str(tmp_path / "o"),
    )
    _one_error(code, err, "column 'spend'", "missing value at row 2", 'missing = "error"')
    assert not (tmp_path / "o").exists()

    cfg = CONFIG.replace("  categorical:", "  standardize: false\n  missing: impute_mean\n  categorical:")
    schema = _init(tmp_path / "imp", monkeypatch, capsys, cfg)
    assert load_schema(schema).missing == "impute_mean"
    shop1, shop2 = tmp_path / "shop1.csv", tmp_path / "shop2.csv"
    shop1.write_text("ID,spend,visits\na,1.0,2\nb,,4\nc,5.0,\n")
    shop2.write_text("ID,spend,visits\nd,3.0,6\ne,7.0,8\n")
    first = [tmp_path / "first" / "shop1", tmp_path / "first" / "shop2"]
    stdout = _prepare(monkeypatch, capsys, shop1, schema, first[0])
    assert "2 missing cells are not filled yet" in stdout and "federation stats" in stdout
    _prepare(monkeypatch, capsys, shop2, schema, first[1])
    st = json.loads((first[0] / "stats.json").read_text())["blocks"]["shop"]
    assert st["count"] == [2, 2] and st["sum"] == [6.0, 6.0] and st["sumsq"] == [26.0, 20.0]
    from hybridfl.errors import DataError

    with pytest.raises(DataError, match="missing cells that the federation's means fill"):
        load_client_dir(first[0])
    out = tmp_path / "run"
    _one_error(*_run(monkeypatch, capsys, schema, first, out)[::2], "missing cells", "federation stats")
    assert not out.exists()
    std = tmp_path / "federation-std.toml"
    code, _, err = run_cli(
        monkeypatch, capsys, "federation", "stats", "--schema", str(schema),
        "--stats", str(first[0] / "stats.json"), "--stats", str(first[1] / "stats.json"), "--out", str(std),
    )  # fmt: skip
    assert code == 0, err
    from hybridfl.data.federation import combine_stats
    from hybridfl.errors import ConfigError

    with pytest.raises(ConfigError, match="no organisation observed feature 0 of block 'shop'"):
        combine_stats(
            load_schema(schema), [("a", {"blocks": {"shop": {"count": [0, 2], "sum": [0, 1], "sumsq": [0, 1]}}})]
        )
    means = load_schema(std).means["shop"]  # spend over 1, 5, 3, 7; visits over 2, 4, 6, 8
    np.testing.assert_allclose(means, [4.0, 5.0])
    stdout = _prepare(monkeypatch, capsys, shop1, std, tmp_path / "second")
    assert "2 missing cells filled with the federation's means" in stdout
    x = load_client_dir(tmp_path / "second").data.blocks["shop"]  # not standardised: standardize = false
    np.testing.assert_allclose(x, [[1.0, 2.0], [4.0, 4.0], [5.0, 5.0]])


# ------------------------------------------------------------------------------------ nothing written


def test_a_missing_he_key_stops_run_federation_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """Encrypted HyFDCA whose clients hold no ``he_secret.key``: one sentence, exit 2, no output
    directory (so no ``config.json`` asking for ``--force`` next time); with an existing empty
    ``--out``, nothing appears in it."""
    schema = _init(
        tmp_path, monkeypatch, capsys, _config("{name: hyfdca, rounds: 1, encryption: ckks, dual_mode: block}")
    )
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, dict.fromkeys(ORGS, True))
    out = tmp_path / "run"
    _one_error(*_run(monkeypatch, capsys, schema, dirs, out)[::2], "holds no HE secret key", "ckks")
    assert not out.exists()
    out.mkdir()
    _one_error(*_run(monkeypatch, capsys, schema, dirs, out)[::2], "holds no HE secret key")
    assert list(out.iterdir()) == []


def test_a_federation_refused_at_setup_leaves_no_config_json(tmp_path, monkeypatch, capsys):
    """What only the setup exchanges find (FedBCD parties without a common sample, found by PSI)
    stops the run with one sentence and takes back the config.json it had written."""
    algo = "{name: fedbcd, rounds: 1, model: linear}"
    schema = _init(tmp_path, monkeypatch, capsys, _config(algo))
    labels = {"bank": True, "census": False, "shop": False}
    dirs = _tables(tmp_path, schema, monkeypatch, capsys, labels, drop={"bank": {f"c{i:03d}" for i in range(24, 72)}})
    out = tmp_path / "run"
    _one_error(*_run(monkeypatch, capsys, schema, dirs, out)[::2], "share no sample ID")
    assert not out.exists()


# ------------------------------------------------------------------------------------ README walkthrough


def _readme_walkthrough() -> tuple[str, list[str]]:
    """The run.yaml and the shell commands of the README's "Three organisations, start to finish"."""
    text = README.read_text()
    part = text[text.index("**Three organisations, start to finish.**") :]
    yaml = re.search(r"```yaml\n(.*?)```", part, re.S).group(1)
    bash = re.search(r"```bash\n(.*?)```", part, re.S).group(1)
    return yaml, [ln for ln in bash.splitlines() if ln.strip()]


def test_the_readme_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every command of the README's walkthrough, as written, in a fresh directory holding the
    three organisations' CSVs (72 customers): init, prepare, he-keys, the key copies, run
    --federation. ``deploy-local`` (Flower) is left out here: test_three_organisations runs it."""
    yaml, commands = _readme_walkthrough()
    assert commands[-1].startswith("hybridfl deploy-local ")
    assert any(c.startswith("hybridfl he-keys ") for c in commands)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml)
    for org, (ids, blocks) in ORGS.items():
        cols = [c for b in blocks for c in BLOCKS[b]] + ["default"]
        (tmp_path / f"{org}.csv").write_text(_csv([f"c{i:03d}" for i in ids], cols, ROWS))
    for line in commands[:-1]:
        for part in line.split("&&"):
            argv = shlex.split(part, comments=True)
            if argv[0] == "cp":
                shutil.copy(argv[1], argv[2])
                continue
            assert argv[0] == "hybridfl", line
            code, _, err = run_cli(monkeypatch, capsys, *argv[1:])
            assert code == 0, (line, err)
    res = json.loads((tmp_path / "runs" / "check" / "results.json").read_text())
    assert res["config"]["algorithm"]["encryption"] == "ckks" and res["rounds"] == res["config"]["algorithm"]["rounds"]
    assert np.isfinite(np.load(tmp_path / "runs" / "check" / "final.npz")["w"]).all()
    for org in ORGS:
        assert (tmp_path / org / "he_secret.key").is_file()
