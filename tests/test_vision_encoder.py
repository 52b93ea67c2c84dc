"""model.vision_encoder: a pretrained Hugging Face image model from a local folder, frozen or fine-tuned, in
place of the conv stem.

The encoders are tiny randomly initialized models that the tests write themselves (a two-stage ResNet with its
own preprocessor_config.json, and a one-layer ViT), with the real transformers library; nothing is downloaded.
"""

import dataclasses
import json
import os
import shutil
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import envs  # noqa: F401 - registers the tasks
from tests.conftest import run_main
from tests.test_model import dims, make_batch, make_model, stream_vs_recompute
from tests.test_text_encoder import restorable
from vla.checkpoint import load_checkpoint
from vla.cli.train import main as train_main
from vla.config import ConfigError
from vla.export.graphs import ExportError, check_exportable
from vla.model import ActionTransformer
from vla.model.vision_encoder import VisionEncoder, VisionEncoderError, fingerprint, relocated
from vla.policy.load import load_policy
from vla.training.config import load_config
from vla.training.distributed import Distributed
from vla.training.train import build_optimizer, load_data, resolve_optional_keys, train_step

TINY = "configs/tiny.yaml"
CONV = "model.patch_embed=conv"  # tiny.yaml's own stem (the default), named where a test relies on it
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
ENCODER = "patch_embed.encoder."  # where a fine-tuned encoder's weights sit in the state dict


def write_tiny_resnet(folder, seed=0):
    """A randomly initialized two-stage ResNet (8 and 16 channels, stride 8) and an image processor config
    with its own mean and std, saved as a Hugging Face model folder."""
    torch.manual_seed(seed)
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    transformers.ResNetModel(config).save_pretrained(folder)
    processor = {"image_processor_type": "ConvNextImageProcessor", "do_rescale": True, "rescale_factor": 1 / 255,
                 "do_normalize": True, "image_mean": MEAN, "image_std": STD}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


def write_tiny_vit(folder, seed=0):
    """A randomly initialized one-layer ViT for 32x32 images (8-pixel patches), no processor config."""
    torch.manual_seed(seed)
    config = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, image_size=32, patch_size=8)  # fmt: skip
    transformers.ViTModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return write_tiny_resnet(tmp_path_factory.mktemp("vision") / "tiny-resnet")


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return write_tiny_vit(tmp_path_factory.mktemp("vision") / "tiny-vit")


def train_run(data, encoder, out, *extra):
    code = train_main(["--config", TINY, "--data", str(data), "--out", str(out), CONV,
                       f"model.vision_encoder={encoder}", "train.steps=6", "train.log_every=3",
                       "train.checkpoint_every=6", *extra])  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="module")
def frozen_run(tiny_dataset, encoder, tmp_path_factory):
    return train_run(tiny_dataset, encoder, tmp_path_factory.mktemp("run") / "frozen")


@pytest.fixture(scope="module")
def trainable_run(tiny_dataset, encoder, tmp_path_factory):
    return train_run(
        tiny_dataset, encoder, tmp_path_factory.mktemp("run") / "tuned", "model.vision_encoder_trainable=true"
    )


def one_line(e) -> str:
    message = str(e.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------ config and folder


def test_config_vision_encoder_fields(encoder):
    assert load_config(TINY, []).model.vision_encoder is None  # the default: the conv stem
    assert load_config(TINY, [CONV, "model.vision_encoder=null"]).model.vision_encoder is None
    refusals = {
        "use null for the conv stem": ["model.vision_encoder=''"],
        "vision_encoder_trainable=True needs a vision_encoder folder": ["model.vision_encoder_trainable=true"],
        "needs patch_embed='conv', got patch_embed='linear'": [
            "model.patch_embed=linear",
            f"model.vision_encoder={encoder}",
        ],
        "conditions nothing: it needs keypoints > 0": [CONV, "model.keypoints=0", f"model.vision_encoder={encoder}"],
        "'model.vision_fingerprint' is decided by the data": ["model.vision_fingerprint=abc"],
    }
    for why, overrides in refusals.items():
        with pytest.raises(ConfigError, match=why) as e:
            load_config(TINY, overrides)
        one_line(e)
    cfg = load_config(TINY, [CONV, "model.film=true", "model.keypoints=2", f"model.vision_encoder={encoder}"])
    assert cfg.model.vision_encoder == str(encoder) and not cfg.model.vision_encoder_trainable  # frozen by default


def test_a_path_that_is_not_a_model_folder_is_refused_before_transformers_is_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now raises ImportError
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    for path in ("microsoft/resnet-18", tmp_path / "absent", tmp_path / "a_file"):
        with pytest.raises(VisionEncoderError, match="not a local directory") as e:
            VisionEncoder(path, 16)
        assert str(path) in one_line(e) and "model.vision_encoder" in str(e.value)
    with pytest.raises(VisionEncoderError, match="no config.json") as e:
        VisionEncoder(tmp_path / "empty", 16)
    one_line(e)


def test_the_cli_refuses_a_hub_name_in_one_line_before_reading_the_data(tiny_dataset, tmp_path, capsys):
    code = train_main(["--config", TINY, "--data", str(tiny_dataset), "--out", str(tmp_path / "r"), CONV,
                       "model.vision_encoder=microsoft/resnet-18"])  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vla-train: error:")]
    assert code == 2 and len(errors) == 1 and "microsoft/resnet-18: not a local directory" in errors[0], errors
    assert not (tmp_path / "r" / "latest").exists()


def test_a_folder_transformers_cannot_load_is_one_line(encoder, tmp_path):
    (tmp_path / "config.json").write_bytes((encoder / "config.json").read_bytes())  # no weights
    with pytest.raises(VisionEncoderError, match="transformers cannot load it") as e:
        VisionEncoder(tmp_path, 16)
    assert str(tmp_path) in one_line(e)


def test_the_encoder_loads_local_files_only_and_normalizes_as_its_processor_says(encoder, vit, monkeypatch):
    seen = []
    real = transformers.AutoModel.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    resnet, vision_transformer = VisionEncoder(encoder, 16), VisionEncoder(vit, 16)
    assert len(seen) == 2 and all(kwargs.get("local_files_only") is True for kwargs in seen), seen
    images = torch.rand(3, 3, 16, 16)  # (N, 3, H, W) in [0, 1]
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    expected = resnet.hf(pixel_values=(images - mean) / std).last_hidden_state  # (N, 16, 2, 2)
    torch.testing.assert_close(resnet(images), expected, rtol=1e-5, atol=1e-5)
    assert resnet.channels == 16 and resnet.input_size is None  # a conv net sees the data's own frames
    # no processor config: ImageNet's mean and std; a ViT's 32x32 position embeddings: frames resized to 32
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    resized = torch.nn.functional.interpolate((images - mean) / std, size=(32, 32), mode="bilinear", antialias=True)
    tokens = vision_transformer.hf(pixel_values=resized).last_hidden_state  # (N, 1 + 16, 16): [CLS] first
    grid = tokens[:, 1:].transpose(1, 2).reshape(3, 16, 4, 4)  # (N, 16, 4, 4): patch tokens on their grid
    torch.testing.assert_close(vision_transformer(images), grid, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize("trainable", [False, True], ids=["frozen", "fine-tuned"])
@pytest.mark.parametrize("which", ["resnet", "vit"])
def test_streaming_equals_recompute_with_a_vision_encoder(which, trainable, request):
    folder = request.getfixturevalue({"resnet": "encoder", "vit": "vit"}[which])
    for kw in (dict(film=False, keypoints=0, aux_feed=False), dict(film=True, keypoints=2, sharp=True)):  # kp FiLM kept
        model = make_model(patch_embed="conv", vision_encoder=str(folder), vision_encoder_trainable=trainable, **kw)
        assert model.patch_embed.film is None and isinstance(model.patch_embed.encoder, VisionEncoder)
        assert model.layout.n_image_tokens == model.layout.grid**2 + model.cfg.keypoints  # the stem's layout
        pooler = getattr(model.patch_embed.encoder.hf, "pooler", None)  # ViT: a classification head's dense layer
        assert not any(p.requires_grad for p in pooler.parameters())  # frozen, or never read by the feature map
        diffs, same = stream_vs_recompute(model, 2 * model.cfg.window + 1)
        assert max(diffs) <= 1e-4 and all(same), diffs
    # the patch tokens do come from the encoder: another encoder, other tokens
    batch = make_batch(dims(model))
    a = model.patch_embed(batch["image"]).tokens
    with torch.no_grad():
        for p in model.patch_embed.encoder.hf.parameters():
            p.mul_(1.5)
    assert not torch.allclose(a, model.patch_embed(batch["image"]).tokens)


@pytest.mark.parametrize("trainable", [False, True], ids=["frozen", "fine-tuned"])
def test_training_trains_the_encoder_only_when_fine_tuned(tiny_dataset, encoder, trainable):
    cfg = load_config(TINY, [CONV, f"model.vision_encoder={encoder}", f"model.vision_encoder_trainable={trainable}"])
    cfg = dataclasses.replace(cfg, data=resolve_optional_keys(cfg.data, str(tiny_dataset)))  # as vla-train does
    data = load_data(cfg, str(tiny_dataset), None)
    torch.manual_seed(0)
    model = ActionTransformer(cfg.model, data.spec)
    hf = model.patch_embed.encoder.hf
    folder_weights = load_file(str(encoder / "model.safetensors"))
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    assert all(torch.equal(before[k], folder_weights[k]) for k in folder_weights)  # our init left them alone
    optimizer, _ = build_optimizer(model, cfg, torch.device("cpu"))
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    encoder_keys = [k for k in model.state_dict() if k.startswith(ENCODER)]
    if trainable:
        assert {id(p) for p in hf.parameters()} <= trained and len(encoder_keys) == len(before)
    else:
        assert not trained & {id(p) for p in hf.parameters()} and not encoder_keys
    model.train()
    assert not hf.training  # BatchNorm statistics stay the folder's either way
    loader = torch.utils.data.DataLoader(data.train_set, batch_size=8, shuffle=True, drop_last=True)
    for step, batch in enumerate(loader):
        batch.pop("demo")
        assert train_step(model, model, optimizer, batch, cfg, Distributed(torch.device("cpu")), False) is not None
        if step == 2:
            break
    after = hf.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    statistics = {k for k in before if "running_" in k or "num_batches" in k}
    assert statistics and not changed & statistics
    if trainable:
        assert "embedder.embedder.convolution.weight" in changed
    else:
        assert not changed, "a frozen encoder's weights changed"


# ------------------------------------------------------------------------------------------ runs and checkpoints


def test_a_frozen_run_records_the_encoder_saves_none_of_it_and_its_policy_acts(frozen_run, encoder):
    meta = load_checkpoint(frozen_run).meta
    assert meta["model"]["vision_encoder"] == str(encoder.resolve()) and not meta["model"]["vision_encoder_trainable"]
    assert meta["data_spec"]["vision_fingerprint"] == fingerprint(encoder)
    saved = load_file(str(frozen_run / "model.safetensors"))
    assert not any(k.startswith(ENCODER) for k in saved)
    assert saved["patch_embed.proj.weight"].shape == (32, 16)  # (d_model, the encoder's channels)
    encoder_tensors = load_file(str(encoder / "model.safetensors"))
    assert not any(t.shape == v.shape and torch.equal(t, v) for t in saved.values() for v in encoder_tensors.values())

    cached, uncached = load_policy(frozen_run, device="cpu"), load_policy(frozen_run, device="cpu", kv_cache=False)
    hf_weights = cached.model.patch_embed.encoder.hf.state_dict()
    assert all(torch.equal(hf_weights[k], v) for k, v in encoder_tensors.items())  # re-read from the folder
    act_in_env(cached, uncached)
    with pytest.raises(ExportError, match="vision_encoder.*torch backend"):
        check_exportable(cached.model)


def test_a_fine_tuned_run_saves_the_trained_encoder_and_loads_it_back(trainable_run, encoder):
    meta = load_checkpoint(trainable_run).meta
    assert meta["model"]["vision_encoder_trainable"] and meta["data_spec"]["vision_fingerprint"] == fingerprint(encoder)
    saved = load_file(str(trainable_run / "model.safetensors"))
    tuned = {k[len(ENCODER) + 3 :]: v for k, v in saved.items() if k.startswith(ENCODER + "hf.")}
    folder_weights = load_file(str(encoder / "model.safetensors"))
    assert set(folder_weights) <= set(tuned)
    key = "embedder.embedder.convolution.weight"
    assert not torch.equal(tuned[key], folder_weights[key])  # trained
    cached, uncached = (
        load_policy(trainable_run, device="cpu"),
        load_policy(trainable_run, device="cpu", kv_cache=False),
    )
    hf_weights = cached.model.patch_embed.encoder.hf.state_dict()
    assert all(torch.equal(hf_weights[k], v) for k, v in tuned.items())  # the checkpoint's, not the folder's
    act_in_env(cached, uncached)


def act_in_env(cached, uncached):
    env = gym.make("tabletop/PickPlace-v0", image_size=64)
    o, _ = env.reset(seed=3)
    for policy in (cached, uncached):
        policy.reset(o["instruction"])
    for _ in range(4):  # streaming == recompute with the encoder's patch tokens
        a, b = cached.act(o), uncached.act(o)
        np.testing.assert_allclose(a, b, atol=1e-5)
        assert a.shape == (4,) and np.all(np.abs(a) <= 1)
        o, *_ = env.step(a)
    env.close()


@pytest.mark.parametrize("which", ["frozen_run", "trainable_run"])
def test_loading_or_resuming_against_a_changed_encoder_is_refused_in_one_line(which, encoder, tmp_path, request):
    """Fine-tuned too: the folder's config and preprocessing decide what the saved weights compute."""
    run = request.getfixturevalue(which)
    recorded = fingerprint(encoder)
    saved = restorable(encoder)
    try:
        model = transformers.AutoModel.from_pretrained(encoder, local_files_only=True)
        with torch.no_grad():
            model.embedder.embedder.convolution.weight[0, 0, 0, 0] += 1e-3  # one weight, slightly
        model.save_pretrained(encoder)
        changed = fingerprint(encoder)
        assert changed != recorded
        with pytest.raises(VisionEncoderError) as e:
            load_policy(run, device="cpu")
        message = one_line(e)
        assert str(encoder.resolve()) in message and recorded in message and changed in message, message
        result = run_main("vla.cli.eval", "--checkpoint", run, "--episodes-per-task", 1, "--json", tmp_path / "e.json")
        err = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(err) == 1 and recorded in err[0] and changed in err[0], result.stderr
        resumed = tmp_path / "resumed"
        shutil.copytree(run, resumed, symlinks=True)
        result = run_main("vla.cli.train", "--out", resumed, "--resume", "train.steps=8")
        err = [line for line in result.stderr.splitlines() if line.startswith("vla-train: error:")]
        assert result.returncode == 2 and len(err) == 1 and changed in err[0], result.stderr
    finally:
        for f, data in saved.items():
            f.write_bytes(data)
    assert fingerprint(encoder) == recorded
    load_policy(run, device="cpu")  # the restored folder loads again


def test_a_moved_encoder_folder_is_refused_in_one_line_or_found_where_it_moved(frozen_run, encoder):
    moved = encoder.with_name("elsewhere")
    recorded = load_checkpoint(frozen_run).meta["data_spec"]["vision_fingerprint"]
    os.replace(encoder, moved)
    try:
        with pytest.raises(VisionEncoderError, match="folder is missing") as e:
            load_policy(frozen_run, device="cpu")
        assert str(encoder.resolve()) in one_line(e) and recorded in str(e.value)
        policy = load_policy(frozen_run, device="cpu", vision_encoder=moved)  # the same encoder, somewhere else
        assert policy.model.patch_embed.encoder.path == str(moved.resolve())
    finally:
        os.replace(moved, encoder)
    with pytest.raises(VisionEncoderError, match="this checkpoint has no vision encoder"):
        relocated({"model": {"vision_encoder": None}}, encoder)


def test_resume_with_a_vision_encoder_continues_the_run(trainable_run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(trainable_run, resumed, symlinks=True)
    assert train_main(["--out", str(resumed), "--resume", "train.steps=8"]) == 0
    meta = load_checkpoint(resumed).meta
    assert meta["step"] == 8 and meta["data_spec"] == load_checkpoint(trainable_run).meta["data_spec"]
    assert json.loads((resumed / "summary.json").read_text())["finished"]


def test_vla_export_refuses_a_vision_encoder_in_one_line(frozen_run, tmp_path):
    result = run_main("vla.cli.export", "--checkpoint", frozen_run, "--out", tmp_path / "x", "--parity-steps", 0)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr
    assert "model.vision_encoder=" in err[0] and "torch backend" in err[0], err
    assert not (tmp_path / "x").exists()
