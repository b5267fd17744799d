"""The safety layer between the policy runtime and the actuators (numpy; the per-step
arithmetic is one compiled kernel, :func:`deploy.kernels.safety_track`).

Whatever the policy, the observation pipeline or the clock does, the joint position
target that leaves :meth:`SafetyLayer.filter` is finite and within the joint limits.
On top of that guarantee it applies, in this order:

1. not active -> the safe posture;
2. no fresh observation for ``watchdog_timeout_s`` -> the safe posture ("watchdog");
3. non-finite observation or target -> hold the last output, or the safe posture if
   ``hold_last_on_fault`` is False or nothing was output yet ("nonfinite_obs",
   "nonfinite_action");
4. ramp-in: for ``ramp_in_s`` after activation (and after recovering from a watchdog
   trip) the target is blended linearly from the posture at that moment to the
   policy's target, so that the robot does not jump when the policy takes over;
5. per-step change limit relative to the previous output ("rate_limited");
6. clamp to the joint limits ("clamped").

The policy target is clipped to the joint limits before the ramp and rate limit; since
the previous output is always within the limits, this gives the same result as clamping
last, but keeps the arithmetic finite (no ``1e308 - (-1e308) = inf``) and makes the
ramp blend toward a reachable target. Every intervention is counted in
:attr:`SafetyLayer.counters` (once per call, however many joints it touched).

Times are seconds on one monotonic clock chosen by the caller (e.g. ROS time). Every
timestamp the layer is given is checked before it is used, and a rejected one is counted
("bad_time") and never makes anything fresh:

- a time that is not finite (NaN, inf, -inf);
- a time earlier than the last accepted one: for :meth:`SafetyLayer.filter` and
  :meth:`SafetyLayer.activate`, the last accepted filter or activation time; for
  :meth:`SafetyLayer.observe`, the last observation time it accepted;
- an observation stamped later than the time of the next :meth:`SafetyLayer.filter`
  call (from the future): it is judged there, and the last valid observation stays.

Ages are computed from accepted times only, so they are never negative and a single
bad timestamp (``observe(1e12)``, a clock that jumps back) cannot keep the watchdog
quiet. A :meth:`SafetyLayer.filter` call whose own time is rejected never passes the
policy's target: a non-finite time is stale (the safe posture, "watchdog"); a time
earlier than the last accepted one holds the last output (the safe posture if
``hold_last_on_fault`` is False) while the watchdog's budget lasts, measured from the
last accepted call plus the time the caller's clock has advanced since it went back,
and sends the safe posture ("watchdog") after that or if that clock goes back again.
A new time line (a simulator reset) needs a new layer.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deploy import kernels
from deploy.kernels import (
    CLAMPED,
    NONFINITE_OBS,
    NONFINITE_OUT,
    NONFINITE_TARGET,
    RATE_LIMITED,
    safety_track,
    warm_up,
)

__all__ = [
    "COUNTER_NAMES",
    "DEFAULT_MAX_TARGET_SPEED",
    "DEFAULT_RAMP_IN_S",
    "DEFAULT_WATCHDOG_PERIODS",
    "SafetyConfig",
    "SafetyLayer",
]

DEFAULT_MAX_TARGET_SPEED = 20.0
"""Default bound on how fast the target may move, in target units (rad) per second.

Generous on purpose: locomotion policies move their position targets by several tenths
of a radian per 20 ms step, and a tighter default would change the policy's behavior
(a sim-to-real gap of our own making). Tighten it per robot.
"""

DEFAULT_WATCHDOG_PERIODS = 5.0
"""Default watchdog timeout in control periods: a few dropped messages are tolerated."""

DEFAULT_RAMP_IN_S = 1.0
"""Default duration of the ramp-in after activation, seconds."""

COUNTER_NAMES = (
    "steps",
    "inactive",
    "watchdog",
    "nonfinite_obs",
    "nonfinite_action",
    "rate_limited",
    "clamped",
    "bad_time",
)
"""Names of :attr:`SafetyLayer.counters`. ``bad_time`` counts rejected timestamps (see the
module docstring); the others count the calls in which their rule intervened."""

_INF = math.inf
_LOWEST = -sys.float_info.max  # below every finite time: the first check rejects -inf only


_NONFINITE = NONFINITE_OBS | NONFINITE_TARGET
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _vector(name: str, value: Any, size: int | None = None) -> np.ndarray:
    arr = np.array(value, dtype=np.float64).reshape(-1)
    if size is not None and arr.size != size:
        raise ValueError(f"{name} must have {size} entries, got {arr.size}")
    return arr


@dataclass
class SafetyConfig:
    """Limits and timings of the safety layer; per-joint arrays follow the action order.

    Args:
        joint_pos_lower, joint_pos_upper: finite joint limits; every output is inside.
        max_delta_per_step: largest change of the target per control step, in target
            units (a scalar or one value per joint; ``inf`` disables the limit).
        watchdog_timeout_s: an observation older than this sends the safe posture
            (``inf`` disables the timeout, but one :meth:`SafetyLayer.observe` is still
            needed before the policy's targets pass).
        ramp_in_s: duration of the blend from the current posture to the policy's
            targets after activation (0 disables it).
        safe_posture: where to go when inactive or stale; clamped to the limits.
        hold_last_on_fault: on a non-finite observation or target, hold the last output
            (True) or go to the safe posture (False).
    """

    joint_pos_lower: np.ndarray
    joint_pos_upper: np.ndarray
    max_delta_per_step: float | np.ndarray
    watchdog_timeout_s: float
    ramp_in_s: float
    safe_posture: np.ndarray
    hold_last_on_fault: bool = True
    num_joints: int = field(init=False)

    def __post_init__(self) -> None:
        self.joint_pos_lower = _vector("joint_pos_lower", self.joint_pos_lower)
        n = self.joint_pos_lower.size
        if n == 0:
            raise ValueError("joint_pos_lower must have at least one entry")
        self.num_joints = n
        self.joint_pos_upper = _vector("joint_pos_upper", self.joint_pos_upper, n)
        if not (
            np.isfinite(self.joint_pos_lower).all() and np.isfinite(self.joint_pos_upper).all()
        ):
            raise ValueError("joint limits must be finite (the output must be finite)")
        if (self.joint_pos_lower > self.joint_pos_upper).any():
            raise ValueError("joint_pos_lower must be <= joint_pos_upper for every joint")
        delta = np.broadcast_to(np.asarray(self.max_delta_per_step, dtype=np.float64), (n,))
        if np.isnan(delta).any() or (delta <= 0).any():
            raise ValueError("max_delta_per_step must be > 0 (inf disables the limit)")
        self.max_delta_per_step = delta.copy()
        self.watchdog_timeout_s = float(self.watchdog_timeout_s)
        self.ramp_in_s = float(self.ramp_in_s)
        self.hold_last_on_fault = bool(self.hold_last_on_fault)
        if math.isnan(self.watchdog_timeout_s) or self.watchdog_timeout_s <= 0:
            raise ValueError("watchdog_timeout_s must be > 0 (inf disables the watchdog)")
        if not (math.isfinite(self.ramp_in_s) and self.ramp_in_s >= 0):
            raise ValueError("ramp_in_s must be finite and >= 0")
        posture = _vector("safe_posture", self.safe_posture, n)
        if not np.isfinite(posture).all():
            raise ValueError("safe_posture must be finite")
        self.safe_posture = np.clip(posture, self.joint_pos_lower, self.joint_pos_upper)

    @classmethod
    def from_metadata(cls, meta: Any, **overrides: Any) -> SafetyConfig:
        """Config from a policy's metadata (:class:`deploy.metadata.PolicyMetadata`).

        Defaults: limits from the metadata, safe posture = default joint positions,
        ``max_delta_per_step = DEFAULT_MAX_TARGET_SPEED * control_period_s``,
        watchdog = ``DEFAULT_WATCHDOG_PERIODS`` control periods, ramp-in
        ``DEFAULT_RAMP_IN_S``. Any field can be overridden by keyword.
        """
        values: dict[str, Any] = {
            "joint_pos_lower": meta.joint_pos_lower,
            "joint_pos_upper": meta.joint_pos_upper,
            "max_delta_per_step": DEFAULT_MAX_TARGET_SPEED * meta.control_period_s,
            "watchdog_timeout_s": DEFAULT_WATCHDOG_PERIODS * meta.control_period_s,
            "ramp_in_s": DEFAULT_RAMP_IN_S,
            "safe_posture": meta.default_joint_pos,
            "hold_last_on_fault": True,
        }
        unknown = set(overrides) - set(values)
        if unknown:
            raise TypeError(f"unknown SafetyConfig field(s): {sorted(unknown)}")
        values.update(overrides)
        return cls(**values)


class SafetyLayer:
    """Turns policy joint targets into targets that are safe to send.

    Typical use on the robot, once per control step::

        safety.observe(now)                       # when a fresh observation arrived
        raw = policy.act(frame)
        cmd = safety.filter(frame, policy.to_joint_targets(raw), now)

    Starts inactive (outputs the safe posture) until :meth:`activate`.
    """

    def __init__(self, config: SafetyConfig) -> None:
        self.config = config
        n = config.num_joints
        # The kernel's state, one row per quantity (see deploy.kernels.safety_track);
        # the limits, like the timings below, are copies, safe from later edits of the
        # config (and one attribute lookup each on the hot path, not two).
        self._state = np.zeros((kernels.SAFETY_ROWS, n))
        self._state[kernels.LOWER] = config.joint_pos_lower
        self._state[kernels.UPPER] = config.joint_pos_upper
        self._state[kernels.DELTA] = config.max_delta_per_step
        self._lower = self._state[kernels.LOWER]
        self._upper = self._state[kernels.UPPER]
        self._delta = self._state[kernels.DELTA]
        self._posture = config.safe_posture
        self._watchdog_s = config.watchdog_timeout_s
        self._ramp_s = config.ramp_in_s
        self._hold_last = config.hold_last_on_fault
        self._out = self._state[kernels.OUT]  # the last output (valid once _has_output)
        self._ramp_start = self._state[kernels.RAMP_START]
        self._no_obs = np.zeros(0)
        # Without a finite per-step limit no step can be rate limited: decided once.
        self._rate_limit = bool(np.isfinite(self._delta).any())
        warm_up()  # compile now, not at the robot's first control step
        self._has_output = False
        self._active = False
        self._ramp_t0 = 0.0
        # The clocks (see the module docstring); all plain floats, so that the checks on
        # the hot path are a few comparisons and allocate nothing.
        self._clock = _LOWEST  # the last accepted filter/activation time
        self._obs_t = math.nan  # the last accepted observation time (NaN: none, stale)
        self._obs_pending: float | None = None  # observed, not yet judged by a filter time
        self._obs_floor = _LOWEST  # the next observation may not be earlier than this
        self._back_t0: float | None = None  # first time of a run of calls timed backwards
        self._back_t = 0.0  # the latest time of that run
        self._stale = True
        self._counters = dict.fromkeys(COUNTER_NAMES, 0)

    # ------------------------------------------------------------------ state
    @property
    def active(self) -> bool:
        """Whether the policy's targets are being passed through (filtered)."""
        return self._active

    @property
    def last_output(self) -> np.ndarray | None:
        """Copy of the last output, or None before the first :meth:`filter`."""
        return self._out.copy() if self._has_output else None

    @property
    def counters(self) -> dict[str, int]:
        """Event counts since construction or :meth:`reset_counters` (a copy).

        ``steps`` counts calls of :meth:`filter`; ``bad_time`` counts rejected
        timestamps (of :meth:`observe`, :meth:`filter` and :meth:`activate`); the others
        count calls in which the named rule intervened.
        """
        return dict(self._counters)

    def reset_counters(self) -> None:
        """Zero all event counts."""
        for key in self._counters:
            self._counters[key] = 0

    def activate(self, now_s: float, current_pos: np.ndarray | None = None) -> None:
        """Start passing policy targets, ramping in from the present posture.

        The ramp starts from ``current_pos`` (e.g. measured joint positions) if given
        and finite, else from the last output, else from the safe posture. Calling it
        while already active does nothing, so a repeated "start" command cannot restart
        the ramp mid-motion.

        A non-finite ``now_s`` raises ValueError; one earlier than the last time
        accepted by :meth:`filter` or :meth:`activate` is refused: counted as
        ``bad_time``, and the layer stays inactive (check :attr:`active`).
        """
        if self._active:
            return
        if not math.isfinite(now_s):
            self._counters["bad_time"] += 1
            raise ValueError(f"activation time must be finite, got {now_s}")
        now_s = float(now_s)
        if now_s < self._clock:
            self._counters["bad_time"] += 1  # the clock went back: no ramp from that time
            return
        if current_pos is not None:
            pos = np.asarray(current_pos, dtype=np.float64).reshape(-1)
            if pos.shape != self._out.shape:
                raise ValueError(f"current_pos must have {self._out.size} entries, got {pos.size}")
            if np.isfinite(pos).all():
                np.clip(pos, self._lower, self._upper, out=self._out)
                self._has_output = True
        if not self._has_output:
            self._out[:] = self._posture
            self._has_output = True
        self._clock = now_s
        self._back_t0 = None
        pending = self._obs_pending
        if pending is not None and pending <= now_s:  # not from the future: accept it
            self._obs_t = pending
            self._obs_pending = None
        self._active = True
        self._stale = False  # the watchdog decides at the next filter()
        self._start_ramp(now_s)

    def deactivate(self) -> None:
        """Stop passing policy targets: the output is the safe posture from now on."""
        self._active = False

    def observe(self, now_s: float) -> None:
        """Record that a fresh observation arrived at ``now_s`` (feeds the watchdog).

        A time that is not finite, or earlier than the last observation time accepted,
        is counted as ``bad_time`` and ignored; one later than the time of the next
        :meth:`filter` call is rejected there (from the future).
        """
        t = float(now_s)
        if self._obs_floor <= t < _INF:  # False for NaN, inf and -inf
            self._obs_pending = t
            self._obs_floor = t
        else:
            self._counters["bad_time"] += 1

    # ------------------------------------------------------------------ filter
    def filter(self, obs: np.ndarray | None, target: np.ndarray, now_s: float) -> np.ndarray:
        """Return the joint position target to send at time ``now_s``.

        Args:
            obs: the observation the target was computed from, checked for non-finite
                values; None skips that check.
            target: the policy's joint position targets (``[num_joints]``).
            now_s: current time, seconds (a rejected time never passes the target: see
                the module docstring).

        Returns:
            A new array, finite and within ``[joint_pos_lower, joint_pos_upper]``.
        """
        if target.__class__ is not np.ndarray or target.dtype is not _F64:
            target = np.asarray(target, dtype=np.float64)
        if target.shape != self._out.shape:
            raise ValueError(f"target must have shape {self._out.shape}, got shape {target.shape}")
        now_s = float(now_s)  # plain float arithmetic: never raises, NaN stays NaN
        c = self._counters
        c["steps"] += 1
        out = self._out

        timed = self._clock <= now_s < _INF  # finite and not earlier than the last time
        if timed:
            self._clock = now_s
            self._back_t0 = None
            pending = self._obs_pending
            if pending is not None:
                self._obs_pending = None
                if pending <= now_s:
                    self._obs_t = pending
                else:  # stamped later than now: from the future, rejected
                    c["bad_time"] += 1
                    obs_t = self._obs_t
                    self._obs_floor = obs_t if obs_t == obs_t else _LOWEST
        else:
            c["bad_time"] += 1

        if not self._active:
            c["inactive"] += 1
            return self._emit_posture()
        if not timed:
            return self._untimed(now_s)

        # Both times accepted, so the age is >= 0 (NaN when nothing was observed yet).
        age = now_s - self._obs_t
        if not age <= self._watchdog_s:  # NaN (no observation) is stale
            c["watchdog"] += 1
            self._stale = True
            return self._emit_posture()
        if self._stale:
            # Recovering from a watchdog trip: ramp in again from the safe posture.
            self._stale = False
            self._start_ramp(now_s)

        ramp = self._ramp_s
        alpha = 1.0
        if ramp > 0:
            alpha = (now_s - self._ramp_t0) / ramp
            if not alpha >= 0.0:  # clock went backwards, or NaN
                alpha = 0.0
        if obs is None:
            obs = self._no_obs
        else:
            if obs.__class__ is not np.ndarray or (obs.dtype is not _F32 and obs.dtype is not _F64):
                obs = np.asarray(obs, dtype=np.float64)  # identity tests: dtype == costs 1 us
            if obs.ndim != 1:
                obs = obs.reshape(-1)
        flags = safety_track(obs, target, self._state, self._rate_limit, alpha)
        if flags & _NONFINITE:
            obs_bad = bool(flags & NONFINITE_OBS)
            target_bad = bool(flags & NONFINITE_TARGET)
            c["nonfinite_obs"] += int(obs_bad)
            c["nonfinite_action"] += int(target_bad)
            if not self._hold_last:
                return self._emit_posture()
            return out.copy()  # the last output: within limits and rate-limited already
        if flags & CLAMPED:
            c["clamped"] += 1
        if flags & RATE_LIMITED:
            c["rate_limited"] += 1
        if flags & NONFINITE_OUT:
            return self._emit_posture()
        return out.copy()

    # ------------------------------------------------------------------ helpers
    def _untimed(self, now_s: float) -> np.ndarray:
        """The output of an active :meth:`filter` call whose time was rejected.

        Never the policy's target. A non-finite time, a stale layer, a clock that went
        back again, or the watchdog's budget spent (the age at the last accepted call
        plus how far the caller's clock has advanced since it went back, a lower bound
        on the real age): the safe posture, counted as "watchdog". Otherwise the last
        output is held (the safe posture if ``hold_last_on_fault`` is False).
        """
        c = self._counters
        expired = True
        if math.isfinite(now_s) and not self._stale:
            if self._back_t0 is None:  # the first call since the clock went back
                self._back_t0 = self._back_t = now_s
            if now_s >= self._back_t:
                self._back_t = now_s
                age = (self._clock - self._obs_t) + (now_s - self._back_t0)
                expired = not age <= self._watchdog_s  # NaN: no observation
        if expired:
            c["watchdog"] += 1
            self._stale = True
            return self._emit_posture()
        if not self._hold_last:
            return self._emit_posture()
        return self._out.copy()

    def _emit_posture(self) -> np.ndarray:
        self._out[:] = self._posture
        self._has_output = True
        return self._out.copy()

    def _start_ramp(self, now_s: float) -> None:
        self._ramp_t0 = float(now_s)
        self._ramp_start[:] = self._out if self._has_output else self._posture
