"""torchrun's environment, or a single process: the few collectives the trainer needs.

Every decision that changes which collective a rank enters next (skip a batch, stop) is taken with
`any`, so all ranks take the same branch: a rank never waits in an all-reduce the others skipped.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


class Distributed:
    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        if self.enabled:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def any(self, flag: bool, device) -> bool:
        """True on every rank if `flag` is true on any rank (so ranks take the same branch)."""
        if not self.enabled:
            return flag
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.enabled:
            dist.barrier()  # no rank tears down while another still talks to it
            dist.destroy_process_group()
