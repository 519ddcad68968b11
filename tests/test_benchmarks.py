"""The benchmark harness (benchmarks/harness.py): rows record the setting, machine, load and commit
behind every number; the report writer writes the JSON and the markdown table; a script's
``--smoke`` run leaves the committed results alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from benchmarks import harness

from tests.conftest import ROOT


def test_run_grid_records_the_setting_seed_and_load_of_every_row():
    calls = []

    def fn(setting: dict, seed: int) -> dict:
        calls.append((setting["n"], seed))
        return {"value": setting["n"] * 10 + seed}

    rows = harness.run_grid(fn, {"small": {"n": 1}, "big": {"n": 2}}, seeds=(0, 1), echo=False)
    assert calls == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [(r["config"], r["seed"], r["value"]) for r in rows] == [
        ("small", 0, 10),
        ("small", 1, 11),
        ("big", 0, 20),
        ("big", 1, 21),
    ]
    for r in rows:
        assert r["setting"]["n"] in (1, 2)
        assert r["wall_s"] >= 0 and r["cpu_s"] >= 0
        assert r["load_before"] >= 0 and r["load_after"] >= 0


def test_write_report_writes_json_rows_with_commit_and_machine_and_a_markdown_table(tmp_path):
    rows = [{"config": "a", "seed": 0, "setting": {"x": 1}, "auc": 0.912345, "ok": True, "miss": None}]
    j, m = harness.write_report("demo", rows, title="Demo", command="python -m benchmarks.demo", out=tmp_path)
    rep = json.loads(j.read_text())
    assert rep["format"] == harness.FORMAT and rep["rows"] == rows and rep["command"] == "python -m benchmarks.demo"
    assert rep["machine"]["cpus"] >= 1 and rep["machine"]["python"].count(".") == 2
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert rep["commit"].startswith(head) if head else rep["commit"] == "unknown"
    md = m.read_text().splitlines()
    assert md[0] == "# Demo"
    assert "| config | seed | auc | ok | miss |" in md
    assert "| a | 0 | 0.9123 | yes | - |" in md
    assert harness.read_report("demo", tmp_path)["rows"][0]["auc"] == pytest.approx(0.912345)


def test_write_report_refuses_a_name_that_is_not_a_file_stem(tmp_path):
    with pytest.raises(ValueError, match="not a plain file stem"):
        harness.write_report("../x", [], title="t", command="c", out=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_smoke_run_writes_its_report_outside_the_committed_results(tmp_path):
    """``python -m benchmarks.privacy_cost psi --smoke`` (a 200-ID PSI) runs end to end from the
    repository root and reports where its results went, and benchmarks/results is untouched."""
    results = ROOT / "benchmarks" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.glob("psi.*")}
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.privacy_cost", "psi", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    where = p.stdout.split("results under ", 1)[1].split()[0]
    rep = json.loads((harness.Path(where) / "psi.json").read_text())
    assert rep["rows"] and all(r["correct"] for r in rep["rows"])
    assert {p: p.stat().st_mtime_ns for p in results.glob("psi.*")} == before


def test_an_unknown_part_is_one_sentence():
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.privacy_cost", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode != 0 and p.stderr.strip().startswith("usage: python -m benchmarks.privacy_cost {psi,")
    assert "Traceback" not in p.stderr


def test_the_report_tables_of_docs_results_are_generated_from_the_committed_json():
    """Every ``<!-- report: NAME -->`` block of docs/results.md equals the table that
    ``python -m benchmarks.harness --docs`` makes from benchmarks/results/NAME.json."""
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(harness.BLOCK.findall(text)) >= 3
    assert harness.fill_docs(text) == text


def test_fill_docs_puts_the_rows_of_a_report_between_the_markers(tmp_path):
    harness.write_report("r", [{"config": "c", "seed": 1, "x": 2.5}], title="T", command="cmd", out=tmp_path)
    filled = harness.fill_docs("a\n<!-- report: r -->\nstale\n<!-- /report -->\nb\n", out=tmp_path)
    assert "stale" not in filled and "| c | 1 | 2.5 |" in filled and filled.endswith("<!-- /report -->\nb\n")


def test_every_script_imports_from_the_root_and_names_a_smoke_setting_for_each_part():
    """The scripts are modules of the ``benchmarks`` package (no ``sys.path`` edits), each part
    with its smoke arguments; at most 12 scripts."""
    import importlib

    scripts = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in ("__init__", "harness"))
    assert 0 < len(scripts) <= 12
    for name in scripts:
        text = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert "sys.path" not in text, name
        mod = importlib.import_module(f"benchmarks.{name}")
        assert mod.PARTS and all(callable(fn) and smoke for fn, smoke in mod.PARTS.values()), name
