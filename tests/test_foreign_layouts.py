"""robomimic and LIBERO files as those projects write them: detected, validated, and trained with one command."""

import json

import numpy as np
import pytest

from tests.conftest import run_main
from tests.foreign_files import LIBERO_INSTRUCTION, write_libero, write_robomimic
from vla.config import ConfigError
from vla.data.hdf5_format import DatasetError
from vla.data.sources import detect_layout, open_source
from vla.data.validate import validate
from vla.training.config import DataConfig, TrainConfig, load_config


@pytest.fixture(scope="module")
def robomimic(tmp_path_factory):
    return write_robomimic(tmp_path_factory.mktemp("rm") / "lift_image.hdf5")


@pytest.fixture(scope="module")
def libero(tmp_path_factory):
    return write_libero(tmp_path_factory.mktemp("lb") / "put_the_black_bowl_on_the_plate_demo.hdf5")


def test_layouts_are_detected(robomimic, libero, tiny_dataset):
    assert detect_layout(robomimic) == "robomimic"
    assert detect_layout(libero) == "libero"
    assert detect_layout(tiny_dataset) == "ours"


def test_robomimic_keys_and_resize(robomimic):
    with open_source(robomimic, image_size=64) as src:
        assert src.keys.image == "agentview_image"
        assert src.keys.proprio == ("robot0_eef_pos", "robot0_gripper_qpos")
        demo = src.read("demo_0")
        assert demo.image.shape == (12, 64, 64, 3) and demo.image.dtype == np.uint8
        assert demo.proprio.shape == (12, 5) and demo.actions.dtype == np.float32
        assert demo.instruction == "" and demo.task == "Lift"  # no instruction attr; task from env_args
        assert src.names("train") == ["demo_0", "demo_1", "demo_2"] and src.names("valid") == ["demo_3"]
        # resizing keeps the picture: the red square's centre of mass moves by the scale factor
        raw = open_source(robomimic).read("demo_0").image[0]
        com = lambda im: np.argwhere(im[..., 0] > 150).mean(0)  # noqa: E731
        np.testing.assert_allclose(com(demo.image[0]), (com(raw) + 0.5) * 64 / 84 - 0.5, atol=1.0)
    with open_source(robomimic, instruction="lift the cube") as src:
        assert src.meta("demo_1")["instruction"] == "lift the cube"


def test_libero_instruction_and_hash_split(libero):
    with open_source(libero) as src:
        assert src.keys.image == "agentview_rgb" and src.keys.proprio == ("ee_states", "gripper_states")
        assert src.meta("demo_2")["instruction"] == LIBERO_INSTRUCTION  # from data.attrs["problem_info"]
        train, valid = src.names("train"), src.names("valid")
        assert valid and train and not set(train) & set(valid) and sorted(train + valid) == src.names("")
        assert src.names("") == [f"demo_{i}" for i in range(4)]
    with open_source(libero) as again:  # deterministic: the same split every time
        assert again.names("valid") == valid
    with open_source(libero) as src, pytest.raises(DatasetError, match="no mask/mine"):
        src.names("mine")


def test_foreign_files_validate(robomimic, libero):
    assert validate(robomimic) == []
    assert validate(libero) == []
    problems = validate(robomimic, image="wrist")  # a key the file lacks: one line naming it
    assert len(problems) == 4 and "has no 'wrist'" in problems[0]


def test_validate_and_info_cli_take_the_key_mapping(robomimic, libero):
    r = run_main("vla.cli.data", "validate", robomimic)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "valid (4 demos, 48 steps, robomimic layout)" in r.stdout
    r = run_main("vla.cli.data", "validate", robomimic, "--proprio-keys", "robot0_eef_pos,nope")
    assert r.returncode == 4 and "has no 'nope'" in r.stdout
    r = run_main("vla.cli.data", "info", libero, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["layout"] == "libero" and s["shapes"]["image"] == [128, 128, 3] and s["shapes"]["proprio"] == [8]
    assert s["instructions"] == {"Libero_Tabletop_Manipulation": [LIBERO_INSTRUCTION]}


def test_empty_split_override_means_all():
    cfg = load_config("configs/tiny.yaml", ["data.train_split=", "data.valid_split=", "data.image_size=64"])
    assert cfg.data.train_split == "" and cfg.data.valid_split == "" and cfg.data.image_size == 64
    with pytest.raises(ConfigError, match="valid_fraction"):
        load_config(None, ["data.valid_fraction=1.5"])
    assert isinstance(TrainConfig().data, DataConfig)


def _train(data, out, *extra):
    return run_main("vla.cli.train", "--config", "configs/tiny.yaml", "--data", data, "--out", out,
                    "train.steps=4", "train.log_every=2", "train.checkpoint_every=4", *extra)  # fmt: skip


def test_robomimic_trains_with_one_command(robomimic, tmp_path):
    r = _train(robomimic, tmp_path / "no_resize")  # 84 px frames, 16 px patches: told how to fix it
    assert r.returncode == 2 and "data.image_size=80" in r.stderr.strip().splitlines()[-1]
    r = _train(robomimic, tmp_path / "run", "data.image_size=64")
    assert r.returncode == 0, r.stderr[-2000:]
    # robomimic's obs/object is its own object state (10 values), not our positions: the default config's
    # auxiliary target turns itself off, as it does where the key is missing
    assert "'object' is not object positions (3 values each): data.aux_key=''" in r.stderr
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    spec = meta["data_spec"]
    assert spec["image_size"] == 64 and spec["proprio_dim"] == 5 and spec["action_dim"] == 7
    assert [json.loads(ln)["step"] for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1] == 4


def test_libero_trains_with_one_command(libero, tmp_path):
    r = _train(libero, tmp_path / "run", "data.image_size=64", "data.train_split=")
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["data_spec"]["image_size"] == 64 and meta["data_spec"]["proprio_dim"] == 8
    assert any("valid/loss" in json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
