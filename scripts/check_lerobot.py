"""Check our LeRobot v3.0 files against the real library, both ways. Run with a separate venv holding lerobot:

    python3 -m venv /work/lerobot-venv && /work/lerobot-venv/bin/pip install lerobot==0.4.4
    /work/lerobot-venv/bin/python scripts/check_lerobot.py [--data data/demo.hdf5] [--work /tmp/lerobot-check]

lerobot is not a dependency of this project: this script imports it, and calls our tools (vla-collect,
vla-data, vla-train) through the project's own .venv (`--vla-python`).

(a) export: `vla-data convert HDF5 DIR` for each codec, then `LeRobotDataset(repo_id, root=DIR)` loads it;
    every frame's action and state must equal ours exactly, the task must be our instruction, and the
    decoded frames are compared with ours (max / mean absolute pixel error, 0..255).
(b) import: a dataset written by LeRobot's own writer (`LeRobotDataset.create`, `add_frame`,
    `save_episode`, `finalize`) is validated, converted to HDF5 and trained on by our tools, directly
    from the LeRobot directory and from the converted HDF5, with the same config: same losses.
Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        FAILED.append(what)


def vla(py: str, *args: str) -> subprocess.CompletedProcess:
    """Run one of our CLIs (python -m vla.<module>) in the project's venv; fail loudly."""
    r = subprocess.run([py, "-m", *args], cwd=REPO, capture_output=True, text=True, env=None)
    if r.returncode != 0:
        sys.exit(f"check_lerobot: `{' '.join(args)}` failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return r


DUMP = """
import sys, numpy as np
from vla.data.sources import open_source
src = open_source(sys.argv[1])
out = {}
for i, name in enumerate(src.names("")):
    d = src.read(name)
    out[f"{i}/action"], out[f"{i}/state"], out[f"{i}/image"] = d.actions, d.proprio, d.image
    out[f"{i}/instruction"] = np.array(d.instruction)
np.savez(sys.argv[2], **out)
"""


def dump(py: str, data: Path, out: Path) -> dict:
    """Episodes of `data` as our reader sees them (the lerobot venv has no h5py): {i: {action, state, ...}}."""
    subprocess.run([py, "-c", DUMP, str(data), str(out)], cwd=REPO, check=True)
    z = np.load(out)
    eps: dict[int, dict] = {}
    for k in z.files:
        i, field = k.split("/")
        eps.setdefault(int(i), {})[field] = z[k]
    return eps


def load(repo_id: str, root: Path):
    """LeRobotDataset with its default video backend (torchcodec), or pyav where torchcodec cannot load."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    try:
        ds = LeRobotDataset(repo_id, root=root)
        ds[0]
        return ds, ds.video_backend
    except (OSError, RuntimeError, ImportError) as e:
        print(f"  (default video backend unavailable: {type(e).__name__}; using pyav)")
        return LeRobotDataset(repo_id, root=root, video_backend="pyav"), "pyav"


def check_export(py: str, data: Path, work: Path, codec: str) -> dict:
    out = work / f"export_{codec}"
    shutil.rmtree(out, ignore_errors=True)
    r = vla(py, "vla.cli.data", "convert", str(data), str(out), "--codec", codec, "--json", "--quiet")
    conv = json.loads(r.stdout)
    print(f"\n(a) export with {codec}: {conv['episodes']} episodes, {conv['frames']} frames, "
          f"{conv['frames_per_s']:.0f} frames/s")  # fmt: skip
    ours = dump(py, data, work / "ours.npz")
    t0 = time.perf_counter()
    ds, backend = load(f"local/vla_export_{codec}", out)
    check(ds.num_episodes == len(ours), f"LeRobotDataset loads it: {ds.num_episodes} episodes, {ds.num_frames} frames")
    action_ok = state_ok = task_ok = True
    worst, total, n = 0, 0.0, 0
    cam = ds.meta.video_keys[0]
    for i in range(len(ds)):
        item = ds[i]
        e, t = int(item["episode_index"]), int(item["frame_index"])
        ep = ours[e]
        action_ok &= np.array_equal(item["action"].numpy(), ep["action"][t])
        state_ok &= np.array_equal(item["observation.state"].numpy(), ep["state"][t])
        task_ok &= item["task"] == str(ep["instruction"])
        frame = (item[cam].numpy().transpose(1, 2, 0) * 255).round().astype(int)  # (3, H, W) 0..1 -> (H, W, 3)
        d = np.abs(frame - ep["image"][t].astype(int))
        worst, total, n = max(worst, int(d.max())), total + float(d.sum()), n + d.size
    secs = time.perf_counter() - t0
    check(action_ok, "actions identical to ours, every frame")
    check(state_ok, "observation.state identical to our proprio, every frame")
    check(task_ok, "task = our instruction, every frame")
    mean = total / n
    limit = 0 if codec == "lossless" else 12
    check(mean <= limit if codec != "lossless" else worst == 0,
          f"frames via LeRobot ({backend}): max abs error {worst}, mean {mean:.3f} (0..255)")  # fmt: skip
    print(f"  read {len(ds)} items through LeRobotDataset in {secs:.1f} s")
    return {"codec": codec, "frames": conv["frames"], "convert_frames_per_s": conv["frames_per_s"],
            "backend": backend, "max_abs_pixel_error": worst, "mean_abs_pixel_error": mean}  # fmt: skip


def check_import(py: str, work: Path, steps: int) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = work / "lerobot_written"
    shutil.rmtree(root, ignore_errors=True)
    size, fps = 64, 10
    features = {
        "observation.images.front": {"dtype": "video", "shape": (size, size, 3),
                                     "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (4,), "names": [f"a{i}" for i in range(4)]},
    }  # fmt: skip
    ds = LeRobotDataset.create("local/written_by_lerobot", fps=fps, features=features, root=root, robot_type="sim")
    rng = np.random.default_rng(0)
    tasks = ["push the red square right", "push the red square down"]
    originals = []
    for e in range(6):
        T, task = 20 + 3 * e, tasks[e % 2]
        frames = np.full((T, size, size, 3), 30, np.uint8)
        frames[..., 2] = np.linspace(20, 120, size, dtype=np.uint8)[None, None, :]
        state = rng.normal(size=(T, 6)).astype(np.float32)
        action = np.tanh(rng.normal(size=(T, 4))).astype(np.float32)
        for t in range(T):
            x, y = (5 + 2 * t) % 50, 10 + (e * 5) % 40
            frames[t, y : y + 10, x : x + 10] = (230, 30, 30)
            ds.add_frame({"observation.images.front": frames[t], "observation.state": state[t], "action": action[t],
                          "task": task})  # fmt: skip
        ds.save_episode()
        originals.append({"frames": frames, "state": state, "action": action, "task": task})
    ds.finalize()
    print(f"\n(b) LeRobot's writer made {root}: {ds.num_episodes} episodes, {ds.num_frames} frames")
    r = vla(py, "vla.cli.data", "validate", str(root))
    check("steps, lerobot layout)" in r.stdout, f"vla-data validate: {r.stdout.strip()}")
    h5 = work / "lerobot_written.hdf5"
    h5.unlink(missing_ok=True)
    r = vla(py, "vla.cli.data", "convert", str(root), str(h5), "--json", "--quiet")
    conv = json.loads(r.stdout)
    speed = f"{conv['frames']} frames, {conv['frames_per_s']:.0f} frames/s"
    check(conv["episodes"] == 6, f"vla-data convert -> HDF5: {speed}")
    back = dump(py, h5, work / "back.npz")
    check(all(np.array_equal(back[i]["action"], o["action"]) for i, o in enumerate(originals)), "actions exact")
    check(all(np.array_equal(back[i]["state"], o["state"]) for i, o in enumerate(originals)), "states exact")
    check(all(str(back[i]["instruction"]) == o["task"] for i, o in enumerate(originals)), "tasks -> instructions")
    errs = [np.abs(back[i]["image"].astype(int) - o["frames"].astype(int)) for i, o in enumerate(originals)]
    worst, mean = max(int(d.max()) for d in errs), float(np.mean([d.mean() for d in errs]))
    check(mean < 12, f"frames LeRobot wrote (AV1) decoded by us: max abs error {worst}, mean {mean:.3f}")
    losses = {}
    for name, data in (("lerobot_dir", root), ("converted_hdf5", h5)):
        out = work / f"train_{name}"
        shutil.rmtree(out, ignore_errors=True)
        vla(py, "vla.cli.train", "--config", "configs/tiny.yaml", "--data", str(data), "--out", str(out),
            f"train.steps={steps}", "train.threads=1", "train.log_every=5", "data.valid_fraction=0.34")  # fmt: skip
        metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        losses[name] = {
            "final_loss": [m["loss"] for m in metrics if "loss" in m][-1],
            "valid_loss": [m["valid/loss"] for m in metrics if "valid/loss" in m][-1],
        }
        print(f"  vla-train on {name}: {steps} steps, loss {losses[name]['final_loss']:.4f}, "
              f"valid/loss {losses[name]['valid_loss']:.4f}")  # fmt: skip
    check(losses["lerobot_dir"] == losses["converted_hdf5"], "training from the LeRobot dir = from its HDF5 conversion")
    return {"frames": conv["frames"], "max_abs_pixel_error": worst, "mean_abs_pixel_error": mean, "losses": losses}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, help="HDF5 to export (default: collect 2 demos per task)")
    p.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    p.add_argument("--vla-python", default=str(REPO / ".venv/bin/python"), help="the project's venv python")
    p.add_argument("--codecs", default="av1,lossless", help="codecs to export with (av1, h264, lossless)")
    p.add_argument("--steps", type=int, default=30, help="training steps for (b)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()
    import lerobot

    print(f"lerobot {lerobot.__version__}")
    work = args.work or Path(tempfile.mkdtemp(prefix="lerobot-check-"))
    work.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data is None:
        data = work / "small.hdf5"
        if not data.exists():
            vla(args.vla_python, "vla.cli.collect", "--tasks", "all", "--episodes-per-task", "2", "--workers", "1",
                "--out", str(data), "--seed", "0", "--quiet")  # fmt: skip
    report = {"lerobot": lerobot.__version__, "export": [check_export(args.vla_python, data, work, c)
                                                         for c in args.codecs.split(",")]}  # fmt: skip
    report["import"] = check_import(args.vla_python, work, args.steps)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"\n{'all checks passed' if not FAILED else f'{len(FAILED)} checks FAILED: {FAILED}'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
