"""Instruction tokenizer: a word-level vocabulary fitted on the dataset, with an unknown-word token.

Offline (no hub download) and stored with the checkpoint as JSON. Text is lower-cased and its
whitespace collapsed; it is then cut into pieces, each a word (`\\w+`) or one punctuation character,
carrying the single space that preceded it (SentencePiece-style, a space is prepended to the text):

    "Put the red block, please."  ->  [" put", " the", " red", " block", ",", " please", "."]

A piece seen in `fit` has its own id. Any other piece becomes ONE `<unk>` token: an unseen word then
costs one position of the fixed instruction length, and training injects made-up words
(envs/language.py) so the policy learns that `<unk>` carries no meaning.

Ids: 0 = <pad>, 1 = <bos> (first token of every encoding), 2..257 reserved (byte ids of the earlier
byte-fallback mode, kept so the word ids stay where trained checkpoints have them), then the words,
the first of them the `<unk>` sentinel (a string no text can cut into a piece).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

PAD_ID = 0
BOS_ID = 1
_N_SPECIAL = 2
_RESERVED = 256  # ids 2..257: the byte ids of the retired byte-fallback mode
_WORD_OFFSET = _N_SPECIAL + _RESERVED

_PIECE = re.compile(r" ?(?:\w+|[^\w\s])")
UNK = " <unk>"  # never a piece: "<" is punctuation, so the pieces of " <unk>" are " <", "unk", ">"


def normalize(text: str) -> str:
    """Lower-case and collapse whitespace: the text `decode(encode(text))` returns (unseen pieces as <unk>)."""
    return " ".join(text.lower().split())


def pieces(text: str) -> list[str]:
    """Cut normalized text into word/punctuation pieces, each with its preceding space."""
    return _PIECE.findall(" " + normalize(text))


def pad_encodings(encode, texts: Iterable[str], max_len: int) -> np.ndarray:
    """(B, max_len) int64: each row `encode(text, max_len)` right-padded with <pad> (= 0)."""
    texts = list(texts)
    out = np.full((len(texts), max_len), PAD_ID, dtype=np.int64)
    for row, text in enumerate(texts):
        ids = encode(text, max_len)
        out[row, : len(ids)] = ids
    return out


class TextTokenizer:
    """Word-level vocabulary with one `<unk>` token. `fit` on the dataset's instruction strings."""

    def __init__(self, words: Iterable[str] = ()):
        self.words: list[str] = list(words)  # pieces with their own id, in id order, <unk> first
        if not self.words or self.words[0] != UNK:
            self.words.insert(0, UNK)
        self._ids = {w: _WORD_OFFSET + i for i, w in enumerate(self.words)}

    @classmethod
    def fit(cls, texts: Iterable[str], min_count: int = 1, max_words: int | None = None) -> TextTokenizer:
        """Vocabulary = pieces seen at least `min_count` times, most frequent first (ties alphabetical)."""
        counts = Counter(p for t in texts for p in pieces(t))
        ranked = sorted((p for p, c in counts.items() if c >= min_count), key=lambda p: (-counts[p], p))
        return cls(ranked[:max_words] if max_words is not None else ranked)

    @property
    def vocab_size(self) -> int:
        return _WORD_OFFSET + len(self.words)

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """`[<bos>, ids...]`, truncated to `max_len` tokens (no padding; see `encode_batch`)."""
        ids = [BOS_ID] + [self._ids.get(p, _WORD_OFFSET) for p in pieces(text)]  # <unk> is the first word
        return ids[:max_len] if max_len is not None else ids

    def encode_batch(self, texts: Iterable[str], max_len: int) -> np.ndarray:
        """(B, max_len) int64, each row `encode(text, max_len)` right-padded with <pad> (= 0)."""
        return pad_encodings(self.encode, texts, max_len)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids (pads and <bos> skipped)."""
        out = []
        for i in (int(i) for i in ids):
            if i < _N_SPECIAL:
                continue
            if not _WORD_OFFSET <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary ({_WORD_OFFSET}..{self.vocab_size - 1})")
            out.append(self.words[i - _WORD_OFFSET])
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text

    def to_dict(self) -> dict:
        return {
            "kind": "word+byte", "version": 2, "pad_id": PAD_ID, "bos_id": BOS_ID, "unknown": "unk",
            "words": self.words,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> TextTokenizer:
        if d.get("kind") != "word+byte" or d.get("version") != 2:
            raise ValueError(f"not a word+byte text tokenizer v2: kind={d.get('kind')!r} version={d.get('version')!r}")
        if d.get("unknown") != "unk":
            raise ValueError(
                f"text tokenizer unknown={d.get('unknown')!r}: the byte fallback is retired (see docs); retrain"
            )
        return cls(d["words"])

    def __repr__(self) -> str:
        return f"TextTokenizer(words={len(self.words)}, vocab_size={self.vocab_size})"
