"""scripts/keypoint_probe.py measures keypoints against the recorded object_px, which rides along in its batches
only to be measured: the net it builds must still be the one the recipe trains (a label-free run's has no
coordinate channels), both when it trains and when it reads a trained run."""

import importlib.util
from pathlib import Path

import pytest

from vla.cli.train import main as train_main

SPEC = importlib.util.spec_from_file_location(
    "keypoint_probe", Path(__file__).parents[1] / "scripts" / "keypoint_probe.py"
)
keypoint_probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(keypoint_probe)

LABEL_FREE = ["data.aux_key=", "data.keypoint_key=", "data.waypoint_targets=true"]


def built_nets(monkeypatch) -> list:
    """Every ActionTransformer the probe builds, recorded as it is built."""
    built, real = [], keypoint_probe.ActionTransformer

    def recording(cfg, spec):
        built.append(real(cfg, spec))
        return built[-1]

    monkeypatch.setattr(keypoint_probe, "ActionTransformer", recording)
    return built


@pytest.mark.parametrize("overrides", [LABEL_FREE, []], ids=["label-free", "keypoint targets"])
def test_the_probe_trains_the_net_its_recipe_trains(tiny_dataset, monkeypatch, capsys, overrides):
    built = built_nets(monkeypatch)
    argv = ["--data", str(tiny_dataset), "--config", "configs/tiny.yaml", "--steps", "2", "--every", "1", *overrides]
    assert keypoint_probe.main(argv) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2 + 3  # header, the uniform entropy, steps 0, 1, 2
    assert built[0].patch_embed.kp_coords_in == (not overrides)


def test_the_probe_reads_a_label_free_run_with_its_own_net(tiny_dataset, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "free"
    args = ["--config", "configs/tiny.yaml", "--data", str(tiny_dataset), "--out", str(run_dir), "train.steps=2"]
    assert train_main([*args, *LABEL_FREE]) == 0
    capsys.readouterr()
    built = built_nets(monkeypatch)
    assert keypoint_probe.main(["--data", str(tiny_dataset), "--checkpoint", str(run_dir), "--windows", "4"]) == 0
    assert not built[0].patch_embed.kp_coords_in  # the checkpoint's net: it loaded (no coordinate channels)
    rows = capsys.readouterr().out.splitlines()[1:]
    assert sorted(r.split()[0] for r in rows) == ["tabletop/PickPlace-v0", "tabletop/Push-v0", "tabletop/Reach-v0",
                                                  "tabletop/Stack-v0"]  # fmt: skip
