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


def test_the_deployed_reports_times_follow_from_their_per_round_breakdown():
    """benchmarks/results/deployed.json (``python -m benchmarks.deployed``): every measured case's
    modelled WAN time is the setup's plus, per round, exchanges x 0.05 s + bytes x 8 / 1e8 + compute
    seconds; the in-process time is setup + rounds; a deployed run to target had as many exchanges
    as in process and reached the target by its own result, or says it was extrapolated."""
    from benchmarks import deployed

    rep = harness.read_report("deployed")
    rows = [r for r in rep["rows"] if "error" not in r]
    assert rows and {r["config"] for r in rows} <= set(deployed.CASES)
    for r in rows:
        rounds, s = r["in_process_rounds"], r["in_process_setup"]
        assert len(rounds) == r["rounds"] > 0
        want = deployed.wan(s["exchanges"], s["bytes"], s["compute_s"])
        want += sum(x["exchanges"] * 0.05 + x["bytes"] * 8 / 1e8 + x["compute_s"] for x in rounds)
        assert r["wan_s"] == pytest.approx(want, rel=1e-9)
        assert r["in_process_s"] == pytest.approx(s["seconds"] + sum(x["seconds"] for x in rounds), rel=1e-9)
        if "deployed_s" not in r:
            continue
        assert r["tls"] and r["auth"] and r["exchanges_equal"]
        measured = r["deployed_rounds"]
        assert all(x["flower_s"] == pytest.approx(x["seconds"] - y["compute_s"]) for x, y in zip(measured, rounds))
        if r.get("deployed_s_extrapolated_from_rounds"):
            k = r["deployed_s_extrapolated_from_rounds"]
            assert len(measured) == k < r["rounds"] and r["deployed_reached"] is None
        else:
            assert len(measured) == r["rounds"] and r["deployed_reached"] is r["reached"]


@pytest.mark.slow  # about 2-4 minutes on 2 shared cores: three SuperNodes in network namespaces (root)
def test_the_deployed_smoke_run_trains_three_organisations_over_flower(tmp_path):
    """``python -m benchmarks.deployed --smoke``: three organisations' CSVs (90 customers) through
    ``client prepare``, ``federation stats`` and ``assemble``, HyFDCA's defaults for 3 rounds in
    process and over Flower across network namespaces: the same exchanges and counted bytes (to
    1e-3: the replies carry measured seconds as text), the same ``w`` up to CKKS noise, and the
    committed results untouched."""
    results = ROOT / "benchmarks" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.glob("deployed.*")}
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.deployed", "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stderr[-2000:]
    where = p.stdout.split("results under ", 1)[1].split()[0]
    (row,) = json.loads((harness.Path(where) / "deployed.json").read_text())["rows"]
    assert "error" not in row, row.get("error")
    assert row["config"] == "hyfdca_orgs600" and row["rounds"] == 3 and row["clients"] == 3
    assert row["tls"] and row["auth"] and row["exchanges_equal"] and row["exchanges_deployed"] > 3
    assert abs(row["bytes_deployed"] - row["bytes_in_process"]) <= 1e-3 * row["bytes_in_process"]
    assert 1 <= row["wire_over_counted"] < 1.05  # Flower's serialized form: a little more than our count
    assert row["final_w_rel_diff"] < 1e-4 and row["evaluator_check"] < 1e-9
    assert row["deployed_s"] > 0 and row["wan_s"] > 0 and row["flower_s_per_round"] is not None
    assert {p: p.stat().st_mtime_ns for p in results.glob("deployed.*")} == before
