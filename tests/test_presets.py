"""Algorithm presets (``preset: paper``, :mod:`hybridfl.algorithms.presets`) and HyFDCA's
settings: the defaults are the measured best, the paper's protocol is one line, a removed
setting is refused with one sentence naming what replaced it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.config import REMOVED
from hybridfl.algorithms.presets import PRESETS
from hybridfl.algorithms.spec import config_fields
from hybridfl.config import parse_config
from hybridfl.errors import ConfigError
from tests.cli_helpers import cli_in_process
from tests.test_cli import assert_one_sentence_error, write


def test_hyfdca_defaults_are_the_recommended_settings():
    c = HyFDCAConfig()
    assert (c.dual_mode, c.output, c.encryption, c.segment_inner_products, c.batch_size) == (
        "segment",
        "step_average",
        "ckks",
        "masked",
        1024,
    )
    assert c.secure_aggregation and c.alignment == "psi"
    # outside segment mode (or without secure aggregation) the defaults that need it fall back
    block = HyFDCAConfig(dual_mode="block")
    assert (block.output, block.segment_inner_products) == ("last", "encrypted")
    assert HyFDCAConfig(secure_aggregation=False).segment_inner_products == "encrypted"
    # ... but an explicit choice that cannot apply is refused
    with pytest.raises(ValueError, match="output 'step_average' needs dual_mode 'segment'"):
        HyFDCAConfig(dual_mode="block", output="step_average")
    with pytest.raises(ValueError, match="'masked' needs dual_mode 'segment'"):
        HyFDCAConfig(dual_mode="block", segment_inner_products="masked")


def test_hyfdca_has_at_most_25_options():
    options = [k for k, _ in config_fields(HyFDCAConfig) if k != "name"]
    assert len(options) <= 25, options
    assert not set(REMOVED) & set(options)


def test_paper_preset_restores_the_paper_protocol_and_explicit_fields_win():
    paper = parse_config({"algorithm": {"name": "hyfdca", "preset": "paper"}}).algorithm_config()
    for key, value in PRESETS["hyfdca"]["paper"].items():
        assert getattr(paper, key) == value, key
    assert (paper.dual_mode, paper.output, paper.encryption, paper.secure_aggregation) == (
        "block",
        "last",
        "paillier",
        False,
    )
    plain = HyFDCAConfig.model_validate({"preset": "paper", "encryption": "none", "rounds": 7})
    assert (plain.encryption, plain.rounds, plain.dual_mode) == ("none", 7, "block")
    # the resolved config carries no preset key: it is what the clients are sent
    assert "preset" not in plain.model_dump() and HyFDCAConfig.model_validate(plain.model_dump()) == plain


def test_unknown_preset_and_removed_settings_are_one_sentence():
    with pytest.raises(ConfigError, match=r"preset 'fastest' is not a preset of hyfdca \(presets: paper\)"):
        parse_config({"algorithm": {"name": "hyfdca", "preset": "fastest"}})
    for key, now in REMOVED.items():
        with pytest.raises(ConfigError) as e:
            parse_config({"algorithm": {"name": "hyfdca", key: 1}})
        assert f"setting '{key}' was removed; use {now}" in str(e.value)


def test_removed_setting_through_the_cli(tmp_path: Path, monkeypatch, capsys):
    cfg = write(tmp_path, "c.yaml", "algorithm: {name: hyfdca, step_average: true}\n")
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert_one_sentence_error(p, "setting 'step_average' was removed; use output: step_average")
    assert not (tmp_path / "out").exists()


def test_describe_shows_the_paper_preset(monkeypatch, capsys):
    p = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "hyfdca")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "preset: paper (explicit options override it): loss: hinge, fit_intercept: false, dual_mode: block" in text
    assert "encryption: paillier" in text and "secure_aggregation: false" in text
    assert "output: one of last, average_last, step_average; default step_average" in text


def test_hyfem_paper_preset_is_the_workshop_schedule(monkeypatch, capsys):
    from hybridfl.algorithms.hyfem import HyFEMConfig

    c = HyFEMConfig.model_validate({"preset": "paper", "rounds": 4})
    assert (c.rounds, c.local_steps, c.batch_size, c.lr, c.lr_decay, c.lr_decay_every, c.momentum) == (
        4,
        32,
        32,
        0.005,
        0.2,
        8,
        0.0,
    )
    assert c.lr_at(9) == pytest.approx(0.005 * 0.2) and not c.secure_aggregation
    p = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "hyfem")
    assert "preset: paper (explicit options override it): variant: avg, rounds: 32" in " ".join(p.stdout.split())


def test_cyclic_participation_forms_one_over_participation_groups():
    assert HyFDCAConfig(participation=1 / 3, participation_mode="cyclic").cyclic_groups == 3
    with pytest.raises(ValueError, match="cyclic' needs participation <= 0.5"):
        HyFDCAConfig(participation_mode="cyclic")


def test_fedbcd_paper_preset_is_the_mnist_cnn_setting_and_explicit_fields_win():
    from hybridfl.algorithms.fedbcd import FedBCDConfig

    paper = parse_config({"algorithm": {"name": "fedbcd", "preset": "paper"}}).algorithm_config()
    for key, value in PRESETS["fedbcd"]["paper"].items():
        assert getattr(paper, key) == value, key
    assert (paper.variant, paper.Q, paper.batch_size, paper.model, paper.optimizer) == ("p", 5, 256, "cnn", "sgd")
    # fields the preset does not name keep their defaults (eta_0 is not in the paper)
    assert (paper.lr, paper.rounds, paper.mu) == (FedBCDConfig().lr, FedBCDConfig().rounds, 0.0)
    assert paper.step_size(3) == pytest.approx(paper.lr / 2)
    # an explicit field wins over the preset's value, the others still come from the preset
    mine = FedBCDConfig.model_validate(
        {"preset": "paper", "model": "linear", "batch_size": 64, "optimizer": "adam", "lr": 1e-4}
    )
    assert (mine.model, mine.batch_size, mine.optimizer, mine.lr) == ("linear", 64, "adam", 1e-4)
    assert (mine.variant, mine.Q, mine.lr_decay, mine.channels) == ("p", 5, "sqrt", 64)
    # FedPBCD-p through the preset: the paper's mu = 0.1 is the variant's default
    prox = FedBCDConfig.model_validate({"preset": "paper", "variant": "prox", "local_steps": 25})
    assert (prox.mu, prox.Q) == (0.1, 25)
    assert "preset" not in mine.model_dump() and FedBCDConfig.model_validate(mine.model_dump()) == mine


def test_fedbcd_unknown_preset_is_one_sentence_and_describe_lists_the_paper_preset(tmp_path: Path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=r"preset 'fast' is not a preset of fedbcd \(presets: paper\)"):
        parse_config({"algorithm": {"name": "fedbcd", "preset": "fast"}})
    cfg = write(tmp_path, "c.yaml", "algorithm: {name: fedbcd, preset: [paper]}\n")
    p = cli_in_process(monkeypatch, capsys, "run", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert_one_sentence_error(p, "preset ['paper'] is not a preset of fedbcd (presets: paper)")
    assert not (tmp_path / "out").exists()
    p = cli_in_process(monkeypatch, capsys, "algorithms", "--describe", "fedbcd")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "preset: paper (explicit options override it): variant: p, local_steps: 5, batch_size: 256" in text
    assert "lr_decay: sqrt, model: cnn, channels: 64, representation_dim: 256" in text
