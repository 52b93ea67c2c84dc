"""Push: slide a named block onto a named target zone with the closed gripper.

Layouts are drawn so that the straight push path is clear of the other objects and the spot behind
the block is reachable, so the instruction, not luck, decides the outcome.
"""

from __future__ import annotations

import numpy as np

from envs.tasks.base import CLOSE, RADIUS, Expert, Layout, Task, move_toward, sample_layout, segment_clearance

SUCCESS_M = 0.025  # block centre within this distance of the target's centre
PUSH_Z = 0.018  # grip height while pushing (the fingertips skim the table)
TRAVEL_Z = 0.07  # grip height when repositioning behind the block
BEHIND_M = 0.045  # grip point's distance behind the block's centre when in contact


class Push(Task):
    name = "push"
    max_episode_steps = 120
    templates = (
        "push the {block} block onto the {target} target",
        "slide the {block} block to the {target} zone",
        "move the {block} block onto the {target} circle",
    )

    def sample(self, rng):
        roles = {"block": int(rng.integers(3)), "target": int(rng.integers(2))}

        def accept(layout: Layout) -> bool:
            start, goal = layout.block_xy[roles["block"]], layout.target_xy[roles["target"]]
            dist = np.linalg.norm(goal - start)
            if not 0.08 <= dist <= 0.25:
                return False
            direction = (goal - start) / dist
            behind = start - direction * (BEHIND_M + 0.04)
            others = [xy for i, xy in enumerate(layout.block_xy) if i != roles["block"]]
            return (
                segment_clearance(behind, goal, others) > RADIUS["block"] * 2 + 0.01
                and segment_clearance(behind, goal, [layout.bin_xy]) > RADIUS["bin"] + RADIUS["block"] + 0.01
                and np.all(np.abs(behind) < [0.26, 0.22])
            )

        layout = sample_layout(rng, accept)
        layout.roles = roles
        words = {
            "block": layout.block_colours[roles["block"]],
            "target": layout.target_colours[roles["target"]],
        }
        return layout, self.phrase(rng, **words)

    def _error(self, scene, layout):
        block = scene.block_pos(layout.roles["block"])[:2]
        return np.linalg.norm(block - layout.target_xy[layout.roles["target"]])

    def success(self, scene, layout):
        return bool(self._error(scene, layout) < SUCCESS_M)

    def goal_position(self, scene, layout):
        return scene.target_pos(layout.roles["target"])

    def reward_terms(self, scene, layout):
        block = scene.block_pos(layout.roles["block"])
        behind_dist = np.linalg.norm(scene.ee_pos[:2] - block[:2]) - BEHIND_M
        return {"reach_dist": -float(abs(behind_dist)), "place_dist": -float(self._error(scene, layout))}


class PushExpert(Expert):
    """Markovian: the action is a function of the current scene alone, with no hidden phase.

    A policy that sees the scene can then learn the expert exactly (every state has one action), and the
    decision regions are wide, so a policy's small drift stays inside the same behaviour instead of
    flipping between "push" and "go round again":
    - low and behind the block, near its line to the target: push toward the spot the grip point will
      be at when the block sits on the target (steering back onto the line on the way);
    - above the spot behind the block: descend onto it;
    - low anywhere else: rise straight up; otherwise travel to above that spot at the safe height.
    """

    def plan(self):
        scene, layout = self.scene, self.layout
        block = scene.block_pos(layout.roles["block"])[:2]
        target = layout.target_xy[layout.roles["target"]]
        to_target = target - block
        direction = to_target / max(np.linalg.norm(to_target), 1e-6)
        spot = block - direction * (BEHIND_M + 0.01)  # where the gripper goes down
        ee = scene.ee_pos
        rel = ee[:2] - block
        along = float(np.dot(rel, direction))  # negative when the gripper is behind the block
        lateral = float(abs(rel[0] * direction[1] - rel[1] * direction[0]))
        behind_block = -BEHIND_M - 0.03 < along < -BEHIND_M + 0.02 and lateral < 0.02

        if behind_block and ee[2] < PUSH_Z + 0.012:
            return move_toward(scene, [*(target - direction * BEHIND_M), PUSH_Z], CLOSE, gain=0.6)
        if np.linalg.norm(ee[:2] - spot) < 0.015:
            return move_toward(scene, [*spot, PUSH_Z], CLOSE)
        if ee[2] < TRAVEL_Z - 0.02:
            return move_toward(scene, [*ee[:2], TRAVEL_Z], CLOSE)  # rise before moving across
        return move_toward(scene, [*spot, TRAVEL_Z], CLOSE)
