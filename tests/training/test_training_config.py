"""Training settings: defaults, YAML < environment < CLI precedence, validation."""

from __future__ import annotations

import pydantic
import pytest

from training.cli.train import main as train_main
from training.config import TrainSettings, load_settings, parse_overrides


def test_defaults_match_the_issue():
    s = TrainSettings()
    assert (s.batch_size, s.max_seq_length, s.losses["simcse"].type, s.three_r.k, s.three_r.pool_size) == (
        64,
        32,
        "simcse",
        6,
        64,
    )


def test_precedence_yaml_env_cli(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "lr: 1.0e-4\nseed: 7\nthree_r: {enabled: true, k: 4}\n"
        "losses: {simcse: {type: simcse, params: {temperature: 0.1}}}\n"
    )
    monkeypatch.setenv("EMBED_TRAIN_SEED", "11")
    monkeypatch.setenv("EMBED_TRAIN_THREE_R__C_INIT", "0.3")
    s = load_settings(cfg, parse_overrides(["--three_r.k", "2", "--batch_size=16"]))
    assert s.lr == 1e-4  # YAML
    assert s.seed == 11  # env beats YAML
    assert s.three_r.c_init == 0.3  # nested env
    assert s.three_r.k == 2  # CLI beats YAML
    assert s.three_r.enabled is True  # YAML, merged with the CLI's nested key
    assert s.batch_size == 16
    assert s.losses["simcse"].params == {"temperature": 0.1}


def test_bad_keys_and_values_are_rejected(tmp_path):
    with pytest.raises(pydantic.ValidationError):
        load_settings(None, {"no_such_field": 1})
    with pytest.raises(pydantic.ValidationError):
        load_settings(None, {"three_r": {"variant": "bogus"}})
    with pytest.raises(ValueError):
        parse_overrides(["lr", "1"])
    assert train_main(["--config"]) == 2


def test_print_config(capsys):
    assert train_main(["--print-config", "--lr", "5e-5"]) == 0
    assert '"lr": 5e-05' in capsys.readouterr().out
