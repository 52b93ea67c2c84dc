"""What every task shares: the colour palette, the randomized layout, and the expert's motion helper.

A task decides three things (dm_control's split between a domain and its tasks): how an episode is
randomized and phrased (`sample`), when it has succeeded (`success`), and its shaped reward terms
(`reward_terms`). Its scripted expert lives beside it in the same module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs import scene as sc

# Distinct, nameable colours; every episode draws the blocks' and targets' colours from here.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.12, 0.12),
    "green": (0.15, 0.65, 0.20),
    "blue": (0.15, 0.30, 0.90),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.55, 0.20, 0.75),
    "orange": (1.00, 0.50, 0.05),
}

# Where objects may be placed on the table (metres), and how much room each needs (a radius).
AREA_LOW = np.array([-0.2, -0.12])
AREA_HIGH = np.array([0.2, 0.16])
RADIUS = {"block": 0.03, "target": sc.TARGET_RADIUS_M, "bin": 0.095}
GAP_M = 0.025  # clearance between any two objects' radii


@dataclass
class Layout:
    """One episode's randomized scene: colours, positions and the roles the task gives them."""

    block_colours: list[str]
    target_colours: list[str]
    block_xy: np.ndarray  # (3, 2) metres
    block_yaw: np.ndarray  # (3,) radians
    target_xy: np.ndarray  # (2, 2)
    bin_xy: np.ndarray  # (2,)
    roles: dict[str, int] = field(default_factory=dict)  # e.g. {"block": 0, "target": 1}

    def apply(self, scene: sc.TabletopScene) -> None:
        for i, colour in enumerate(self.block_colours):
            scene.set_colour(sc.BLOCKS[i], PALETTE[colour])
            scene.place_block(i, self.block_xy[i], self.block_yaw[i])
        for i, colour in enumerate(self.target_colours):
            scene.set_colour(sc.TARGETS[i], PALETTE[colour])
            scene.place_target(i, self.target_xy[i])
        scene.place_bin(self.bin_xy)


def _far_enough(xy: np.ndarray, kind: str, placed: list[tuple[np.ndarray, str]]) -> bool:
    return all(np.linalg.norm(xy - other) >= RADIUS[kind] + RADIUS[k] + GAP_M for other, k in placed)


def sample_layout(rng: np.random.Generator, accept=lambda layout: True, tries: int = 1000) -> Layout:
    """Draw colours and non-overlapping positions; retry until `accept(layout)` (task constraints)."""
    names = list(PALETTE)
    for _ in range(tries):
        block_colours = [names[i] for i in rng.choice(len(names), size=3, replace=False)]
        target_colours = [names[i] for i in rng.choice(len(names), size=2, replace=False)]
        placed: list[tuple[np.ndarray, str]] = []
        ok = True
        for kind in ["bin", "target", "target", "block", "block", "block"]:
            margin = RADIUS[kind] if kind == "bin" else 0.0
            for _ in range(100):
                xy = rng.uniform(AREA_LOW + margin / 2, AREA_HIGH - margin / 2)
                if _far_enough(xy, kind, placed):
                    placed.append((xy, kind))
                    break
            else:
                ok = False
                break
        if not ok:
            continue
        layout = Layout(
            block_colours=block_colours,
            target_colours=target_colours,
            bin_xy=placed[0][0],
            target_xy=np.array([placed[1][0], placed[2][0]]),
            block_xy=np.array([p for p, _ in placed[3:]]),
            block_yaw=rng.uniform(-0.3, 0.3, size=3),
        )
        if accept(layout):
            return layout
    raise RuntimeError("could not sample a layout that satisfies the task's constraints")


def segment_clearance(a: np.ndarray, b: np.ndarray, points: list[np.ndarray]) -> float:
    """Smallest distance from any of `points` to the segment a-b (all 2-D)."""
    ab = b - a
    best = np.inf
    for p in points:
        t = np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0)
        best = min(best, float(np.linalg.norm(a + t * ab - p)))
    return best


class Task:
    """Base class: subclasses define `name`, `templates`, `max_episode_steps` and the three hooks."""

    name: str
    templates: tuple[str, ...]
    max_episode_steps: int

    def sample(self, rng: np.random.Generator) -> tuple[Layout, str]:
        raise NotImplementedError

    def success(self, scene: sc.TabletopScene, layout: Layout) -> bool:
        raise NotImplementedError

    def reward_terms(self, scene: sc.TabletopScene, layout: Layout) -> dict[str, float]:
        raise NotImplementedError

    def goal_position(self, scene: sc.TabletopScene, layout: Layout) -> np.ndarray:
        """Where the named object must go (metres); for reach, the object itself."""
        raise NotImplementedError

    def key_positions(self, scene: sc.TabletopScene, layout: Layout) -> np.ndarray:
        """float32 (6,): the named block's xyz and its goal's xyz. Privileged: for datasets, not policies."""
        block = scene.block_pos(layout.roles["block"])
        return np.concatenate([block, self.goal_position(scene, layout)]).astype(np.float32)

    def phrase(self, rng: np.random.Generator, **words: str) -> str:
        return self.templates[rng.integers(len(self.templates))].format(**words)


def move_toward(
    scene: sc.TabletopScene, goal: np.ndarray, gripper: float, gain: float = 1.0, top_speed: float | None = None
) -> np.ndarray:
    """A proportional step of the end effector toward `goal` (metres), as a [-1, 1] action.

    By default each axis is clipped to [-1, 1] on its own; with `top_speed` the step is scaled down as
    a vector until its largest component is at most `top_speed`, which keeps the direction of travel
    (clipping bends a long diagonal move toward 45 degrees)."""
    delta = (np.asarray(goal) - scene.ee_pos) / sc.MAX_STEP_M * gain
    action = np.empty(4, dtype=np.float32)
    if top_speed is None:
        action[:3] = np.clip(delta, -1.0, 1.0)
    else:
        action[:3] = delta * min(1.0, top_speed / max(float(np.abs(delta).max()), 1e-9))
    action[3] = gripper
    return action


def ramp(low: float, high: float, distance: float, start: float, span: float) -> float:
    """`low` up to `distance` = `start`, rising linearly to `high` at `start + span` and beyond: an expert's
    height that changes with the distance to where it goes down, so the descent starts while still moving."""
    return low + (high - low) * np.clip((distance - start) / span, 0.0, 1.0)


OPEN, CLOSE = -1.0, 1.0


class Bursts:
    """Perturbations for demonstrations: with probability `chance` per tick a burst starts, 2-5 ticks of
    one random xyz step of 0.8 (1.6 cm a tick, so 3-8 cm off course), replacing the expert's step.

    DART's Gaussian noise averages out within a few ticks and shows states millimetres off the expert's
    path; a burst carries the gripper as far as a cloned policy drifts before it fails (a Push policy
    that slips past the block's side), so the expert's labels there show the recovery."""

    SPEED, TICKS = 0.8, (2, 6)

    def __init__(self, chance: float, rng: np.random.Generator):
        if not 0 <= chance < 1:
            raise ValueError(f"perturbation chance per tick must be in [0, 1), got {chance}")
        self.chance, self.rng = chance, rng
        self.reset()

    def reset(self) -> None:
        self.left, self.step = 0, np.zeros(3)

    def __call__(self, step: np.ndarray) -> np.ndarray:
        """This tick's xyz step: `step`, or the running burst's."""
        if self.chance == 0:
            return step  # no draws: the noise stream stays as without bursts
        if self.left == 0 and self.rng.random() < self.chance:
            direction = self.rng.normal(size=3)
            self.step = self.SPEED * direction / np.linalg.norm(direction)
            self.left = int(self.rng.integers(*self.TICKS))
        if self.left == 0:
            return step
        self.left -= 1
        return self.step


class Expert:
    """A scripted expert: reads the simulator's true state, returns an action. Noise is optional.

    Experts are closed-loop state machines, so they recover from perturbations (their own injected
    noise included): every phase re-checks the scene and falls back to an earlier phase if needed.
    `noise` (Gaussian, std on a[:3] every tick), `perturb` (`Bursts`) and `detour` change the executed
    action only; `clean_action` keeps the label (DART). `detour` is the chance per episode that it first
    drives the gripper to the task's `detour_pose`, a state cloned policies end up in and fail from, and
    takes over there, so the labels show the way out (tasks without such a pose ignore it).
    """

    def __init__(self, env, noise: float = 0.0, seed: int | None = None, perturb: float = 0.0, detour: float = 0.0):
        if not 0 <= detour <= 1:
            raise ValueError(f"detour chance per episode must be in [0, 1], got {detour}")
        self.env = env
        self.noise = noise
        self.detour = detour
        self.rng = np.random.default_rng(seed)
        self.bursts = Bursts(perturb, self.rng)
        self.reset()

    @property
    def scene(self) -> sc.TabletopScene:
        return self.env.scene

    @property
    def layout(self) -> Layout:
        return self.env.layout

    def reset(self) -> None:
        self.phase = 0
        self.timer = 0
        self.bursts.reset()
        self.detour_goal, self.detour_ticks, self.detour_drawn = None, 0, False

    def plan(self) -> np.ndarray:
        raise NotImplementedError

    def detour_pose(self) -> np.ndarray | None:
        """Where a detour takes the gripper (xyz, metres), drawn with `self.rng`; None: this task has none
        (and then `detour` draws nothing: the noise stream stays as without it)."""
        return None

    def act(self, obs=None) -> np.ndarray:
        action = self.plan()
        self.clean_action = np.clip(action, -1.0, 1.0).astype(np.float32)  # before noise: a DART label
        if self.detour > 0 and not self.detour_drawn:  # the first tick: the scene is reset, the pose can be drawn
            self.detour_drawn, pose = True, self.detour_pose()
            if pose is not None and self.rng.random() < self.detour:
                self.detour_goal = pose
        if self.detour_goal is not None:
            return self._detour_step()
        if self.noise > 0:
            action[:3] += self.rng.normal(0.0, self.noise, size=3)
        action[:3] = self.bursts(action[:3])
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _detour_step(self) -> np.ndarray:
        """A step toward the detour's pose (the gripper command stays the expert's); it ends there, or
        after 40 ticks."""
        step = move_toward(self.scene, self.detour_goal, float(self.clean_action[3]))
        self.detour_ticks += 1
        if np.linalg.norm(self.scene.ee_pos - self.detour_goal) < 0.01 or self.detour_ticks >= 40:
            self.detour_goal = None
        return step
