"""Attention you can see: where the first action token of a step looks, per layer and head.

For chosen steps of a rollout, the policy's current window is run through the model's math
attention path, and the row of the step's first action slot is split into its keys: the current
frame's image patches (drawn as a heatmap over the frame) and the instruction's words (a bar per
word). One PNG per layer and step, each head a column; the chapter's figures 2-4-1 and 2-4-4 made
real for this policy. With keypoint tokens, a further PNG per step shows each keypoint's heat map.
`vla-eval --attention DIR` writes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vla.model import SEG_ACTION, SEG_IMAGE, SEG_INSTRUCTION
from vla.tokenizers import PAD_ID


def first_action_attention(policy) -> dict:
    """Attention of the newest step's first action slot: per layer (H, patches) and (H, words)."""
    model, cfg, lay = policy.model, policy.cfg, policy.model.layout
    batch = policy.window_batch()
    T = batch["timestep"].shape[1]
    with torch.no_grad():
        seen = model.inspect(batch)
    maps = seen["attention"]  # per layer (1, H, N, N)
    layout = model.token_layout(T)
    seg, step = layout["segment"], layout["step"]
    query = int(torch.nonzero((step == T - 1) & (seg == SEG_ACTION))[0])  # first action slot, newest step
    patches = torch.nonzero((step == T - 1) & (seg == SEG_IMAGE))[:, 0][: lay.grid**2]  # first camera's patches
    words = torch.nonzero(seg == SEG_INSTRUCTION)[:, 0]
    ids = batch["instruction"][0].tolist()
    real = [i for i, tok in enumerate(ids) if tok != PAD_ID]  # padding: masked keys, nothing to show
    pieces = [policy.tok.text.decode([ids[i]]) or "<bos>" for i in real]
    per_layer = []
    for att in maps:
        row = att[0, :, query].float().cpu()  # (H, N)
        per_layer.append(
            {
                "patches": row[:, patches].view(cfg.n_head, lay.grid, lay.grid).numpy(),  # (H, g, g)
                "words": row[:, words[real]].numpy(),  # (H, n_words)
                "other": (1.0 - row[:, patches].sum(-1) - row[:, words[real]].sum(-1)).numpy(),  # (H,)
            }
        )
    result = {"layers": per_layer, "words": pieces, "frame": batch["image"][0, -1, 0].cpu().numpy()}
    if cfg.keypoints:  # the newest frame's keypoint heat maps, from the same pass (first camera)
        h = lay.keypoint_grid
        heat = seen["keypoint_heat"][0, -1, 0]  # (M, h*w): newest step, first camera
        result["keypoints"] = heat.view(cfg.keypoints, h, h).float().cpu().numpy()
        result["where"] = (heat @ model.patch_embed.kp_coords).float().cpu().numpy()  # (M, 2)
    return result


def plot_attention(result: dict, out_dir: Path, tag: str) -> list[Path]:
    """One PNG per layer: heads as columns; top, patch attention over the frame; bottom, words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    frame, words, paths = result["frame"], result["words"], []
    size = frame.shape[0]
    for layer, maps in enumerate(result["layers"]):
        heads = maps["patches"].shape[0]
        fig, axes = plt.subplots(2, heads, figsize=(2.6 * heads, 5.2), squeeze=False)
        for h in range(heads):
            heat = np.kron(maps["patches"][h], np.ones((size // maps["patches"].shape[1],) * 2))  # (H, W)
            ax = axes[0, h]
            ax.imshow(frame)
            ax.imshow(heat, cmap="magma", alpha=0.55, vmin=0.0, vmax=max(heat.max(), 1e-6))
            ax.set_title(f"head {h}: patches {maps['patches'][h].sum():.0%}", fontsize=8)
            ax.axis("off")
            ax = axes[1, h]
            ax.barh(range(len(words)), maps["words"][h], color="tab:blue")
            ax.set_yticks(range(len(words)))
            ax.set_yticklabels(words, fontsize=7)
            ax.invert_yaxis()
            other = maps["other"][h]  # keypoints, proprio, earlier steps, own action slots
            ax.set_title(f"words {maps['words'][h].sum():.0%}, other tokens {other:.0%}", fontsize=7)
            ax.tick_params(axis="x", labelsize=6)
        fig.suptitle(f"{tag}: layer {layer}, attention of the first action token", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"{tag}_layer{layer}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    if "keypoints" in result:
        paths.append(plot_keypoints(result, out_dir, tag))
    return paths


def plot_keypoints(result: dict, out_dir: Path, tag: str) -> Path:
    """One PNG: each keypoint's spatial-softmax map over the frame, its soft-argmax marked with a cross.
    With keypoint targets, maps 0 and 1 are trained to find the named block and its goal."""
    import matplotlib.pyplot as plt

    frame, maps, where = result["frame"], result["keypoints"], result["where"]
    size, m = frame.shape[0], maps.shape[0]
    fig, axes = plt.subplots(1, m, figsize=(2.0 * m, 2.3), squeeze=False)
    for k, ax in enumerate(axes[0]):
        ax.imshow(frame)
        heat = np.kron(maps[k], np.ones((size // maps.shape[1],) * 2))  # (H, W)
        ax.imshow(heat, cmap="magma", alpha=0.6, vmin=0.0, vmax=max(heat.max(), 1e-9))
        row, col = (where[k] + 1) / 2 * size - 0.5  # -1..1 edge to edge -> pixel coordinates
        ax.plot(col, row, "c+", markersize=10, markeredgewidth=2)
        ax.set_title(f"keypoint {k}", fontsize=8)
        ax.axis("off")
    fig.suptitle(f"{tag}: keypoint heat maps", fontsize=9)
    fig.tight_layout()
    path = out_dir / f"{tag}_keypoints.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def attention_rollout(policy, task: str, seed: int, steps: list[int], out_dir: str | Path) -> list[Path]:
    """Roll the policy out on one episode and save the attention figures at the chosen steps."""
    from vla.evaluation.episode import episode_steps
    from vla.evaluation.evaluate import policy_env

    env = policy_env(task, policy.spec)
    paths, name = [], task.split("/")[-1]
    for step in episode_steps(env, policy, seed, max_steps=max(steps, default=-1) + 1):
        if step.t in steps:  # the attention of the act that chose this step's action
            tag = f"{name}_seed{seed}_step{step.t:03d}"
            paths += plot_attention(first_action_attention(policy), Path(out_dir), tag)
    env.close()
    return paths
