"""Vectorized simulation: batched MuJoCo environments behind one VecEnv contract."""

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
