"""Tokenizers stored with every checkpoint: instruction text, actions, proprioception (numpy only: the robot
side runs them without torch).

Images are tokenized inside the model (`vla.model.PatchEmbed`): patchify + projection."""

from vla.tokenizers.action import ActionTokenizer
from vla.tokenizers.bundle import Tokenizers
from vla.tokenizers.proprio import ProprioNormalizer
from vla.tokenizers.text import BOS_ID, PAD_ID, TextTokenizer

__all__ = ["ActionTokenizer", "Tokenizers", "ProprioNormalizer", "TextTokenizer", "PAD_ID", "BOS_ID"]
