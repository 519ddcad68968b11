"""The model a run leaves (``model/``), ``load_model`` and ``hybridfl predict``.

A run of each of the four federated algorithms on a small table (string IDs, a categorical
column, standardised numeric columns) writes ``model/``; scoring the run's own test rows with the
loaded model gives exactly the test accuracy in the run's results; HyFEM's local inference with a
client's model gives that client's reported accuracy. Then bad input to ``load_model`` and
``predict``: one sentence each, nothing written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hybridfl.config import parse_config
from hybridfl.data.export_table import raw_table
from hybridfl.errors import HybridFLError
from hybridfl.experiment import execute, prepare
from hybridfl.inference import ModelError, load_model
from tests.cli_helpers import cli


def run_cli(*args: str, capsys=None) -> tuple[int, str, str]:
    """``hybridfl <args>`` in this process (``main()``: errors become one sentence and exit 2):
    ``(exit code, stdout, stderr)``."""
    import sys

    from hybridfl.cli.main import main

    argv, sys.argv = sys.argv, ["hybridfl", *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = argv
    out = capsys.readouterr() if capsys is not None else None
    return code, out.out if out else "", out.err if out else ""


ALGORITHMS = {
    "hyfem": {"name": "hyfem", "rounds": 3, "local_steps": 5, "extractor_dim": 8, "hidden": 16},
    "hyfdca": {
        "name": "hyfdca",
        "rounds": 3,
        "lambda": 0.01,
        "encryption": "none",
        "alignment": "plaintext",
        "reference_sdca_epochs": 3,
        "dual_mode": "block",  # the default before the measured best
    },
    "hybrid_fedavg": {"name": "hybrid_fedavg", "rounds": 3, "lambda": 0.01, "reference_sdca_epochs": 3},
    "fedbcd": {"name": "fedbcd", "rounds": 5, "model": "linear", "batch_size": 32},
}
PARTITIONS = {
    "hyfem": {"kind": "grid", "sample_groups": 2, "block_groups": 2},
    "hyfdca": {"kind": "grid", "sample_groups": 2, "block_groups": 2},
    "hybrid_fedavg": {"kind": "grid", "sample_groups": 2, "block_groups": 2},
    "fedbcd": {"kind": "vertical", "parties": [["profile"], ["money"]], "label_party": 1},
}


def make_table(path: Path, n: int = 400, seed: int = 0) -> Path:
    """A customers table: string IDs, a categorical ``region``, numeric columns, labels yes/no."""
    rng = np.random.default_rng(seed)
    region = rng.choice(["north", "south", "east"], n)
    age = rng.integers(18, 80, n)
    income = rng.normal(50, 15, n).round(2)
    debt = rng.normal(10, 5, n).round(2)
    calls = rng.poisson(3, n)
    z = 0.05 * (age - 45) + 0.08 * (debt - 10) - 0.04 * (income - 50) + (region == "east") * 0.8
    label = np.where(z + rng.normal(0, 0.7, n) > 0.3, "yes", "no")
    pd.DataFrame(
        {
            "customer": [f"c{i:05d}" for i in range(n)],
            "region": region,
            "age": age,
            "income": income,
            "debt": debt,
            "calls": calls,
            "label": label,
        }
    ).to_csv(path, index=False)
    return path


def config(table: Path, algo: str) -> dict:
    return {
        "seed": 0,
        "dataset": {
            "name": "table",
            "path": str(table),
            "label_column": "label",
            "id_column": "customer",
            "blocks": {"profile": ["region", "age", "calls"], "money": ["income", "debt"]},
            "categorical": ["region"],
        },
        "partition": PARTITIONS[algo],
        "algorithm": ALGORITHMS[algo],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, dict, object]]:
    """Every algorithm run once on the same table: name -> (run dir, results.json, config)."""
    base = tmp_path_factory.mktemp("runs")
    table = make_table(base / "customers.csv")
    out = {}
    for algo in ALGORITHMS:
        cfg = parse_config(config(table, algo))
        d = base / algo
        execute(prepare(cfg, d), d)
        out[algo] = (d, json.loads((d / "results.json").read_text()), cfg)
    return out


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_predict_on_the_runs_test_rows_gives_its_test_accuracy(runs, algo):
    d, res, cfg = runs[algo]
    model = load_model(d / "model")
    test = raw_table(cfg.dataset, cfg.seed, "test")
    reported = res["server_accuracy"] if algo == "hyfem" else res["accuracy"]
    assert model.evaluate(test)["accuracy"] == reported
    pred = model.predict(test)
    assert set(pred) <= {"yes", "no"} and len(pred) == len(test)
    assert list(model.classes_) == ["no", "yes"]
    assert model.blocks == ["profile", "money"]
    if algo != "hyfdca" and algo != "hybrid_fedavg":  # hinge: margins only
        p = model.predict_proba(test)
        assert p.shape == (len(test), 2) and np.allclose(p.sum(axis=1), 1.0)
        assert np.array_equal(model.classes_[p.argmax(axis=1)], pred) or algo == "fedbcd"


def test_manifest_records_the_encoding_and_hashes(runs):
    d, _, _ = runs["hyfdca"]
    m = json.loads((d / "model" / "model.json").read_text())
    assert m["format"] == "hybridfl-model" and m["kind"] == "linear" and m["algorithm"] == "hyfdca"
    region = m["encoding"]["blocks"][0]["columns"][0]
    assert region == {"name": "region", "kind": "categorical", "levels": ["east", "north", "south"]}
    assert m["encoding"]["blocks"][0]["scale"] == "float32" and m["encoding"]["id_column"] == "customer"
    data = (d / "model" / "model.safetensors").read_bytes()
    assert m["files"]["model.safetensors"] == hashlib.sha256(data).hexdigest()


def test_hyfem_local_inference_equals_each_clients_reported_accuracy(runs):
    d, res, cfg = runs["hyfem"]
    model = load_model(d / "model")
    test = raw_table(cfg.dataset, cfg.seed, "test")
    for cid, acc in res["client_accuracy"].items():
        assert model.evaluate(test, client=cid)["accuracy"] == acc
    # local inference with one block only: the server model cut to it, scores every row
    only = test.drop(columns=["income", "debt"])
    assert len(model.predict(only)) == len(test)
    cut = model.model_for(["profile"])
    assert cut.blocks == ("profile",) and cut.classifier.fc1.in_features == model.extractor_dim


def test_dict_of_raw_blocks_equals_the_table(runs):
    d, _, cfg = runs["hybrid_fedavg"]
    model = load_model(d / "model")
    test = raw_table(cfg.dataset, cfg.seed, "test")
    onehot = np.stack([(test["region"] == lv).to_numpy(float) for lv in ("east", "north", "south")], axis=1)
    blocks = {
        "profile": np.column_stack([onehot, test["age"], test["calls"]]),
        "money": test[["income", "debt"]].to_numpy(),
    }
    assert np.array_equal(model.decision_function(blocks), model.decision_function(test))


def test_predict_cli_writes_predictions_and_metrics(runs, tmp_path, capsys):
    d, res, cfg = runs["hyfdca"]
    test = raw_table(cfg.dataset, cfg.seed, "test")
    t = tmp_path / "new.csv"
    test.drop(columns=["label"]).to_csv(t, index=False)
    out = tmp_path / "pred.csv"
    p = subprocess.run(
        cli("predict", "--model", str(d / "model"), "--table", str(t), "--out", str(out)),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    pred = pd.read_csv(out)
    assert list(pred.columns) == ["customer", "prediction", "margin"]
    assert list(pred["customer"]) == list(test["customer"])
    assert np.allclose(pred["margin"], load_model(d / "model").decision_function(test))
    # an existing output is never overwritten without --force
    before = out.read_bytes()
    code, _, err = run_cli("predict", "--model", str(d / "model"), "--table", str(t), "--out", str(out), capsys=capsys)
    assert code == 2 and "already exists" in err and "Traceback" not in err
    assert out.read_bytes() == before


# ---------------------------------------------------------------------------------------- bad input


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / "model"
    shutil.copytree(src, dst)
    return dst


def _rehash(d: Path) -> None:
    m = json.loads((d / "model.json").read_text())
    m["files"]["model.safetensors"] = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    (d / "model.json").write_text(json.dumps(m))


def _edit_manifest(d: Path, fn) -> None:
    m = json.loads((d / "model.json").read_text())
    fn(m)
    (d / "model.json").write_text(json.dumps(m))


def _retensor(d: Path, fn) -> None:
    from safetensors.numpy import load, save

    t = load((d / "model.safetensors").read_bytes())
    fn(t)
    (d / "model.safetensors").write_bytes(save(t))
    _rehash(d)


BAD_MODELS = {
    "missing directory": (lambda d: shutil.rmtree(d), "does not exist"),
    "a file, not a directory": (lambda d: (shutil.rmtree(d), d.write_text("x")), "not a directory"),
    "no manifest": (lambda d: (d / "model.json").unlink(), "holds no model.json"),
    "manifest not JSON": (lambda d: (d / "model.json").write_text("{not json"), "not valid JSON"),
    "foreign format": (
        lambda d: _edit_manifest(d, lambda m: m.update(format="other")),
        "not a hybridfl model manifest",
    ),
    "future version": (lambda d: _edit_manifest(d, lambda m: m.update(format_version=99)), "not supported"),
    "unknown kind": (lambda d: _edit_manifest(d, lambda m: m.update(kind="tree")), "invalid: kind"),
    "weights changed": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-8] + b"\0" * 8),
        "does not match the SHA-256",
    ),
    "weights missing": (lambda d: (d / "model.safetensors").unlink(), "is missing"),
    "a foreign file beside": (lambda d: (d / "extra.pkl").write_bytes(b"\x80"), "does not list"),
    "not safetensors": (lambda d: ((d / "model.safetensors").write_bytes(b"garbage"), _rehash(d)), "not a readable"),
    "a tensor of another shape": (
        lambda d: _retensor(d, lambda t: t.update({"w.money": np.zeros(5)})),
        "has shape (5,), expected (2,)",
    ),
    "an extra tensor": (lambda d: _retensor(d, lambda t: t.update({"evil": np.zeros(1)})), "does not use"),
    "a NaN weight": (lambda d: _retensor(d, lambda t: t.update({"intercept": np.array([np.nan])})), "not finite"),
    "a bad loss": (lambda d: _edit_manifest(d, lambda m: m["model"].update(loss="cubic")), "loss 'cubic'"),
    "a column in two blocks": (
        lambda d: _edit_manifest(d, lambda m: m["encoding"]["blocks"][1]["columns"][0].update(name="age")),
        "in both block",
    ),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_load_model_refuses_with_one_sentence(runs, tmp_path, case):
    d = _copy(runs["hybrid_fedavg"][0] / "model", tmp_path)
    spoil, words = BAD_MODELS[case]
    spoil(d)
    with pytest.raises(ModelError) as e:
        load_model(d)
    msg = str(e.value)
    assert words in msg and msg.count("\n") == 0 and msg.endswith("."), msg


def _table(runs) -> pd.DataFrame:
    d, _, cfg = runs["hyfem"]
    return raw_table(cfg.dataset, cfg.seed, "test")


BAD_TABLES = {
    "a missing column": (
        lambda t: t.drop(columns=["debt"]),
        "holds column 'income' of block 'money' but not its column 'debt'",
    ),
    "an unseen category": (lambda t: t.assign(region=["west"] + list(t["region"][1:])), "never saw"),
    "a NaN": (lambda t: t.assign(age=[np.nan] + list(t["age"][1:])), "missing (NaN) value at row 1"),
    "a non-number": (lambda t: t.assign(income=["lots"] + list(t["income"][1:])), "non-number at row 1"),
    "an infinite value": (lambda t: t.assign(debt=[np.inf] + list(t["debt"][1:])), "infinite value at row 1"),
    "no block at all": (lambda t: t[["customer", "label"]], "holds none of the model's blocks"),
    "repeated IDs": (lambda t: t.assign(customer=["same"] * len(t)), "repeats an ID"),
    "an unknown label": (lambda t: t.assign(label=["maybe"] + list(t["label"][1:])), "not one of the model's"),
    "no rows": (lambda t: t.iloc[:0], "no data rows"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_predict_refuses_bad_tables_with_one_sentence(runs, case):
    from hybridfl.cli.predict import predict_frame

    model = load_model(runs["hybrid_fedavg"][0] / "model")
    spoil, words = BAD_TABLES[case]
    with pytest.raises(HybridFLError) as e:
        predict_frame(model, spoil(_table(runs)), "new.csv")
    msg = str(e.value)
    assert words in msg and msg.count("\n") == 0, msg
    assert "c000" not in msg  # no ID or other value of the table in the message


def test_predict_api_refusals(runs):
    lin = load_model(runs["hyfdca"][0] / "model")
    hyfem = load_model(runs["hyfem"][0] / "model")
    t = _table(runs)
    with pytest.raises(ModelError, match="margins, not probabilities"):
        lin.predict_proba(t)
    with pytest.raises(ModelError, match="has no client 'nobody'"):
        hyfem.predict(t, client="nobody")
    with pytest.raises(ModelError, match="per-sample shape"):
        lin.predict({"profile": np.zeros((3, 2)), "money": np.zeros((3, 2))})
    with pytest.raises(ModelError, match="does not have"):
        lin.predict({"other": np.zeros((3, 2))})
    with pytest.raises(ModelError, match="NaN or infinite"):
        lin.predict({"profile": np.full((3, 5), np.nan), "money": np.zeros((3, 2))})
    with pytest.raises(ModelError, match="DataFrame or a dict"):
        lin.predict([[1, 2, 3]])


def test_predict_cli_bad_input_is_one_sentence_and_writes_nothing(runs, tmp_path, capsys):
    d = runs["hyfem"][0]
    t = tmp_path / "bad.csv"
    _table(runs).drop(columns=["debt"]).to_csv(t, index=False)
    out = tmp_path / "p.csv"
    for args in (
        ("--model", str(d / "model"), "--table", str(t), "--out", str(out)),
        ("--model", str(tmp_path / "none"), "--table", str(t), "--out", str(out)),
        ("--model", str(d / "model"), "--table", str(tmp_path / "absent.csv"), "--out", str(out)),
        ("--model", str(runs["hyfdca"][0] / "model"), "--table", str(t), "--out", str(out), "--client", "client-0"),
    ):
        code, _, err = run_cli("predict", *args, capsys=capsys)
        assert code == 2, err
        assert "Traceback" not in err and err.strip().startswith("error:") and err.strip().count("\n") == 0, err
        assert not out.exists()
    # one real process: the installed entry point gives the same one sentence and exit status 2
    p = subprocess.run(
        cli("predict", "--model", str(tmp_path / "none"), "--table", str(t), "--out", str(out)),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_federation_run_leaves_the_servers_model_scoring_like_its_w(tmp_path, monkeypatch, capsys):
    """``run --federation`` (three organisations' CSVs, hybrid FedAvg): ``<out>/model`` scores
    the customers' rows with the schema's encoding exactly as the run's ``w`` does; FedBCD's
    parties keep their models, so the server writes none for it (not tested here)."""
    from hybridfl.algorithms.convex.problem import features
    from hybridfl.data.loaders import table_to_dataset
    from tests.test_run_federation import BLOCKS, _csv, _federation

    schema, dirs, rows = _federation(tmp_path, monkeypatch, capsys, "{name: hybrid_fedavg, rounds: 3, loss: logistic}")
    out = tmp_path / "run"
    args = ["run", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "--out", str(out), "-q"]
    code, _, err = run_cli(*args, capsys=capsys)
    assert code == 0, err
    model = load_model(out / "model")
    every = [c for b in BLOCKS.values() for c in b] + ["default"]
    table = tmp_path / "all.csv"
    table.write_text(_csv(sorted(rows), every, rows))
    frame = pd.read_csv(table)
    final = np.load(out / "final.npz")
    w, b = final["w"], float(final["intercept"][0])  # fit_intercept: the intercept block is last in w
    levels = {"region": ["east west", "north", "south"]}
    ds = table_to_dataset(
        frame, name="x", label_column="default", blocks=BLOCKS, id_column="ID", categorical=list(levels)
    )
    assert b != 0.0 and w[-1] == b and model.intercept == b
    np.testing.assert_allclose(model.decision_function(frame), features(ds) @ w[:-1] + b, rtol=1e-6, atol=1e-9)
    assert model.predict_proba(frame).shape == (len(frame), 2)


# ---------------------------------------------------------------------------------------- federated


def _org_tables(test: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Three organisations' new rows of the test table: ``a`` (the receiver, with labels) holds
    the profile block of rows 0-79, ``b`` the money block of rows 20-99, ``c`` both blocks of rows
    60 on. Rows 0-19 of ``a`` have no money block anywhere."""
    prof, money = ["region", "age", "calls"], ["income", "debt"]
    return {
        "a": test.iloc[:80][["customer", *prof, "label"]],
        "b": test.iloc[20:100][["customer", *money]].iloc[::-1],  # another order than the receiver's
        "c": test.iloc[60:][["customer", *prof, *money]],
    }


@pytest.mark.parametrize("algo", ["hyfdca", "hyfem", "fedbcd"])
def test_federated_prediction_equals_single_table_prediction(runs, algo):
    """The receiver's predictions from three organisations' tables equal the single-table ones of
    the same rows: linear margins to 1e-9 (fixed point 2^-32 per organisation), FedBCD and HyFEM
    (float32 models, parts summed in float64) to 1e-6; HyFEM's rows with the profile block only
    are its local inference (the server model cut to that block); the linear and FedBCD models
    leave them unscored."""
    from hybridfl.inference.federated import federated_predict

    d, _, cfg = runs[algo]
    model = load_model(d / "model")
    test = raw_table(cfg.dataset, cfg.seed, "test")
    out, stats = federated_predict(model, _org_tables(test), "a")
    assert list(out["customer"]) == list(test["customer"][:80])
    full = model.raw(test.iloc[20:80])
    if algo == "hyfem":
        local = model.raw(test.iloc[:20][["customer", "region", "age", "calls"]])
        ref_pred, ref_scores = model.outputs(np.concatenate([local, full]))
        assert stats["scored"] == 80 and stats["unscored"] == 0
        rows = slice(0, 80)
    else:
        ref_pred, ref_scores = model.outputs(full)
        assert stats["scored"] == 60 and stats["unscored"] == 20
        assert (out["prediction"][:20] == "").all() and out[list(ref_scores)[0]][:20].isna().all()
        rows = slice(20, 80)
    assert list(out["prediction"][rows]) == list(ref_pred)
    tol = 1e-9 if algo == "hyfdca" else 1e-6
    for k, v in ref_scores.items():
        np.testing.assert_allclose(out[k][rows].to_numpy(), v, rtol=0, atol=tol)
    # hello, keys (3 each), the PSI request (1), PSI serve (2), plan (1), score (2), combine (1), and replies
    assert stats["messages"] == 2 * (3 + 3 + 1 + 2 + 1 + 2 + 1)


def test_federated_prediction_message_audit(runs):
    """Every message's bytes (what the server relays and each organisation receives): no sample ID
    in the clear (PSI blobs and keyed tags only), no feature value of any table, and every
    organisation's scores masked (an organisation's vector is non-zero where it contributes
    nothing); only the receiver ends with predictions."""
    from hybridfl.inference.federated import build_orgs, run_prediction
    from hybridfl.runtime.messages import decode
    from hybridfl.runtime.transport import InProcessTransport

    d, _, cfg = runs["hyfdca"]
    model = load_model(d / "model")
    test = raw_table(cfg.dataset, cfg.seed, "test")
    tables = _org_tables(test)
    wire: list[bytes] = []
    orgs, _ = build_orgs(model, tables, "a")
    run_prediction(InProcessTransport(orgs, wire.append), list(orgs), "a", model.blocks)
    blob = b"".join(wire)
    for t in tables.values():
        for i in t["customer"]:
            assert str(i).encode() not in blob
    for c in ("income", "debt", "age"):
        for v in test[c][:100]:
            assert np.float64(v).tobytes() not in blob and np.float32(v).tobytes() not in blob
    msgs = [decode(w) for w in wire]
    masked = [m for m in msgs if m.kind == "predict.score" and "masked" in m.payload]
    assert {m.sender for m in masked} == {"b", "c"}
    for m in masked:  # b contributes nothing to rows 0-19, c nothing to rows 0-59: still random words
        assert np.count_nonzero(m.payload["masked"][:20]) == 20
    assert orgs["a"].raw is not None and orgs["b"].raw is None and orgs["c"].raw is None


def test_federated_prediction_refusals(runs, capsys, tmp_path):
    """A receiver outside the organisations, a table without the ID column, a plan changed by the
    server (authenticated encryption), a replayed message: one sentence each."""
    from hybridfl.inference.federated import PredictionError, build_orgs, federated_predict, run_prediction
    from hybridfl.runtime.transport import InProcessTransport

    d, _, cfg = runs["hyfdca"]
    model = load_model(d / "model")
    tables = _org_tables(raw_table(cfg.dataset, cfg.seed, "test"))
    with pytest.raises(PredictionError, match="not one of the organisations"):
        federated_predict(model, tables, "z")
    with pytest.raises(PredictionError, match="no ID column"):
        federated_predict(model, {**tables, "b": tables["b"].drop(columns=["customer"])}, "a")

    class Tamper(InProcessTransport):
        def send_and_receive(self, messages):
            for m in messages:
                if m.kind == "predict.score":
                    p = bytearray(m.payload["plan"])
                    p[-1] ^= 1
                    m.payload["plan"] = bytes(p)
            return super().send_and_receive(messages)

    orgs, _ = build_orgs(model, tables, "a")
    with pytest.raises(HybridFLError, match="does not decrypt under the pair key") as e:
        run_prediction(Tamper(orgs), list(orgs), "a", model.blocks)
    assert "\n" not in str(e.value)
    from hybridfl.runtime.messages import SERVER, Message

    # b refused the changed plan: it fails closed, so the next message is refused too
    with pytest.raises(HybridFLError, match="has stopped taking part in this request after refusing 'predict.score'"):
        orgs["b"].handle(Message("predict.hello", SERVER, "b", 0, {"to": "a"}))
    # a fresh request: each step only in its place and once, sizes bounded, names checked
    orgs, _ = build_orgs(model, tables, "a")
    with pytest.raises(HybridFLError, match="its next step is 'predict.hello'"):
        orgs["c"].handle(Message("predict.score", SERVER, "c", 0, {"plan": b"x" * 40}))
    assert orgs["c"].stopped
    hello = orgs["b"].handle(Message("predict.hello", SERVER, "b", 0, {"to": "a"}))
    with pytest.raises(HybridFLError, match="its next step is 'predict.keys'"):
        orgs["b"].handle(Message("predict.hello", SERVER, "b", 0, {"to": "a"}))
    orgs, _ = build_orgs(model, tables, "a")
    orgs["b"].handle(Message("predict.hello", SERVER, "b", 0, {"to": "a"}))
    keys = {"peers": ["a", "c"], "pk.a": hello.payload["pk"], "pk.c": hello.payload["pk"], "width": 1}
    with pytest.raises(HybridFLError, match="without a row count"):
        orgs["b"].handle(Message("predict.keys", SERVER, "b", 0, {**keys, "n": 10**12}))
    orgs, _ = build_orgs(model, tables, "a")
    with pytest.raises(HybridFLError, match="not from the server to it"):
        orgs["b"].handle(Message("predict.hello", "c", "b", 0, {"to": "a"}))


def test_federated_predict_cli_from_client_directories(tmp_path, monkeypatch, capsys):
    """``hybridfl predict --federation F --clients ... --tables ... --model RUN/model``: the three
    organisations' CSVs, the run's own model; the receiver (the first label holder, ``bank``) gets
    a prediction for each of its customers whose blocks somebody holds, equal to the single-table
    one (the others unscored); bad input is one
    sentence and writes nothing."""
    from tests.test_run_federation import BLOCKS, _csv, _federation

    schema, dirs, rows = _federation(tmp_path, monkeypatch, capsys, "{name: hybrid_fedavg, rounds: 3}")
    run = tmp_path / "run"
    code, _, err = run_cli(
        "run",
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
        "--out",
        str(run),
        "-q",
        capsys=capsys,
    )
    assert code == 0, err
    tables = ",".join(str(tmp_path / f"{d.name}.csv") for d in dirs)
    out = tmp_path / "pred.csv"
    args = [
        "predict",
        "--model",
        str(run / "model"),
        "--federation",
        str(schema),
        "--clients",
        ",".join(map(str, dirs)),
    ]
    code, stdout, err = run_cli(*args, "--tables", tables, "--out", str(out), capsys=capsys)
    assert code == 0, err
    assert "of 'bank' scored by 3 organisations" in stdout
    pred = pd.read_csv(out)
    every = [c for b in BLOCKS.values() for c in b] + ["default"]
    whole = tmp_path / "all.csv"
    whole.write_text(_csv(sorted(rows), every, rows))
    ref = load_model(run / "model").decision_function(pd.read_csv(whole).set_index("ID").loc[pred["ID"]].reset_index())
    # bank's customers c001, c003, ..., c023 have no shop block anywhere (shop holds the even ones,
    # census c024 on): unscored; every other one equals the single-table margin
    unscored = {f"c{i:03d}" for i in range(1, 24, 2)}
    assert set(pred["ID"][pred["margin"].isna()]) == unscored
    ok = pred["margin"].notna().to_numpy()
    assert ok.sum() == 48 - 12 and np.abs(ref[ok]).min() > 1e-3
    np.testing.assert_allclose(pred["margin"].to_numpy()[ok], ref[ok], rtol=0, atol=1e-9)
    # each organisation's own part (run --federation wrote <client>/model/): the same predictions
    own = tmp_path / "own.csv"
    args_parts = ["predict", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "--tables", tables]
    code, _, err = run_cli(*args_parts, "--out", str(own), capsys=capsys)
    assert code == 0, err
    pd.testing.assert_frame_equal(pd.read_csv(own), pred, rtol=0, atol=1e-12)
    with pytest.raises(ModelError, match="part of a model, not a whole model"):
        load_model(dirs[0] / "model")
    from hybridfl.inference.parts import load_org_part

    bank, census = load_org_part(dirs[0] / "model"), load_org_part(dirs[1] / "model")
    assert bank.part.units == ["demo", "bank"] and bank.part.head is not None  # bank holds labels
    assert set(census.part.units) == {"demo", "shop"} and set(census.part.weights) == {"demo", "shop"}
    for bad, words in (
        (["--tables", tables.rsplit(",", 1)[0]], "2 tables for 3 --clients"),
        (["--tables", tables, "--to", "nobody"], "not one of the organisations"),
        (["--tables", tables, "--table", str(whole)], "drop --table"),
    ):
        out2 = tmp_path / "p2.csv"
        code, _, err = run_cli(*args, *bad, "--out", str(out2), capsys=capsys)
        assert code == 2 and words in err and "Traceback" not in err, err
        assert not out2.exists()
