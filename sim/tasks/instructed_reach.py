"""Instructed reach (task "instructed_reach"): a language instruction names one of three
coloured balls, and a two-link planar arm must touch it with its fingertip.

A language-conditioned visual task for vision-language-action policies. The arm is
Gymnasium's Reacher (same links, joints, motors, integrator and 50 Hz control), the
balls are three of red, green, blue and yellow, and a fixed camera above the table
renders every env of the batch.

Observations:
    ``policy``  joint cos/sin, joint velocities, fingertip xy: what the robot knows
                without vision or language. Where the balls are is not in it (that is
                what the image is for), nor which one is named (that is what the
                instruction is for: a policy that read the colour from here could
                ignore the words, and no test of language grounding would mean much).
    ``critic``  the policy terms, then the privileged scene: ``instruction_id`` (the
                named colour's index in COLOURS), every ball's xy and colour index (in
                slot order) and the named ball's offset from the fingertip.
    ``image``   uint8 [N, H, W, 3] from the top camera (``images=False`` drops it).
``env.instructions`` holds each env's instruction as text, e.g. "reach the red ball",
for a tokenizer; ``env.instruction_ids`` is the same information as integers.

Reward: ``-distance`` (fingertip to the *named* ball, metres) plus ``success_bonus`` on
the step that succeeds. Success: the fingertip centre within ``success_radius`` of the
named ball's centre and slower than ``success_speed``: reach it and stop there; info
reports ``success``, ``distance`` and the fingertip's ``speed`` every step. The episode
terminates on success (``terminate_on_success=True``, the default), so a success is
counted once and an episode of the expert is a clean demonstration; it is truncated
after ``max_episode_steps``.

Splits: the instruction names a ball in one of four quadrants around the arm's base
(quadrant k spans angles [k * 90, (k + 1) * 90) degrees from +x, +x to the image's right
and +y up). The pairs (named colour, quadrant) in HELD_OUT never occur in
``split="train"``: colour k of COLOURS is held out in quadrant k, so each colour and each
quadrant is trained on, only not together. ``split="eval"`` draws only held-out pairs:
the test of composing a colour with a place never seen with it. The distractor balls
are anywhere, in both splits (a red ball in quadrant 0 appears in training, it is only
never the one named).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import mujoco
import numpy as np
import torch

from sim.camera import BatchCamera, ImageSpec, image_size_of
from sim.randomization import SimToRealConfig
from sim.spec import RobotDescription
from sim.tasks.gym_base import torque_robot
from sim.vec_env import MujocoVecEnv

COLOURS = ("red", "green", "blue", "yellow")
# saturated, and far apart in every channel from each other, the grey table and the
# white arm, so that a colour is a clean cue at 64 px
RGBA = {
    "red": (0.9, 0.1, 0.1, 1.0),
    "green": (0.1, 0.8, 0.1, 1.0),
    "blue": (0.1, 0.2, 0.95, 1.0),
    "yellow": (0.95, 0.85, 0.1, 1.0),
}
NUM_TARGETS = 3
INSTRUCTION_TEMPLATE = "reach the {colour} ball"
_INSTRUCTION_RE = re.compile(r"^\s*reach the (\w+) ball\s*$", re.IGNORECASE)
SPLITS = ("train", "eval")
# (named colour, quadrant) pairs never named in training: colour k in quadrant k
HELD_OUT = frozenset((c, k) for k, c in enumerate(COLOURS))

LINK0 = 0.1  # shoulder to elbow (m), as Reacher's
LINK1 = 0.11  # elbow to fingertip centre (m), as Reacher's
BALL_RADIUS = 0.02
# ball centres lie in this annulus around the base: inside the arm's reach (0.01 .. 0.21)
# with margin, and inside the camera's view (half-width 0.23 m at the table)
RADIUS_RANGE = (0.07, 0.19)
# gap kept between a named ball and its quadrant's borders (rad): a ball on a border
# would belong to either split by a hair's breadth that no image shows
QUADRANT_MARGIN = 0.15
MIN_SEPARATION = 0.07  # between ball centres: > 2 * success_radius, so one success only
START_CLEARANCE = 0.05  # the fingertip starts at least this far from every ball


def _xml(height: int, width: int) -> str:
    balls = "\n".join(
        f"""
    <body name="target{k}" pos="0 0 0.01">
      <joint name="target{k}_x" type="slide" axis="1 0 0" damping="0" armature="0"/>
      <joint name="target{k}_y" type="slide" axis="0 1 0" damping="0" armature="0"/>
      <geom name="target{k}" type="sphere" size="{BALL_RADIUS}" rgba="1 1 1 1"
            material="ball" contype="0" conaffinity="0" mass="0.01"/>
    </body>"""
        for k in range(NUM_TARGETS)
    )
    return f"""
<mujoco model="instructed_reach">
  <compiler angle="radian" inertiafromgeom="true"/>
  <option timestep="0.01" integrator="RK4"/>
  <visual>
    <global offwidth="{max(width, 64)}" offheight="{max(height, 64)}"/>
    <quality shadowsize="0" offsamples="0" numslices="12" numstacks="6"/>
  </visual>
  <asset>
    <material name="matte" specular="0" shininess="0" reflectance="0"/>
    <material name="ball" specular="0" shininess="0" reflectance="0" emission="0.4"/>
  </asset>
  <default>
    <joint armature="1" damping="1"/>
    <geom contype="0" conaffinity="0" friction="1 0.1 0.1"/>
  </default>
  <worldbody>
    <light name="top" directional="true" pos="0 0 1" dir="0 0 -1" castshadow="false"
           diffuse="0.6 0.6 0.6"/>
    <camera name="top" pos="0 0 0.6" fovy="42"/>
    <geom name="table" type="plane" pos="0 0 -0.01" size="0.3 0.3 0.01"
          material="matte" rgba="0.25 0.25 0.25 1"/>
    <geom name="root" type="cylinder" fromto="0 0 -0.01 0 0 0.02" size="0.011"
          rgba="0.9 0.9 0.9 1"/>
    <body name="body0" pos="0 0 0.02">
      <joint name="joint0" type="hinge" axis="0 0 1"/>
      <geom name="link0" type="capsule" fromto="0 0 0 {LINK0} 0 0" size="0.01"
            rgba="0.9 0.9 0.9 1"/>
      <body name="body1" pos="{LINK0} 0 0">
        <joint name="joint1" type="hinge" axis="0 0 1" range="-3.0 3.0"/>
        <geom name="link1" type="capsule" fromto="0 0 0 0.1 0 0" size="0.01"
              rgba="0.9 0.9 0.9 1"/>
        <body name="fingertip" pos="{LINK1} 0 0">
          <geom name="fingertip" type="sphere" size="0.01" rgba="1 1 1 1"/>
        </body>
      </body>
    </body>
    {balls}
  </worldbody>
  <actuator>
    <motor joint="joint0" ctrlrange="-1 1" gear="200"/>
    <motor joint="joint1" ctrlrange="-1 1" gear="200"/>
  </actuator>
</mujoco>
"""


def instruction_text(colour: str) -> str:
    """The instruction that names the ball of ``colour``."""
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; known colours: {', '.join(COLOURS)}")
    return INSTRUCTION_TEMPLATE.format(colour=colour)


GOAL_TERM = "fingertip"
"""The policy term that ends every successful episode on the named ball: VLA SFT's goal
probe predicts its last value from the image, the words and the proprioception."""


def all_instructions() -> list[str]:
    """Every instruction the task gives, in COLOURS order (e.g. a tokenizer's vocabulary)."""
    return [instruction_text(c) for c in COLOURS]


def parse_instruction(text: str) -> int:
    """The index in COLOURS of the colour ``text`` names ("reach the <colour> ball").

    ValueError naming the problem: not a string, not the template, or a colour the task
    has no ball of.
    """
    if not isinstance(text, str):
        raise ValueError(f"an instruction must be a string, got {text!r}")
    m = _INSTRUCTION_RE.match(text)
    if m is None:
        raise ValueError(
            f"instruction {text!r} does not read {INSTRUCTION_TEMPLATE.format(colour='<colour>')!r}"
        )
    colour = m.group(1).lower()
    if colour not in COLOURS:
        raise ValueError(
            f"unknown colour {colour!r} in instruction {text!r}; known colours: "
            f"{', '.join(COLOURS)}"
        )
    return COLOURS.index(colour)


def quadrant_of(xy: np.ndarray) -> np.ndarray:
    """Quadrant (0..3) of points [..., 2] around the arm's base, counter-clockwise from +x."""
    angle = np.mod(np.arctan2(xy[..., 1], xy[..., 0]), 2 * np.pi)
    return np.minimum((angle // (np.pi / 2)).astype(np.int64), 3)


def fingertip_xy(q: np.ndarray) -> np.ndarray:
    """Fingertip centre [N, 2] of arm joint angles [N, 2] (planar forward kinematics)."""
    a0, a01 = q[:, 0], q[:, 0] + q[:, 1]
    return np.stack(
        [LINK0 * np.cos(a0) + LINK1 * np.cos(a01), LINK0 * np.sin(a0) + LINK1 * np.sin(a01)],
        axis=1,
    )


def fingertip_velocity(q: np.ndarray, qd: np.ndarray) -> np.ndarray:
    """Fingertip velocity [N, 2] (m/s) of joint angles and velocities [N, 2]."""
    a0, a01 = q[:, 0], q[:, 0] + q[:, 1]
    w0, w01 = qd[:, 0], qd[:, 0] + qd[:, 1]
    return np.stack(
        [
            -LINK0 * np.sin(a0) * w0 - LINK1 * np.sin(a01) * w01,
            LINK0 * np.cos(a0) * w0 + LINK1 * np.cos(a01) * w01,
        ],
        axis=1,
    )


def _wrap(a: np.ndarray) -> np.ndarray:
    return np.mod(a + np.pi, 2 * np.pi) - np.pi


class InstructedReach(MujocoVecEnv):
    name = "instructed_reach"
    frame_skip = 2
    # the scripted expert reaches and stops in 18 steps on average, 22 at most (512
    # episodes per split); ~4x that leaves a learner room to correct itself without
    # making failed episodes long
    max_episode_steps = 80

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        s2r: SimToRealConfig | None = None,
        *,
        split: str = "train",
        images: bool = True,
        image_size: int | Sequence[int] = 64,
        success_radius: float = 0.02,
        success_speed: float = 0.05,
        success_bonus: float = 1.0,
        terminate_on_success: bool = True,
        **kwargs: Any,
    ):
        """split: "train" names only (colour, quadrant) pairs outside HELD_OUT, "eval"
        only those in it. images: render the ``image`` group (False: proprioception and
        the instruction only, e.g. for state-based RL or a fast expert). image_size: an
        int for square frames or (height, width), pixels, 1..1024. success_radius:
        metres between fingertip and named ball centres that count as reaching it.
        success_speed: the fingertip must also be this slow (m/s; inf: any speed), i.e.
        stop on the ball: without it an arm spinning through the balls' annulus
        "reaches" whichever ball it sweeps over, instruction and image unseen (an
        untrained policy did so in 3 of 4 episodes). success_bonus: reward added on the step that succeeds. terminate_on_success:
        end the episode on success (else it runs to max_episode_steps)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.height, self.width = image_size_of(image_size)
        if not (np.isfinite(success_radius) and 0 < success_radius < MIN_SEPARATION / 2):
            raise ValueError(
                f"success_radius must be in (0, {MIN_SEPARATION / 2}) m (half the balls' "
                f"minimum separation), got {success_radius!r}"
            )
        self.split = split
        self.images = bool(images)
        self.success_radius = float(success_radius)
        if not (success_speed > 0):
            raise ValueError(f"success_speed must be > 0 m/s, got {success_speed!r}")
        self.success_speed = float(success_speed)
        self.success_bonus = float(success_bonus)
        self.terminate_on_success = bool(terminate_on_success)
        super().__init__(num_envs, seed, device, s2r, **kwargs)
        m = self.model
        self._arm_q = m.jnt_qposadr[[m.joint(f"joint{j}").id for j in range(2)]]
        self._arm_v = m.jnt_dofadr[[m.joint(f"joint{j}").id for j in range(2)]]
        self._ball_q = np.array(
            [
                [m.jnt_qposadr[m.joint(f"target{k}_{ax}").id] for ax in "xy"]
                for k in range(NUM_TARGETS)
            ]
        )
        self._ball_geoms = [m.geom(f"target{k}").id for k in range(NUM_TARGETS)]
        n = self.num_envs
        # per-env task state; numpy arrays on the env, so state_dict() checkpoints them
        self.ball_colour = np.tile(np.arange(NUM_TARGETS, dtype=np.int64), (n, 1))
        self.named_slot = np.zeros(n, dtype=np.int64)
        self.camera = BatchCamera(m, n, (self.height, self.width), "top") if self.images else None
        self._viewers: dict[tuple[int, int, str], BatchCamera] = {}

    # ------------------------------------------------------------------ model
    def _task_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(_xml(self.height, self.width))

    @cached_property
    def robot(self) -> RobotDescription:
        return torque_robot(self.model, float(self.model.opt.timestep) * self.frame_skip)

    @property
    def image_spec(self) -> ImageSpec | None:
        """Shape and camera of the ``image`` group (None with ``images=False``)."""
        return self.camera.spec if self.camera is not None else None

    def _task_obs_terms(self) -> dict[str, list[tuple[str, int]]]:
        policy = [
            ("joint_cos", 2),
            ("joint_sin", 2),
            ("joint_vel", 2),
            ("fingertip", 2),
        ]
        scene = [
            ("instruction_id", 1),
            ("ball_pos", 2 * NUM_TARGETS),
            ("ball_colour", NUM_TARGETS),
            ("goal_delta", 2),
        ]
        return {"policy": policy, "critic": policy + scene}

    # ------------------------------------------------------------------ state
    def _arm(self) -> tuple[np.ndarray, np.ndarray]:
        return self.engine.get("qpos")[:, self._arm_q], self.engine.get("qvel")[:, self._arm_v]

    def ball_positions(self) -> np.ndarray:
        """Ball centres [N, 3, 2] (xy, metres), in slot order."""
        return self.engine.get("qpos")[:, self._ball_q]

    def goal_positions(self) -> np.ndarray:
        """Centre [N, 2] of each env's named ball."""
        return self.ball_positions()[np.arange(self.num_envs), self.named_slot]

    def fingertip(self) -> np.ndarray:
        """Fingertip centre [N, 2] (computed from the joints, exact after a step)."""
        return fingertip_xy(self._arm()[0])

    @property
    def instruction_ids(self) -> np.ndarray:
        """Each env's named colour, as its index in COLOURS."""
        return self.ball_colour[np.arange(self.num_envs), self.named_slot]

    @property
    def instructions(self) -> list[str]:
        """Each env's instruction as text, e.g. "reach the red ball"."""
        return [instruction_text(COLOURS[c]) for c in self.instruction_ids]

    # ------------------------------------------------------------------ hooks
    def _task_obs(self) -> dict[str, np.ndarray]:
        q, qd = self._arm()
        tip = fingertip_xy(q)
        balls = self.ball_positions()
        goal = balls[np.arange(self.num_envs), self.named_slot]
        return {
            "joint_cos": np.cos(q),
            "joint_sin": np.sin(q),
            "joint_vel": qd,
            "fingertip": tip,
            "instruction_id": self.instruction_ids.astype(np.float64),
            "ball_pos": balls.reshape(self.num_envs, -1),
            "ball_colour": self.ball_colour.astype(np.float64),
            "goal_delta": goal - tip,
        }

    def _task_reward(self, pre, actions):
        q, qd = self._arm()
        distance = np.linalg.norm(fingertip_xy(q) - self.goal_positions(), axis=1)
        speed = np.linalg.norm(fingertip_velocity(q, qd), axis=1)
        success = ((distance <= self.success_radius) & (speed <= self.success_speed)).astype(
            np.float64
        )
        bonus = self.success_bonus * success
        terminated = success > 0 if self.terminate_on_success else np.zeros_like(success, bool)
        extras = {
            "reward_distance": -distance,
            "reward_success": bonus,
            "success": success,
            "distance": distance,
            "speed": speed,
        }
        return -distance + bonus, terminated, extras

    def _task_reset(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        qpos = self.engine.get("qpos")[ids].copy()
        for row, i in enumerate(ids):
            colours, slot, balls = self._draw_scene(rng)
            q = self._draw_arm(rng, balls)
            self.ball_colour[i] = colours
            self.named_slot[i] = slot
            qpos[row, self._arm_q] = q
            qpos[row, self._ball_q] = balls
        self.engine.set("qpos", qpos, ids)
        self.engine.set("qvel", np.zeros((len(ids), self.model.nv)), ids)

    def _draw_scene(self, rng: np.random.Generator) -> tuple[np.ndarray, int, np.ndarray]:
        """(colour index per slot, the named slot, ball centres [3, 2]) of one layout."""
        named = int(rng.integers(len(COLOURS)))
        if self.split == "eval":
            quadrant = next(k for c, k in HELD_OUT if c == COLOURS[named])
        else:
            allowed = [k for k in range(4) if (COLOURS[named], k) not in HELD_OUT]
            quadrant = allowed[int(rng.integers(len(allowed)))]
        lo = quadrant * np.pi / 2 + QUADRANT_MARGIN
        angle = rng.uniform(lo, lo + np.pi / 2 - 2 * QUADRANT_MARGIN)
        goal = self._polar(rng, angle)
        others = [c for c in range(len(COLOURS)) if c != named]
        distractors = rng.permutation(others)[: NUM_TARGETS - 1]
        balls = [goal]
        while len(balls) < NUM_TARGETS:
            p = self._polar(rng, rng.uniform(0, 2 * np.pi))
            if min(np.linalg.norm(p - b) for b in balls) >= MIN_SEPARATION:
                balls.append(p)
        # the named ball's slot is random, so nothing downstream can learn "slot 0"
        order = rng.permutation(NUM_TARGETS)
        colours = np.array([named, *distractors], dtype=np.int64)[order]
        slot = int(np.nonzero(order == 0)[0][0])
        return colours, slot, np.array(balls)[order]

    @staticmethod
    def _polar(rng: np.random.Generator, angle: float) -> np.ndarray:
        lo, hi = RADIUS_RANGE
        r = np.sqrt(rng.uniform(lo * lo, hi * hi))  # uniform over the annulus' area
        return np.array([r * np.cos(angle), r * np.sin(angle)])

    def _draw_arm(self, rng: np.random.Generator, balls: np.ndarray) -> np.ndarray:
        while True:
            q = np.array([rng.uniform(-np.pi, np.pi), rng.uniform(-2.5, 2.5)])
            tip = fingertip_xy(q[None])[0]
            if np.linalg.norm(balls - tip, axis=1).min() >= START_CLEARANCE:
                return q

    # ------------------------------------------------------------------ images
    def _paint(self, env_id: int, model: mujoco.MjModel) -> None:
        for slot, geom in enumerate(self._ball_geoms):
            model.geom_rgba[geom] = RGBA[COLOURS[self.ball_colour[env_id, slot]]]

    def render_images(self, ids: np.ndarray | None = None) -> np.ndarray:
        """The top camera's frames of envs ``ids`` (None: all), rendered now: uint8
        [len(ids), H, W, 3] (a copy)."""
        if self.camera is None:
            raise RuntimeError("this env was made with images=False")
        ids = self._all if ids is None else np.asarray(ids, dtype=np.int64)
        frames = self.camera.render(self.engine.get("qpos"), ids, self._paint)
        return frames[ids].copy()

    def _observe(self, reset_ids: np.ndarray | None) -> dict[str, torch.Tensor]:
        obs = super()._observe(reset_ids)
        if self.camera is not None:
            ids = self._all if reset_ids is None else reset_ids
            frames = self.camera.render(self.engine.get("qpos"), ids, self._paint)
            # flat [N, H*W*3] inside the base class: its step() merges the reset envs'
            # fresh observation into the batch with a [N, 1] mask, which broadcasts over
            # flat groups only; reset() and step() below hand out [N, H, W, 3] views
            flat = torch.from_numpy(frames.reshape(self.num_envs, -1).copy())
            obs["image"] = flat.to(self.device)
        return obs

    def _shaped(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "image" not in obs:
            return obs
        return {**obs, "image": obs["image"].view(self.num_envs, self.height, self.width, 3)}

    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        return self._shaped(super().reset(seed))

    def step(self, actions: Any):
        obs, reward, terminated, truncated, info = super().step(actions)
        info["final_obs"] = self._shaped(info["final_obs"])
        return self._shaped(obs), reward, terminated, truncated, info

    def render(
        self, env_id: int = 0, width: int = 480, height: int = 360, camera: str | int = -1
    ) -> np.ndarray:
        """An RGB frame of one env with its balls in their colours (the base class's
        render would draw the model's colours); camera: a name or an id, -1 the top one."""
        if isinstance(camera, int | np.integer):
            if not -1 <= camera < self.model.ncam:
                raise ValueError(
                    f"camera id {camera} out of range; the model has {self.model.ncam}"
                )
            camera = "top" if camera == -1 else self.model.camera(int(camera)).name
        name = str(camera)
        key = (int(height), int(width), name)
        if key not in self._viewers:
            self._viewers[key] = BatchCamera(self.model, 1, (height, width), name)
        viewer = self._viewers[key]
        qpos = self.engine.get("qpos")[[env_id]]
        viewer.render(qpos, [0], lambda _, m: self._paint(env_id, m))
        return viewer.frames[0].copy()

    def close(self) -> None:
        if self.camera is not None:
            self.camera.close()
        for viewer in self._viewers.values():
            viewer.close()
        self._viewers.clear()
        super().close()

    # ------------------------------------------------------------------ language
    def instruct(
        self, texts: Sequence[str], ids: Sequence[int] | np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """Name another ball in envs ``ids`` (None: all) by instruction text, e.g. to test
        a policy on a prompt of one's own; returns the new observation.

        ValueError naming the problem: a text that is not an instruction, a colour the
        task does not know, or a colour that env has no ball of.
        """
        ids = self._all if ids is None else np.asarray(ids, dtype=np.int64)
        if isinstance(texts, str) or len(texts) != len(ids):
            raise ValueError(f"instruct needs one text per env ({len(ids)}), got {texts!r}")
        slots = []
        for i, text in zip(ids, texts):
            colour = parse_instruction(text)
            hit = np.nonzero(self.ball_colour[i] == colour)[0]
            if len(hit) == 0:
                present = ", ".join(COLOURS[c] for c in self.ball_colour[i])
                raise ValueError(
                    f"env {int(i)} has no {COLOURS[colour]} ball (its balls: {present})"
                )
            slots.append(int(hit[0]))
        self.named_slot[ids] = slots
        self._obs = self._observe(ids)
        return self._shaped(self._obs)

    def wrong_instructions(self, rng: np.random.Generator) -> list[str]:
        """For each env, an instruction naming one of its *other* balls (uniformly): the
        input of a language-grounding test, where a policy is told the wrong ball while
        the task still rewards the named one. A policy that follows the words fails; one
        that ignores them and picks a ball at random succeeds a third as often as it
        does with the right words."""
        out = []
        for i in range(self.num_envs):
            others = np.delete(self.ball_colour[i], self.named_slot[i])
            out.append(instruction_text(COLOURS[int(rng.choice(others))]))
        return out

    # ------------------------------------------------------------------ expert
    def expert_action(self, kp: float = 1.0, kd: float = 0.12) -> np.ndarray:
        """Actions [N, 2] of a scripted expert that reaches each env's named ball: planar
        inverse kinematics to the ball's centre (the elbow solution nearer the current
        pose), then a joint PD law, clipped to the motors' range. It reads the true ball
        positions, which a learner only sees in the image.

        kp, kd: gains in action units per radian and per rad/s; with the motors' gear of
        200 and the joints' armature of 1 the defaults are about critically damped.
        """
        q, qd = self._arm()
        goal = self.goal_positions()
        r2 = np.square(goal).sum(axis=1)
        cos_elbow = np.clip((r2 - LINK0**2 - LINK1**2) / (2 * LINK0 * LINK1), -1.0, 1.0)
        best = None
        for sign in (1.0, -1.0):
            elbow = sign * np.arccos(cos_elbow)
            shoulder = np.arctan2(goal[:, 1], goal[:, 0]) - np.arctan2(
                LINK1 * np.sin(elbow), LINK0 + LINK1 * np.cos(elbow)
            )
            err = np.stack([_wrap(shoulder - q[:, 0]), elbow - q[:, 1]], axis=1)
            cost = np.abs(err).sum(axis=1)
            if best is None:
                best, best_cost = err, cost
            else:
                better = cost < best_cost
                best = np.where(better[:, None], err, best)
                best_cost = np.minimum(cost, best_cost)
        return np.clip(kp * best - kd * qd, -1.0, 1.0)
