"""A VLA policy's inputs from ROS messages: the camera image and the proprio vector (numpy).

Messages are read duck-typed (``sensor_msgs/Image``: ``height``, ``width``, ``encoding``,
``step``, ``data``; ``JointState``: ``name``, ``position``, ``velocity``; a point:
``point.x`` ...), so this module imports nothing of ROS and is tested without it.

Images: ``rgb8`` is what the policy takes (RGB, channels last); ``bgr8`` (many camera
drivers' default) has its channels reversed. Any other encoding, or a size other than the
one the policy was trained at, is refused with :class:`ImageError`: resizing or
re-encoding on the robot would feed the network pixels it never saw in training, so the
camera driver must be set to the trained size instead. Checking a message
(:func:`check_image`) reads only its header; the pixels are converted
(:func:`image_into`) only when a chunk is computed.

Proprio terms (the metadata's ``obs_terms``, in order):

==================  ======  =============================================================
term                size    from
==================  ======  =============================================================
``joint_pos``       joints  ``JointState.position`` minus the default joint positions
``joint_vel``       joints  ``JointState.velocity``
``joint_cos``       joints  ``cos(JointState.position)``
``joint_sin``       joints  ``sin(JointState.position)``
``fingertip``       2 or 3  the end effector's point (``geometry_msgs/PointStamped``: x, y
                            [, z]), from the robot's forward kinematics
``last_action``     joints  the last raw action sent
==================  ======  =============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sim2real_ros.observation import ObservationError

__all__ = [
    "IMAGE_ENCODINGS",
    "VLA_TERMS",
    "ImageError",
    "ProprioAssembler",
    "check_image",
    "image_into",
    "normalize_instruction",
]

IMAGE_ENCODINGS = ("rgb8", "bgr8")
"""Encodings the node converts; anything else is refused."""

VLA_TERMS: dict[str, int | tuple[int, ...] | None] = {
    "joint_pos": None,  # None: one value per action joint
    "joint_vel": None,
    "joint_cos": None,
    "joint_sin": None,
    "fingertip": (2, 3),
    "last_action": None,
}
"""Proprio term names the VLA node can compute, with their sizes."""

_JOINT_STATE_TERMS = ("joint_pos", "joint_vel", "joint_cos", "joint_sin")


class ImageError(ValueError):
    """A camera image the policy cannot take (encoding, size, or a truncated buffer)."""


def check_image(msg: Any, height: int, width: int) -> None:
    """Raise :class:`ImageError` naming why ``msg`` cannot feed a ``height x width`` policy.

    Reads the header fields and the buffer's length only, not the pixels.
    """
    enc = str(msg.encoding)
    if enc not in IMAGE_ENCODINGS:
        raise ImageError(f"encoding {enc!r} not supported (the node takes {IMAGE_ENCODINGS})")
    h, w = int(msg.height), int(msg.width)
    if (h, w) != (height, width):
        raise ImageError(
            f"image is {h} x {w}, the policy was trained at {height} x {width}: set the camera "
            "driver to that size (the node does not resize)"
        )
    step = int(msg.step)
    if step < 3 * w:
        raise ImageError(f"row step {step} < 3 * width {3 * w}")
    if len(msg.data) < step * h:
        raise ImageError(f"image data has {len(msg.data)} bytes, need step * height {step * h}")


def image_into(msg: Any, out: np.ndarray) -> np.ndarray:
    """Copy a checked ``rgb8``/``bgr8`` message into ``out`` (uint8 ``[H, W, 3]``, RGB)."""
    h, w = out.shape[:2]
    step = int(msg.step)
    flat = np.frombuffer(msg.data, dtype=np.uint8, count=step * h)
    rows = flat.reshape(h, step)[:, : 3 * w].reshape(h, w, 3)
    np.copyto(out, rows[..., ::-1] if msg.encoding == "bgr8" else rows)
    return out


def normalize_instruction(text: str) -> str:
    """Lower case, single spaces, no trailing full stop: the key of the instruction list."""
    return " ".join(str(text).lower().split()).rstrip(".")


def _as_float_array(values: Any) -> np.ndarray:
    try:  # rclpy gives float64[] fields as array.array('d'): a zero-copy view
        return np.frombuffer(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray(values, dtype=np.float64)


class ProprioAssembler:
    """Builds the proprio vector in the order of the policy's ``obs_terms``.

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
        self.default_joint_pos = np.asarray(default_joint_pos, dtype=np.float64).reshape(nj)
        terms = [(str(n), int(s)) for n, s in obs_terms]
        unknown = [n for n, _ in terms if n not in VLA_TERMS]
        if unknown:
            raise ObservationError(
                f"the policy observes term(s) {unknown} that the VLA node cannot compute; "
                f"known terms: {sorted(VLA_TERMS)}"
            )
        self.slices: dict[str, slice] = {}
        start = 0
        for name, size in terms:
            want = VLA_TERMS[name]
            ok = (
                size == nj
                if want is None
                else size in want
                if isinstance(want, tuple)
                else size == want
            )
            if not ok:
                raise ObservationError(
                    f"proprio term {name!r} has size {size} in the policy metadata; the node "
                    f"computes {nj if want is None else want}"
                )
            self.slices[name] = slice(start, start + size)
            start += size
        self.size = start
        self.needs_joint_state = any(n in self.slices for n in _JOINT_STATE_TERMS)
        self.needs_fingertip = "fingertip" in self.slices
        self._frame = np.zeros(self.size)
        self._index = np.zeros(nj, dtype=np.intp)
        self._index_names: list[str] | None = None

    def joint_positions(self, joint_state: Any) -> np.ndarray:
        """Measured positions of the action joints, in policy order (a new array)."""
        pos = _as_float_array(joint_state.position)
        if pos.size != len(joint_state.name):
            raise ObservationError(
                f"JointState has {len(joint_state.name)} names but {pos.size} positions"
            )
        return pos[self._joint_index(joint_state.name)]

    def _joint_index(self, names: Sequence[str]) -> np.ndarray:
        if names == self._index_names:
            return self._index
        where: dict[str, int] = {}
        for i, name in enumerate(names):
            where.setdefault(name, i)
        missing = [j for j in self.joint_names if j not in where]
        if missing:
            raise ObservationError(f"JointState lacks action joint(s) {missing}")
        self._index[:] = [where[j] for j in self.joint_names]
        self._index_names = list(names)
        return self._index

    def assemble(self, joint_state: Any, point: Any, last_action: np.ndarray) -> np.ndarray:
        """The proprio vector (a view of an internal buffer, overwritten by the next call).

        Non-finite sensor values pass through (the caller and the safety layer reject
        them). Raises :class:`ObservationError` for a missing message or joint.
        """
        f, s = self._frame, self.slices
        if self.needs_joint_state:
            if joint_state is None:
                raise ObservationError("no JointState received yet")
            pos = self.joint_positions(joint_state)
            if "joint_pos" in s:
                f[s["joint_pos"]] = pos - self.default_joint_pos
            if "joint_cos" in s:
                f[s["joint_cos"]] = np.cos(pos)
            if "joint_sin" in s:
                f[s["joint_sin"]] = np.sin(pos)
            if "joint_vel" in s:
                vel = _as_float_array(joint_state.velocity)
                if vel.size != len(joint_state.name):
                    raise ObservationError(
                        f"JointState has {len(joint_state.name)} names but {vel.size} velocities"
                    )
                f[s["joint_vel"]] = vel[self._index]
        if self.needs_fingertip:
            if point is None:
                raise ObservationError("no fingertip point received yet")
            sl = s["fingertip"]
            p = point.point
            f[sl] = (p.x, p.y, p.z)[: sl.stop - sl.start]
        if "last_action" in s:
            f[s["last_action"]] = last_action
        return f
