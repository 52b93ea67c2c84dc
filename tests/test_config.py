"""Typed configs refuse typos and coerce CLI strings to the declared types."""

from dataclasses import dataclass, field
from pathlib import Path

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
    for empty in ("name=", "name=''", 'name=""'):  # what `name=""` in a shell passes, and its quoted forms
        assert apply_overrides(Run(), [empty]).name == ""
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(Run(), ["steps="])


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


PRESETS = sorted(str(p) for p in Path("configs").rglob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_parses_and_builds_its_model(preset):
    """configs/*.yaml and configs/ablations/*.yaml: each loads (no unknown keys), its model builds with
    our tasks' data sizes, and each ablation differs from the defaults in the knob it names."""
    from vla.model import ActionTransformer, DataSpec
    from vla.training.config import TrainConfig, load_config

    cfg = load_config(preset, [])
    spec = DataSpec(image_size=64, proprio_dim=9, action_dim=4, vocab_size=50, aux_dim=6 if cfg.data.aux_key else 0)
    model = ActionTransformer(cfg.model, spec)
    assert model.num_params() > 0
    if "ablations" in preset:
        assert cfg != TrainConfig(), f"{preset} changes nothing"


def test_the_demo_preset_is_the_defaults_but_for_its_budget():
    from vla.training.config import TrainConfig, load_config

    demo, defaults = load_config("configs/demo.yaml", []), TrainConfig()
    assert (demo.model, demo.data, demo.optim, demo.policy) == (
        defaults.model,
        defaults.data,
        defaults.optim,
        defaults.policy,
    )


def test_data_decided_sizes_are_refused_with_a_reason():
    from vla.training.config import load_config

    for key in ("image_size", "proprio_dim", "action_dim", "vocab_size", "aux_dim"):
        with pytest.raises(ConfigError, match=f"'model.{key}' is decided by the data"):
            load_config(None, [f"model.{key}=3"])


def test_removed_options_say_so_and_old_saved_configs_still_load():
    """A retired option (docs/ablations.md) set to the behaviour that remains is what an old checkpoint's
    config.json holds: it loads. Any other value names the option and where it went."""
    from vla.training.config import TrainConfig, load_config

    old = ["model.time_encoding=relative", "model.action_decoding=parallel", "optim.ema_decay=0", "train.stop_at=7"]
    assert load_config(None, old) == TrainConfig()
    saved = to_dict(TrainConfig())
    saved["model"]["causal_scope"], saved["train"]["skip_nonfinite"] = "step", False
    assert from_dict(TrainConfig, saved) == TrainConfig()
    with pytest.raises(ConfigError, match="'model.action_decoding' was removed .only 'parallel' remains.*0c1a0cc"):
        load_config(None, ["model.action_decoding=autoregressive"])
    with pytest.raises(ConfigError, match="'train.skip_nonfinite' was removed"):
        from_dict(TrainConfig, {"train": {"skip_nonfinite": True}})


def test_auxiliary_targets_need_keypoints():
    from vla.training.config import load_config

    assert load_config("configs/ablations/linear_patches.yaml", []).model.keypoints == 0
    with pytest.raises(ConfigError, match="need model.keypoints > 0"):
        load_config("configs/ablations/linear_patches.yaml", ["data.aux_key=object"])
