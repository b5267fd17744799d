"""Small array chores that the runtime, the safety layer, sim2sim and the ROS controller
share: a finite check that allocates nothing, and the map between a policy's raw
actions and joint targets."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ActionMap", "all_finite"]


def all_finite(x: np.ndarray, zeros: np.ndarray) -> bool:
    """True if every element of the 1-D float ``x`` is finite, without allocating.

    ``zeros`` is a preallocated zero vector of ``x``'s length: ``x . 0`` is 0 for finite
    ``x`` and NaN as soon as one element is NaN or +-inf (0 * inf = NaN); unlike a plain
    sum it cannot overflow. About 4x faster than ``np.isfinite(x).all()`` on the sizes
    of a control step (0.5 us against 2.3 us). With ``inf`` in ``x`` numpy flags
    "invalid value in dot": a RuntimeWarning by default, an exception under
    ``np.seterr(all="raise")`` or warnings-as-errors, which is caught here and also
    means "not finite". Only bad data pays for that.
    """
    try:
        return math.isfinite(x.dot(zeros))
    except (FloatingPointError, RuntimeWarning):
        return False


class ActionMap:
    """``target = offset + scale * raw`` per joint, and back.

    The network outputs raw actions; robots and the safety layer work on joint targets.
    The inverse is what a policy must see as its last action after the safety layer
    changed the target: the raw action that would have produced the sent target. A
    joint with scale 0 has no inverse: its raw value is ``fixed_raw`` (0 unless the
    caller passes the raw action itself).
    """

    def __init__(self, offset: Any, scale: Any) -> None:
        self.offset = np.asarray(offset, dtype=np.float64).reshape(-1)
        self.scale = np.asarray(scale, dtype=np.float64).reshape(-1)
        if self.offset.shape != self.scale.shape:
            raise ValueError(
                f"action offset and scale differ in size: {self.offset.size} and {self.scale.size}"
            )
        self.invertible = self.scale != 0.0
        self.all_invertible = bool(self.invertible.all())
        self._divisor = np.where(self.invertible, self.scale, 1.0)

    @property
    def size(self) -> int:
        return int(self.scale.size)

    def to_targets(self, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Joint targets of raw actions ``[..., J]`` (float64; into ``out`` if given)."""
        if out is None:
            return self.offset + self.scale * raw
        np.multiply(raw, self.scale, out=out)
        np.add(out, self.offset, out=out)
        return out

    def to_raw(
        self, targets: np.ndarray, out: np.ndarray | None = None, fixed_raw: Any = 0.0
    ) -> np.ndarray:
        """Raw actions whose targets are ``targets`` ``[..., J]``; ``fixed_raw`` where the
        scale is 0 (a number or an array shaped like ``targets``)."""
        if out is None:
            out = np.empty(np.shape(targets), dtype=np.float64)
        np.subtract(targets, self.offset, out=out)
        np.divide(out, self._divisor, out=out)
        if not self.all_invertible:
            fixed = ~self.invertible
            out[..., fixed] = np.broadcast_to(fixed_raw, out.shape)[..., fixed]
        return out
