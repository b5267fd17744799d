"""One control step of the deployed policy, without ROS: observation -> policy -> safety.

:class:`PolicyController` is what the policy node runs on every tick; the node only turns
ROS messages into its arguments and its result into messages. It uses, of our code,
:mod:`deploy.runtime` (the ONNX policy with its history and recurrent state),
:mod:`deploy.safety` (the safety layer between policy and publisher) and
:mod:`deploy.metadata` (errors), plus :mod:`sim2real_ros.observation`.

The step, at time ``now`` (seconds, one monotonic clock):

1. the velocity command: the last one received, clipped to ``command_limits``; zero if
   none arrived for ``command_timeout_s`` or it was not finite;
2. the observation frame from the latest ``JointState``/``Imu`` (joints by name); a frame
   that cannot be built (a joint missing) becomes all-NaN, which the runtime and the
   safety layer treat as a fault (hold the last output, then the safe posture);
3. the watchdog is fed with the receive time of the *older* of the needed sensor
   messages, and only if the frame is finite: a sensor that stops, or sends NaN, trips
   it after ``watchdog_timeout_s``;
4. ``policy.act`` -> joint targets -> ``SafetyLayer.filter`` -> the output, always finite
   and within the joint limits;
5. the last action (an observation term) is the raw action whose target is the output,
   ``(output - offset) / scale``, as in sim2sim: the policy sees what was sent.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from deploy.arrays import ActionMap, all_finite
from deploy.metadata import MetadataError, PolicyLoadError
from deploy.runtime import OnnxPolicy
from deploy.safety import DEFAULT_MAX_TARGET_SPEED, SafetyConfig, SafetyLayer
from sim2real_ros.observation import ObservationAssembler, ObservationError

__all__ = ["ConfigureError", "LoopStats", "PolicyController"]


class ConfigureError(RuntimeError):
    """The policy cannot run on this node: file, metadata or observation problem."""


class PolicyController:
    """The policy, its observation assembly and its safety layer, stepped per tick.

    Args:
        policy_path: the ``.onnx`` file (with sim2real metadata).
        control_period_s: loop period; ``None`` or 0: the metadata's control period.
        watchdog_timeout_s: ``None`` or 0: the safety layer's default (5 metadata periods).
        ramp_in_s: blend time from the present posture to the policy after activation.
        max_target_speed: rad/s bound on target motion (``inf`` or 0: no bound).
        hold_last_on_fault: non-finite observation/action -> hold last (else safe posture).
        command_timeout_s: a command older than this counts as zero (``inf``: never).
        command_limits: ``(|vx|, |vy|, |yaw rate|)`` bounds on the command.
        intra_op_threads: onnxruntime threads.
        seed: a generative policy's (diffusion, flow) noise: its Generator's seed.
        deterministic: a generative policy gets zero noise instead of seeded draws. The
            default samples, as ``sim2real eval`` and sim2sim evaluate the file: the
            robot runs the policy that was measured.

    Raises:
        ConfigureError: the file is missing or broken, its metadata is invalid, it is not
            a position-controlled policy, or it observes a term with no ROS source.
    """

    def __init__(
        self,
        policy_path: str | os.PathLike[str],
        *,
        control_period_s: float | None = None,
        watchdog_timeout_s: float | None = None,
        ramp_in_s: float = 1.0,
        max_target_speed: float = DEFAULT_MAX_TARGET_SPEED,
        hold_last_on_fault: bool = True,
        command_timeout_s: float = 0.5,
        command_limits: Sequence[float] = (1.0, 0.5, 1.0),
        intra_op_threads: int = 1,
        seed: int = 0,
        deterministic: bool = False,
    ) -> None:
        path = os.fspath(policy_path)
        if not path:
            raise ConfigureError("no policy file given (parameter 'policy_path' is empty)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigureError(f"seed must be an integer >= 0, got {seed!r}")
        try:
            self.policy = OnnxPolicy(
                path, intra_op_threads=intra_op_threads, seed=int(seed), deterministic=deterministic
            )
        except FileNotFoundError:
            raise ConfigureError(f"policy file not found: {path}") from None
        except (PolicyLoadError, MetadataError) as exc:
            raise ConfigureError(f"cannot use policy file {path}: {exc}") from None
        self.seed = int(seed)
        meta = self.policy.metadata
        self.metadata = meta
        if meta.extra.get("control_mode", "position") != "position":
            raise ConfigureError(
                f"policy {path} is {meta.extra.get('control_mode')}-controlled; this node sends "
                "joint position targets and runs position-controlled policies only"
            )
        try:
            self.assembler = ObservationAssembler(
                meta.obs_terms, meta.action_joint_names, meta.default_joint_pos
            )
        except ObservationError as exc:
            raise ConfigureError(f"policy {path}: {exc}") from None
        if self.assembler.frame_size != self.policy.obs_frame_size:
            raise ConfigureError("observation frame size disagrees with the policy")  # unreachable
        self.joint_names = list(meta.action_joint_names)
        self.num_joints = len(self.joint_names)
        period = float(control_period_s or 0.0) or meta.control_period_s
        if not (math.isfinite(period) and period > 0):
            raise ConfigureError(f"control period must be > 0, got {period}")
        self.control_period_s = period
        speed = float(max_target_speed)
        overrides: dict[str, Any] = {
            "ramp_in_s": float(ramp_in_s),
            "hold_last_on_fault": bool(hold_last_on_fault),
            "max_delta_per_step": speed * period if speed > 0 else math.inf,
        }
        if watchdog_timeout_s:
            overrides["watchdog_timeout_s"] = float(watchdog_timeout_s)
        try:
            self.safety = SafetyLayer(SafetyConfig.from_metadata(meta, **overrides))
        except ValueError as exc:
            raise ConfigureError(f"safety settings: {exc}") from None
        self.safe_posture = self.safety.config.safe_posture.copy()
        self.action_map = ActionMap(meta.action_offset, meta.action_scale)
        self.command_timeout_s = float(command_timeout_s)
        limits = np.abs(np.asarray(command_limits, dtype=np.float64).reshape(-1))
        if limits.shape != (3,):
            raise ConfigureError(f"command_limits must be 3 numbers, got {command_limits!r}")
        self.command_limits = limits
        self.command = np.zeros(3)
        self._command_in = np.zeros(3)
        self._command_t = -math.inf
        self.last_action = np.zeros(self.num_joints)
        self._raw = np.zeros(self.num_joints, dtype=np.float32)
        self._target = np.zeros(self.num_joints)
        self._nan_frame = np.full(self.assembler.frame_size, np.nan)
        self._frame_zeros = np.zeros(self.assembler.frame_size)
        self.counters = {"bad_observation": 0, "bad_command": 0, "command_timeout": 0}
        self.last_error = ""

    # ------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> bool:
        return self.safety.active

    def activate(self, now: float, joint_state: Any = None) -> None:
        """Start the policy: fresh history and state, its noise Generator re-seeded (every
        activation samples the same draws), ramp in from the measured posture."""
        self.policy.reset(seed=self.seed)
        self.last_action.fill(0.0)
        current = None
        if joint_state is not None:
            try:
                current = self.assembler.joint_positions(joint_state)
            except ObservationError:
                current = None
        self.safety.activate(now, current)

    def deactivate(self) -> None:
        """Stop passing the policy's targets: the output is the safe posture from now on."""
        self.safety.deactivate()

    # ------------------------------------------------------------------ inputs
    def set_command(self, vx: float, vy: float, yaw_rate: float, now: float) -> bool:
        """Record a velocity command received at ``now``; False (ignored) if not finite."""
        c = self._command_in
        c[0], c[1], c[2] = vx, vy, yaw_rate
        if not np.isfinite(c).all():
            self.counters["bad_command"] += 1
            self._command_t = -math.inf
            return False
        self._command_t = now
        return True

    def _current_command(self, now: float) -> np.ndarray:
        cmd = self.command
        if now - self._command_t <= self.command_timeout_s:
            np.clip(self._command_in, -self.command_limits, self.command_limits, out=cmd)
        else:
            if self._command_t > -math.inf and cmd.any():
                self.counters["command_timeout"] += 1
            cmd.fill(0.0)
        return cmd

    # ------------------------------------------------------------------ the step
    def step(
        self,
        joint_state: Any,
        imu: Any,
        sensor_time: float | None,
        now: float,
    ) -> np.ndarray:
        """One control step at ``now``; the joint position targets to send (a new array).

        Args:
            joint_state: the latest JointState (None before the first).
            imu: the latest Imu (None before the first, or if the policy needs none).
            sensor_time: receive time of the older of the needed messages (None: none yet).
            now: the current time on the same clock.
        """
        cmd = self._current_command(now)
        try:
            frame = self.assembler.assemble(joint_state, imu, cmd, self.last_action)
            self.last_error = ""
        except ObservationError as exc:
            self.counters["bad_observation"] += 1
            self.last_error = str(exc)
            frame = self._nan_frame
        if frame is not self._nan_frame:
            if all_finite(frame, self._frame_zeros):
                if sensor_time is not None:
                    self.safety.observe(sensor_time)  # only a usable frame feeds the watchdog
            else:
                self.counters["bad_observation"] += 1
                self.last_error = "non-finite sensor values (NaN or inf)"
        if self.safety.active:
            self.policy.act(frame, out=self._raw, targets=self._target)
            target = self._target
        else:
            target = self.safe_posture  # inactive: the safety layer sends the posture anyway
        out = self.safety.filter(frame, target, now)
        self.action_map.to_raw(out, out=self.last_action)
        return out


class LoopStats:
    """Timing of the control loop: tick periods, compute time, stamp-to-publish latency.

    A ring of the last ``window`` steps feeds the diagnostics; with ``log_capacity`` > 0
    every step (up to that many) is also kept for :meth:`save` (the benchmark's raw data):
    rows of ``LOG_COLUMNS``.
    """

    LOG_COLUMNS = ("tick", "done", "wall_tick", "wall_published", "stamp")
    """Monotonic tick and end of step; wall clock at the tick and after publishing; the
    header stamp (wall clock) of the JointState the step used (NaN if none)."""

    def __init__(self, period_s: float, window: int = 4096, log_capacity: int = 0) -> None:
        self.period_s = float(period_s)
        self.window = int(window)
        self._tick = np.full(self.window, np.nan)
        self._compute = np.full(self.window, np.nan)
        self._latency = np.full(self.window, np.nan)
        self._i = 0
        self.steps = 0
        self.log_capacity = int(log_capacity)
        cols = len(self.LOG_COLUMNS)
        self._log = np.full((self.log_capacity, cols), np.nan) if self.log_capacity else None
        self._n_log = 0

    def record(
        self,
        tick: float,
        done: float,
        wall_published: float,
        stamp: float | None,
        wall_tick: float | None = None,
    ) -> None:
        """One step: tick and end (monotonic s), publish wall time, the obs stamp."""
        i = self._i
        self._tick[i] = tick
        self._compute[i] = done - tick
        self._latency[i] = wall_published - stamp if stamp else math.nan
        self._i = (i + 1) % self.window
        self.steps += 1
        if self._log is not None and self._n_log < self.log_capacity:
            row = self._log[self._n_log]
            row[0], row[1] = tick, done
            row[2] = wall_tick if wall_tick is not None else math.nan
            row[3] = wall_published
            row[4] = stamp if stamp else math.nan
            self._n_log += 1

    def summary(self) -> dict[str, float]:
        """Rate (Hz), period jitter |period - nominal| and latency percentiles (ms)."""
        n = min(self.steps, self.window)
        out: dict[str, float] = {"steps": float(self.steps)}
        if n < 2:
            return out
        order = np.arange(self._i - n, self._i) % self.window
        ticks = self._tick[order]
        periods = np.diff(ticks)
        span = ticks[-1] - ticks[0]
        out["rate_hz"] = (n - 1) / span if span > 0 else math.nan
        jitter = np.abs(periods - self.period_s) * 1e3
        out["jitter_p50_ms"], out["jitter_p99_ms"] = np.percentile(jitter, [50, 99])
        out["jitter_max_ms"] = float(jitter.max())
        comp = self._compute[order] * 1e3
        out["compute_p50_ms"], out["compute_p99_ms"] = np.percentile(comp, [50, 99])
        lat = self._latency[order]
        lat = lat[np.isfinite(lat)] * 1e3
        if lat.size:
            out["latency_p50_ms"], out["latency_p99_ms"] = np.percentile(lat, [50, 99])
            out["latency_max_ms"] = float(lat.max())
        return {k: float(v) for k, v in out.items()}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the per-step log (rows of :attr:`LOG_COLUMNS`) as ``.npy`` (if kept)."""
        if self._log is None:
            return
        path = os.fspath(path)
        tmp = path + ".tmp.npy"
        np.save(tmp, self._log[: self._n_log])
        os.replace(tmp, path)
