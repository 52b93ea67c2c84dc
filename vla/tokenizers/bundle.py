"""The tokenizers a checkpoint stores, as one bundle: instruction text, actions, proprioception (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass

from vla.tokenizers.action import ActionTokenizer
from vla.tokenizers.encoder import KIND as ENCODER_KIND
from vla.tokenizers.encoder import EncoderTokenizer
from vla.tokenizers.proprio import ProprioNormalizer
from vla.tokenizers.text import TextTokenizer


@dataclass
class Tokenizers:
    """Everything that turns raw observations/actions into model inputs; saved with a checkpoint."""

    text: TextTokenizer | EncoderTokenizer  # a word table, or a pretrained text encoder's own tokenizer
    action: ActionTokenizer
    proprio: ProprioNormalizer

    @property
    def text_fingerprint(self) -> str:
        """The text encoder folder's fingerprint (vla/tokenizers/encoder.py), "" for the word table."""
        return self.text.fingerprint if isinstance(self.text, EncoderTokenizer) else ""

    def to_dict(self) -> dict:
        return {"text": self.text.to_dict(), "action": self.action.to_dict(), "proprio": self.proprio.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> Tokenizers:
        return cls(
            text=(EncoderTokenizer if d["text"].get("kind") == ENCODER_KIND else TextTokenizer).from_dict(d["text"]),
            action=ActionTokenizer.from_dict(d["action"]),
            proprio=ProprioNormalizer.from_dict(d["proprio"]),
        )
