"""model.text_encoder: a pretrained Hugging Face encoder from a local folder, frozen, feeding the instruction tokens.

The encoder is a tiny randomly initialized BERT that the tests write themselves (config, weights and a
WordPiece vocabulary of the dataset's words), with the real transformers library; nothing is downloaded.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import envs  # noqa: F401 - registers the tasks
from tests.conftest import run_main
from vla.checkpoint import load_checkpoint
from vla.cli.train import main as train_main
from vla.config import ConfigError
from vla.data.sources import open_source
from vla.export.graphs import ExportError, check_exportable
from vla.model import ActionTransformer
from vla.model.text_encoder import FrozenTextEncoder, TextEncoderError, fingerprint
from vla.policy.load import load_policy
from vla.tokenizers.encoder import EncoderTokenizer
from vla.training.config import load_config
from vla.training.distributed import Distributed
from vla.training.train import build_optimizer, load_data, resolve_optional_keys, train_step

TINY = "configs/tiny.yaml"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_tiny_bert(folder, words, seed=0):
    """A randomly initialized 1-layer BERT (hidden 16, 2 heads) and its WordPiece tokenizer, saved as a
    Hugging Face model folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL + sorted(set(words))) + "\n")
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"))  # the vocabulary file (4.x and 5.x)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(folder)
    return folder


def dataset_words(path):
    src = open_source(path)
    text = " ".join(src.read(n, images=False).instruction for split in ("train", "valid") for n in src.names(split))
    return re.findall(r"\w+|[^\w\s]", text.lower())


@pytest.fixture(scope="module")
def encoder(tiny_dataset, tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("encoder") / "tiny-bert", dataset_words(tiny_dataset))


@pytest.fixture(scope="module")
def run(tiny_dataset, encoder, tmp_path_factory):
    """A tiny run trained with the text encoder."""
    out = tmp_path_factory.mktemp("run") / "enc"
    code = train_main(["--config", TINY, "--data", str(tiny_dataset), "--out", str(out), "train.steps=12",
                       "train.log_every=6", "train.checkpoint_every=12", f"model.text_encoder={encoder}"])  # fmt: skip
    assert code == 0
    return out


def test_a_path_that_is_not_a_local_directory_is_refused_before_transformers_is_asked(tmp_path, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("transformers was asked to load a model")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", no_hub)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    for path in ("bert-base-uncased", "google/flan-t5-small", tmp_path / "absent", tmp_path / "a_file"):
        for load in (FrozenTextEncoder, EncoderTokenizer.open):
            with pytest.raises(TextEncoderError, match="not a local directory") as e:
                load(path)
            assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TextEncoderError, match="no config.json"):
        FrozenTextEncoder(tmp_path / "empty")


def test_a_folder_transformers_cannot_load_is_one_line(encoder, tmp_path):
    (tmp_path / "config.json").write_bytes((encoder / "config.json").read_bytes())  # no weights, no tokenizer
    no_vocabulary = "no vocabulary|transformers cannot load it"  # transformers 5 loads an empty tokenizer, 4 refuses
    for load, why in ((FrozenTextEncoder, "transformers cannot load it"), (EncoderTokenizer.open, no_vocabulary)):
        with pytest.raises(TextEncoderError, match=why) as e:
            load(tmp_path)
        assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_the_cli_refuses_a_hub_name_in_one_line(tiny_dataset, tmp_path, capsys):
    code = train_main(["--config", TINY, "--data", str(tiny_dataset), "--out", str(tmp_path / "r"),
                       "model.text_encoder=bert-base-uncased"])  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vla-train: error:")]
    assert code == 2 and len(errors) == 1 and "bert-base-uncased: not a local directory" in errors[0], errors
    assert not (tmp_path / "r" / "latest").exists()


def test_a_relative_encoder_path_is_recorded_absolute(tiny_dataset, encoder, tmp_path, monkeypatch):
    config = os.path.abspath(TINY)
    monkeypatch.chdir(encoder.parent)
    code = train_main(["--config", config, "--data", str(tiny_dataset), "--out", str(tmp_path / "r"),
                       "train.steps=2", f"model.text_encoder={encoder.name}"])  # fmt: skip
    assert code == 0
    meta = load_checkpoint(tmp_path / "r").meta
    assert meta["model"]["text_encoder"] == meta["tokenizers"]["text"]["path"] == str(encoder.resolve())
    monkeypatch.chdir(tmp_path)
    load_policy(tmp_path / "r", device="cpu")  # from another directory


def test_the_encoder_and_its_tokenizer_load_local_files_only(encoder, monkeypatch):
    seen = []
    for cls in (transformers.AutoModel, transformers.AutoTokenizer):
        real = cls.from_pretrained

        def spy(*args, _real=real, **kwargs):
            seen.append(kwargs)
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    FrozenTextEncoder(encoder)
    EncoderTokenizer.open(encoder)
    assert len(seen) == 2 and all(kwargs.get("local_files_only") is True for kwargs in seen), seen


def test_config_text_encoder_fields():
    with pytest.raises(ConfigError, match="use null for the word table"):
        load_config(TINY, ["model.text_encoder=''"])
    with pytest.raises(ConfigError, match="'model.text_fingerprint' is decided by the data"):
        load_config(TINY, ["model.text_fingerprint=abc"])
    assert load_config(TINY, []).model.text_encoder is None  # the default: the word table
    assert load_config(TINY, ["model.text_encoder=null"]).model.text_encoder is None


def test_training_keeps_the_encoder_frozen_and_encodes_each_instruction_once(tiny_dataset, encoder):
    cfg = load_config(TINY, [f"model.text_encoder={encoder}", "train.batch_size=16"])
    cfg = dataclasses.replace(cfg, data=resolve_optional_keys(cfg.data, str(tiny_dataset)))  # as vla-train does
    data = load_data(cfg, str(tiny_dataset), None)
    assert isinstance(data.tokenizers.text, EncoderTokenizer) and data.spec.text_fingerprint == fingerprint(encoder)
    torch.manual_seed(0)
    model = ActionTransformer(cfg.model, data.spec)
    hf = model.text_encoder.hf
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    encoded_rows = []
    hf.register_forward_hook(lambda m, a, kw, out: encoded_rows.append(len(kw["input_ids"])), with_kwargs=True)
    optimizer, _ = build_optimizer(model, cfg, torch.device("cpu"))
    proj_before = model.instr_proj.weight.detach().clone()
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert not trained & {id(p) for p in hf.parameters()} and all(not p.requires_grad for p in hf.parameters())
    model.train()
    assert not hf.training  # .train() never reaches the frozen encoder: no dropout in its features
    loader = torch.utils.data.DataLoader(data.train_set, batch_size=16, shuffle=True, drop_last=True)
    seen, steps = set(), 0
    for batch in loader:
        batch.pop("demo")
        if steps == 0:  # a closed-loop evaluation between steps encodes under inference mode: training still works
            with torch.inference_mode():
                model.start(model.new_cache(16), batch["instruction"])
        seen |= {tuple(r) for r in batch["instruction"].tolist()}
        assert train_step(model, model, optimizer, batch, cfg, Distributed(torch.device("cpu")), False) is not None
        steps += 1
        if steps == 8:
            break
    after = hf.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the encoder's weights changed"
    assert not torch.equal(proj_before, model.instr_proj.weight)  # the projection into d_model does train
    assert sum(encoded_rows) == len(seen) < steps * 16, (encoded_rows, len(seen))  # once per distinct instruction
    assert all(not k.startswith("text_encoder") for k in model.state_dict())


def test_a_run_with_an_encoder_records_it_saves_none_of_it_and_its_policy_acts(run, encoder):
    meta = load_checkpoint(run).meta
    digest = fingerprint(encoder)
    assert meta["model"]["text_encoder"] == str(encoder.resolve())
    assert meta["data_spec"]["text_fingerprint"] == digest
    assert meta["tokenizers"]["text"] == {
        "kind": "hf-encoder", "version": 1, "path": str(encoder.resolve()), "fingerprint": digest,
    }  # fmt: skip
    saved = load_file(str(run / "model.safetensors"))
    encoder_tensors = load_file(str(encoder / "model.safetensors"))
    assert "instr_proj.weight" in saved and saved["instr_proj.weight"].shape == (32, 16)  # (d_model, hidden)
    assert not any(k.startswith("text_encoder") or "instr_embed" in k for k in saved)
    vocab_table = encoder_tensors["embeddings.word_embeddings.weight"].shape  # (encoder vocabulary, hidden)
    assert not any(t.shape == vocab_table for t in saved.values())

    cached, uncached = load_policy(run, device="cpu"), load_policy(run, device="cpu", kv_cache=False)
    assert torch.equal(cached.model.text_encoder.hf.embeddings.word_embeddings.weight,
                       encoder_tensors["embeddings.word_embeddings.weight"])  # fmt: skip  # re-read from the folder
    env = gym.make("tabletop/PickPlace-v0", image_size=64)
    o, _ = env.reset(seed=3)
    for policy in (cached, uncached):
        policy.reset(o["instruction"])
    for _ in range(5):  # streaming == recompute with the encoder's features in the prefix
        a, b = cached.act(o), uncached.act(o)
        np.testing.assert_allclose(a, b, atol=1e-5)
        assert a.shape == (4,) and np.all(np.abs(a) <= 1)
        o, *_ = env.step(a)
    env.close()

    tok = cached.tok.text
    red, blue = (torch.as_tensor(tok.encode_batch([f"put the {c} block in the bin"], 12)) for c in ("red", "blue"))
    same = (red == blue)[0] & (red != 0)[0]  # positions holding the same word piece
    assert same.sum() >= 5 and not same.all()
    ea, eb = cached.model.text_encoder(red), cached.model.text_encoder(blue)  # (1, L, hidden) the frozen features
    assert (ea - eb)[0, ~same & (red != 0)[0]].abs().amax() > 0.1  # the colour word
    assert (ea - eb)[0, same].abs().amax(-1).min() > 1e-5  # contextual: the shared words' features differ too
    fa, fb = cached.model.embed_instruction(red), cached.model.embed_instruction(blue)  # (1, L, d) the prefix inputs
    assert (fa - fb)[0].abs().amax() > 1e-3 * fa.abs().amax()
    with pytest.raises(ExportError, match="text_encoder.*torch backend"):
        check_exportable(cached.model)


def restorable(path):
    """The bytes of every file in `path`, to put back after a test changed them."""
    return {f: f.read_bytes() for f in path.iterdir()}


def test_loading_against_a_changed_encoder_is_refused_in_one_line(run, encoder, tmp_path):
    recorded = fingerprint(encoder)
    saved = restorable(encoder)
    try:
        model = transformers.AutoModel.from_pretrained(encoder, local_files_only=True)
        with torch.no_grad():
            model.embeddings.word_embeddings.weight[5, 0] += 1e-3  # one weight, slightly
        model.save_pretrained(encoder)
        changed = fingerprint(encoder)
        assert changed != recorded
        with pytest.raises(TextEncoderError) as e:
            load_policy(run, device="cpu")
        message = str(e.value)
        assert "\n" not in message and str(encoder.resolve()) in message, message
        assert recorded in message and changed in message, message
        result = run_main("vla.cli.eval", "--checkpoint", run, "--episodes-per-task", 1, "--json", tmp_path / "e.json")
        err = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(err) == 1 and recorded in err[0] and changed in err[0], result.stderr
        assert not (tmp_path / "e.json").exists()
    finally:
        for f, data in saved.items():
            f.write_bytes(data)
    assert fingerprint(encoder) == recorded
    load_policy(run, device="cpu")  # the restored folder loads again


def test_loading_with_the_encoder_folder_missing_is_refused_in_one_line_or_found_where_it_moved(run, encoder):
    moved = encoder.with_name("elsewhere")
    recorded = load_checkpoint(run).meta["data_spec"]["text_fingerprint"]
    os.replace(encoder, moved)
    try:
        with pytest.raises(TextEncoderError, match="folder is missing") as e:
            load_policy(run, device="cpu")
        message = str(e.value)
        assert "\n" not in message and str(encoder.resolve()) in message and recorded in message, message
        policy = load_policy(run, device="cpu", text_encoder=moved)  # the same encoder, somewhere else
        assert policy.model.text_encoder.path == policy.tok.text.path == str(moved.resolve())
        vocab = (moved / "vocab.txt").read_text()
        (moved / "vocab.txt").write_text(vocab + "zebra\n")  # no longer the same encoder
        with pytest.raises(TextEncoderError, match=f"differs from {recorded}"):
            load_policy(run, device="cpu", text_encoder=moved)
        (moved / "vocab.txt").write_text(vocab)
    finally:
        os.replace(moved, encoder)


def test_resume_with_an_encoder_continues_the_run(run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, symlinks=True)
    assert train_main(["--out", str(resumed), "--resume", "train.steps=14"]) == 0
    meta = load_checkpoint(resumed).meta
    assert meta["step"] == 14 and meta["tokenizers"]["text"] == load_checkpoint(run).meta["tokenizers"]["text"]
    assert json.loads((resumed / "summary.json").read_text())["finished"]


def test_the_core_never_imports_transformers_without_a_text_encoder(tiny_checkpoint):
    code = (
        "import sys; from vla.policy.load import load_policy; import vla.training.train; "
        f"p = load_policy({str(tiny_checkpoint)!r}, device='cpu'); p.reset('put the red block in the bin'); "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_text_encoder_for_a_word_table_checkpoint_is_refused(tiny_checkpoint, encoder):
    with pytest.raises(TextEncoderError, match="this checkpoint has no text encoder"):
        load_policy(tiny_checkpoint, device="cpu", text_encoder=encoder)
