"""Optional pretrained text encoder: a local Hugging Face model folder whose frozen features embed the instruction.

    model:
      text_encoder: /models/bert-base-uncased    # a directory on disk (config.json, weights, tokenizer files)

With `model.text_encoder` set, the instruction ids are the encoder tokenizer's ids and each instruction
token's input is the encoder's last hidden state at that token, projected to d_model by a trained linear
map (`ActionTransformer.embed_instruction`), plus the usual position and segment embeddings. An unseen
word is then whatever the pretrained encoder makes of it, not byte tokens the policy never learned.

- Never a download: a path that is not a local directory is refused before transformers is asked, and
  transformers loads with `local_files_only=True` (vla/hf_folder.py, shared with vla/model/vision_encoder.py).
- Frozen: the encoder's weights are never trained (`requires_grad=False`, eval mode, no_grad) and never
  saved with ours. They are held outside the network's module tree, so `state_dict()`, `parameters()`
  and the optimizer never see them; a checkpoint records the folder's path and `fingerprint` instead,
  and loading refuses a folder that is missing or whose fingerprint differs (one line, exit 2).
- Cached: the encoder is a pure function of an instruction's ids, and training windows repeat a few
  hundred instructions, so each distinct id row is encoded once (an LRU table), not once per batch.

Ids are the encoder tokenizer's ids plus one, so that 0 stays the padding id the network masks (a
tokenizer's own pad id is 0 for BERT but 1 for RoBERTa, whose 0 is <s>). `transformers` is imported
here only, and only when a text encoder is used: `pip install -e ".[text]"`.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import torch
import torch.nn as nn

from vla.tokenizers.encoder import FOLDER, TextEncoderError, fingerprint, relocated
from vla.tokenizers.text import PAD_ID

__all__ = ["FrozenTextEncoder", "TextEncoderError", "fingerprint", "relocated"]


class FrozenTextEncoder(nn.Module):
    """ids (B, L) -> the frozen encoder's last hidden states (B, L, E) float32, zero at padding.

    The Hugging Face model is held outside the module tree (no parameters or buffers of this module), so
    it is never saved, trained or counted; `_apply` carries it along on `.to(device)`. It stays in eval
    mode whatever `.train()` the network is put in, since `.train()` never reaches it."""

    def __init__(self, path: str | os.PathLike, expected_fingerprint: str | None = None, cache_size: int = 1024):
        super().__init__()
        folder, self.fingerprint = FOLDER.checked(path, expected_fingerprint)
        self.path = str(folder)
        hf = FOLDER.from_pretrained("AutoModel", folder)
        if hf.config.is_encoder_decoder:  # T5-style: the encoder half
            hf = hf.get_encoder()
        hf.requires_grad_(False).eval()
        object.__setattr__(self, "hf", hf)  # not a submodule: see the class docstring
        self.hidden_size = int(hf.config.hidden_size)
        self.hf_pad_id = int(getattr(hf.config, "pad_token_id", None) or 0)  # masked anyway
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()  # id row -> (L, E), LRU

    def _apply(self, fn, recurse=True):
        self.hf._apply(fn)
        self._cache.clear()  # its tensors live on the old device / dtype
        return super()._apply(fn, recurse)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the encoder (no cache): (n, L) our ids -> (n, L, E) float32, in full precision even under autocast
        (cached features do not depend on which pass computed them)."""
        with torch.no_grad(), torch.autocast(ids.device.type, enabled=False):
            valid = ids != PAD_ID  # (n, L)
            hf_ids = torch.where(valid, ids - 1, torch.full_like(ids, self.hf_pad_id))
            hidden = self.hf(input_ids=hf_ids, attention_mask=valid.long()).last_hidden_state  # (n, L, E)
            return hidden.float() * valid[..., None]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 -> (B, L, E) float32; each distinct row encoded once while it stays in the cache.
        Reading the rows costs one (B, L) copy to the host, far less than the encoder pass it saves."""
        rows = [tuple(r) for r in ids.tolist()]
        found = {r: self._cache[r] for r in dict.fromkeys(rows) if r in self._cache}
        missing = [r for r in dict.fromkeys(rows) if r not in found]
        if missing:
            fresh = self.encode(torch.tensor(missing, dtype=torch.long, device=ids.device))  # (n, L, E)
            found.update(zip(missing, fresh, strict=True))
        for r, features in found.items():
            self._cache[r] = features
            self._cache.move_to_end(r)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        # a new tensor, so autograd may save it even when the cached rows were computed in inference mode
        return torch.stack([found[r] for r in rows])  # (B, L, E)

    def extra_repr(self) -> str:
        return f"{self.path}, fingerprint={self.fingerprint}, hidden_size={self.hidden_size}, frozen"
