"""Training throughput (tokens/s) and model FLOPs utilization against this machine's matmul limit.

Three figures from one run, same thread count:
- peak: the dense fp32 matmul rate this machine reaches (best of several large square matmuls);
- ours: the trainer's real step (forward, loss on action tokens, backward, clipping, AdamW) on the
  configured model, at its batch size and token stream length; MFU = model FLOPs per sample (from
  the model card: forward + backward ~ 3x forward) x samples/s / peak;
- plain: a plain PyTorch `nn.TransformerEncoder` stack of the same width, depth, heads, MLP width and
  sequence length with a causal mask, trained the same way: the peer for "how close to a plain
  transformer do we get", with FLOPs counted by the same formula.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn as nn

from vla.bench.latency import TABLETOP
from vla.bench.step_methods import matmul_peak
from vla.config import from_dict, load_yaml
from vla.errors import UserError
from vla.model import ActionTransformer, TokenLayout
from vla.model.card import model_card
from vla.training.augment import random_shift
from vla.training.config import TrainConfig
from vla.training.train import total_loss


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/demo.yaml", help="training preset (default configs/demo.yaml)")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps per measurement (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument(
        "--peak-seconds", type=float, default=1.5, help="time spent finding the matmul peak, s (default 1.5)"
    )


def synthetic_batch(lay: TokenLayout, batch_size: int, generator: torch.Generator, keypoint_targets: int = 0) -> dict:
    """Random inputs of the real shapes (throughput does not depend on the values), with auxiliary
    targets when the data has them and `keypoint_targets` heat-map targets per step."""
    cfg, spec = lay.cfg, lay.spec
    B, K = batch_size, cfg.window
    extra = {}
    if spec.aux_dim:
        extra["aux"] = torch.randn(B, K, spec.aux_dim, generator=generator)
    if keypoint_targets:
        extra["keypoint_targets"] = torch.rand(B, K, keypoint_targets, 2, generator=generator) * 2 - 1
    return extra | {
        "instruction": torch.randint(2, spec.vocab_size, (B, cfg.instruction_len), generator=generator),
        "image": torch.randint(
            0, 256, (B, K, spec.n_cameras, spec.image_size, spec.image_size, 3), generator=generator, dtype=torch.uint8
        ),  # fmt: skip
        "proprio": torch.randn(B, K, spec.proprio_dim, generator=generator),
        "timestep": torch.arange(K).repeat(B, 1),
        "step_mask": torch.ones(B, K, dtype=torch.bool),
        "actions": torch.randint(0, cfg.action_bins, (B, K, lay.n_action_tokens), generator=generator),
    }


def _time_steps(step_fn, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step_fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        step_fn()
    return (time.perf_counter() - t0) / steps


def measure_ours(cfg: TrainConfig, batch_size: int, warmup: int, steps: int) -> dict:
    spec = dataclasses.replace(
        TABLETOP, aux_dim=TABLETOP.aux_dim if cfg.data.aux_key else 0, keypoint_targets=bool(cfg.data.keypoint_key)
    )
    model = ActionTransformer(cfg.model, spec)
    opt = torch.optim.AdamW(model.optim_groups(cfg.optim.weight_decay), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    batch = synthetic_batch(model.layout, batch_size, gen, keypoint_targets=2 if cfg.data.keypoint_key else 0)

    def step():
        b = dict(batch, image=random_shift(batch["image"], cfg.data.augment_shift, gen))
        loss = total_loss(model(b), cfg.optim)  # the losses the trainer sums, with its weights
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    seconds = _time_steps(step, warmup, steps)
    card = model_card(cfg.model, spec)
    return {
        "seconds_per_step": seconds,
        "samples_per_s": batch_size / seconds,
        "tokens_per_s": batch_size * model.layout.n_tokens / seconds,
        "flops_per_sample": card["flops"]["per_training_sample_train"],
        "parameters": card["parameters"]["total"],
    }


def measure_plain(lay: TokenLayout, batch_size: int, warmup: int, steps: int) -> dict:
    """nn.TransformerEncoder of the same shape over the same number of tokens, causal mask."""
    mc = lay.cfg
    N, d = lay.n_tokens, mc.d_model
    layer = nn.TransformerEncoderLayer(d, mc.n_head, mc.d_ff, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)  # fmt: skip
    stack = nn.Sequential(
        nn.TransformerEncoder(layer, mc.n_layer, enable_nested_tensor=False), nn.Linear(d, mc.action_bins)
    )
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-4)
    x = torch.randn(batch_size, N, d)
    target = torch.randint(0, mc.action_bins, (batch_size, N))
    mask = nn.Transformer.generate_square_subsequent_mask(N)
    encoder, head = stack[0], stack[1]

    def step():
        logits = head(encoder(x, mask=mask, is_causal=True))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(stack.parameters(), 1.0)
        opt.step()

    seconds = _time_steps(step, warmup, steps)
    formula = 4 * d * d + 2 * d * mc.d_ff
    forward = N * mc.n_layer * 2 * formula + mc.n_layer * 4 * d * N * N + N * 2 * d * mc.action_bins
    return {
        "seconds_per_step": seconds,
        "samples_per_s": batch_size / seconds,
        "tokens_per_s": batch_size * N / seconds,
        "flops_per_sample": 3 * forward,
    }


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = from_dict(TrainConfig, load_yaml(args.config))
    batch_size = args.batch_size or cfg.train.batch_size
    if args.steps < 1 or args.warmup < 0 or args.peak_seconds <= 0:
        raise UserError(f"need --steps >= 1, --warmup >= 0, --peak-seconds > 0; got {args.steps}, {args.warmup}, "
                        f"{args.peak_seconds}")  # fmt: skip
    peak = matmul_peak(torch.device("cpu"), args.peak_seconds)
    ours = measure_ours(cfg, batch_size, args.warmup, args.steps)
    lay = TokenLayout(cfg.model, TABLETOP)
    plain = measure_plain(lay, batch_size, args.warmup, args.steps)
    for r in (ours, plain):
        r["flops_per_s"] = r["samples_per_s"] * r["flops_per_sample"]
        r["mfu"] = r["flops_per_s"] / peak
    return {
        "config": args.config,
        "batch_size": batch_size,
        "tokens_per_sample": lay.n_tokens,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_peak_flops_per_s": peak,
        "ours": ours,
        "plain_transformer": plain,
        "mfu_ratio_ours_over_plain": ours["mfu"] / plain["mfu"],
    }


def format_markdown(r: dict) -> str:
    peak = r["matmul_peak_flops_per_s"] / 1e9
    rows = [
        f"Training throughput, `{r['config']}`, batch {r['batch_size']} x {r['tokens_per_sample']} tokens, "
        f"{r['threads']} threads, torch {r['torch']}; matmul peak {peak:.1f} GFLOP/s.",
        "",
        "| | tokens/s | samples/s | GFLOP/s | MFU |",
        "|---|---|---|---|---|",
    ]
    for name, key in (("vla trainer step", "ours"), ("plain nn.TransformerEncoder, same shape", "plain_transformer")):
        x = r[key]
        rows.append(f"| {name} | {x['tokens_per_s']:,.0f} | {x['samples_per_s']:.1f} | {x['flops_per_s'] / 1e9:.1f} | "
                    f"{x['mfu']:.0%} |")  # fmt: skip
    rows.append(f"\nOurs / plain MFU: {r['mfu_ratio_ours_over_plain']:.2f}x")
    return "\n".join(rows) + "\n"
