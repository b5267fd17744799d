"""The policy's observation frame, assembled from the latest ROS messages (numpy only).

The policy file's metadata lists the observation terms in order with their sizes. Each
known term name maps to a function of the latest ``sensor_msgs/JointState``,
``sensor_msgs/Imu``, the velocity command and the last action; a term with no ROS
source (``base_lin_vel``, a privileged term, a typo) is refused when the assembler is
built, i.e. when the node is configured, never on the robot mid-run.

Known terms (the quadruped task's actor observation, ``sim/tasks/quadruped.py``):

=====================  ======  ================================================================
term                   size    from
=====================  ======  ================================================================
``base_ang_vel``       3       ``Imu.angular_velocity`` (body frame, rad/s)
``projected_gravity``  3       ``Imu.orientation``: the unit gravity vector in the body frame,
                               ``R^T (0, 0, -1)``
``command``            3       the command (``Twist.linear.x``, ``linear.y``, ``angular.z``)
``joint_pos``          joints  ``JointState.position`` minus the default joint positions
``joint_vel``          joints  ``JointState.velocity``
``last_action``        joints  the last raw action sent (the node passes it in)
=====================  ======  ================================================================

Joints are looked up by name, never by position: a ``JointState`` may list the joints in
any order and carry extra joints; one that lacks an action joint is an error. The
messages are read duck-typed (``.name``, ``.position``, ``.velocity``; ``.orientation.x``
...; ``.angular_velocity.x`` ...), so this module imports nothing of ROS and is tested
without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "JOINT_TERMS",
    "KNOWN_TERMS",
    "ObservationAssembler",
    "ObservationError",
    "projected_gravity",
]

JOINT_TERMS = ("joint_pos", "joint_vel", "last_action")
"""Terms with one value per action joint."""

KNOWN_TERMS: dict[str, int | None] = {
    "base_ang_vel": 3,
    "projected_gravity": 3,
    "command": 3,
    "joint_pos": None,  # None: one value per action joint
    "joint_vel": None,
    "last_action": None,
}
"""Observation term names the node can compute, with their sizes."""

IMU_TERMS = ("base_ang_vel", "projected_gravity")


class ObservationError(ValueError):
    """The policy asks for an observation the node cannot build, or a message is unusable."""


def projected_gravity(x: float, y: float, z: float, w: float, out: np.ndarray) -> np.ndarray:
    """Unit gravity in the body frame, ``R^T (0, 0, -1)``, from a (x, y, z, w) quaternion.

    ``R`` rotates body vectors into the world frame (ROS's ``Imu.orientation``); the result
    is minus the third row of ``R``, computed without building the matrix. The quaternion
    is normalized first; a zero or non-finite one gives NaN (which the node treats as a
    bad observation).
    """
    n2 = x * x + y * y + z * z + w * w
    if not (n2 > 0.0 and math.isfinite(n2)):
        out.fill(math.nan)
        return out
    s = 2.0 / n2
    out[0] = -s * (x * z - w * y)
    out[1] = -s * (y * z + w * x)
    out[2] = -(1.0 - s * (x * x + y * y))
    return out


def _as_float_array(values: Any) -> np.ndarray:
    # rclpy gives float64[] fields as array.array('d'): a zero-copy view of it
    try:
        arr = np.frombuffer(values, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.asarray(values, dtype=np.float64)
    return arr


class ObservationAssembler:
    """Builds observation frames in the order of the policy's ``obs_terms``.

    Args:
        obs_terms: ``[(name, size), ...]`` from the policy metadata.
        joint_names: the action joints in the policy's order.
        default_joint_pos: subtracted from measured positions for ``joint_pos``.

    Raises:
        ObservationError: a term has no ROS source or its size disagrees.
    """

    def __init__(
        self,
        obs_terms: Sequence[tuple[str, int]],
        joint_names: Sequence[str],
        default_joint_pos: Sequence[float],
    ) -> None:
        self.joint_names = [str(n) for n in joint_names]
        nj = len(self.joint_names)
        if nj == 0:
            raise ObservationError("the policy names no action joints")
        self.default_joint_pos = np.asarray(default_joint_pos, dtype=np.float64).reshape(-1)
        if self.default_joint_pos.size != nj:
            raise ObservationError(
                f"default_joint_pos has {self.default_joint_pos.size} values for {nj} joints"
            )
        self.terms = [(str(n), int(s)) for n, s in obs_terms]
        unknown = [n for n, _ in self.terms if n not in KNOWN_TERMS]
        if unknown:
            raise ObservationError(
                f"the policy observes term(s) {unknown} that the ROS node cannot compute from "
                f"JointState, Imu, the command and the last action; known terms: "
                f"{sorted(KNOWN_TERMS)}"
            )
        self.slices: dict[str, slice] = {}
        start = 0
        for name, size in self.terms:
            want = nj if KNOWN_TERMS[name] is None else KNOWN_TERMS[name]
            if size != want:
                raise ObservationError(
                    f"observation term {name!r} has size {size} in the policy metadata, but the "
                    f"node computes {want} values for it"
                )
            self.slices[name] = slice(start, start + size)
            start += size
        self.frame_size = start
        self.needs_imu = any(n in self.slices for n in IMU_TERMS)
        self.needs_joint_state = any(n in self.slices for n in ("joint_pos", "joint_vel"))
        self.needs_velocity = "joint_vel" in self.slices
        self.needs_command = "command" in self.slices
        self._frame = np.zeros(self.frame_size)
        # views of the frame, one per term (None: not observed), written in place
        views = {name: self._frame[sl] for name, sl in self.slices.items()}
        self._pos = views.get("joint_pos")
        self._vel = views.get("joint_vel")
        self._gravity_view = views.get("projected_gravity")
        self._command_view = views.get("command")
        self._action_view = views.get("last_action")
        self._gyro_at = self.slices["base_ang_vel"].start if "base_ang_vel" in self.slices else None
        self._index = np.zeros(nj, dtype=np.intp)
        self._index_names: list[str] | None = None

    # ------------------------------------------------------------------ joints by name
    def joint_index(self, names: Sequence[str]) -> np.ndarray:
        """Indices into a JointState's arrays of the action joints, in policy order.

        Cached: a robot sends the same name list every time, so the lookup is built once.
        Raises :class:`ObservationError` naming the missing joints.
        """
        if names == self._index_names:
            return self._index
        where = {}
        for i, name in enumerate(names):
            where.setdefault(name, i)
        missing = [j for j in self.joint_names if j not in where]
        if missing:
            raise ObservationError(
                f"JointState lacks action joint(s) {missing} (it names {list(names)})"
            )
        self._index[:] = [where[j] for j in self.joint_names]
        self._index_names = list(names)
        return self._index

    def joint_positions(self, joint_state: Any) -> np.ndarray:
        """Measured positions of the action joints, policy order (a new array)."""
        idx = self.joint_index(joint_state.name)
        pos = _as_float_array(joint_state.position)
        if pos.size != len(joint_state.name):
            raise ObservationError(
                f"JointState has {len(joint_state.name)} names but {pos.size} positions"
            )
        return pos[idx]

    # ------------------------------------------------------------------ the frame
    def assemble(
        self,
        joint_state: Any,
        imu: Any,
        command: Sequence[float] | np.ndarray,
        last_action: np.ndarray,
    ) -> np.ndarray:
        """The observation frame from the latest messages (a view of an internal buffer).

        Args:
            joint_state: the latest ``JointState`` (or None if the policy needs none).
            imu: the latest ``Imu`` (or None if the policy needs none).
            command: ``(vx, vy, yaw_rate)``.
            last_action: the last raw action, policy joint order.

        Returns:
            The frame, float64, ``frame_size`` values; overwritten by the next call, so
            copy it to keep it. Non-finite sensor values pass through as they are (the
            caller and the safety layer reject the frame).

        Raises:
            ObservationError: a needed message is missing, lacks a joint, or has
            mismatched array lengths.
        """
        f = self._frame
        if self.needs_joint_state:
            if joint_state is None:
                raise ObservationError("no JointState received yet")
            names = joint_state.name
            idx = self.joint_index(names)
            n = len(names)
            if self._pos is not None:
                pos = _as_float_array(joint_state.position)
                if pos.size != n:
                    raise ObservationError(f"JointState has {n} names but {pos.size} positions")
                np.take(pos, idx, out=self._pos)
                np.subtract(self._pos, self.default_joint_pos, out=self._pos)
            if self._vel is not None:
                vel = _as_float_array(joint_state.velocity)
                if vel.size != n:
                    raise ObservationError(
                        f"JointState has {n} names but {vel.size} velocities (the policy "
                        "observes joint velocities)"
                    )
                np.take(vel, idx, out=self._vel)
        if self.needs_imu:
            if imu is None:
                raise ObservationError("no Imu received yet")
            s = self._gyro_at
            if s is not None:
                w = imu.angular_velocity
                f[s] = w.x
                f[s + 1] = w.y
                f[s + 2] = w.z
            if self._gravity_view is not None:
                q = imu.orientation
                projected_gravity(q.x, q.y, q.z, q.w, self._gravity_view)
        if self._command_view is not None:
            self._command_view[:] = command
        if self._action_view is not None:
            self._action_view[:] = last_action
        return f
