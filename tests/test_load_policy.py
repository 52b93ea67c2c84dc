"""load_policy: one entry point for every backend; the onnxruntime ones need neither torch nor h5py; CPU threads
picked for the step; what cannot load is one line."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import run_main
from tests.serving import in_process_chunks, observations
from vla import load_policy
from vla.errors import UserError
from vla.policy.load import step_threads
from vla.policy.onnx_policy import PolicyLoadError

INSTRUCTION = "push the red block to the green target"


@pytest.fixture(scope="module")
def int8_export(tiny_checkpoint, tmp_path_factory):
    from vla.export.graphs import export_policy

    out = tmp_path_factory.mktemp("export") / "export"
    export_policy(load_policy(tiny_checkpoint, device="cpu"), out, int8=True)
    return out


def run_without_torch(body: str) -> subprocess.CompletedProcess:
    """`body` in a fresh interpreter where torch and h5py cannot be imported."""
    script = f"""
import sys
for name in ("torch", "h5py"):
    sys.modules[name] = None  # any import of these now fails
import numpy as np
from vla import load_policy
{body}
loaded = {{m.split(".")[0] for m, v in sys.modules.items() if v is not None}}
assert not loaded & {{"torch", "h5py"}}, loaded
"""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_onnxruntime_backends_load_and_step_without_torch_or_h5py(int8_export, tmp_path):
    spec = load_policy(int8_export, backend="onnxruntime").spec
    for backend in ("onnxruntime", "onnxruntime-int8"):
        out = tmp_path / f"{backend}.npy"
        r = run_without_torch(f"""
from tests.serving import observations
policy = load_policy({str(int8_export)!r}, backend={backend!r})
policy.reset({INSTRUCTION!r})
np.save({str(out)!r}, np.stack([policy.act_chunk(o) for o in observations(policy.spec, seed=3, n=5)]))
print("ok")
""")
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
        here = load_policy(int8_export, backend=backend)
        np.testing.assert_array_equal(
            np.load(out), np.stack(in_process_chunks(here, INSTRUCTION, observations(spec, 3, 5)))
        )


def test_int8_without_an_int8_graph_is_one_line_before_torch(tiny_checkpoint, tmp_path):
    from vla.export.graphs import export_policy

    export_policy(load_policy(tiny_checkpoint, device="cpu"), tmp_path / "export")
    r = run_without_torch(f"""
from vla.errors import UserError
try:
    load_policy({str(tmp_path / "export")!r}, backend="onnxruntime-int8")
except UserError as e:
    print(e)
""")
    assert r.returncode == 0, r.stderr
    assert "no int8 step graph" in r.stdout and len(r.stdout.strip().splitlines()) == 1


def test_a_checkpoint_without_an_export_is_a_user_error(tiny_checkpoint):
    with pytest.raises(PolicyLoadError, match="no ONNX export") as e:
        load_policy(tiny_checkpoint, backend="onnxruntime")
    assert isinstance(e.value, UserError) and len(str(e.value).splitlines()) == 1
    r = run_main("vla.cli.eval", "--checkpoint", tiny_checkpoint, "--backend", "onnxruntime")
    assert r.returncode == 2 and "no ONNX export" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r


def test_onnxruntime_refuses_recompute_and_torch_options(int8_export):
    with pytest.raises(ValueError, match="always streams"):
        load_policy(int8_export, backend="onnxruntime", kv_cache=False)
    with pytest.raises(ValueError, match="torch backend options"):
        load_policy(int8_export, backend="onnxruntime", text_encoder="/somewhere")
    with pytest.raises(ValueError, match="is not one of"):
        load_policy(int8_export, backend="tensorrt")


def test_load_policy_sets_the_step_threads_on_cpu(tiny_checkpoint):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        load_policy(tiny_checkpoint, device="cpu")
        assert torch.get_num_threads() == step_threads() <= 2
        load_policy(tiny_checkpoint, device="cpu", threads=3)  # the caller's choice wins
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
