"""Shared pieces of the tasks that reproduce Gymnasium's MuJoCo v5 environments.

The MJCF comes from the installed gymnasium package, so the model is the very one
`gymnasium.make("<Task>-v5")` simulates; observation, reward, termination and reset
code mirror the v5 definitions term by term, vectorized over envs.
"""

from __future__ import annotations

import os
from functools import cached_property

import gymnasium
import mujoco
import numpy as np

from sim.spec import RobotDescription
from sim.vec_env import MujocoVecEnv

GYM_ASSETS = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")


def load_gym_model(xml_name: str) -> mujoco.MjModel:
    path = os.path.join(GYM_ASSETS, xml_name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Gymnasium MJCF {path} not found; is gymnasium[mujoco] installed?")
    spec = mujoco.MjSpec.from_file(path)
    total_mass = spec.compiler.settotalmass
    if total_mass <= 0:
        return spec.compile()
    # half_cheetah.xml sets the compiler's settotalmass, which MuJoCo deprecated: compiling
    # it warns on stderr and writes MUJOCO_LOG.TXT into the cwd. The replacement MuJoCo
    # names gives a model equal to the old one field for field (checked: every array of
    # MjModel identical), so the parity with gymnasium.make holds.
    spec.compiler.settotalmass = -1.0
    model = spec.compile()
    mujoco.mj_setTotalmass(model, total_mass)
    mujoco.mj_setConst(model, mujoco.MjData(model))
    return model


def torque_robot(model: mujoco.MjModel, control_dt: float) -> RobotDescription:
    """Description of a torque-controlled robot whose actions are the actuators' controls."""
    jids = model.actuator_trnid[:, 0]
    names = tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in jids)
    qadr = model.jnt_qposadr[jids]
    lim = model.jnt_range[jids]
    limited = model.jnt_limited[jids].astype(bool)
    nu = model.nu
    return RobotDescription(
        joint_names=names,
        default_joint_pos=model.qpos0[qadr].copy(),
        kp=np.zeros(nu),
        kd=np.zeros(nu),
        action_scale=np.ones(nu),
        action_offset=np.zeros(nu),
        joint_pos_lower=np.where(limited, lim[:, 0], -np.inf),
        joint_pos_upper=np.where(limited, lim[:, 1], np.inf),
        torque_limit=np.abs(model.actuator_gear[:, 0])
        * np.abs(model.actuator_ctrlrange).max(axis=1),
        physics_dt=float(model.opt.timestep),
        control_dt=float(control_dt),
        control_mode="torque",
    )


class GymTask(MujocoVecEnv):
    """A Gymnasium v5 MuJoCo task; subclasses name the XML and the v5 terms."""

    xml: str = ""

    def _task_model(self) -> mujoco.MjModel:
        return load_gym_model(self.xml)

    @cached_property
    def robot(self) -> RobotDescription:
        return torque_robot(self.model, float(self.model.opt.timestep) * self.frame_skip)

    def _task_action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.model.actuator_ctrlrange[:, 0].copy(), self.model.actuator_ctrlrange[
            :, 1
        ].copy()

    @property
    def init_qpos(self) -> np.ndarray:
        return self.model.qpos0

    @property
    def init_qvel(self) -> np.ndarray:
        return np.zeros(self.model.nv)

    def _set_reset_state(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        self.engine.set("qpos", qpos, ids)
        self.engine.set("qvel", qvel, ids)

    def _ctrl_cost(self, actions: np.ndarray, weight: float) -> np.ndarray:
        return weight * np.square(actions).sum(axis=1)
