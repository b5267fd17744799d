"""The PD gains a policy needs on the robot's joints, and the user's overrides of them.

A position-controlled policy acts through PD controllers: its targets become torques
``kp * (target - q) - kd * dq`` with the gains it was trained with (its metadata's ``kp``
and ``kd``). The policy node sends targets only; the robot's joint controllers (a
ros2_control controller, a vendor driver) close that loop, so they must run those gains.
Other gains change what every target does, which is why an override is allowed (a robot's
actuators may differ from the model) but always named in a warning.

No ROS here: the node logs and publishes what :func:`resolve_gains` returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GainsError", "PDGains", "resolve_gains"]


class GainsError(ValueError):
    """A ``kp``/``kd`` override that cannot be used (length, non-finite, negative)."""


@dataclass(frozen=True)
class PDGains:
    """Per-joint gains, in the policy's joint order (``joint_names``)."""

    joint_names: tuple[str, ...]
    kp: np.ndarray
    kd: np.ndarray
    trained_kp: np.ndarray
    trained_kd: np.ndarray

    def overrides(self) -> dict[str, list[tuple[str, float, float]]]:
        """``{"kp": [(joint, value, trained value), ...], "kd": [...]}``: the joints whose
        gain differs from the trained one (empty lists: the trained gains)."""
        out: dict[str, list[tuple[str, float, float]]] = {}
        for name, value, trained in (
            ("kp", self.kp, self.trained_kp),
            ("kd", self.kd, self.trained_kd),
        ):
            out[name] = [
                (joint, float(v), float(t))
                for joint, v, t in zip(self.joint_names, value, trained)
                if not math.isclose(v, t, rel_tol=1e-9, abs_tol=1e-12)
            ]
        return out

    def table(self) -> str:
        """One line per joint: index, name, kp, kd (and the trained value where it differs)."""
        width = max(len(n) for n in self.joint_names)
        lines = []
        for i, joint in enumerate(self.joint_names):
            parts = []
            for name, value, trained in (
                ("kp", self.kp[i], self.trained_kp[i]),
                ("kd", self.kd[i], self.trained_kd[i]),
            ):
                text = f"{name} {value:g}"
                if not math.isclose(value, trained, rel_tol=1e-9, abs_tol=1e-12):
                    text += f" (trained {trained:g})"
                parts.append(text)
            lines.append(f"  {i:2d} {joint:<{width}}  " + "  ".join(parts))
        return "\n".join(lines)

    def as_array(self) -> np.ndarray:
        """``[kp..., kd...]``: the payload of the node's gains message (2 x joints)."""
        return np.concatenate([self.kp, self.kd]).astype(np.float64)


def _gain_vector(name: str, value: Sequence[float] | None, trained: np.ndarray) -> np.ndarray:
    if value is None or (isinstance(value, list | tuple) and len(value) == 0):
        return trained.copy()
    try:
        out = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise GainsError(f"{name} must be a list of numbers, got {value!r}") from None
    if out.shape != trained.shape:
        raise GainsError(
            f"{name} has {out.size} values; the policy has {trained.size} joints (one gain per "
            "joint, in the policy's joint order)"
        )
    if not (np.isfinite(out).all() and (out >= 0).all()):
        raise GainsError(f"{name} must be finite and >= 0, got {out.tolist()}")
    return out


def resolve_gains(
    joint_names: Sequence[str],
    trained_kp: Sequence[float],
    trained_kd: Sequence[float],
    kp: Sequence[float] | None = None,
    kd: Sequence[float] | None = None,
) -> PDGains:
    """The gains to run: the trained ones, or ``kp``/``kd`` where given (None or empty:
    the trained gains). Raises :class:`GainsError` on an override of the wrong length, or
    with a negative or non-finite value."""
    t_kp = np.asarray(trained_kp, dtype=np.float64).reshape(-1)
    t_kd = np.asarray(trained_kd, dtype=np.float64).reshape(-1)
    return PDGains(
        joint_names=tuple(joint_names),
        kp=_gain_vector("kp", kp, t_kp),
        kd=_gain_vector("kd", kd, t_kd),
        trained_kp=t_kp,
        trained_kd=t_kd,
    )
