"""ONNX export (:mod:`hybridfl.inference.onnx`, ``hybridfl export-onnx``).

HyFEM (global, each client's model, the server model cut to one block), FedBCD (MLP towers) and
hybrid FedAvg (linear) are trained on ``test_predict``'s small table; onnxruntime's output on the
run's test rows (encoded, not standardised: the graph standardises) equals the predictor's
``raw`` to 1e-5, for 100 rows and for one. CNN extractors and towers (image blocks, a float64
standardisation) are checked on models written directly. Then the command line and its one-sentence
refusals, and the missing extra.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from hybridfl.config import parse_config  # noqa: E402
from hybridfl.data.export_table import raw_table  # noqa: E402
from hybridfl.experiment import execute, prepare  # noqa: E402
from hybridfl.inference import ModelError, load_model  # noqa: E402
from hybridfl.inference.onnx import export_onnx, onnx_inputs  # noqa: E402
from tests.test_predict import config, make_table, run_cli  # noqa: E402

ALGOS = {
    "hyfem": {},
    "hybrid_fedavg": {},
    "fedbcd": {"model": "mlp", "representation_dim": 8, "hidden": 16},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """name -> (the run's model directory, its test rows as a raw table)."""
    base = tmp_path_factory.mktemp("onnx-runs")
    table = make_table(base / "customers.csv")
    out = {}
    for algo, extra in ALGOS.items():
        c = config(table, algo)
        c["algorithm"] = {**c["algorithm"], **extra}
        cfg = parse_config(c)
        d = base / algo
        execute(prepare(cfg, d), d)
        out[algo] = (d / "model", raw_table(cfg.dataset, cfg.seed, "test"))
    return out


def _session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(sess, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]


def _check(model, path: Path, frame, ref: np.ndarray, names: list[str]) -> None:
    """onnxruntime on ``frame``'s encoded rows equals ``ref`` (100 rows, and the first row alone)."""
    sess = _session(path)
    assert [i.name for i in sess.get_inputs()] == names
    feeds = onnx_inputs(model, frame, names)
    np.testing.assert_allclose(_run(sess, feeds), ref, rtol=1e-5, atol=1e-5)
    one = _run(sess, {b: x[:1] for b, x in feeds.items()})
    assert one.shape == ref[:1].shape
    np.testing.assert_allclose(one, ref[:1], rtol=1e-5, atol=1e-5)


def _meta(path: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_hyfem_global_client_and_cut_models_equal_torch(runs, tmp_path):
    d, test = runs["hyfem"]
    model = load_model(d)
    assert len(test) == 100
    p = export_onnx(model, tmp_path / "g.onnx")
    _check(model, p, test, model.raw(test), ["profile", "money"])
    meta = _meta(p)
    assert meta["format"] == "hybridfl-onnx" and meta["format_version"] == "1" and meta["kind"] == "hyfem"
    assert json.loads(meta["blocks"]) == ["profile", "money"] and json.loads(meta["classes"]) == ["no", "yes"]
    assert meta["output"] == "logits" and meta["standardization"] == "in-graph" and meta["model"] == "global"
    assert meta["algorithm"] == "hyfem" and json.loads(meta["encoding"])["id_column"] == "customer"
    for cid, (blocks, _) in model.clients.items():
        p = export_onnx(model, tmp_path / f"{cid}.onnx", client=cid)
        _check(model, p, test, model.raw(test, client=cid), blocks)
        assert _meta(p)["model"] == f"client:{cid}"
    p = export_onnx(model, tmp_path / "cut.onnx", blocks=["money"])
    _check(model, p, test, model.raw(test.drop(columns=["region", "age", "calls"])), ["money"])
    assert _meta(p)["model"] == "blocks"


def test_fedbcd_and_linear_models_equal_torch(runs, tmp_path):
    for algo, out, dtype in (("fedbcd", "logits", np.float32), ("hybrid_fedavg", "margin", np.float64)):
        d, test = runs[algo]
        model = load_model(d)
        p = export_onnx(d, tmp_path / f"{algo}.onnx")  # a model directory works too
        _check(model, p, test, model.raw(test), ["profile", "money"])
        sess = _session(p)
        assert [o.name for o in sess.get_outputs()] == [out]
        assert _run(sess, onnx_inputs(model, test)).dtype == dtype
    assert json.loads(_meta(p)["labels"]) == ["no", "yes"] and _meta(p)["loss"] == model.loss


def test_without_standardisation_the_inputs_are_the_standardised_blocks(runs, tmp_path):
    d, test = runs["fedbcd"]
    model = load_model(d)
    p = export_onnx(model, tmp_path / "s.onnx", standardize=False)
    assert _meta(p)["standardization"] == "none"
    xs = model._input_blocks(test, model.blocks)
    np.testing.assert_allclose(_run(_session(p), xs), model.raw(test), rtol=1e-5, atol=1e-5)


def _image_models(tmp_path: Path) -> dict[str, Path]:
    """A HyFEM model with CNN extractors and a FedBCD model of CNN towers (concat top) on two 1x8x8
    image blocks, written directly; block ``left`` standardised in float64."""
    import torch

    from hybridfl.data.encoding import default_encoding
    from hybridfl.inference import ModelParts, write_model_dir
    from hybridfl.models.hybrid import HybridModel, default_extractor
    from hybridfl.models.towers import LinearTop, PaperCNNTower

    torch.manual_seed(0)
    shapes = {"left": (1, 8, 8), "right": (1, 8, 8)}
    rng = np.random.default_rng(0)
    scale = {"left": (rng.normal(0, 1, 64), rng.uniform(0.5, 2.0, 64))}
    g = HybridModel(["left", "right"], shapes, 3, 4, 8, default_extractor("cnn"))
    c = HybridModel(["left"], shapes, 3, 4, 6, default_extractor("cnn"))
    t = {f"global.{k}": v.numpy() for k, v in g.state_dict().items()}
    t |= {f"client.0.{k}": v.numpy() for k, v in c.state_dict().items()}
    meta = {
        "extractor": "cnn",
        "extractor_dim": 4,
        "hidden": 8,
        "clients": [{"id": "c0", "blocks": ["left"], "hidden": 6}],
    }
    out = {}
    out["hyfem"] = write_model_dir(
        tmp_path / "hyfem",
        ModelParts("hyfem", t, meta),
        default_encoding(shapes, ["a", "b", "c"]),
        scale,
        "hyfem",
        scale_dtype="float64",
    )
    towers = [PaperCNNTower((1, 8, 8), 5, 3) for _ in range(2)]
    top = LinearTop(10)
    torch.nn.init.normal_(top.fc.weight)
    t = {f"party.{i}.{k}": v.numpy() for i, m in enumerate(towers) for k, v in m.state_dict().items()}
    t |= {f"top.{k}": v.numpy() for k, v in top.state_dict().items()}
    meta = {
        "model": "cnn",
        "top": "concat",
        "representation_dim": 5,
        "hidden": 4,
        "channels": 3,
        "parties": [{"id": "p0", "blocks": ["left"]}, {"id": "p1", "blocks": ["right"]}],
    }
    out["fedbcd"] = write_model_dir(
        tmp_path / "fedbcd",
        ModelParts("fedbcd", t, meta),
        default_encoding(shapes, ["a", "b"]),
        scale,
        "fedbcd",
        scale_dtype="float64",
    )
    return out


def test_cnn_models_on_image_blocks_equal_torch(tmp_path):
    dirs = _image_models(tmp_path)
    rng = np.random.default_rng(1)
    xs = {b: rng.normal(0, 1, (37, 1, 8, 8)).astype(np.float32) for b in ("left", "right")}
    for kind, kw in (("hyfem", {}), ("hyfem", {"client": "c0"}), ("fedbcd", {})):
        model = load_model(dirs[kind])
        sess = _session(export_onnx(model, tmp_path / f"{kind}.onnx", **kw))
        ref = model.raw(xs, **kw)
        np.testing.assert_allclose(_run(sess, xs), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_run(sess, {b: x[:1] for b, x in xs.items()}), ref[:1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------- command line


def test_export_onnx_cli(runs, tmp_path, capsys):
    d, test = runs["hyfem"]
    model = load_model(d)
    out = tmp_path / "m.onnx"
    code, stdout, err = run_cli("export-onnx", "--model", str(d), "--out", str(out), "--blocks", "money", capsys=capsys)
    assert code == 0, err
    assert "written to" in stdout and _meta(out)["model"] == "blocks"
    np.testing.assert_allclose(
        _run(_session(out), onnx_inputs(model, test, ["money"])),
        model.raw(test.drop(columns=["region", "age", "calls"])),
        rtol=1e-5,
        atol=1e-5,
    )
    code, _, err = run_cli("export-onnx", "--model", str(d), "--out", str(out), capsys=capsys)
    assert code == 2 and "already exists" in err
    cid = next(iter(model.clients))
    code, _, err = run_cli("export-onnx", "-m", str(d), "-o", str(out), "--client", cid, "--force", capsys=capsys)
    assert code == 0, err
    assert _meta(out)["model"] == f"client:{cid}"


def _one_sentence(code: int, err: str) -> str:
    msg = err.strip()
    assert code == 2, err
    assert "Traceback" not in err and msg.startswith("error:") and msg.count("\n") == 0 and msg.endswith("."), err
    return msg


def test_export_onnx_cli_refusals_are_one_sentence_and_write_nothing(runs, tmp_path, capsys):
    hyfem, fedbcd = runs["hyfem"][0], runs["fedbcd"][0]
    out = tmp_path / "m.onnx"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.json").write_text("{not json")
    for args, words in (
        (("--model", str(tmp_path / "none")), "does not exist"),
        (("--model", str(bad)), "not valid JSON"),
        (("--model", str(hyfem), "--client", "nobody"), "has no client 'nobody'"),
        (("--model", str(hyfem), "--blocks", "money,salary"), "has no block 'salary'"),
        (("--model", str(hyfem), "--blocks", ","), "no block chosen"),
        (("--model", str(hyfem), "--blocks", "money", "--client", "x"), "not both"),
        (("--model", str(fedbcd), "--client", "x"), "this is a fedbcd model"),
        (("--model", str(fedbcd), "--blocks", "money"), "scores every block"),
    ):
        code, _, err = run_cli("export-onnx", *args, "--out", str(out), capsys=capsys)
        assert words in _one_sentence(code, err), err
        assert not out.exists()
    with pytest.raises(ModelError, match="has no client"):
        export_onnx(load_model(hyfem), out, client="nobody")


def test_export_onnx_without_the_extra_names_it(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    out = tmp_path / "m.onnx"
    code, _, err = run_cli("export-onnx", "--model", str(runs["hyfem"][0]), "--out", str(out), capsys=capsys)
    assert "pip install 'hybridfl[onnx]'" in _one_sentence(code, err)
    assert not out.exists()
