"""Recovery windows: where executed actions leave the expert's path, and the sampler drawing them more often."""

import numpy as np
import pytest

from vla import recovery
from vla.collect import main as collect_main
from vla.dataset import EpochSampler
from vla.hdf5_format import open_dataset
from vla.train import recovery_weights, resolve_optional_keys
from vla.train_config import DataConfig


def test_dart_noise_stays_on_the_path_and_a_detour_leaves_it():
    rng = np.random.default_rng(0)
    labels = rng.uniform(-1, 1, (400, 4))
    noisy = np.clip(labels + rng.normal(0, 0.3, labels.shape), -1, 1)  # vla-collect --noise 0.3
    assert not recovery.off_path(noisy, labels).any()
    detoured = noisy.copy()
    detoured[100:110, :3] = np.clip(labels[100:110, :3] + 1.5 * np.array([1, -1, 0.5]), -1, 1)  # 10 ticks away
    off = recovery.off_path(detoured, labels)
    assert not off[:101].any()  # before the detour's first action takes effect
    assert off[102:115].all()  # during it, and while the expert brings the robot back
    assert not off[140:].any()  # and then back on the path


def test_weighted_epochs_draw_in_proportion_and_resume():
    n, B = 40, 4
    weights = np.ones(n)
    weights[:4] = 5.0  # 4 windows of 40 with 5x the weight: 20 / 56 of the draws
    stream = lambda s: [i for _, i in zip(range(4000), iter(s), strict=False)]  # noqa: E731
    full = stream(EpochSampler(n, B, seed=3, weights=weights))
    assert full == stream(EpochSampler(n, B, seed=3, weights=weights))
    share = np.mean(np.asarray(full) < 4)
    assert abs(share - 20 / 56) < 0.03, share
    assert stream(EpochSampler(n, B, seed=3, weights=weights, start_step=5))[:100] == full[20:120]


@pytest.fixture(scope="module")
def detoured_push(tmp_path_factory):
    """Real Push demonstrations with DART noise: every one with a detour, and none."""
    out = tmp_path_factory.mktemp("recovery")
    paths = {}
    for name, extra in (("detour", ["--noise", "0.3", "--detour", "1"]), ("noise", ["--noise", "0.3"])):
        paths[name] = out / f"{name}.hdf5"
        argv = ["--tasks", "push", "--episodes-per-task", "3", "--workers", "1", "--quiet", "--out", str(paths[name])]
        assert collect_main([*argv, *extra]) == 0
    return paths


def test_recovery_weights_mark_the_detours_of_real_demonstrations(detoured_push, capsys):
    path = str(detoured_push["detour"])
    data = resolve_optional_keys(DataConfig(recovery_weight=3.0, train_split=""), path)
    with open_dataset(path) as f:
        names = sorted(f["data"], key=lambda n: int(n.split("_")[1]))
        lengths = [len(f["data"][n]["actions"]) for n in names]
    weights = recovery_weights(data, path, names)
    assert len(weights) == sum(lengths) and set(np.unique(weights)) == {1.0, 3.0}
    for w in np.split(weights, np.cumsum(lengths)[:-1]):  # each demo: on the path, off it, back on it
        assert w[0] == 1 and w.max() == 3 and w[-1] == 1
    assert "windows off the expert's path, drawn 3x as often" in capsys.readouterr().err
    path = str(detoured_push["noise"])  # DART's noise alone never leaves the path
    with open_dataset(path) as f:
        names = list(f["data"])
    data = resolve_optional_keys(DataConfig(recovery_weight=3.0, train_split=""), path)
    assert (recovery_weights(data, path, names) == 1).all()


def test_recovery_weight_without_labels_is_uniform_and_says_so(tiny_dataset, capsys):
    path = str(tiny_dataset)  # collected without noise: executed actions only
    data = resolve_optional_keys(DataConfig(recovery_weight=3.0), path)
    assert data.action_key == "actions"
    assert recovery_weights(data, path, ["demo_0"]) is None
    assert "data.recovery_weight has no effect" in capsys.readouterr().err
    with pytest.raises(ValueError, match="recovery_weight=0.5 must be >= 1"):
        DataConfig(recovery_weight=0.5)
