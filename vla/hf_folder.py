"""A local Hugging Face model folder: how a pretrained encoder (vla/model/text_encoder.py, vla/model/vision_encoder.py)
enters a policy, and how a checkpoint knows it is the same one later.

- Never a download: a path that is not a local directory with a config.json is refused (one line) before
  transformers is imported, and transformers loads with `local_files_only=True`.
- Fingerprinted: sha256 over the files that decide what the model computes; a checkpoint records it, and
  loading refuses a folder that is missing or whose fingerprint differs (one line, exit 2 from the CLIs).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from vla.errors import UserError

# The files that decide what an encoder computes: config, weights, tokenizer (vocab, merges, sentencepiece),
# image preprocessing (preprocessor_config.json).
FINGERPRINTED_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")
_digests: dict[tuple, str] = {}  # fingerprint memo, keyed on the files' names, sizes and mtimes


def fingerprint(folder: Path) -> str:
    """sha256 over the folder's config, weight and tokenizer files (sorted names, sizes and bytes), 16 hex digits."""
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in FINGERPRINTED_SUFFIXES)
    key = (str(folder), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _digests:  # a GB-sized encoder is hashed once per process, not at every load
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
            with f.open("rb") as stream:
                for block in iter(lambda s=stream: s.read(1 << 20), b""):
                    h.update(block)
        _digests[key] = h.hexdigest()[:16]
    return _digests[key]


@dataclass(frozen=True)
class ModelFolder:
    """The checks and the loading of one config field that names a model folder, with its words for errors."""

    noun: str  # what the folder holds, as messages name it: "text encoder"
    key: str  # the config field that names the folder: "model.text_encoder"
    extra: str  # the pip extra that installs transformers: "text"
    error: type[UserError]  # what every refusal raises (one line)

    def local_dir(self, path: str | os.PathLike) -> Path:
        """The folder `path` names, resolved; refused (one line) unless it is a local Hugging Face model folder."""
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise self.error(
                f"{self.noun} {path}: not a local directory ({self.key} is the path of a Hugging Face model "
                "folder on disk; nothing is ever downloaded)"
            )
        if not (folder / "config.json").is_file():
            raise self.error(f"{self.noun} {path}: no config.json, so not a Hugging Face model folder")
        return folder.resolve()

    def fingerprint(self, path: str | os.PathLike) -> str:
        """The fingerprint of the folder at `path`, refused (one line) unless it is a local model folder."""
        return fingerprint(self.local_dir(path))

    def checked(self, path: str | os.PathLike, expected: str | None) -> tuple[Path, str]:
        """(folder, fingerprint); with `expected` (what a checkpoint recorded) a missing or different folder is
        refused."""
        if expected and not Path(path).expanduser().is_dir():
            raise self.error(
                f"{self.noun} {path}: the folder is missing (the checkpoint was trained against fingerprint "
                f"{expected}); put that encoder back at this path"
            )
        folder = self.local_dir(path)
        actual = fingerprint(folder)
        if expected and actual != expected:
            raise self.error(
                f"{self.noun} {path}: fingerprint {actual} differs from {expected} recorded in the checkpoint "
                "(the folder changed since training); restore that encoder or train again"
            )
        return folder, actual

    def from_pretrained(self, kind: str, folder: Path):
        """`transformers.<kind>.from_pretrained(folder)` from local files only; a folder it cannot read is one
        line."""
        try:
            import transformers
        except ImportError:
            raise self.error(f"{self.key} needs the transformers library: pip install -e '.[{self.extra}]'") from None
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()  # a few local files: no progress bar on stderr
        try:
            return getattr(transformers, kind).from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError) as e:  # no weights / tokenizer files, an unknown model type, ...
            detail = " ".join(str(e).split())[:300]
            raise self.error(
                f"{self.noun} {folder}: transformers cannot load it ({type(e).__name__}: {detail})"
            ) from None
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()
