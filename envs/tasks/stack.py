"""Stack: put a named block on top of another named block."""

from __future__ import annotations

import numpy as np

from envs import scene as sc
from envs.tasks.base import Task, sample_layout
from envs.tasks.pick_place import CarryExpert

ALIGN_M = 0.02  # top block's centre within this horizontal distance of the base's centre


class Stack(Task):
    name = "stack"
    max_episode_steps = 100
    templates = (
        "stack the {block} block on the {base} block",
        "put the {block} block on top of the {base} block",
        "place the {block} block onto the {base} block",
    )

    def sample(self, rng):
        layout = sample_layout(rng)
        block, base = (int(i) for i in rng.choice(3, size=2, replace=False))
        layout.roles = {"block": block, "base": base}
        words = {"block": layout.block_colours[block], "base": layout.block_colours[base]}
        return layout, self.phrase(rng, **words)

    def success(self, scene, layout):
        top, base = scene.block_pos(layout.roles["block"]), scene.block_pos(layout.roles["base"])
        height = top[2] - base[2]
        return bool(
            np.linalg.norm(top[:2] - base[:2]) < ALIGN_M
            and abs(height - 2 * sc.BLOCK_HALF_M) < 0.008
            and base[2] < sc.BLOCK_HALF_M + 0.005
            and not scene.fingers_touch_block(layout.roles["block"])
        )

    def goal_position(self, scene, layout):
        return scene.block_pos(layout.roles["base"])

    def reward_terms(self, scene, layout):
        i = layout.roles["block"]
        top, base = scene.block_pos(i), scene.block_pos(layout.roles["base"])
        return {
            "reach_dist": -float(np.linalg.norm(scene.ee_pos - top)),
            "grasped": float(scene.grasped(i)),
            "place_dist": -float(np.linalg.norm(top - base - (0.0, 0.0, 2 * sc.BLOCK_HALF_M))),
        }


class StackExpert(CarryExpert):
    def place_xy(self):
        return self.scene.block_pos(self.layout.roles["base"])[:2]

    def release_z(self):
        # Grip point at the top block's centre when it rests on the base, plus a few millimetres.
        return self.scene.block_pos(self.layout.roles["base"])[2] + 2 * sc.BLOCK_HALF_M + 0.006
