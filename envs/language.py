"""Paraphrases of the tabletop instructions: a small grammar, split into a training part and a held-out part.

Every task phrases its episodes with three fixed templates (envs/tasks/*.py). A policy trained on those
alone knows only their words: "put the red cube in the container" spells "cube" and "container" as
bytes it never learned. This grammar rephrases an instruction of the same task with the same colour
words: synonyms for the objects, verbs and prepositions per task, sentence frames, politeness.

    paraphrase("pick_place", {"block": "green"}, rng)   -> "lift the green cube and get it into the tray"
    paraphrase("push", {"block": "red", "target": "blue"}, rng, HELD_OUT)
                                                        -> "drag the box that is red on to the blue marker"

Colours are copied exactly, in the template's order (never replaced, dropped or added), and each object
keeps its identity (a block is always named by a block noun, a target zone by a zone noun, the bin by a
bin noun), so the colour words and the object nouns still decide what the instruction means.

The productions are split. TRAIN (frames that generate every template, plus synonyms) is what training
augmentation draws from and what the tokenizer's vocabulary is fitted on. HELD_OUT holds other sentence
frames (the colour after the noun, "goes", "find ... and ...") and other synonyms, verbs and fillers;
`vla-eval --instructions paraphrase` draws from it, so the probe measures instructions the policy has
never seen. A held-out sentence always has a held-out frame, and each word slot draws a held-out
alternative with probability `novel` (else a training one), so most carry words outside the training
vocabulary. Drawing is deterministic given the numpy Generator.

`augment` is the training-time noise on top: a paraphrase (tabletop tasks), then word dropout of
function words and an injected made-up word (the tokenizer reads it as its one `<unk>` token, so the
policy learns that a word it does not know carries no meaning). Instructions of other datasets (no parse
against the task's templates) keep every content word: they get only the dropout of function words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from envs.tabletop_env import TASK_CLASSES
from envs.tasks.base import PALETTE

# The colour slots of each task's templates, in the order they appear (the names of their format fields).
COLOUR_SLOTS: dict[str, tuple[str, ...]] = {
    "reach": ("block",),
    "push": ("block", "target"),
    "pick_place": ("block",),
    "stack": ("block", "base"),
}
_SLOT = re.compile(r"\{(\w+)\}")  # {block}: a colour slot (lower case); {CUBE}: a word class (upper case)


@dataclass(frozen=True)
class Grammar:
    """One side of the split: sentence frames per task, and the alternatives of each word class."""

    frames: Mapping[str, tuple[str, ...]]  # task -> frames with {colour} slots and {CLASS} word classes
    words: Mapping[str, tuple[str, ...]]  # word class -> alternatives (one or more words each)
    openers: tuple[str, ...]  # politeness before the sentence
    closers: tuple[str, ...]  # after it


TRAIN = Grammar(
    frames={
        "reach": (
            "{REACH} the {block} {CUBE}",
            "{REACH} the {block} {CUBE} with the gripper",
            "move the gripper until it is at the {block} {CUBE}",
        ),
        "push": (
            "{PUSH} the {block} {CUBE} {ONTO} the {target} {ZONE}",
            "{PUSH} the {block} {CUBE} until it is on the {target} {ZONE}",
        ),
        "pick_place": (
            "{PLACE} the {block} {CUBE} {INTO} the {BIN}",
            "{GRAB} the {block} {CUBE} and {PLACE} it {INTO} the {BIN}",
            "{PLACE} the {block} {CUBE} so it is {INTO} the {BIN}",
        ),
        "stack": (
            "{STACK} the {block} {CUBE} {ON} the {base} {CUBE}",
            "{GRAB} the {block} {CUBE} and {STACK} it {ON} the {base} {CUBE}",
            "{STACK} the {block} {CUBE} so it is {ON} the {base} {CUBE}",
        ),
    },
    words={
        "CUBE": ("block", "cube", "box", "brick"),
        "ZONE": ("target", "zone", "circle", "pad", "spot", "mark", "disc"),
        "BIN": ("bin", "container", "basket", "tray"),
        "REACH": ("reach", "touch", "go to", "move to", "approach", "move the gripper to", "get to"),
        "PUSH": ("push", "slide", "shove", "move", "nudge"),
        "PLACE": ("put", "place", "drop", "move", "get"),
        "STACK": ("stack", "put", "place", "set"),
        "GRAB": ("pick up", "grab", "take", "lift"),
        "ONTO": ("onto", "to", "on to", "over to"),
        "INTO": ("in", "into", "inside"),
        "ON": ("on", "onto", "on top of"),
    },
    openers=("please", "could you", "can you", "now"),
    closers=("please", "now", "for me"),
)

HELD_OUT = Grammar(
    frames={
        "reach": (
            "{REACH} the {CUBE} that is {block}",
            "find the {block} {CUBE} and {REACH} it",
        ),
        "push": (
            "{PUSH} the {CUBE} that is {block} {ONTO} the {target} {ZONE}",
            "get the {block} {CUBE} {ONTO} the {target} {ZONE} by pushing it",
        ),
        "pick_place": (
            "{PLACE} the {CUBE} that is {block} {INTO} the {BIN}",
            "the {block} {CUBE} goes {INTO} the {BIN}",
        ),
        "stack": (
            "{STACK} the {CUBE} that is {block} {ON} the {base} {CUBE}",
            "the {block} {CUBE} goes {ON} the {base} {CUBE}",
        ),
    },
    words={
        "CUBE": ("cuboid", "piece"),
        "ZONE": ("marker", "patch"),
        "BIN": ("crate", "bucket"),
        "REACH": ("hover over", "head to"),
        "PUSH": ("shift", "drag"),
        "PLACE": ("deposit", "stow"),
        "STACK": ("rest", "pile"),
        "ONTO": ("across to", "right onto"),
        "INTO": ("down into",),
        "ON": ("atop", "upon"),
    },
    openers=("kindly", "would you", "go ahead and"),
    closers=("thanks", "right away"),
)

OPENER_P, CLOSER_P = 0.3, 0.2  # how often a paraphrase starts / ends with politeness
NOVEL_P = 0.5  # held-out sentences: chance that a word slot takes a held-out alternative
DROPPABLE = frozenset({"the", "it", "and", "please", "now", "a"})  # words dropout may remove (never content)
DROP_P = 0.1  # per droppable word
UNKNOWN_P = 0.25  # chance of one made-up word (inserted, or replacing a non-colour word)


def task_name(task: str) -> str | None:
    """The tabletop task's short name for a short name or a gymnasium id ("tabletop/PickPlace-v0"); else None."""
    if task in TASK_CLASSES:
        return task
    import envs

    return next((name for name in TASK_CLASSES if envs.task_id(name) == task), None)


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def paraphrase(task: str, colours: Mapping[str, str], rng: np.random.Generator, grammar: Grammar = TRAIN) -> str:
    """A sentence of `grammar` for `task` (a short name or id) naming exactly `colours` (slot -> colour)."""
    name = task_name(task)
    if name is None:
        raise ValueError(f"no paraphrase grammar for task {task!r}; tabletop tasks: {', '.join(TASK_CLASSES)}")
    if set(colours) != set(COLOUR_SLOTS[name]):
        raise ValueError(f"{name} names the colours of {COLOUR_SLOTS[name]}, got {dict(colours)}")
    held_out = grammar is not TRAIN

    def choose(train: tuple[str, ...], novel: tuple[str, ...]) -> str:
        return _pick(rng, novel if held_out and novel and rng.random() < NOVEL_P else train)

    def fill(match: re.Match) -> str:
        key = match.group(1)
        if key in colours:
            return colours[key]
        return choose(TRAIN.words[key], HELD_OUT.words.get(key, ()))

    sentence = _SLOT.sub(fill, _pick(rng, grammar.frames[name]))
    if rng.random() < OPENER_P and not sentence.startswith("the "):  # openers lead imperatives only
        sentence = f"{choose(TRAIN.openers, HELD_OUT.openers)} {sentence}"
    if rng.random() < CLOSER_P:
        closer = choose(TRAIN.closers, HELD_OUT.closers)
        sentence = sentence if sentence.startswith(closer) else f"{sentence} {closer}"
    return " ".join(sentence.split())


def vocabulary(grammar: Grammar = TRAIN) -> set[str]:
    """Every word a sentence of `grammar` can hold, colours excluded (TRAIN: with the templates' words)."""
    texts = [f for frames in grammar.frames.values() for f in frames] + [*grammar.openers, *grammar.closers]
    texts += [w for alternatives in grammar.words.values() for w in alternatives]
    if grammar is TRAIN:
        texts += [t for cls in TASK_CLASSES.values() for t in cls.templates]
    return {w for t in texts for w in _SLOT.sub(" ", t).split()}


TRAIN_VOCABULARY = vocabulary(TRAIN)


def parse(task: str, instruction: str) -> dict[str, str] | None:
    """The colour words of an instruction written by one of `task`'s templates, or None (other phrasing,
    another dataset's task)."""
    name = task_name(task)
    if name is None:
        return None
    for template in TASK_CLASSES[name].templates:
        pattern = _SLOT.sub(lambda m: f"(?P<{m.group(1)}>[a-z]+)", template)
        match = re.fullmatch(pattern, " ".join(instruction.lower().split()))
        if match:
            return match.groupdict()
    return None


def made_up_word(rng: np.random.Generator, known: set[str]) -> str:
    """A pronounceable non-word of 2-3 syllables ("tavoke"), not in `known` and not a colour."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    while True:
        n = int(rng.integers(2, 4))
        word = "".join(_pick(rng, tuple(consonants)) + _pick(rng, tuple(vowels)) for _ in range(n))
        if word not in known and word not in PALETTE:
            return word


def augment(
    task: str,
    instruction: str,
    rng: np.random.Generator,
    paraphrase_p: float,
    fits: Callable[[str], bool] = lambda s: True,
    tries: int = 8,
) -> str:
    """A training instruction for a demo of `task`: with probability `paraphrase_p` a TRAIN paraphrase
    with the instruction's colour words (tabletop tasks whose instruction parses), then word dropout and
    an injected made-up word (other instructions: the dropout only). `fits(sentence)` is the model's length
    limit: a draw that does not fit is redrawn (up to `tries` times, else the instruction stays), noise that
    would not fit is skipped, so truncation never cuts a colour word off a training instruction."""
    text = " ".join(instruction.lower().split())
    colours = parse(task, text)
    if colours is not None and rng.random() < paraphrase_p:
        for _ in range(tries):
            candidate = paraphrase(task, colours, rng)
            if fits(candidate):
                text = candidate
                break
    keep = set(colours.values()) if colours else set()
    words = [w for w in text.split() if w in keep or w not in DROPPABLE or rng.random() >= DROP_P]
    if colours is not None and rng.random() < UNKNOWN_P:  # other datasets: no word of theirs is replaced
        new = made_up_word(rng, TRAIN_VOCABULARY | keep)
        replaceable = [i for i, w in enumerate(words) if w not in keep]
        noisy = list(words)
        if replaceable and rng.random() < 0.5:
            noisy[_pick(rng, tuple(replaceable))] = new  # as an unseen synonym would stand
        else:
            noisy.insert(int(rng.integers(len(words) + 1)), new)  # as a filler would
        words = noisy if fits(" ".join(noisy)) else words
    return " ".join(words) if words else text
