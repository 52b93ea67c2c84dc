"""The LeRobot v3.0 layout, written and read with real parquet and mp4 files (no lerobot import)."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from vla.data.hdf5_format import DatasetError
from vla.data.lerobot_format import LeRobotDir
from vla.data.lerobot_video import available_codecs, default_codec
from vla.data.lerobot_writer import LeRobotEpisode, LeRobotWriter, new_dataset_dir

CAM = "observation.images.front"


def _episodes(n=3, size=32, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        T = 6 + 2 * i
        base = np.linspace(0, 255, size * size * 3).reshape(size, size, 3)
        frames = np.stack([np.roll(base, 2 * t + 5 * i, axis=1) for t in range(T)]).astype(np.uint8)  # (T, H, W, 3)
        out.append(
            LeRobotEpisode(
                task=f"task number {i % 2}",
                state=rng.normal(size=(T, 5)).astype(np.float32),
                action=rng.uniform(-1, 1, (T, 3)).astype(np.float32),
                cameras={"front": frames},
                extra={"next.reward": np.arange(T, dtype=np.float32)},
                meta={"seed": 10 + i},
            )
        )
    return out


def _write(root, episodes, codec):
    w = LeRobotWriter(root, fps=20, codec=codec, robot_type="test")
    for ep in episodes:
        w.add_episode(ep)
    w.finalize()
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    eps = _episodes()
    return _write(tmp_path_factory.mktemp("lr") / "ds", eps, "lossless"), eps


def test_layout_matches_lerobot_v3(written):
    root, eps = written
    for rel in ("meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
                "data/chunk-000/file-000.parquet", f"videos/{CAM}/chunk-000/file-000.mp4"):  # fmt: skip
        assert (root / rel).is_file(), rel
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20
    assert info["total_episodes"] == 3 and info["total_frames"] == sum(len(e.action) for e in eps)
    assert info["total_tasks"] == 2 and info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    f = info["features"]
    assert f["observation.state"] == {"dtype": "float32", "shape": [5], "names": [f"state_{i}" for i in range(5)]}
    assert f["action"]["shape"] == [3] and f["timestamp"] == {"dtype": "float32", "shape": [1], "names": None}
    assert f[CAM]["dtype"] == "video" and f[CAM]["shape"] == [32, 32, 3]
    assert f[CAM]["info"]["video.codec"] == "h264" and f[CAM]["info"]["video.fps"] == 20

    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert data.column_names[:2] == ["observation.state", "action"]
    assert data.column("index").to_pylist() == list(range(info["total_frames"]))
    assert data.schema.field("observation.state").type.list_size == 5  # fixed-size list: Sequence(length=5)

    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    t = 0.0
    for i, (row, ep) in enumerate(zip(episodes, eps, strict=True)):
        T = len(ep.action)
        assert row["episode_index"] == i and row["length"] == T and row["tasks"] == [ep.task]
        assert row["data/chunk_index"] == 0 and row["data/file_index"] == 0
        assert row["dataset_to_index"] - row["dataset_from_index"] == T
        assert row[f"videos/{CAM}/from_timestamp"] == pytest.approx(t)  # episodes back to back in one mp4
        t = row[f"videos/{CAM}/to_timestamp"]
        assert t - row[f"videos/{CAM}/from_timestamp"] == pytest.approx(T / 20)
        assert row["stats/action/count"] == [T] and row["vla/seed"] == 10 + i
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("__index_level_0__").to_pylist() == ["task number 0", "task number 1"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["__index_level_0__"]
    stats = json.loads((root / "meta/stats.json").read_text())
    all_actions = np.concatenate([e.action for e in eps])
    np.testing.assert_allclose(stats["action"]["mean"], all_actions.mean(0), rtol=1e-5)
    assert np.array(stats[CAM]["mean"]).shape == (3, 1, 1)


def test_lossless_round_trip_is_exact(written):
    root, eps = written
    d = LeRobotDir(root)
    for row, ep in zip(d.episodes, eps, strict=True):
        np.testing.assert_array_equal(d.column(row, "action"), ep.action)
        np.testing.assert_array_equal(d.column(row, "observation.state"), ep.state)
        np.testing.assert_array_equal(d.frames(row, CAM), ep.cameras["front"])
        assert d.instruction(row) == ep.task


@pytest.mark.parametrize("codec", [c for c in ("av1", "h264") if c in available_codecs()])
def test_lossy_codecs_decode_every_frame_in_place(tmp_path, codec):
    eps = _episodes()
    d = LeRobotDir(_write(tmp_path / codec, eps, codec))
    assert default_codec() in available_codecs()
    for row, ep in zip(d.episodes, eps, strict=True):
        got, want = d.frames(row, CAM).astype(int), ep.cameras["front"].astype(int)
        assert got.shape == want.shape
        assert np.abs(got - want).mean() < 6  # codec error on a smooth gradient
        # the right frame, not a neighbour: each frame is closer to its own original than to the next one
        own = np.abs(got[:-1] - want[:-1]).mean(axis=(1, 2, 3))
        shifted = np.abs(got[:-1] - want[1:]).mean(axis=(1, 2, 3))
        assert (own < shifted).all()


def test_feature_mismatch_between_episodes_is_an_error(tmp_path):
    eps = _episodes(2)
    eps[1].state = eps[1].state[:, :4]
    w = LeRobotWriter(tmp_path / "ds", fps=20, codec="lossless")
    w.add_episode(eps[0])
    with pytest.raises(DatasetError, match=r"observation.state \[4\] vs \[5\]"):
        w.add_episode(eps[1])


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupt_directories_give_one_line_errors(written, tmp_path):
    root, _ = written
    bad = _copy(root, tmp_path / "no_info")
    (bad / "meta/info.json").unlink()
    with pytest.raises(DatasetError, match="missing meta/info.json"):
        LeRobotDir(bad)

    bad = _copy(root, tmp_path / "trunc_parquet")
    p = bad / "data/chunk-000/file-000.parquet"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(DatasetError, match="cannot read parquet") as e:
        LeRobotDir(bad)
    assert "\n" not in str(e.value)

    bad = _copy(root, tmp_path / "trunc_mp4")
    p = bad / f"videos/{CAM}/chunk-000/file-000.mp4"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])
    d = LeRobotDir(bad)  # metadata is fine; the frames are not
    with pytest.raises(DatasetError, match="truncated or corrupted"):
        for row in d.episodes:
            d.frames(row, CAM)

    bad = _copy(root, tmp_path / "extra_feature")
    info = json.loads((bad / "meta/info.json").read_text())
    info["features"]["observation.velocity"] = {"dtype": "float32", "shape": [3], "names": None}
    (bad / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"lists features \['observation.velocity'\] that the data file lacks"):
        LeRobotDir(bad)

    bad = _copy(root, tmp_path / "v21")
    info["codebase_version"] = "v2.1"
    (bad / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="only LeRobot v3"):
        LeRobotDir(bad)


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(RuntimeError), new_dataset_dir(dst) as tmp:
        (tmp / "meta").mkdir()
        raise RuntimeError("killed half way")
    assert not dst.exists() and list(tmp_path.iterdir()) == []
    with new_dataset_dir(dst) as tmp:
        (tmp / "done").write_text("1")
    assert (dst / "done").read_text() == "1"
    with pytest.raises(DatasetError, match="already exists"), new_dataset_dir(dst):
        pass
