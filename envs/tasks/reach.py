"""Reach: bring the gripper just above a named block. Distractors: the other blocks, bin and targets."""

from __future__ import annotations

import numpy as np

from envs import scene as sc
from envs.tasks.base import OPEN, Expert, Layout, Task, move_toward, sample_layout

HOVER_M = 0.035  # the grip point's goal height above the block's centre
SUCCESS_M = 0.03  # success radius around the goal


def _goal(scene: sc.TabletopScene, layout: Layout) -> np.ndarray:
    return scene.block_pos(layout.roles["block"]) + (0.0, 0.0, HOVER_M)


class Reach(Task):
    name = "reach"
    max_episode_steps = 50
    templates = (
        "reach the {block} block",
        "move the gripper to the {block} block",
        "touch the {block} block",
    )

    def sample(self, rng):
        layout = sample_layout(rng)
        layout.roles = {"block": int(rng.integers(3))}
        return layout, self.phrase(rng, block=layout.block_colours[layout.roles["block"]])

    def success(self, scene, layout):
        return bool(np.linalg.norm(scene.ee_pos - _goal(scene, layout)) < SUCCESS_M)

    def reward_terms(self, scene, layout):
        return {"reach_dist": -float(np.linalg.norm(scene.ee_pos - _goal(scene, layout)))}

    def goal_position(self, scene, layout):
        return _goal(scene, layout)


class ReachExpert(Expert):
    def plan(self):
        return move_toward(self.scene, _goal(self.scene, self.layout), OPEN)
