"""Typed configs refuse typos and coerce CLI strings to the declared types."""

from dataclasses import dataclass, field

import pytest

from vla.config import ConfigError, apply_overrides, from_dict, load_yaml, to_dict


@dataclass
class Optim:
    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])


@dataclass
class Run:
    steps: int = 100
    name: str = "run"
    amp: bool = False
    optim: Optim = field(default_factory=Optim)

    def __post_init__(self):
        if self.steps <= 0:
            raise ValueError(f"steps must be positive, got steps={self.steps}")


def test_nested_dict_round_trip():
    cfg = from_dict(Run, {"steps": 5, "optim": {"lr": "1e-3"}})
    assert cfg.steps == 5 and cfg.optim.lr == 1e-3
    assert from_dict(Run, to_dict(cfg)) == cfg


def test_unknown_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr'.*did you mean 'lr'"):
        from_dict(Run, {"optim": {"lrr": 1}})
    with pytest.raises(ConfigError, match=r"unknown key 'step'.*did you mean 'steps'"):
        apply_overrides(Run(), ["step=3"])


def test_overrides_coerce_and_validate():
    cfg = apply_overrides(Run(), ["steps=7", "optim.lr=0.01", "amp=true", "--name=x", "optim.betas=[0.8,0.9]"])
    assert (cfg.steps, cfg.optim.lr, cfg.amp, cfg.name, cfg.optim.betas) == (7, 0.01, True, "x", [0.8, 0.9])
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(Run(), ["steps=many"])
    with pytest.raises(ConfigError, match="steps must be positive, got steps=0"):
        apply_overrides(Run(), ["steps=0"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(Run(), ["steps"])


def test_load_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(listy)
