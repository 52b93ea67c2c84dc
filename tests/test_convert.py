"""`vla-data convert`: HDF5 <-> LeRobot v3 round trips, corrupt inputs, and training from a LeRobot dir."""

import hashlib
import json
import shutil

import numpy as np
import pytest

from tests.conftest import run_main
from tests.foreign_files import write_robomimic
from vla.data.convert import convert
from vla.data.sources import open_source
from vla.data.validate import validate

# One worker builds the module-scoped datasets once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("convert")


def _digest(path):
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for p in files:
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def lossless(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "tiny_lerobot"
    convert(tiny_dataset, out, codec="lossless", quiet=True)
    return out


def _compare(a_path, b_path):
    """Max and mean abs pixel error; asserts everything else is identical."""
    a, b = open_source(a_path), open_source(b_path)
    assert a.names("") == b.names("")
    assert a.names("train") == b.names("train") and a.names("valid") == b.names("valid")
    worst, total, n = 0, 0.0, 0
    for name in a.names(""):
        x, y = a.read(name), b.read(name)
        assert (x.task, x.seed, x.instruction, x.success) == (y.task, y.seed, y.instruction, y.success)
        np.testing.assert_array_equal(x.actions, y.actions)  # episode boundaries: same lengths, same rows
        np.testing.assert_array_equal(x.proprio, y.proprio)
        np.testing.assert_array_equal(x.rewards, y.rewards)
        np.testing.assert_array_equal(x.dones, y.dones)
        np.testing.assert_array_equal(a.obs(name, "object"), b.obs(name, "object"))
        d = np.abs(x.image.astype(int) - y.image.astype(int))
        worst, total, n = max(worst, int(d.max())), total + d.sum(), n + d.size
    assert a.env_args() == b.env_args()
    return worst, total / n


def test_round_trip_lossless_is_exact(tiny_dataset, lossless, tmp_path):
    assert _compare(tiny_dataset, lossless) == (0, 0.0)
    back = tmp_path / "back.hdf5"
    convert(lossless, back, quiet=True)
    assert validate(back) == []
    assert _compare(tiny_dataset, back) == (0, 0.0)


def test_round_trip_default_codec_within_codec_error(tiny_dataset, tmp_path, capsys):
    out = tmp_path / "lr"
    r = convert(tiny_dataset, out)
    assert r["frames_per_s"] > 0 and r["episodes"] == 16
    assert "--codec lossless keeps every pixel" in capsys.readouterr().err  # tiny frames, lossy video: a note
    convert(tiny_dataset, tmp_path / "exact", codec="lossless")
    assert "note:" not in capsys.readouterr().err
    back = tmp_path / "back.hdf5"
    convert(out, back, quiet=True)
    worst, mean = _compare(tiny_dataset, back)
    assert 0 < mean < 8, (worst, mean)  # lossy video: small on average, large only at sharp coloured edges


def test_cli_convert_reports_speed_and_refuses_to_overwrite(tiny_dataset, lossless, tmp_path):
    dst = tmp_path / "cli_lr"
    r = run_main("vla.cli.data", "convert", tiny_dataset, dst, "--codec", "h264", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with open_source(tiny_dataset) as src:
        assert out["frames"] == sum(src.meta(n)["num_samples"] for n in src.names(""))
    assert out["frames_per_s"] > 0 and out["codec"] == "h264" and out["fps"] == 20
    r = run_main("vla.cli.data", "convert", tiny_dataset, dst, "--quiet")
    assert r.returncode == 2 and "already exists; pass --force" in r.stderr
    r = run_main("vla.cli.data", "validate", dst)
    assert r.returncode == 0 and "steps, lerobot layout)" in r.stdout


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate data/chunk-000/file-000.parquet", "cannot read parquet"),
        ("truncate videos/observation.images.image/chunk-000/file-000.mp4", "truncated or corrupted"),
        ("delete meta/info.json", "missing meta/info.json"),
        ("add feature observation.velocity", "lists features ['observation.velocity'] that the data file lacks"),
    ],
)
def test_corrupt_lerobot_input(lossless, tmp_path, damage, message):
    src = shutil.copytree(lossless, tmp_path / "src")
    what, rel = damage.split(" ", 1)
    if what == "truncate":
        p = src / rel
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif what == "delete":
        (src / rel).unlink()
    else:
        info = json.loads((src / "meta/info.json").read_text())
        info["features"][rel.split()[-1]] = {"dtype": "float32", "shape": [3], "names": None}
        (src / "meta/info.json").write_text(json.dumps(info))
    before = _digest(src)
    dst = tmp_path / "out.hdf5"
    r = run_main("vla.cli.data", "convert", src, dst, "--quiet")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert _digest(src) == before  # the source is only read
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]  # no partial output either
    r = run_main("vla.cli.data", "validate", src)
    assert r.returncode == 4 and message in r.stdout


def test_truncated_hdf5_input(tiny_dataset, tmp_path):
    src = tmp_path / "cut.hdf5"
    src.write_bytes(tiny_dataset.read_bytes()[: tiny_dataset.stat().st_size // 2])
    before = _digest(src)
    r = run_main("vla.cli.data", "convert", src, tmp_path / "out", "--quiet")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _digest(src) == before and sorted(p.name for p in tmp_path.iterdir()) == ["cut.hdf5"]


def test_robomimic_to_lerobot_keeps_both_cameras(tmp_path):
    rm = write_robomimic(tmp_path / "rm.hdf5", demos=2, T=6)
    out = tmp_path / "rm_lr"
    convert(rm, out, codec="lossless", quiet=True)
    info = json.loads((out / "meta/info.json").read_text())
    assert {"observation.images.agentview_image", "observation.images.robot0_eye_in_hand_image"} <= set(
        info["features"]
    )
    assert info["features"]["observation.state"]["shape"] == [5] and info["features"]["action"]["shape"] == [7]
    assert info["fps"] == 20  # robomimic's env_kwargs.control_freq
    src, dst = open_source(rm), open_source(out)
    np.testing.assert_array_equal(src.read("demo_1").image, dst.read("demo_1").image)
    np.testing.assert_array_equal(src.frames_of("demo_1", "robot0_eye_in_hand_image"),
                                  dst.frames_of("demo_1", "robot0_eye_in_hand_image"))  # fmt: skip
    assert dst.names("valid") == ["demo_1"]  # robomimic's own masks travel as the vla/split column


def _train(data, out, *extra):
    return run_main("vla.cli.train", "--config", "configs/tiny.yaml", "--data", data, "--out", out,
                    "train.steps=4", "train.log_every=2", "train.checkpoint_every=4", *extra)  # fmt: skip


def test_train_from_lerobot_dir_matches_hdf5(tiny_dataset, lossless, tmp_path):
    """Lossless export: the same windows, so the same losses as training on the HDF5 itself."""
    r = _train(lossless, tmp_path / "lr")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _train(tiny_dataset, tmp_path / "h5")
    assert r.returncode == 0, r.stderr[-2000:]
    read = lambda p: [json.loads(ln) for ln in (p / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    a, b = read(tmp_path / "lr"), read(tmp_path / "h5")
    assert [m.get("loss") for m in a] == [m.get("loss") for m in b]
    assert [m.get("valid/loss") for m in a] == [m.get("valid/loss") for m in b]
    assert any("valid/loss" in m for m in a)


def test_train_rejects_features_that_do_not_match(lossless, tmp_path):
    r = _train(lossless, tmp_path / "x", "data.image_key=wrist")
    assert r.returncode == 2
    assert "no camera 'wrist' (videos: observation.images.image)" in r.stderr.strip().splitlines()[-1]
    r = _train(lossless, tmp_path / "y", "data.proprio_keys=[joint_pos]")
    assert r.returncode == 2 and "no feature 'joint_pos'" in r.stderr.strip().splitlines()[-1]


def test_expert_actions_travel_both_ways(tiny_dataset, tmp_path):
    """DART labels (vla-collect --noise) become an `expert_actions` feature and come back exactly."""
    import h5py

    src = tmp_path / "noisy.hdf5"
    shutil.copy(tiny_dataset, src)
    with h5py.File(src, "a") as f:
        for name in f["data"]:
            g = f["data"][name]
            g.create_dataset("expert_actions", data=np.clip(g["actions"][()] * 0.5, -1, 1).astype(np.float32))
    assert validate(src) == []
    convert(src, tmp_path / "lr", codec="lossless", quiet=True)
    convert(tmp_path / "lr", tmp_path / "back.hdf5", quiet=True)
    with h5py.File(src) as a, h5py.File(tmp_path / "back.hdf5") as b:
        for name in a["data"]:
            np.testing.assert_array_equal(a["data"][name]["expert_actions"][()], b["data"][name]["expert_actions"][()])
    with open_source(tmp_path / "lr", actions="expert_actions") as lr:
        assert lr.keys.actions == "expert_actions"
        np.testing.assert_array_equal(
            lr.read("demo_0").actions, open_source(src, actions="expert_actions").read("demo_0").actions
        )


def test_convert_help(capsys):
    from vla.cli.data import main

    with pytest.raises(SystemExit) as e:
        main(["convert", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: vla-data convert" in out and "--codec" in out and "--image-key" in out


def test_drop_leaves_out_the_simulator_labels_both_ways(tiny_dataset, lossless, tmp_path):
    """--drop object,object_px: the demo data as a real robot's dataset holds it, either direction."""
    out = tmp_path / "no_labels"
    r = run_main("vla.cli.data", "convert", tiny_dataset, out, "--codec", "lossless", "--drop", "object,object_px",
                 "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    features = json.loads((out / "meta/info.json").read_text())["features"]
    assert "observation.state" in features and "action" in features
    assert not {"observation.object", "observation.object_px"} & set(features), sorted(features)
    back = tmp_path / "back.hdf5"
    convert(lossless, back, quiet=True, drop=("object",))
    with open_source(back) as src:
        keys = src.obs_keys(src.names("")[0])
    assert "object" not in keys and "object_px" in keys
    r = run_main("vla.cli.data", "convert", tiny_dataset, tmp_path / "typo", "--drop", "objet", "--quiet")
    assert r.returncode == 2 and "--drop objet: no such observation key" in r.stderr and "object_px" in r.stderr
    assert not (tmp_path / "typo").exists()
