"""`hybridfl run` with `algorithm: hyfdca | hybrid_fedavg | centralized`: results files and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT


def cli(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYBRIDFL_CACHE": str(tmp / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "hybridfl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )


CREDIT = """
seed: 0
dataset: {{name: credit_default, data_dir: {data}}}
partition: {{kind: grid, sample_groups: 3, block_groups: 3}}
algorithm: {{name: {algo}, {extra}}}
"""


@pytest.mark.parametrize(
    "algo,extra",
    [
        # alignment: plaintext keeps this results-file test fast (PSI on 22,500 IDs costs about a
        # minute of CPU; the PSI alignment has its own tests, tests/test_hyfdca_psi.py)
        (
            "hyfdca",
            "rounds: 3, lambda: 0.01, encryption: ckks, eval_every: 1, reference_sdca_epochs: 5, alignment: plaintext, "
            "dual_mode: block",  # block mode (the default before the measured best): a fast round on 22,500 rows
        ),
        pytest.param(
            "hybrid_fedavg", "rounds: 3, lambda: 0.01, lr: 0.03, reference_sdca_epochs: 5", marks=pytest.mark.slow
        ),
        pytest.param(
            "centralized", "solver: liblinear, lambda: 0.01, reference_sdca_epochs: 5", marks=pytest.mark.slow
        ),
    ],
)
def test_run_writes_results(tmp_path, credit_dir, algo, extra):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CREDIT.format(data=credit_dir, algo=algo, extra=extra))
    out = tmp_path / "out"
    p = cli("run", "--config", str(cfg), "--out", str(out), "--quiet", tmp=tmp_path)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "results.json").read_text())
    for key in (
        "primal_objective",
        "reference_objective",
        "relative_suboptimality",
        "duality_gap",
        "encryption_seconds",
    ):
        assert key in res, key
    assert res["reference_objective"] > 0 and res["relative_suboptimality"] > -1e-9
    assert (out / "metrics.csv").is_file() and (out / "accuracy.png").is_file()
    if algo == "hyfdca":
        assert res["encryption_seconds"] > 0 and res["duality_gap"] >= 0
        assert (out / "suboptimality.png").is_file()
        assert "relative suboptimality" in p.stdout


def test_example_configs_validate():
    from hybridfl.config import load_config

    for name in ("hyfdca_mnist.yaml", "hyfdca_credit_default.yaml", "hyfdca_adult.yaml"):
        cfg = load_config(ROOT / "examples" / "configs" / name)
        algo = cfg.algorithm_config()
        assert algo.name == "hyfdca"
        # issue 15 item 3: examples of a privacy algorithm use encryption and secure aggregation
        assert algo.encryption != "none" and algo.secure_aggregation, name


def test_plaintext_run_prints_what_the_server_learns(tmp_path, monkeypatch, capsys):
    """``encryption: none``: one warning line naming what the server reads; with CKKS, none."""
    import sys

    from hybridfl.cli import main as cli_main

    for enc, expect in (("none", True), ("ckks", False)):
        cfg = tmp_path / f"{enc}.yaml"
        cfg.write_text(
            "dataset: {name: digits}\npartition: {kind: grid, sample_groups: 2, block_groups: 2}\n"
            f"algorithm: {{name: hyfdca, rounds: 1, positive_classes: [0, 1, 2, 3, 4], encryption: {enc}, "
            "reference: false}\n"
        )
        monkeypatch.setattr(sys, "argv", ["hybridfl", "run", "--config", str(cfg), "--out", str(tmp_path / enc), "-q"])
        with pytest.raises(SystemExit) as e:
            cli_main.main()
        assert e.value.code == 0
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if "warning" in ln]
        if expect:
            assert len(lines) == 1, err
            assert "without encryption" in lines[0] and "labels" in lines[0] and "docs/privacy.md" in lines[0]
        else:
            assert lines == [], err


def test_privacy_warning_lines():
    """One line per weakened setting, none for the examples' settings (docs/privacy.md)."""
    from hybridfl.algorithms.hyfdca import HyFDCAConfig
    from hybridfl.algorithms.hyfdca.spec import privacy_warning

    assert privacy_warning(HyFDCAConfig(encryption="ckks")) is None
    assert privacy_warning(HyFDCAConfig()) is None  # the defaults: CKKS, masked inner products, secure aggregation
    assert "without encryption" in privacy_warning(HyFDCAConfig(encryption="none"))
    assert "Gram" in privacy_warning(
        HyFDCAConfig(dual_mode="segment", encryption="none", segment_inner_products="encrypted")
    )
    assert "without secure aggregation" in privacy_warning(HyFDCAConfig(encryption="ckks", secure_aggregation=False))
    assert "position share" in privacy_warning(HyFDCAConfig(secure_aggregation=False))  # output: step_average


def test_few_local_steps_are_warned_at_setup(credit_small, caplog):
    """Known leakage (docs/privacy.md): a client with fewer than 10 local steps a round makes each
    change of the public w a combination of that few raw rows; setup says so, per client."""
    import logging

    from hybridfl.algorithms.hyfdca import HyFDCAConfig
    from hybridfl.data.partitioners import GridPartitioner
    from hybridfl.runtime.simulation import build_federation

    part = GridPartitioner(2, 2, 1, 0).partition(credit_small.train)
    for fraction, warned in ((1e-3, True), (1.0, False)):
        caplog.clear()
        cfg = HyFDCAConfig(dual_mode="block", encryption="none", rounds=1, reference=False, local_fraction=fraction)
        with caplog.at_level(logging.WARNING):
            build_federation("hyfdca", credit_small, part, cfg).setup()
        lines = [r.getMessage() for r in caplog.records if "local steps per round" in r.getMessage()]
        assert len(lines) == (4 if warned else 0), lines
        if warned:
            assert "takes 1 local steps" in lines[0] and "raise local_fraction" in lines[0]


def _one_sentence(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr


def test_cli_bad_input_one_sentence(tmp_path, mfeat_dir, monkeypatch, capsys):
    from tests.cli_helpers import cli_in_process

    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        f"dataset: {{name: mfeat, data_dir: {mfeat_dir}}}\n"
        "partition: {kind: grid, sample_groups: 2, block_groups: 2}\nalgorithm: {name: hyfdca, rounds: 1}\n"
    )
    monkeypatch.setenv("HYBRIDFL_CACHE", str(tmp_path / "cache"))
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "o"))
    _one_sentence(p, "needs binary labels")
    assert not (tmp_path / "o" / "results.json").exists()  # checked before training: no results
    # lambda <= 0 and an empty client: tests/test_hyfdca.py (config validation, PartitionError)
    assert DATA.is_dir()
