"""Meta-World MT50 on LeRobot's published protocol: the constants that define it (docs/metaworld_mt50.md).

`import envs` registers `metaworld-lerobot/<task>-v3` for all 50 v3 tasks (envs/metaworld.py's
MetaWorldEnv with `protocol="lerobot"`) and the suites `metaworld-lerobot/mt50`, `-easy`, `-medium`,
`-hard`, `-very-hard`. Everything here is copied from huggingface/lerobot (commit 7427f31, 2026-08-23):
    src/lerobot/envs/metaworld.py          camera, camera fix, state, episode length, termination
    src/lerobot/envs/metaworld_config.json TASK_DESCRIPTIONS, DIFFICULTY_TO_TASKS
What the policy sees: the corner2 image and obs[:4] (hand xyz, gripper). No goal, no object state.
"""

from __future__ import annotations

import string

PREFIX = "metaworld-lerobot/"
SUITE = "metaworld-lerobot/mt50"

# LeRobot renders "corner2" after moving it: `env.model.cam_pos[2] = [0.75, 0.075, 0.7]` (camera 2 is
# corner2 in every v3 scene; the same position as "corner4", with corner2's orientation and 60 degree fovy).
# Its frames come out rolled by 180 degrees and are flipped on both axes (`np.flip(image, (0, 1))`), as ours.
CAMERA = "corner2"
CAMERA_POS = (0.75, 0.075, 0.7)

# LeRobot's rollout runs `env._max_episode_steps` = 500 steps (Meta-World's max_path_length; the config's
# `episode_length: 400` is not read by the Meta-World env) and ends an episode at its first success.
MAX_EPISODE_STEPS = 500

# The instruction LeRobot feeds (`task_description`), verbatim: capitals, commas and hyphens included (our
# text tokenizer lower-cases and cuts punctuation into its own pieces, so nothing is lost or normalized).
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + " ,-"

# One description per task (LeRobot's metaworld_config.json, "TASK_DESCRIPTIONS").
TASK_DESCRIPTIONS = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "hand-insert-v3": "Insert the gripper into a hole",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "pick-place-v3": "Pick and place a puck to a goal",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-v3": "Reach a goal position",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-close-v3": "Push and close a window",
    "window-open-v3": "Push and open a window",
}
# LeRobot's difficulty split ("DIFFICULTY_TO_TASKS"): easy 28, medium 11, hard 6, very hard 5.
DIFFICULTY_TO_TASKS = {
    "easy": (
        "button-press-v3",
        "button-press-topdown-v3",
        "button-press-topdown-wall-v3",
        "button-press-wall-v3",
        "coffee-button-v3",
        "dial-turn-v3",
        "door-close-v3",
        "door-lock-v3",
        "door-open-v3",
        "door-unlock-v3",
        "drawer-close-v3",
        "drawer-open-v3",
        "faucet-close-v3",
        "faucet-open-v3",
        "handle-press-v3",
        "handle-press-side-v3",
        "handle-pull-v3",
        "handle-pull-side-v3",
        "lever-pull-v3",
        "plate-slide-v3",
        "plate-slide-back-v3",
        "plate-slide-back-side-v3",
        "plate-slide-side-v3",
        "reach-v3",
        "reach-wall-v3",
        "window-close-v3",
        "window-open-v3",
        "peg-unplug-side-v3",
    ),
    "medium": (
        "basketball-v3",
        "bin-picking-v3",
        "box-close-v3",
        "coffee-pull-v3",
        "coffee-push-v3",
        "hammer-v3",
        "peg-insert-side-v3",
        "push-wall-v3",
        "soccer-v3",
        "sweep-v3",
        "sweep-into-v3",
    ),
    "hard": (
        "assembly-v3",
        "hand-insert-v3",
        "pick-out-of-hole-v3",
        "pick-place-v3",
        "push-v3",
        "push-back-v3",
    ),
    "very_hard": (
        "shelf-place-v3",
        "disassemble-v3",
        "stick-pull-v3",
        "stick-push-v3",
        "pick-place-wall-v3",
    ),
}

SPLITS = {"easy": "mt50-easy", "medium": "mt50-medium", "hard": "mt50-hard", "very_hard": "mt50-very-hard"}
TASKS = tuple(sorted(TASK_DESCRIPTIONS))  # LeRobot's TASK_NAME_TO_ID order (alphabetical)


def suites() -> dict[str, list[str]]:
    """{suite id: task ids}: the MT50 and its four difficulty splits, in LeRobot's order."""
    out = {SUITE: [PREFIX + t for t in TASKS]}
    for difficulty, name in SPLITS.items():
        out[PREFIX + name] = [PREFIX + t for t in DIFFICULTY_TO_TASKS[difficulty]]
    return out
