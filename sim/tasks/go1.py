"""Unitree Go1 velocity tracking, on flat ground (`go1`) and on rough terrain with a
terrain curriculum (`go1_rough`).

The robot is the Go1 MJCF that setup installs (`python -m sim.robot_assets install`;
docs/robots.md says where it comes from). The file has the bodies, joints, inertias
and collision shapes, and nothing else; `go1_spec` adds, with MjSpec, what a task
needs: one position actuator per joint with gains and torque limits from the robot's
motor data, the rotor inertia reflected through the gearbox (armature), ground
contacts only, and a "home" standing keyframe. The Quadruped task does the rest:
observations, rewards, commands, sim-to-real models.
"""

from __future__ import annotations

import os
from dataclasses import fields

import mujoco
import numpy as np

from sim.randomization import SimToRealConfig
from sim.robot_assets import go1_model_dir
from sim.tasks.quadruped import JOINTS, LEGS, Quadruped
from sim.terrain import Terrain, TerrainConfig, next_levels

# Unitree's motor data for the Go1 (go1_description URDF; Unitree's specifications):
# every joint has the same rotor behind a 6:1 gearbox, the knee adds a 1.5:1 linkage
ROTOR_INERTIA = 0.000111842  # kg m^2, about the rotor axis
GEAR_RATIO = {"hip": 6.0, "thigh": 6.0, "calf": 9.0}
EFFORT_LIMIT = {"hip": 23.7, "thigh": 23.7, "calf": 35.55}  # Nm at the joint
# PD gains placing the joint, seen as the rotor's reflected inertia alone, at a 10 Hz
# natural frequency with damping ratio 2 (overdamped: the legs' own inertia and the
# contacts lower both). That gives kp 15.9 / 35.8 Nm/rad: soft enough to absorb
# touchdowns, stiff enough that the home pose holds the 12.7 kg robot up.
NATURAL_FREQ_HZ = 10.0
DAMPING_RATIO = 2.0
HOME_HEIGHT = 0.278  # m, trunk above the floor in the home pose (the feet just touch)
# the home pose: feet under the hips, each splayed 2.6 cm outwards (a positive hip angle
# moves a foot to +y). With the feet turned inwards instead (hips -0.1 on the left), 38
# of 300 robots standing still on the terrain tiles tipped over within 2 s; splayed, none
HOME_JOINTS = {"hip": 0.1, "thigh": 0.9, "calf": -1.8}  # left legs; right hips mirror
FLOOR_FRICTION = (1.0, 0.005, 0.0001)

_W = 2 * np.pi * NATURAL_FREQ_HZ


def _part(joint: str) -> str:
    return joint.split("_")[1]


def armature(joint: str) -> float:
    """Rotor inertia reflected through the joint's gearbox (kg m^2)."""
    return ROTOR_INERTIA * GEAR_RATIO[_part(joint)] ** 2


KP = np.array([armature(j) * _W**2 for j in JOINTS])
KD = np.array([2 * DAMPING_RATIO * armature(j) * _W for j in JOINTS])
TORQUE_LIMIT = np.array([EFFORT_LIMIT[_part(j)] for j in JOINTS])
# an action of 1 asks for a quarter of the joint's torque limit: per joint, as the
# gains differ by joint (0.37 rad at the hips and thighs, 0.25 rad at the knees)
ACTION_SCALE = 0.25 * TORQUE_LIMIT / KP
DEFAULT_JOINT_POS = np.array(
    [HOME_JOINTS[_part(j)] * (-1.0 if j[1] == "R" and _part(j) == "hip" else 1.0) for j in JOINTS]
)
FOOT_GEOMS = tuple(f"{leg}_foot_collision" for leg in LEGS)


def go1_spec(model_path: str | os.PathLike | None = None) -> mujoco.MjSpec:
    """The Go1 as a task needs it, without ground (`add_floor` or a terrain adds that).

    `model_path`: a go1.xml to start from (default: the installed one).
    """
    path = os.fspath(model_path) if model_path else str(go1_model_dir() / "go1.xml")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MJCF file {path} not found")
    spec = mujoco.MjSpec.from_file(path)
    spec.modelname = "sim2real_go1"
    opt = spec.option
    opt.timestep = 0.002
    opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    # elliptic cones with a high impratio, as for `quadruped`: feet do not creep under a
    # static load
    opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    opt.impratio = 100.0
    # MuJoCo's default arena for this model is 14 MiB per env; a robot fallen on rough
    # ground with random targets peaked at 140 KiB (34 contacts)
    spec.memory = 1 << 20
    # the accelerometer and angular momentum sensors cost a pass over every body at each
    # physics step (mj_rnePostConstraint) and the task reads none of them
    for s in list(spec.sensors):
        if s.type in (mujoco.mjtSensor.mjSENS_ACCELEROMETER, mujoco.mjtSensor.mjSENS_SUBTREEANGMOM):
            spec.delete(s)
    # robot geoms touch the ground only, never each other (as `quadruped`): self-contacts
    # cost solver rows at every step and a trotting gait keeps the legs apart anyway
    for g in spec.geoms:
        if g.contype or g.conaffinity:
            g.contype, g.conaffinity = 1, 0
            g.condim = 3
    for name in JOINTS:
        j = spec.joint(name)
        if j is None:
            raise ValueError(f"MJCF {path} lacks the joint {name!r}")
        j.armature = armature(name)
    for name, kp, kd, limit in zip(JOINTS, KP, KD, TORQUE_LIMIT, strict=True):
        a = spec.add_actuator(
            name=name.removesuffix("_joint"),
            target=name,
            trntype=mujoco.mjtTrn.mjTRN_JOINT,
        )
        a.set_to_position(kp=float(kp), kv=float(kd), inheritrange=True)
        a.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        a.forcerange = [-float(limit), float(limit)]
    spec.worldbody.add_light(
        name="sun", pos=[0, 0, 4], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL
    )
    _add_home_key(spec)
    return spec


def _add_home_key(spec: mujoco.MjSpec) -> None:
    # qpos follows the joints in tree order (the file's: FR, FL, RR, RL); ctrl follows
    # the actuators, added in our JOINTS order
    qpos: list[float] = []
    home = dict(zip(JOINTS, DEFAULT_JOINT_POS, strict=True))
    for j in spec.joints:
        if j.type == mujoco.mjtJoint.mjJNT_FREE:
            qpos += [0.0, 0.0, HOME_HEIGHT, 1.0, 0.0, 0.0, 0.0]
        elif j.type in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
            qpos.append(float(home.get(j.name, 0.0)))
        else:
            raise ValueError(f"unexpected ball joint {j.name!r} in the Go1 model")
    spec.add_key(name="home", qpos=qpos, ctrl=[float(v) for v in DEFAULT_JOINT_POS])


def _ground_material(spec: mujoco.MjSpec) -> str:
    spec.add_texture(
        name="grid",
        type=mujoco.mjtTexture.mjTEXTURE_2D,
        builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER,
        width=512,
        height=512,
        rgb1=[0.22, 0.25, 0.28],
        rgb2=[0.30, 0.33, 0.36],
    )
    mat = spec.add_material(name="grid", texrepeat=[1, 1], texuniform=True, reflectance=0.1)
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "grid"
    return "grid"


def add_floor(spec: mujoco.MjSpec) -> mujoco.MjsGeom:
    """A flat floor at z = 0 that the robot's geoms collide with."""
    return spec.worldbody.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[0, 0, 0.05],
        contype=0,
        conaffinity=1,
        friction=list(FLOOR_FRICTION),
        material=_ground_material(spec),
    )


class Go1(Quadruped):
    """The Unitree Go1 following velocity commands on flat ground.

    `model_path=` builds from another go1.xml (e.g. mujoco_menagerie's) instead of the
    installed one; what the file lacks is added as for the default.
    """

    name = "go1"
    base_body = "trunk"
    foot_geoms = FOOT_GEOMS
    action_scale = ACTION_SCALE
    min_base_height = 0.15  # m; the trunk stands at ~0.27

    def _robot_spec(self) -> mujoco.MjSpec:
        return go1_spec(self.model_path)

    def _load_model(self) -> tuple[mujoco.MjModel, str]:
        spec = self._robot_spec()
        add_floor(spec)
        return spec.compile(), self.model_path or "go1.xml (installed)"


class Go1Rough(Go1):
    """The Go1 on a heightfield of tiles that get harder level by level (sim.terrain).

    Each env has a column of the tile grid (a terrain kind) for good and a level: it
    spawns at the centre of its tile, and when its episode ends it moves up a level if
    it walked more than half a tile, down if it walked less than half of what its
    commands asked for over an episode (`next_levels`). The mean level is the per-step
    info term `terrain_level`. All envs share the heightfield, each in its own
    simulation, so robots on the same tile pass through each other.

    The actor observes what the robot measures, as on flat ground; the critic also
    gets a height scan around the base (`height_scan`). Heights the flat task measures
    from the floor (base height, foot contacts) are measured from the terrain under
    the robot; the base touching the ground is MuJoCo's contact sensor.
    """

    name = "go1_rough"
    # on stairs the ground under the base is not the ground the feet stand on: falls
    # end episodes through the base's contacts and the tilt, not its height
    min_base_height = -np.inf
    spawn_jitter = 0.5  # m, uniform around the tile centre (the platforms span +-1 m)
    spawn_clearance = 0.4  # m: spawn above the highest ground this close to the base
    bounds_margin = 1.0  # m from the heightfield's edge: leaving it ends the episode
    scan_x = np.linspace(-0.8, 0.8, 17)
    scan_y = np.linspace(-0.5, 0.5, 11)

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device="cpu",
        s2r: SimToRealConfig | None = None,
        *,
        terrain: TerrainConfig | dict | None = None,
        terrain_seed: int = 0,
        max_init_level: int = 4,
        curriculum: bool = True,
        height_scan: bool = True,
        **kwargs,
    ):
        if isinstance(terrain, dict):
            known = {f.name for f in fields(TerrainConfig)}
            unknown = set(terrain) - known
            if unknown:
                raise ValueError(
                    f"unknown terrain fields {sorted(unknown)}; known: {sorted(known)}"
                )
            terrain = TerrainConfig(**terrain)
        self.terrain = Terrain(terrain, seed=terrain_seed)
        levels = self.terrain.cfg.num_levels
        if not 0 <= max_init_level:
            raise ValueError(f"max_init_level must be >= 0, got {max_init_level}")
        self.max_init_level = min(int(max_init_level), levels - 1)
        self.curriculum = bool(curriculum)
        self.height_scan = bool(height_scan)
        super().__init__(num_envs, seed, device, s2r, **kwargs)
        n = self.num_envs
        # legged_gym's assignment: each env keeps one column (kind), levels start low
        self.terrain_cols = np.arange(n, dtype=np.int64) % self.terrain.cfg.num_cols
        self.terrain_levels = self._rng.integers(0, self.max_init_level + 1, size=n)
        self._spawn_xy = np.zeros((n, 2))
        self._end_xy = np.zeros((n, 2))
        self._asked = np.zeros(n)  # commanded planar distance so far this episode (m)
        gx, gy = np.meshgrid(self.scan_x, self.scan_y, indexing="ij")
        self._scan_points = np.stack([gx.ravel(), gy.ravel()], axis=1)
        self.engine.get("sensordata")  # bound before the first reset, as in Quadruped

    # ------------------------------------------------------------------ model
    def _load_model(self) -> tuple[mujoco.MjModel, str]:
        spec = self._robot_spec()
        mat = _ground_material(spec)
        self.terrain.add_to_spec(
            spec, contype=0, conaffinity=1, friction=list(FLOOR_FRICTION), material=mat
        )
        spec.add_sensor(
            name="base_contact",
            type=mujoco.mjtSensor.mjSENS_CONTACT,
            objtype=mujoco.mjtObj.mjOBJ_BODY,
            objname=self.base_body,
            reftype=mujoco.mjtObj.mjOBJ_GEOM,
            refname="terrain",
            intprm=[1, 0, 1],  # data "found", no reduction, one slot
        )
        m = spec.compile()
        sid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SENSOR, "base_contact")
        self._base_contact_adr = int(m.sensor_adr[sid])
        return m, self.model_path or "go1.xml (installed)"

    # ------------------------------------------------------------------ ground
    def _ground_under(self, xy: np.ndarray) -> np.ndarray:
        return self.terrain.height_at(xy)

    def _base_touches_ground(self, base: dict, qpos: np.ndarray) -> np.ndarray:
        return self.engine.get("sensordata")[:, self._base_contact_adr] > 0

    # ------------------------------------------------------------------ observations
    def _task_obs_terms(self):
        terms = super()._task_obs_terms()
        if self.height_scan:
            terms["critic"] = terms["critic"] + [
                ("height_scan", len(self.scan_x) * len(self.scan_y))
            ]
        return terms

    def _task_obs(self):
        obs = super()._task_obs()
        if self.height_scan:
            obs["height_scan"] = self._scan()
        return obs

    def _scan(self) -> np.ndarray:
        """Base height above the ground at points of a grid around it, turned with its
        heading (legged_gym's measured heights), less the standing height."""
        qpos = self.engine.get("qpos")
        w, x, y, z = qpos[:, 3], qpos[:, 4], qpos[:, 5], qpos[:, 6]
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
        px, py = self._scan_points[:, 0], self._scan_points[:, 1]
        pts = np.stack([qpos[:, 0:1] + c * px - s * py, qpos[:, 1:2] + s * px + c * py], axis=-1)
        rel = qpos[:, 2:3] - self.terrain.height_at(pts) - self._reset_qpos[2]
        return np.clip(rel, -1.0, 1.0)

    # ------------------------------------------------------------------ episodes
    def _task_reward(self, pre, actions):
        # the command in force during this step, before the parent may draw a new one
        self._asked += np.linalg.norm(self.commands[:, :2], axis=1) * self.dt
        reward, terminated, extras = super()._task_reward(pre, actions)
        xy = self.engine.get("qpos")[:, 0:2]
        self._end_xy[...] = xy
        x0, x1, y0, y1 = self.terrain.extent
        m = self.bounds_margin
        outside = (
            (xy[:, 0] < x0 + m) | (xy[:, 0] > x1 - m) | (xy[:, 1] < y0 + m) | (xy[:, 1] > y1 - m)
        )
        extras["terrain_level"] = self.terrain_levels.astype(np.float64)
        return reward, terminated | outside, extras

    def _task_reset(self, ids, rng):
        ended = ids[self.episode_length[ids] > 0]
        if self.curriculum and len(ended):
            walked = np.linalg.norm(self._end_xy[ended] - self._spawn_xy[ended], axis=1)
            left = (self.max_episode_steps - self.episode_length[ended]) * self.dt
            asked = self._asked[ended] + np.linalg.norm(self.commands[ended, :2], axis=1) * left
            self.terrain_levels[ended] = next_levels(
                self.terrain_levels[ended],
                walked,
                asked,
                self.terrain.cfg.tile_size,
                self.terrain.cfg.num_levels,
                rng,
            )
        super()._task_reset(ids, rng)  # the standing pose at the origin, heading, command
        k = len(ids)
        origin = self.terrain.origins[self.terrain_levels[ids], self.terrain_cols[ids]]
        xy = origin[:, 0:2] + rng.uniform(-self.spawn_jitter, self.spawn_jitter, size=(k, 2))
        qpos = self.engine.get("qpos")[ids].copy()
        qpos[:, 0:2] = xy
        # the pose was settled on flat ground at height 0: lift it onto the highest ground
        # under the robot so that no foot starts inside a bump or a step
        qpos[:, 2] += self.terrain.max_height_around(xy, self.spawn_clearance)
        self.engine.set("qpos", qpos, ids)
        self._spawn_xy[ids] = xy
        self._end_xy[ids] = xy
        self._asked[ids] = 0.0
