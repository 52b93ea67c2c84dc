"""Instruction paraphrases (envs/language.py): the grammar's split, training augmentation and the held-out probe."""

import itertools
import json
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs
from envs import language
from envs.tabletop_env import INSTRUCTION_CHARSET, TASK_CLASSES
from envs.tasks.base import PALETTE
from vla.cli.eval import main as eval_main
from vla.data.hdf5_format import ObsKeys
from vla.data.windows import EpochSampler, WindowDataset, fit_tokenizers
from vla.tokenizers.text import pieces

COLOURS = {"reach": {"block": "red"}, "push": {"block": "green", "target": "purple"},
           "pick_place": {"block": "yellow"}, "stack": {"block": "blue", "base": "orange"}}  # fmt: skip
NOUNS = {cls: set(language.TRAIN.words[cls] + language.HELD_OUT.words[cls]) for cls in ("CUBE", "ZONE", "BIN")}
GRAMMARS = {"train": language.TRAIN, "held_out": language.HELD_OUT}


def colour_words(sentence: str) -> list[str]:
    return [w for w in sentence.split() if w in PALETTE]


def sentences(task: str, grammar, seed: int, n: int = 300) -> list[str]:
    rng = np.random.default_rng(seed)
    return [language.paraphrase(task, COLOURS[task], rng, grammar) for _ in range(n)]


def language_regex(grammar, task: str) -> re.Pattern:
    """Every sentence `grammar` can produce for `task` (any colours), as one regex: frames with each word
    class as an alternation of the alternatives either part may fill it with, politeness optional."""

    def alternatives(options):
        return "(?:" + "|".join(re.escape(o) for o in sorted(options, key=len, reverse=True)) + ")"

    def slot(m):
        key = m.group(1)
        if key.islower():
            return "[a-z]+"
        return alternatives(language.TRAIN.words[key] + language.HELD_OUT.words.get(key, ()))

    frames = "|".join(language._SLOT.sub(slot, f) for f in grammar.frames[task])
    polite = alternatives(language.TRAIN.openers + language.HELD_OUT.openers + language.TRAIN.closers)
    closers = alternatives(language.TRAIN.closers + language.HELD_OUT.closers)
    return re.compile(f"(?:{polite} )?(?:{frames})(?: {closers})?")


@pytest.mark.parametrize("part", GRAMMARS)
@pytest.mark.parametrize("task", list(TASK_CLASSES))
def test_paraphrases_keep_the_colour_words_and_the_objects_and_are_deterministic(task, part):
    grammar = GRAMMARS[part]
    drawn = sentences(task, grammar, seed=3)
    assert drawn == sentences(task, grammar, seed=3)  # the same generator state: the same sentences
    assert drawn != sentences(task, grammar, seed=4)
    assert len(set(drawn)) > 50  # a grammar, not a handful of strings
    expected = list(COLOURS[task].values())
    for s in drawn:
        assert colour_words(s) == expected, s  # exact, in order, none dropped or added
        words = set(s.split())
        assert words & NOUNS["CUBE"], s  # the block is still named as a block
        assert bool(words & NOUNS["ZONE"]) == (task == "push"), s  # a target zone only where there is one
        assert bool(words & NOUNS["BIN"]) == (task == "pick_place"), s
        if task == "stack":
            assert sum(w in NOUNS["CUBE"] for w in s.split()) == 2, s  # two blocks: the moved one and the base
        assert set(s) <= set(INSTRUCTION_CHARSET), s  # fits the env's instruction space
    assert re.fullmatch(language_regex(grammar, task), drawn[0])  # the test's regex describes the grammar


@pytest.mark.parametrize("task", list(TASK_CLASSES))
def test_held_out_frames_and_words_are_disjoint_from_training(task):
    train_frames, held_frames = set(language.TRAIN.frames[task]), set(language.HELD_OUT.frames[task])
    templates = {language._SLOT.sub(lambda m: "{" + m.group(1) + "}", t) for t in TASK_CLASSES[task].templates}
    assert not train_frames & held_frames and not held_frames & templates
    train_language = language_regex(language.TRAIN, task)
    for template in TASK_CLASSES[task].templates:  # every demo's instruction is a training sentence
        assert train_language.fullmatch(template.format(**COLOURS[task])), template
    for s in sentences(task, language.HELD_OUT, seed=5):
        assert not train_language.fullmatch(s), s  # never a sentence training can produce
        assert set(s.split()) - language.TRAIN_VOCABULARY - set(PALETTE), s  # a word training never used
    for s in sentences(task, language.TRAIN, seed=5):
        assert set(s.split()) <= language.TRAIN_VOCABULARY | set(PALETTE), s


def test_every_held_out_synonym_and_filler_has_a_word_training_never_uses():
    held = [*itertools.chain.from_iterable(language.HELD_OUT.words.values()), *language.HELD_OUT.openers,
            *language.HELD_OUT.closers]  # fmt: skip
    for option in held:
        assert set(option.split()) - language.TRAIN_VOCABULARY, option
    assert {"cube", "container", "basket", "pad"} <= language.TRAIN_VOCABULARY  # the plain words a user tries
    assert {"cuboid", "crate", "marker", "kindly"} <= language.vocabulary(language.HELD_OUT) - language.TRAIN_VOCABULARY


def test_parse_reads_the_colour_words_of_a_template_only():
    assert language.parse("tabletop/Push-v0", "slide the red block to the blue zone") == {
        "block": "red",
        "target": "blue",
    }
    assert language.parse("stack", "put the green block on top of the red block") == {"block": "green", "base": "red"}
    assert language.parse("tabletop/Reach-v0", "reach the cube that is red") is None  # not a template
    assert language.parse("libero/kitchen", "put the bowl on the plate") is None  # not a tabletop task
    with pytest.raises(ValueError, match="names the colours"):
        language.paraphrase("push", {"block": "red"}, np.random.default_rng(0))


def test_augment_changes_instructions_but_never_their_colour_words():
    own = "push the red block onto the blue target"
    out = [language.augment("tabletop/Push-v0", own, np.random.default_rng([0, i]), 0.8) for i in range(400)]
    assert out == [language.augment("tabletop/Push-v0", own, np.random.default_rng([0, i]), 0.8) for i in range(400)]
    assert all(colour_words(s) == ["red", "blue"] for s in out)
    assert 0.6 < np.mean([s != own for s in out]) < 1.0
    unknown = [w for s in out for w in s.split() if w not in language.TRAIN_VOCABULARY | set(PALETTE)]
    assert len(unknown) > 40  # made-up words, for the policy to learn to read past
    # With no paraphrases only the noise changes it: function words dropped, at most one made-up word
    # inserted or standing for one other word; the colours stay.
    known = language.TRAIN_VOCABULARY | set(PALETTE)
    plain = [language.augment("tabletop/Push-v0", own, np.random.default_rng([1, i]), 0.0) for i in range(200)]
    for s in plain:
        kept, made_up = [w for w in s.split() if w in known], [w for w in s.split() if w not in known]
        rest = iter(own.split())
        assert all(w in rest for w in kept), s  # what is left is in the original order
        missing = [w for w in own.split() if w not in kept and w not in language.DROPPABLE]
        assert len(made_up) <= 1 and len(missing) <= len(made_up) and colour_words(s) == ["red", "blue"], s
    assert any(s != own for s in plain) and sum(s == own for s in plain) > 100
    # Another dataset's instruction: every content word stays, in order; no made-up word is added.
    foreign = "put the bowl on the plate"
    for i in range(200):
        s = language.augment("libero/kitchen", foreign, np.random.default_rng([2, i]), 0.8)
        assert [w for w in s.split() if w not in language.DROPPABLE] == ["put", "bowl", "on", "plate"], s
    # A length limit is respected: nothing is made longer than the model reads.
    short = [language.augment("push", own, np.random.default_rng([3, i]), 1.0, lambda s: len(s.split()) <= 8)
             for i in range(200)]  # fmt: skip
    assert all(len(s.split()) <= 8 for s in short) and any(s != own for s in short)


# ----------------------------------------------------------------------------------- the dataset


@pytest.fixture(scope="module")
def tokenizers(tiny_dataset):
    return fit_tokenizers(tiny_dataset, "train", ObsKeys(), 32, "uniform", paraphrase_vocabulary=True)


def test_the_fitted_vocabulary_gives_every_training_synonym_its_own_id(tiny_dataset, tokenizers):
    plain = fit_tokenizers(tiny_dataset, "train", ObsKeys(), 32, "uniform").text
    fitted = tokenizers.text
    word_ids = lambda tok, w: tok.encode(w)[1:]  # noqa: E731 - without <bos>
    for word in sorted(language.TRAIN_VOCABULARY):
        assert len(word_ids(fitted, word)) == 1, word  # one id: the word, not its bytes
    unk = fitted.encode("zzyzx")[1:]  # the one <unk> token
    assert word_ids(plain, "cube") == unk  # the templates alone do not know it
    assert word_ids(fitted, "cuboid") == unk  # held out: never given an id
    assert set(plain.words) <= set(fitted.words)  # the demos' words keep theirs


def windows(tiny_dataset, tokenizers, augment: float, seed: int = 0) -> WindowDataset:
    return WindowDataset(tiny_dataset, "train", tokenizers, window=2, chunk=1, instruction_len=16, preload=True,
                         instruction_augment=augment, seed=seed)  # fmt: skip


def test_augmented_windows_rephrase_the_instruction_and_keep_its_colours(tiny_dataset, tokenizers):
    ds = windows(tiny_dataset, tokenizers, 0.8)
    changed = 0
    for i in range(0, len(ds), 3):
        d = int(ds.index[i][0])
        own, text = ds.instruction_texts[d], ds.instruction_text(i)
        ids = tokenizers.text.encode(text)
        assert len(ids) <= 16 and ds[i]["instruction"].tolist()[: len(ids)] == ids  # nothing truncated
        assert colour_words(text) == colour_words(own), (own, text)
        changed += text != own
    assert changed > 0.5 * len(range(0, len(ds), 3))
    off = windows(tiny_dataset, tokenizers, 0.0)
    assert all(tokenizers.text.decode(off[i]["instruction"]) == off.instruction_texts[int(off.index[i][0])]
               for i in range(0, len(off), 7))  # fmt: skip


def test_augmented_windows_are_reproducible_across_runs_and_workers(tiny_dataset, tokenizers):
    a, b = windows(tiny_dataset, tokenizers, 0.8, seed=1), windows(tiny_dataset, tokenizers, 0.8, seed=1)
    other = windows(tiny_dataset, tokenizers, 0.8, seed=2)
    picks = range(0, len(a), 5)
    assert all(torch.equal(a[i]["instruction"], b[i]["instruction"]) for i in picks)
    assert any(not torch.equal(a[i]["instruction"], other[i]["instruction"]) for i in picks)
    assert torch.equal(a[11]["instruction"], a[11]["instruction"])  # no state carried between calls

    def stream(workers: int, start_step: int = 0):
        sampler = EpochSampler(len(a), 4, seed=1, start_step=start_step)
        loader = torch.utils.data.DataLoader(a, batch_size=4, sampler=sampler, num_workers=workers)
        return [batch["instruction"] for batch, _ in zip(loader, range(6), strict=False)]

    single, parallel = stream(0), stream(2)
    assert all(torch.equal(x, y) for x, y in zip(single, parallel, strict=True))
    resumed = stream(0, start_step=3)  # as after a kill at step 3: the same instructions from there on
    assert all(torch.equal(x, y) for x, y in zip(single[3:], resumed[:3], strict=True))


# ------------------------------------------------------------------------------------ the probe


def test_vla_eval_paraphrase_runs_held_out_rephrasings_of_each_episode(tiny_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    assert eval_main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "1", "--seed", "3",
                      "--instructions", "paraphrase", "--json", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["instructions"] == "paraphrase"
    assert sorted(result["tasks"]) == sorted(envs.TASKS) and result["overall"]["episodes"] == len(envs.TASKS)
    vocabulary = set(json.loads((tiny_checkpoint / "config.json").read_text())["tokenizers"]["text"]["words"])
    for task, episodes in result["episodes_detail"].items():
        env = gym.make(task, image_size=32)
        name = language.task_name(task)
        held_out = language_regex(language.HELD_OUT, name)
        for k, ep in enumerate(episodes):
            own = env.reset(seed=3 + k)[0]["instruction"]
            said = ep["instruction"]
            assert said != own and language.parse(task, said) is None  # not a template's sentence
            assert held_out.fullmatch(said), said
            assert colour_words(said) == colour_words(own), (own, said)  # the same objects are asked for
            assert {p.strip() for p in pieces(said)} - {w.strip() for w in vocabulary} - set(PALETTE)  # unseen words
        env.close()
