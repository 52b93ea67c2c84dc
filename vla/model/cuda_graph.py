"""The streaming step replayed from CUDA graphs: one capture per ring slot, the launch overhead gone.

    step = CapturedStep(model)            # a CUDA model; captures K graphs (a few hundred ms)
    step.start(instruction)               # (B, L) ids: eager, once per episode
    out = step(image, proprio, timestep)  # == model.step(cache, ...), from one graph launch

On a GPU a control step of a model this small is launch-bound: a few hundred kernels of microseconds
each, every one queued by Python. A CUDA graph records the kernels once and replays them with one
launch. The step is capturable because everything it reads sits at a fixed address with a fixed shape:
the KV buffer and the slot state are preallocated by `KVCache` and written in place, the inputs and the
FiLM context are copied into static buffers here, and the step never reads a value back to the host.
Its one host-side decision, which ring slot a step writes (`n_steps % K`), chooses which of the K
graphs to replay. Outputs are the graphs' static tensors: read (or clone) them before the next step of
the same slot. Greedy decoding only (sampling draws from a host generator).
"""

from __future__ import annotations

import torch

from vla.model import ActionTransformer
from vla.model.streaming import StepOutput


class CapturedStep:
    def __init__(self, model: ActionTransformer, batch_size: int = 1, warmup: int = 3):
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {device}")
        self.model = model.eval()
        cfg, spec = model.cfg, model.spec
        B = batch_size
        self.cache = model.new_cache(B, device)
        size = spec.image_size
        self.image = torch.zeros(B, spec.n_cameras, size, size, 3, dtype=torch.uint8, device=device)
        self.proprio = torch.zeros(B, spec.proprio_dim, device=device)
        self.timestep = torch.zeros(B, dtype=torch.long, device=device)
        self.film_ctx = None  # static copy of the episode's FiLM conditioning (vision.Film), filled in place
        placeholder = torch.zeros(B, cfg.instruction_len, dtype=torch.long, device=device)
        placeholder[:, 0] = 1  # any instruction: start() encodes the real one in place
        self.start(placeholder)
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.outputs: list[StepOutput] = []
        side = torch.cuda.Stream(device)
        for slot in range(cfg.window):
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm-up off the capture stream (cuBLAS/cuDNN workspaces)
                for _ in range(warmup):
                    self.cache.n_steps = slot
                    model.step(self.cache, self.image, self.proprio, self.timestep)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            self.cache.n_steps = slot
            with torch.cuda.graph(graph):
                out = model.step(self.cache, self.image, self.proprio, self.timestep)
            self.graphs.append(graph)
            self.outputs.append(out)
        self.start(placeholder)  # capture wrote the slots; a user's episode starts clean

    def start(self, instruction: torch.Tensor) -> None:
        """Begin an episode (eager): the prefix is written into the captured KV buffer in place."""
        self.model.start(self.cache, instruction)
        if self.cache.film_ctx is not None:
            if self.film_ctx is None:
                self.film_ctx = self.cache.film_ctx
            else:
                self.film_ctx.copy_(self.cache.film_ctx)
            self.cache.film_ctx = self.film_ctx  # the address the graphs read

    def __call__(self, image: torch.Tensor, proprio: torch.Tensor, timestep: torch.Tensor) -> StepOutput:
        """`model.step(cache, image, proprio, timestep)` (greedy) by replaying the graph of this step's slot."""
        slot = self.cache.n_steps % len(self.graphs)
        self.image.copy_(image)
        self.proprio.copy_(proprio)
        self.timestep.copy_(timestep)
        self.graphs[slot].replay()
        self.cache.n_steps += 1  # what cache.advance does on the host; its tensor writes are in the graph
        return self.outputs[slot]
