"""Vectorized simulation: batched MuJoCo environments behind one VecEnv contract."""

import os as _os

# MuJoCo picks its OpenGL backend when it is first imported: without a display, rendering
# (videos, image observations) needs EGL, which a user of the Python API should not have
# to know to ask for. An explicit MUJOCO_GL wins.
if not _os.environ.get("DISPLAY") and not _os.environ.get("WAYLAND_DISPLAY"):
    _os.environ.setdefault("MUJOCO_GL", "egl")

from sim.randomization import SimToRealConfig
from sim.registry import make, register, task_class, task_names
from sim.spec import (
    ActionSpec,
    JointIndices,
    ObservationSpec,
    ObsGroup,
    ObsTerm,
    RobotDescription,
)
from sim.vec_env import MujocoVecEnv

__all__ = [
    "ActionSpec",
    "JointIndices",
    "MujocoVecEnv",
    "ObsGroup",
    "ObsTerm",
    "ObservationSpec",
    "RobotDescription",
    "SimToRealConfig",
    "make",
    "register",
    "task_class",
    "task_names",
]
