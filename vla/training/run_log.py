"""What a training run writes as it goes (rank 0): TensorBoard events, metrics.jsonl, a progress bar.

On resume, metrics logged after the checkpoint being resumed are dropped (from metrics.jsonl, and
from TensorBoard by `purge_step`), so the run's record reads as if it had never been interrupted.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vla.config import to_dict
from vla.files import write_json


def _record_step(line: str) -> int | None:
    """The step of a metrics.jsonl line, or None for a line that is not a whole JSON record."""
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return None


class RunLog:
    enabled = True

    def __init__(self, out: Path, cfg, start_step: int, tokens_per_step: int, resumed: bool):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "run_config.json", to_dict(cfg))
        self.writer = SummaryWriter(str(out / "tb"), purge_step=start_step if resumed else None)
        if not resumed:
            self._hparams(cfg)
        path = out / "metrics.jsonl"
        kept = []
        if resumed and path.exists():  # a kill can cut the last line short: only whole records are kept
            kept = [ln for ln in path.read_text().splitlines() if _record_step(ln) is not None]
            kept = [ln for ln in kept if _record_step(ln) <= start_step]
        path.write_text("".join(ln + "\n" for ln in kept))
        # train_s: wall-clock seconds of training so far (side jobs included), carried across resumes
        self._offset = next((json.loads(ln)["train_s"] for ln in reversed(kept) if '"train_s"' in ln), 0.0)
        self._start = time.perf_counter()
        self.metrics = path.open("a")
        self.bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", file=sys.stderr, dynamic_ncols=True)
        self.tokens_per_step = tokens_per_step
        self._t, self._n = time.perf_counter(), 0

    def _hparams(self, cfg) -> None:
        """Hyperparameters at the start of the run, as text and in TensorBoard's HParams tab."""
        from torch.utils.tensorboard.summary import hparams

        flat = {}
        for section, values in to_dict(cfg).items():
            for k, v in values.items():
                flat[f"{section}.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
        self.writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
        for summary in hparams(flat, {"eval/success_rate": float("nan"), "valid/loss": float("nan")}):
            self.writer.file_writer.add_summary(summary)

    def scalars(self, step: int, record: dict, tb_prefix: str = "") -> None:
        """One metrics.jsonl line and the same scalars in TensorBoard (tags `tb_prefix` + key)."""
        for k, v in record.items():
            self.writer.add_scalar(tb_prefix + k, v, step)
        self.metrics.write(json.dumps({"step": step, **record}) + "\n")
        self.metrics.flush()

    def train_step(self, step: int, outputs: dict, grad_norm: float, lr: float) -> None:
        elapsed = time.perf_counter() - self._t
        tok_s = self._n * self.tokens_per_step / max(elapsed, 1e-9)
        self._t, self._n = time.perf_counter(), 0
        loss = outputs["loss"].item()
        record = {
            "loss": loss,
            **{k: outputs[k].item() for k in ("aux_loss", "keypoint_loss") if k in outputs},
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tok_s,
            "train_s": self._offset + time.perf_counter() - self._start,
            **{f"accuracy/dim{i}": a for i, a in enumerate(outputs["accuracy"].tolist())},
        }
        self.scalars(step, record, tb_prefix="train/")
        self.bar.set_postfix_str(f"loss {loss:.3f} | {tok_s / 1000:.1f}k tok/s")

    def closed_loop(self, step: int, result: dict) -> None:
        record = {"eval/success_rate": result["overall"]["success_rate"]}
        record.update({f"eval/success/{t}": r["success_rate"] for t, r in result["tasks"].items()})
        self.scalars(step, record)
        per_task = " ".join(f"{t.split('/')[-1]}={r['success_rate']:.0%}" for t, r in result["tasks"].items())
        self.write(f"step {step}: closed-loop success {result['overall']['success_rate']:.0%} {per_task}")

    def write(self, line: str) -> None:
        self.bar.write(line)

    def tick(self) -> None:
        self._n += 1
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        self.metrics.close()


class SilentLog:
    """The log of a rank other than 0: every call does nothing."""

    enabled = False

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
