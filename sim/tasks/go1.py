"""Unitree Go1 velocity tracking, on flat ground (`go1`) and on rough terrain with a
terrain curriculum (`go1_rough`, sim/tasks/terrain_ground.py).

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

import mujoco
import numpy as np

from sim.randomization import SimToRealConfig
from sim.robot_assets import go1_model_dir
from sim.tasks.quadruped import JOINTS, LEGS, Quadruped
from sim.terrain import TerrainConfig

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
        source = self.model_path or "go1.xml (installed)"
        if self.terrain is None:
            add_floor(spec)
            return spec.compile(), source
        ground = {"contype": 0, "conaffinity": 1, "friction": list(FLOOR_FRICTION)}
        return self._compile_with_terrain(spec, material=_ground_material(spec), **ground), source


class Go1Rough(Go1):
    """The Go1 on a heightfield of tiles that get harder level by level (sim.terrain),
    with the terrain curriculum of sim/tasks/terrain_ground.py: the `go1` task with a
    terrain by default (`terrain=` a dict of TerrainConfig fields changes the tiles).
    """

    name = "go1_rough"

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device="cpu",
        s2r: SimToRealConfig | None = None,
        *,
        terrain: TerrainConfig | dict | bool | None = None,
        **kwargs,
    ):
        if terrain is None or terrain is False:  # the task is its terrain
            terrain = True
        super().__init__(num_envs, seed, device, s2r, terrain=terrain, **kwargs)
