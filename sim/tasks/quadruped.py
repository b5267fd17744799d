"""Quadruped velocity tracking: a 12-joint legged robot follows (vx, vy, yaw rate) commands.

The task follows legged_gym / Isaac Lab's flat-terrain locomotion setup: joint
position targets around a standing pose, PD control inside MuJoCo at every physics
step (500 Hz), policy at 50 Hz, an actor that sees only what a real robot measures
and a critic that also sees privileged state (base velocity, the randomized physics).

Bring your own robot with `model_path=`: any MJCF with a free-floating body "base",
joints <leg>_{hip,thigh,calf}_joint for legs FL, FR, RL, RR, one position actuator
per joint, foot geoms <leg>_foot, a keyframe "home" and a flat floor at z = 0.
A subclass may name the base body and the feet otherwise (`base_body`, `foot_geoms`),
build its model in code (`_load_model`) and stand on uneven ground (`_ground_under`,
`_base_touches_ground`); sim/tasks/go1.py does all four.

Beside the reward terms the task declares constraints (CONSTRAINT_LIMITS: joint range,
torque, joint speed, step length, tilt) and reports their violations every step, for
constraints as terminations (training.constraints). `command_curriculum=L` splits the
command ranges into L levels: each env draws from (level + 1) / L of them and moves a
level up or down at the end of each episode by how well it tracked. `terrain=` puts
the robot on sim/terrain.py's heightfield with its terrain curriculum instead of the
flat floor (sim/tasks/terrain_ground.py; flat by default).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property

import mujoco
import numpy as np

from sim.mjcf import load_model, require_names
from sim.randomization import SimToRealConfig
from sim.spec import JointIndices, RobotDescription
from sim.tasks.terrain_ground import TerrainGround
from sim.terrain import TerrainConfig
from sim.vec_env import MujocoVecEnv

LEGS = ("FL", "FR", "RL", "RR")
JOINTS = tuple(f"{leg}_{part}_joint" for leg in LEGS for part in ("hip", "thigh", "calf"))
FEET = tuple(f"{leg}_foot" for leg in LEGS)
ASSET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
DEFAULT_MODEL = os.path.join(ASSET, "quadruped.xml")

REWARD_WEIGHTS = {
    "tracking_lin_vel": 1.0,
    "tracking_ang_vel": 0.5,
    "lin_vel_z": -2.0,
    "ang_vel_xy": -0.05,
    "orientation": -1.0,
    "torques": -1e-5,
    "dof_acc": -2.5e-7,
    "action_rate": -0.01,
    "feet_air_time": 1.0,
}

# Constraints (training.constraints, CaT) beside the reward terms: name -> limit. Each
# step the task reports how far each is violated (info "cstr_<name>", 0 when it holds,
# the worst joint or foot of the robot otherwise).
CONSTRAINT_LIMITS = {
    "joint_pos": 0.95,  # fraction of each joint's range, around its middle
    "torque": 0.8,  # fraction of each actuator's torque limit
    "joint_vel": 15.0,  # rad/s
    "foot_air_time": 0.25,  # s: a step that lands sooner than this is too short
    "orientation": 0.5,  # sine of the base's tilt from upright
}

Range = tuple[float, float]


# the base geoms' shape rules (Quadruped._base_lowest_point)
_SPHERE, _CAPSULE, _CYLINDER, _ELLIPSOID, _BOUNDING_BOX = range(5)


def _row_norm(x: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of a real (n, k) array: np.linalg.norm(x, axis=1)'s
    own arithmetic (square, add.reduce, sqrt), without its per-call checks."""
    return np.sqrt(np.add.reduce(x * x, axis=1))


# ---------------------------------------------------------------------- quaternions
def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """(n, 4) unit quaternions (w, x, y, z) -> (n, 3, 3) rotation matrices (body to world)."""
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    r = np.empty((*q.shape[:-1], 3, 3))
    r[..., 0, 0] = 1 - 2 * (y * y + z * z)
    r[..., 0, 1] = 2 * (x * y - w * z)
    r[..., 0, 2] = 2 * (x * z + w * y)
    r[..., 1, 0] = 2 * (x * y + w * z)
    r[..., 1, 1] = 1 - 2 * (x * x + z * z)
    r[..., 1, 2] = 2 * (y * z - w * x)
    r[..., 2, 0] = 2 * (x * z - w * y)
    r[..., 2, 1] = 2 * (y * z + w * x)
    r[..., 2, 2] = 1 - 2 * (x * x + y * y)
    return r


def rotate_inverse(rot: np.ndarray, v: np.ndarray) -> np.ndarray:
    """World vectors (n, 3) into the body frames given by (n, 3, 3) rotations."""
    return np.einsum("nji,nj->ni", rot, v)


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    q = np.zeros((len(yaw), 4))
    q[:, 0] = np.cos(yaw / 2)
    q[:, 3] = np.sin(yaw / 2)
    return q


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products of (n, 4) quaternions (w, x, y, z)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def _check_range(name: str, r) -> Range:
    try:
        lo, hi = (float(v) for v in r)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair, got {r!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"{name} must be a finite (low, high) pair with low <= high, got {r!r}")
    return lo, hi


def _over_defaults(
    what: str, defaults: dict[str, float], given: dict[str, float] | None, positive: bool = False
) -> dict[str, float]:
    """`defaults` with `given` over them; ValueError naming unknown names (or, with
    `positive`, values that are not numbers > 0)."""
    given = given or {}
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; known: {sorted(defaults)}")
    for k, v in given.items():
        if positive and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
            raise ValueError(f"{what}[{k!r}] must be a number > 0, got {v!r}")
    return {**defaults, **{k: float(v) for k, v in given.items()}}


class Quadruped(TerrainGround, MujocoVecEnv):
    """Velocity-command locomotion for a 12-joint quadruped on flat ground, or on a
    heightfield with a terrain curriculum (`terrain=`; TerrainGround)."""

    name = "quadruped"
    frame_skip = 10  # 500 Hz physics, 50 Hz policy
    max_episode_steps = 1000  # 20 s
    base_body = "base"
    foot_geoms: tuple[str, ...] = FEET  # in LEGS order
    constraint_names = tuple(CONSTRAINT_LIMITS)

    action_scale = 0.25
    # command ranges: forward (m/s), lateral (m/s), yaw rate (rad/s), body frame
    command_vx: Range = (-1.0, 1.0)
    command_vy: Range = (-0.5, 0.5)
    command_yaw: Range = (-1.0, 1.0)
    command_resample_s = 10.0  # each env draws a new command this often (inf: never)
    command_zero_below = 0.2  # planar commands slower than this become "stand still"
    tracking_sigma = 0.25
    feet_air_time_target = 0.5  # s
    foot_contact_margin = 0.01  # m between a foot's lowest point and the floor
    base_contact_margin = 0.005  # m, a base geom this close to the floor touches it
    min_base_height = 0.2  # m
    max_tilt = np.deg2rad(60.0)
    reset_joint_noise = 0.05  # rad, uniform around the standing pose
    reset_yaw_range: Range = (-np.pi, np.pi)
    # legged_gym's clip of the summed reward at zero: with the penalties dominating early
    # on, a negative step reward teaches the robot to fall as soon as it can
    only_positive_rewards = True
    # command curriculum: an env whose episode tracked the command this well (mean of the
    # tracking kernel over a whole episode, a fall counting as zero from then on) moves up
    # a level, one that tracked worse than the lower mark moves down
    curriculum_up = 0.8
    curriculum_down = 0.5

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device="cpu",
        s2r: SimToRealConfig | None = None,
        *,
        model_path: str | os.PathLike | None = None,
        fixed_command: Sequence[float] | None = None,
        command_vx: Range | None = None,
        command_vy: Range | None = None,
        command_yaw: Range | None = None,
        command_resample_s: float | None = None,
        reward_weights: dict[str, float] | None = None,
        only_positive_rewards: bool | None = None,
        constraint_limits: dict[str, float] | None = None,
        command_curriculum: int = 0,
        terrain: TerrainConfig | dict | bool | None = None,
        terrain_seed: int = 0,
        max_init_level: int = 4,
        level: int | None = None,
        curriculum: bool = True,
        height_scan: bool = True,
        **kwargs,
    ):
        self._configure_terrain(
            terrain, terrain_seed, max_init_level, level, curriculum, height_scan
        )
        self.model_path = None if model_path is None else os.fspath(model_path)
        for name, r in (("command_vx", command_vx), ("command_vy", command_vy)):
            if r is not None:
                setattr(self, name, _check_range(name, r))
        if command_yaw is not None:
            self.command_yaw = _check_range("command_yaw", command_yaw)
        if command_resample_s is not None:
            if not command_resample_s > 0:
                raise ValueError(f"command_resample_s must be > 0, got {command_resample_s}")
            self.command_resample_s = float(command_resample_s)
        if only_positive_rewards is not None:
            self.only_positive_rewards = bool(only_positive_rewards)
        self.fixed_command = None
        if fixed_command is not None:
            fc = np.asarray(fixed_command, dtype=np.float64)
            if fc.shape != (3,) or not np.isfinite(fc).all():
                raise ValueError(
                    f"fixed_command must be 3 finite numbers (vx, vy, yaw rate), got {fixed_command!r}"
                )
            self.fixed_command = fc
        self.reward_weights = _over_defaults("reward terms", REWARD_WEIGHTS, reward_weights)
        if isinstance(command_curriculum, bool) or not (
            isinstance(command_curriculum, int) and command_curriculum >= 0
        ):
            raise ValueError(
                f"command_curriculum must be a number of levels >= 0, got {command_curriculum!r}"
            )
        self.command_curriculum = command_curriculum
        self.constraint_limits = _over_defaults(
            "constraints", CONSTRAINT_LIMITS, constraint_limits, positive=True
        )
        super().__init__(num_envs, seed, device, s2r, **kwargs)
        n = self.num_envs
        self.commands = np.zeros((n, 3))
        # per env: its command level (level l draws from the ranges times (l + 1) / levels)
        # and the episode's summed tracking kernel, which moves it
        self.command_levels = np.zeros(n, dtype=np.int64)
        self._tracking_sum = np.zeros(n)
        self.feet_air_time = np.zeros((n, len(self.foot_geoms)))
        self.last_contacts = np.zeros((n, len(self.foot_geoms)), dtype=bool)
        self._prev_applied = np.zeros((n, self.action_spec.size))
        self._last_joint_vel = np.zeros((n, len(JOINTS)))
        # an infinite interval keeps each episode's first command
        every = self.command_resample_s / self.dt
        self._resample_steps = max(1, round(every)) if np.isfinite(every) else None
        # mujoco.batch fills an output field only from the first call after it is bound:
        # bind what the reward reads now, so that the forward() of the first reset fills it
        for name in ("geom_xpos", "actuator_force"):
            self.engine.get(name)
        if self.terrain is not None:
            self._init_terrain_state()

    # ------------------------------------------------------------------ model
    @classmethod
    def default_s2r(cls) -> SimToRealConfig:
        return SimToRealConfig(
            mass_scale=(0.9, 1.1),
            added_base_mass=(-1.0, 2.0),
            friction_scale=(0.5, 1.25),
            motor_strength=(0.9, 1.1),
            kp_scale=(0.9, 1.1),
            kd_scale=(0.9, 1.1),
            obs_noise={
                "base_ang_vel": 0.1,
                "projected_gravity": 0.03,
                "joint_pos": 0.01,
                "joint_vel": 0.5,
            },
            action_latency=(0, 1),
            push_interval_s=8.0,
            push_velocity=0.5,
            obs_history=1,
        )

    def _task_model(self) -> mujoco.MjModel:
        m, source = self._load_model()
        self._index_model(m, source)
        self._reset_qpos = self._settled_pose(m)
        return m

    def _load_model(self) -> tuple[mujoco.MjModel, str]:
        """The compiled model and a name for it in error messages."""
        path = self.model_path or DEFAULT_MODEL
        if self.terrain is None:
            return load_model(path), path
        load_model(path)  # its errors, which name the file
        spec = mujoco.MjSpec.from_file(os.path.expanduser(path))
        # the heightfield replaces the file's floor planes, and takes over their contact
        # settings and look
        planes = [g for g in spec.worldbody.geoms if g.type == mujoco.mjtGeom.mjGEOM_PLANE]
        ground = {"contype": 0, "conaffinity": 1}
        if planes:
            p = planes[0]
            ground = {
                "contype": p.contype,
                "conaffinity": p.conaffinity,
                "condim": p.condim,
                "friction": list(p.friction),
                "material": p.material,
            }
        for p in planes:
            spec.delete(p)
        return self._compile_with_terrain(spec, **ground), path

    def _settled_pose(self, m: mujoco.MjModel, seconds: float = 1.0) -> np.ndarray:
        """The home pose after the robot has settled on its PD targets (nominal model).

        Episodes start from it, so that they do not begin with a drop and the sway
        that the legs' compliance makes of it; the home keyframe itself when the
        robot does not stand (then it falls at every reset, which training shows).
        """
        d = mujoco.MjData(m)
        mujoco.mj_resetDataKeyframe(m, d, self._home_key)
        d.ctrl[self._act] = self.default_joint_pos
        mujoco.mj_step(m, d, nstep=int(round(seconds / m.opt.timestep)))
        q = d.qpos.copy()
        upright = quat_to_mat(q[None, 3:7])[0, 2, 2] > np.cos(self.max_tilt)
        if not (np.isfinite(q).all() and upright and q[2] - self.floor_height > 0.05):
            return self._home_qpos.copy()
        q[0:2] = 0.0
        # keep roll and pitch, drop the heading: resets draw their own
        w, x, y, z = q[3:7]
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        q[3:7] = quat_mul(yaw_quat(np.array([-yaw])), q[None, 3:7])[0]
        return q

    def _index_model(self, m: mujoco.MjModel, source: str) -> None:
        """Find everything the task reads in `m`; ValueError naming what is missing."""
        (base,) = require_names(m, "body", [self.base_body], source)
        jids = np.array(require_names(m, "joint", JOINTS, source))
        feet = np.array(require_names(m, "geom", self.foot_geoms, source))
        (home,) = require_names(m, "keyframe", ["home"], source)
        self._home_key = home
        free = [
            j
            for j in range(m.body_jntadr[base], m.body_jntadr[base] + m.body_jntnum[base])
            if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE
        ]
        if not free:
            raise ValueError(f"MJCF {source}: body {self.base_body!r} has no free joint")
        if m.jnt_qposadr[free[0]] != 0 or m.jnt_dofadr[free[0]] != 0:
            raise ValueError(f"MJCF {source}: the free joint of {self.base_body!r} must come first")
        # one position actuator per joint
        acts = np.full(len(JOINTS), -1)
        for a in range(m.nu):
            if m.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT:
                hit = np.nonzero(jids == m.actuator_trnid[a, 0])[0]
                if len(hit):
                    acts[hit[0]] = a
        missing = [JOINTS[i] for i in np.nonzero(acts < 0)[0]]
        if missing:
            raise ValueError(f"MJCF {source} lacks actuators for the joints {missing}")
        if m.nu != len(JOINTS):
            raise ValueError(
                f"MJCF {source} has {m.nu} actuators; the task drives exactly {len(JOINTS)}, "
                f"one per joint {list(JOINTS)}"
            )
        gain, bias = m.actuator_gainprm[acts], m.actuator_biasprm[acts]
        position = (
            (m.actuator_gaintype[acts] == mujoco.mjtGain.mjGAIN_FIXED)
            & (m.actuator_biastype[acts] == mujoco.mjtBias.mjBIAS_AFFINE)
            & (gain[:, 0] > 0)
            & np.isclose(bias[:, 1], -gain[:, 0])
        )
        if not position.all():
            bad = [JOINTS[i] for i in np.nonzero(~position)[0]]
            raise ValueError(
                f"MJCF {source}: the actuators of {bad} are not position actuators (<position>)"
            )
        self._act = acts
        self._jqpos = m.jnt_qposadr[jids]
        self._jdof = m.jnt_dofadr[jids]
        self._jrange = m.jnt_range[jids].copy()
        limited = m.jnt_limited[jids].astype(bool)
        self._jrange[~limited] = (-np.inf, np.inf)
        self._feet = feet
        self._foot_radius = m.geom_size[feet, 0].copy()
        self._home_qpos = m.key_qpos[home].copy()
        self.default_joint_pos = self._home_qpos[self._jqpos].copy()
        # floor: the highest horizontal plane of the world body, else z = 0
        planes = [
            g
            for g in range(m.ngeom)
            if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_PLANE and m.geom_bodyid[g] == 0
        ]
        self.floor_height = float(max((m.geom_pos[g, 2] for g in planes), default=0.0))
        # the base's collision geoms, for the trunk-contact termination
        g = np.array(
            [
                i
                for i in range(m.ngeom)
                if m.geom_bodyid[i] == base and (m.geom_contype[i] or m.geom_conaffinity[i])
            ],
            dtype=np.int64,
        )
        self._base_geoms = g
        self._bg_pos = m.geom_pos[g].copy()
        self._bg_rot = quat_to_mat(m.geom_quat[g]) if len(g) else np.zeros((0, 3, 3))
        self._bg_type = m.geom_type[g].copy()
        self._bg_size = m.geom_size[g].copy()
        self._bg_aabb = m.geom_aabb[g].copy()
        # each geom's shape rule as a plain int, chosen once: comparing mujoco's enum
        # members on every step cost ~7 us per comparison, four per geom
        shapes = {
            int(mujoco.mjtGeom.mjGEOM_SPHERE): _SPHERE,
            int(mujoco.mjtGeom.mjGEOM_CAPSULE): _CAPSULE,
            int(mujoco.mjtGeom.mjGEOM_CYLINDER): _CYLINDER,
            int(mujoco.mjtGeom.mjGEOM_ELLIPSOID): _ELLIPSOID,
        }
        self._bg_shape = [shapes.get(int(t), _BOUNDING_BOX) for t in self._bg_type]
        # with every joint limited the violation needs no NaN guard (inf - inf)
        self._all_joints_limited = bool(np.isfinite(self._jrange).all())

    @cached_property
    def robot(self) -> RobotDescription:
        m, a = self.model, self._act
        forced = m.actuator_forcelimited[a].astype(bool)
        torque = np.where(forced, np.abs(m.actuator_forcerange[a]).max(axis=1), np.inf)
        return RobotDescription(
            joint_names=JOINTS,
            default_joint_pos=self.default_joint_pos.copy(),
            kp=m.actuator_gainprm[a, 0].copy(),
            kd=-m.actuator_biasprm[a, 2].copy(),
            action_scale=np.full(len(JOINTS), self.action_scale),
            action_offset=self.default_joint_pos.copy(),
            joint_pos_lower=self._jrange[:, 0].copy(),
            joint_pos_upper=self._jrange[:, 1].copy(),
            torque_limit=torque,
            physics_dt=float(m.opt.timestep),
            control_dt=float(m.opt.timestep) * self.frame_skip,
            control_mode="position",
        )

    @cached_property
    def joint_indices(self) -> JointIndices:
        # the indices _index_model found and checked (one position actuator per joint)
        return JointIndices(JOINTS, self._act, self._jqpos, self._jdof)

    def _task_action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        # symmetric bounds wide enough to reach either end of every joint's range
        d = self.default_joint_pos
        reach = np.maximum(np.abs(self._jrange[:, 0] - d), np.abs(self._jrange[:, 1] - d))
        high = np.where(np.isfinite(reach), reach / self.action_scale, 100.0)
        return -high, high.copy()

    # ------------------------------------------------------------------ commands
    def set_command(self, cmd, ids=None) -> None:
        """Set the (vx, vy, yaw rate) command of envs `ids` (all by default).

        `cmd` is (len(ids), 3) or one (3,) command for all; it holds until the env's
        next command draw (every `command_resample_s`) or reset. An env built with
        `fixed_command=` never draws: a command set here holds until the next reset,
        which restores the fixed one.
        """
        ids = self._all if ids is None else np.asarray(ids, dtype=np.int64)
        cmd = np.asarray(cmd, dtype=np.float64)
        if cmd.shape == (3,):
            cmd = np.broadcast_to(cmd, (len(ids), 3))
        if cmd.shape != (len(ids), 3):
            raise ValueError(f"command must have shape ({len(ids)}, 3) or (3,), got {cmd.shape}")
        if not np.isfinite(cmd).all():
            raise ValueError("command must be finite")
        self.commands[ids] = cmd

    def _sample_commands(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        if len(ids) == 0:
            return
        if self.fixed_command is not None:
            self.commands[ids] = self.fixed_command
            return
        k = len(ids)
        cmd = np.stack(
            [
                rng.uniform(*self.command_vx, size=k),
                rng.uniform(*self.command_vy, size=k),
                rng.uniform(*self.command_yaw, size=k),
            ],
            axis=1,
        )
        if self.command_curriculum:
            cmd *= ((self.command_levels[ids] + 1) / self.command_curriculum)[:, None]
        cmd[:, :2] *= (np.linalg.norm(cmd[:, :2], axis=1) >= self.command_zero_below)[:, None]
        self.commands[ids] = cmd

    # ------------------------------------------------------------------ ground
    def _ground_under(self, xy: np.ndarray) -> np.ndarray | float:
        """Ground height under the world points `xy` (..., 2): the flat floor here; a
        task on uneven terrain returns an array of shape xy.shape[:-1]."""
        if self.terrain is not None:
            return self.terrain.height_at(xy)
        return self.floor_height

    def _base_touches_ground(self, base: dict, qpos: np.ndarray) -> np.ndarray:
        """Per env, whether a collision geom of the base touches the ground."""
        if self.terrain is not None:
            return self._terrain_base_contact()
        return self._base_lowest_point(base, qpos) < self.base_contact_margin

    # ------------------------------------------------------------------ state
    def _base_state(self):
        # the reward and the observation of a step both read it (MujocoVecEnv._per_step)
        return self._per_step("base_state", self._compute_base_state)

    def _compute_base_state(self):
        qpos, qvel = self.engine.get("qpos"), self.engine.get("qvel")
        rot = quat_to_mat(qpos[:, 3:7])
        return {
            "height": qpos[:, 2] - self._ground_under(qpos[:, 0:2]),
            "rot": rot,
            # the free joint's linear velocity is in the world frame, its angular
            # velocity already in the body frame
            "lin_vel": rotate_inverse(rot, qvel[:, 0:3]),
            "ang_vel": qvel[:, 3:6].copy(),
            "gravity": -rot[:, 2, :],  # R^T (0, 0, -1)
        }

    def _joint_state(self):
        return self._per_step("joint_state", self._compute_joint_state)

    def _compute_joint_state(self):
        qpos, qvel = self.engine.get("qpos"), self.engine.get("qvel")
        return qpos[:, self._jqpos] - self.default_joint_pos, qvel[:, self._jdof]

    def _base_lowest_point(self, base: dict, qpos: np.ndarray) -> np.ndarray:
        """Height above the floor of the lowest point of the base's collision geoms."""
        if len(self._base_geoms) == 0:
            return np.full(self.num_envs, np.inf)
        rz = base["rot"][:, 2, :]  # world z row of the base rotation, (n, 3)
        center = qpos[:, 2:3] + rz @ self._bg_pos.T  # (n, G)
        gz = np.einsum("nj,gjk->ngk", rz, self._bg_rot)  # geom axes' world z, (n, G, 3)
        s = self._bg_size
        half = np.empty(center.shape)
        off = np.zeros(center.shape)
        for i, shape in enumerate(self._bg_shape):
            z = gz[:, i]
            if shape == _SPHERE:
                half[:, i] = s[i, 0]
            elif shape == _CAPSULE:
                half[:, i] = np.abs(z[:, 2]) * s[i, 1] + s[i, 0]
            elif shape == _CYLINDER:
                half[:, i] = np.abs(z[:, 2]) * s[i, 1] + s[i, 0] * np.sqrt(
                    np.clip(1 - z[:, 2] ** 2, 0, 1)
                )
            elif shape == _ELLIPSOID:
                half[:, i] = np.sqrt(((z * s[i]) ** 2).sum(axis=1))
            else:  # box, mesh and the rest: their bounding box
                off[:, i] = z @ self._bg_aabb[i, :3]
                half[:, i] = np.abs(z) @ self._bg_aabb[i, 3:]
        return (center + off - half).min(axis=1) - self.floor_height

    def _foot_contacts(self) -> np.ndarray:
        feet = self.engine.get("geom_xpos")[:, self._feet]
        ground = self._ground_under(feet[..., 0:2])
        return feet[..., 2] - self._foot_radius - ground < self.foot_contact_margin

    # ------------------------------------------------------------------ hooks
    def _task_obs_terms(self):
        nj = len(JOINTS)
        policy = [
            ("base_ang_vel", 3),
            ("projected_gravity", 3),
            ("command", 3),
            ("joint_pos", nj),
            ("joint_vel", nj),
            ("last_action", nj),
        ]
        critic = policy + [
            ("base_lin_vel", 3),
            ("friction", 1),
            ("added_mass", 1),
            ("motor_strength", nj),
            ("base_height", 1),
        ]
        terms = {"policy": policy, "critic": critic}
        if self.terrain is not None:
            self._terrain_obs_terms(terms)
        return terms

    def _task_obs(self):
        base = self._base_state()
        jpos, jvel = self._joint_state()
        r = self.randomizer
        obs = {
            "base_ang_vel": base["ang_vel"],
            "projected_gravity": base["gravity"],
            "command": self.commands,
            "joint_pos": jpos,
            "joint_vel": jvel,
            "last_action": self.last_action,
            "base_lin_vel": base["lin_vel"],
            "friction": r.friction[:, None],
            "added_mass": r.added_mass[:, None],
            "motor_strength": r.strength[:, self._act],
            "base_height": base["height"][:, None],
        }
        if self.terrain is not None and self.height_scan:
            obs["height_scan"] = self._scan()
        return obs

    def _task_ctrl(self, actions: np.ndarray) -> np.ndarray:
        low, high = self.action_spec.low, self.action_spec.high
        target = self.default_joint_pos + self.action_scale * np.clip(actions, low, high)
        target = np.clip(target, self._jrange[:, 0], self._jrange[:, 1])
        ctrl = np.empty((self.num_envs, self.model.nu))
        ctrl[:, self._act] = target
        return ctrl

    def _task_reward(self, pre, actions):
        if self.terrain is not None:
            self._terrain_ask()  # the command in force during this step, before a new draw
        w, dt = self.reward_weights, self.dt
        base = self._base_state()
        qpos = self.engine.get("qpos")
        _, jvel = self._joint_state()
        cmd = self.commands
        lin_err2 = np.square(cmd[:, :2] - base["lin_vel"][:, :2]).sum(axis=1)
        yaw_err2 = np.square(cmd[:, 2] - base["ang_vel"][:, 2])
        tau = self.engine.get("actuator_force")
        # feet air time (legged_gym): reward steps longer than the target, paid at touchdown
        contact = self._foot_contacts()
        contact_filt = contact | self.last_contacts
        self.last_contacts = contact
        first_contact = (self.feet_air_time > 0.0) & contact_filt
        self.feet_air_time += dt
        air = ((self.feet_air_time - self.feet_air_time_target) * first_contact).sum(axis=1)
        air *= _row_norm(cmd[:, :2]) > 0.1
        # a step's air time at touchdown, before it is cleared: the air-time constraint
        short_step = (
            (self.constraint_limits["foot_air_time"] - self.feet_air_time) * first_contact
        ).max(axis=1)
        self.feet_air_time *= ~contact_filt
        terms = {
            "tracking_lin_vel": np.exp(-lin_err2 / self.tracking_sigma),
            "tracking_ang_vel": np.exp(-yaw_err2 / self.tracking_sigma),
            "lin_vel_z": np.square(base["lin_vel"][:, 2]),
            "ang_vel_xy": np.square(base["ang_vel"][:, :2]).sum(axis=1),
            "orientation": np.square(base["gravity"][:, :2]).sum(axis=1),
            "torques": np.square(tau).sum(axis=1),
            "dof_acc": np.square((jvel - self._last_joint_vel) / dt).sum(axis=1),
            "action_rate": np.square(actions - self._prev_applied).sum(axis=1),
            "feet_air_time": air,
        }
        extras = {f"rew_{k}": v * (w[k] * dt) for k, v in terms.items()}
        reward = sum(extras.values())
        if self.only_positive_rewards:
            reward = np.maximum(reward, 0.0)
        extras["lin_vel_error"] = np.sqrt(lin_err2)
        extras["ang_vel_error"] = np.sqrt(yaw_err2)
        # forward speed in the body frame: with a fixed forward command, how fast the robot
        # really walks (a policy that stands still on rough ground falls no more)
        extras["base_vx"] = base["lin_vel"][:, 0].copy()
        extras.update(self._constraint_violations(base, qpos, jvel, tau, short_step))
        if self.command_curriculum:
            self._tracking_sum += terms["tracking_lin_vel"]
            extras["command_level"] = self.command_levels.astype(np.float64)
        self._last_joint_vel = jvel
        self._prev_applied = actions.copy()
        # terminations: the trunk touches the floor, sinks too low, or tips over
        base_contact = self._base_touches_ground(base, qpos)
        low = base["height"] < self.min_base_height
        tilted = base["gravity"][:, 2] > -np.cos(self.max_tilt)
        terminated = base_contact | low | tilted
        # periodic command draws (episode_length counts this step only after the hook)
        if self.fixed_command is None and self._resample_steps is not None:
            due = np.nonzero((self.episode_length + 1) % self._resample_steps == 0)[0]
            self._sample_commands(due, self._rng)
        if self.terrain is not None:
            terminated = terminated | self._terrain_step(extras)
        return reward, terminated, extras

    def _constraint_violations(self, base, qpos, jvel, tau, short_step) -> dict[str, np.ndarray]:
        """How far each constraint of CONSTRAINT_LIMITS is violated, per env (>= 0)."""
        lim = self.constraint_limits
        lo, hi = self._jrange[:, 0], self._jrange[:, 1]
        mid, half = (lo + hi) / 2, (hi - lo) / 2 * lim["joint_pos"]
        q = qpos[:, self._jqpos]
        if self._all_joints_limited:
            beyond = np.abs(q - mid) - half
            if not np.isfinite(beyond).all():  # a diverged simulation's state: as below
                beyond = np.nan_to_num(beyond, nan=0.0, neginf=0.0)
        else:
            with np.errstate(invalid="ignore"):  # unlimited joints: inf - inf
                beyond = np.nan_to_num(np.abs(q - mid) - half, nan=0.0, neginf=0.0)
        force = np.abs(tau[:, self._act])
        torque = force - lim["torque"] * self.robot.torque_limit
        return {
            "cstr_joint_pos": np.maximum(beyond, 0.0).max(axis=1),
            "cstr_torque": np.maximum(torque, 0.0).max(axis=1),
            "cstr_joint_vel": np.maximum(np.abs(jvel) - lim["joint_vel"], 0.0).max(axis=1),
            "cstr_foot_air_time": np.maximum(short_step, 0.0),
            "cstr_orientation": np.maximum(
                _row_norm(base["gravity"][:, :2]) - lim["orientation"], 0.0
            ),
        }

    def _command_curriculum(self, ids: np.ndarray) -> None:
        """Move the command level of the envs among `ids` whose episode just ended."""
        ended = ids[self.episode_length[ids] > 0]
        if self.command_curriculum and len(ended):
            tracking = self._tracking_sum[ended] / self.max_episode_steps
            step = (tracking > self.curriculum_up).astype(np.int64) - (
                tracking < self.curriculum_down
            )
            self.command_levels[ended] = np.clip(
                self.command_levels[ended] + step, 0, self.command_curriculum - 1
            )
        self._tracking_sum[ids] = 0.0

    def _task_reset(self, ids, rng):
        # the settled standing pose, turned to a random heading, joints jittered
        if self.terrain is not None:
            self._terrain_curriculum(ids, rng)
        self._command_curriculum(ids)
        k = len(ids)
        qpos = np.repeat(self._reset_qpos[None], k, axis=0)
        qpos[:, 0:2] = 0.0
        yaw = yaw_quat(rng.uniform(*self.reset_yaw_range, size=k))
        qpos[:, 3:7] = quat_mul(yaw, qpos[:, 3:7])
        jpos = qpos[:, self._jqpos] + rng.uniform(
            -self.reset_joint_noise, self.reset_joint_noise, size=(k, len(JOINTS))
        )
        qpos[:, self._jqpos] = np.clip(jpos, self._jrange[:, 0], self._jrange[:, 1])
        self.engine.set("qpos", qpos, ids)
        self.engine.set("qvel", np.zeros((k, self.model.nv)), ids)
        ctrl = np.zeros((k, self.model.nu))
        ctrl[:, self._act] = self.default_joint_pos
        self.engine.set("ctrl", ctrl, ids)
        self._sample_commands(ids, rng)
        self.feet_air_time[ids] = 0.0
        self.last_contacts[ids] = False
        self._prev_applied[ids] = 0.0
        self._last_joint_vel[ids] = 0.0
        if self.terrain is not None:
            self._place_on_terrain(ids, rng)
