"""The data that describes an environment to learners and to the robot side.

These specs travel: the runner sizes networks from them, export copies them into
the ONNX metadata, and the ROS node assembles observations in the order they give.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ObsTerm:
    name: str
    size: int


@dataclass(frozen=True)
class ObsGroup:
    """An ordered list of observation terms; the group's tensor is their concatenation."""

    terms: tuple[ObsTerm, ...]
    history: int = 1  # frames stacked oldest first; the tensor size is size * history

    @property
    def frame_size(self) -> int:
        return sum(t.size for t in self.terms)

    @property
    def size(self) -> int:
        return self.frame_size * self.history

    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for t in self.terms:
            out[t.name] = slice(start, start + t.size)
            start += t.size
        return out


@dataclass(frozen=True)
class ObservationSpec:
    """Named observation groups, as Isaac Lab's managers expose them.

    `policy` is what the robot has; `critic` (optional) adds privileged state for an
    asymmetric critic and, when present, contains the policy terms first.
    """

    groups: dict[str, ObsGroup]

    def __getitem__(self, name: str) -> ObsGroup:
        if name not in self.groups:
            raise KeyError(f"no observation group {name!r}; groups: {sorted(self.groups)}")
        return self.groups[name]

    @property
    def policy(self) -> ObsGroup:
        return self.groups["policy"]


@dataclass(frozen=True)
class ActionSpec:
    size: int
    low: np.ndarray
    high: np.ndarray
    joint_names: tuple[str, ...]


@dataclass(frozen=True)
class RobotDescription:
    """What deployment needs to know about the robot, in the policy's joint order.

    For torque-level gym tasks `kp`/`kd` are zero and `action_scale` maps the action to
    the actuator's control; for position-controlled robots the joint target is
    `default_joint_pos + action_scale * action`.
    """

    joint_names: tuple[str, ...]
    default_joint_pos: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    action_scale: np.ndarray
    action_offset: np.ndarray
    joint_pos_lower: np.ndarray
    joint_pos_upper: np.ndarray
    torque_limit: np.ndarray
    physics_dt: float
    control_dt: float
    control_mode: str = "torque"  # "torque" | "position"

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}


@dataclass(frozen=True, eq=False)  # eq=False: == on array fields has no single truth value
class JointIndices:
    """Where each action joint lives in the MuJoCo model, in `action_spec.joint_names` order.

    For code that steps its own copy of a task's model (the ROS simulated robot):
    `data.ctrl[actuator_ids]`, `data.qpos[qpos_adr]`, `data.qvel[dof_adr]`. The arrays
    are int64 copies marked read-only, so that no reader can move a task's indices.
    """

    joint_names: tuple[str, ...]
    actuator_ids: np.ndarray
    qpos_adr: np.ndarray
    dof_adr: np.ndarray

    def __post_init__(self) -> None:
        names = tuple(self.joint_names)
        object.__setattr__(self, "joint_names", names)
        for field in ("actuator_ids", "qpos_adr", "dof_adr"):
            a = np.array(getattr(self, field), dtype=np.int64)
            if a.shape != (len(names),):
                raise ValueError(
                    f"JointIndices.{field} needs one index per joint ({len(names)}), "
                    f"got shape {a.shape}"
                )
            a.setflags(write=False)
            object.__setattr__(self, field, a)
