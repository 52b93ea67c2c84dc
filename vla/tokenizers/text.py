"""Instruction tokenizer: a word-level vocabulary fitted on the dataset, with an unknown-word token.

Offline (no hub download) and stored with the checkpoint as JSON. Text is lower-cased and its
whitespace collapsed; it is then cut into pieces, each a word (`\\w+`) or one punctuation character,
carrying the single space that preceded it (SentencePiece-style, a space is prepended to the text):

    "Put the red block, please."  ->  [" put", " the", " red", " block", ",", " please", "."]

A piece seen in `fit` has its own id. Any other piece becomes ONE `<unk>` token (`unknown="unk"`, the
default): an unseen word then costs one position of the fixed instruction length, and training injects
made-up words (envs/language.py) so the policy learns that `<unk>` carries no meaning. With
`unknown="bytes"` an unseen piece is spelled as its UTF-8 bytes instead (one token per byte), and
`decode(encode(s))` gives back the normalized text exactly (unless `max_len` truncated it); an
unseen word then costs as many positions as it has letters.

Ids: 0 = <pad>, 1 = <bos> (first token of every encoding), 2..257 = bytes 0..255, then the words; in
"unk" mode the first word is the `<unk>` sentinel (a string no text can cut into a piece).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

PAD_ID = 0
BOS_ID = 1
_N_SPECIAL = 2
_BYTE_OFFSET = _N_SPECIAL  # id of byte b is _BYTE_OFFSET + b
_N_BYTES = 256
_WORD_OFFSET = _BYTE_OFFSET + _N_BYTES

_PIECE = re.compile(r" ?(?:\w+|[^\w\s])")
UNK = " <unk>"  # never a piece: "<" is punctuation, so the pieces of " <unk>" are " <", "unk", ">"
UNKNOWN_MODES = ("unk", "bytes")


def normalize(text: str) -> str:
    """Lower-case and collapse whitespace: the text `decode(encode(text))` returns."""
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
    """Word-level vocabulary plus byte fallback. `fit` on the dataset's instruction strings."""

    def __init__(self, words: Iterable[str] = (), unknown: str = "bytes"):
        if unknown not in UNKNOWN_MODES:
            raise ValueError(f"unknown={unknown!r}: expected one of {UNKNOWN_MODES}")
        self.words: list[str] = list(words)  # pieces with their own id, in id order
        if unknown == "unk" and (not self.words or self.words[0] != UNK):
            self.words.insert(0, UNK)
        self.unknown = unknown
        self._ids = {w: _WORD_OFFSET + i for i, w in enumerate(self.words)}

    @classmethod
    def fit(
        cls, texts: Iterable[str], min_count: int = 1, max_words: int | None = None, unknown: str = "unk"
    ) -> TextTokenizer:
        """Vocabulary = pieces seen at least `min_count` times, most frequent first (ties alphabetical)."""
        counts = Counter(p for t in texts for p in pieces(t))
        ranked = sorted((p for p, c in counts.items() if c >= min_count), key=lambda p: (-counts[p], p))
        return cls(ranked[:max_words] if max_words is not None else ranked, unknown)

    @property
    def vocab_size(self) -> int:
        return _WORD_OFFSET + len(self.words)

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """`[<bos>, ids...]`, truncated to `max_len` tokens (no padding; see `encode_batch`)."""
        ids = [BOS_ID]
        for p in pieces(text):
            i = self._ids.get(p)
            if i is None:
                i = _WORD_OFFSET if self.unknown == "unk" else None  # <unk> is the first word
            ids.extend([i] if i is not None else [_BYTE_OFFSET + b for b in p.encode("utf-8")])
        return ids[:max_len] if max_len is not None else ids

    def encode_batch(self, texts: Iterable[str], max_len: int) -> np.ndarray:
        """(B, max_len) int64, each row `encode(text, max_len)` right-padded with <pad> (= 0)."""
        return pad_encodings(self.encode, texts, max_len)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids (pads and <bos> skipped; runs of byte tokens decoded as UTF-8)."""
        out, pending = [], bytearray()
        for i in (int(i) for i in ids):
            if i < _N_SPECIAL:
                continue
            if i < _WORD_OFFSET:
                pending.append(i - _BYTE_OFFSET)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if i - _WORD_OFFSET >= len(self.words):
                raise ValueError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self.words[i - _WORD_OFFSET])
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text

    def to_dict(self) -> dict:
        return {
            "kind": "word+byte", "version": 2, "pad_id": PAD_ID, "bos_id": BOS_ID, "unknown": self.unknown,
            "words": self.words,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> TextTokenizer:
        """Reads version 2 and version 1 (before `<unk>`: unseen pieces were always spelled as bytes)."""
        if d.get("kind") != "word+byte" or d.get("version") not in (1, 2):
            raise ValueError(f"not a word+byte text tokenizer: kind={d.get('kind')!r} version={d.get('version')!r}")
        return cls(d["words"], d.get("unknown", "bytes"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        return f"TextTokenizer(words={len(self.words)}, vocab_size={self.vocab_size}, unknown={self.unknown!r})"
