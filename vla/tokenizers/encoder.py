"""A pretrained text encoder's own tokenizer (`model.text_encoder`, vla/model/text_encoder.py), numpy-only.

The checkpoint records the encoder folder's path and fingerprint; loading refuses a folder that is missing
or whose fingerprint differs (one line, exit 2). Ids are the encoder tokenizer's ids plus one, so that 0
stays the padding id the network masks. `transformers` is imported only when such a tokenizer is opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from vla.errors import UserError
from vla.hf_folder import ModelFolder
from vla.tokenizers.text import PAD_ID, pad_encodings

KIND, VERSION = "hf-encoder", 1


class TextEncoderError(UserError):
    """The text encoder folder is not there, not a model folder, or not the one a checkpoint was trained on."""


FOLDER = ModelFolder("text encoder", "model.text_encoder", "text", TextEncoderError)
fingerprint = FOLDER.fingerprint  # the text encoder folder's (vla/hf_folder.py)


def relocated(meta: dict, path: str | os.PathLike) -> dict:
    """A checkpoint's config.json with its text encoder folder at `path` (the same encoder, moved: the
    recorded fingerprint still decides whether it loads)."""
    text = meta.get("tokenizers", {}).get("text", {})
    if text.get("kind") != KIND:
        raise TextEncoderError(f"text_encoder={str(path)!r} given, but this checkpoint has no text encoder")
    folder = str(Path(path).expanduser().resolve())
    tokenizers = {**meta["tokenizers"], "text": {**text, "path": folder}}
    return {**meta, "model": {**meta["model"], "text_encoder": folder}, "tokenizers": tokenizers}


class EncoderTokenizer:
    """The encoder's own tokenizer behind `TextTokenizer`'s interface; saved with the checkpoint as its
    folder's path and fingerprint (the vocabulary itself stays in the folder)."""

    def __init__(self, path: str, fingerprint: str, hf_tokenizer):
        self.path, self.fingerprint, self.hf = path, fingerprint, hf_tokenizer

    @classmethod
    def open(cls, path: str | os.PathLike, expected_fingerprint: str | None = None) -> EncoderTokenizer:
        folder, digest = FOLDER.checked(path, expected_fingerprint)
        hf = FOLDER.from_pretrained("AutoTokenizer", folder)
        # transformers 5 builds an empty tokenizer (special tokens only) from a folder without tokenizer files:
        # every word would become [UNK]
        if len(hf) <= len(set(hf.all_special_ids)):
            raise TextEncoderError(
                f"text encoder {path}: no vocabulary (the folder has no tokenizer files such as tokenizer.json or "
                "vocab.txt); save the model's tokenizer into it too"
            )
        return cls(str(folder), digest, hf)

    @property
    def vocab_size(self) -> int:
        return len(self.hf) + 1  # + our padding id 0

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """The tokenizer's ids (with its special tokens, e.g. [CLS] ... [SEP]) plus one, truncated to `max_len`."""
        ids = self.hf(text, truncation=max_len is not None, max_length=max_len)["input_ids"]
        return [i + 1 for i in ids]

    def encode_batch(self, texts: Iterable[str], max_len: int) -> np.ndarray:
        """(B, max_len) int64, each row `encode(text, max_len)` right-padded with 0."""
        return pad_encodings(self.encode, texts, max_len)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids (padding skipped; special tokens shown, e.g. [CLS])."""
        return self.hf.decode([int(i) - 1 for i in ids if int(i) != PAD_ID])

    def to_dict(self) -> dict:
        return {"kind": KIND, "version": VERSION, "path": self.path, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, d: dict) -> EncoderTokenizer:
        if d.get("kind") != KIND or d.get("version") != VERSION:
            raise ValueError(
                f"not a {KIND} v{VERSION} text tokenizer: kind={d.get('kind')!r} version={d.get('version')!r}"
            )
        return cls.open(d["path"], d["fingerprint"])

    def __repr__(self) -> str:
        return f"EncoderTokenizer({self.path}, fingerprint={self.fingerprint}, vocab_size={self.vocab_size})"
