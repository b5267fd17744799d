"""Sim-to-real models: domain randomization at reset, sensor noise, action latency, pushes.

Everything is drawn from the env's seeded generator and applied to whole batches of
envs at once; nothing here loops over envs in Python.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

Range = tuple[float, float]


def _check_range(name: str, r: Range | None, positive: bool = False) -> Range | None:
    """The (low, high) tuple of ``r`` (a JSON or YAML list too); ValueError naming ``name``."""
    if r is None:
        return None
    try:
        lo, hi = (float(v) for v in r)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair, got {r!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"{name} must be a finite (low, high) pair with low <= high, got {r!r}")
    if positive and lo <= 0:
        raise ValueError(f"{name} must be positive, got {r!r}")
    return lo, hi


def _is_number(v: object, integral: bool = False) -> bool:
    kind = numbers.Integral if integral else numbers.Real
    return isinstance(v, kind) and not isinstance(v, bool)


@dataclass
class SimToRealConfig:
    """Per-task defaults; every field can be overridden through `sim.make(..., s2r=...)`.

    Ranges are (low, high) of a uniform draw made at every reset of an env; `None`
    disables the item. Scales multiply the model's nominal value.
    """

    mass_scale: Range | None = None
    """Scale of every body's mass (inertia scales along)."""
    added_base_mass: Range | None = None
    """kg added to the base body (the task names it)."""
    friction_scale: Range | None = None
    """Scale of the sliding friction of every geom."""
    motor_strength: Range | None = None
    """Per actuator, scales torque (and its limit)."""
    kp_scale: Range | None = None
    """Per actuator, scales the position gain kp (on top of motor_strength); position
    actuators only."""
    kd_scale: Range | None = None
    """Per actuator, scales the damping gain kd (on top of motor_strength); position
    actuators only."""
    obs_noise: dict[str, float] = field(default_factory=dict)
    """Policy observation term -> std of Gaussian noise added to it, drawn every step."""
    obs_bias: dict[str, float] = field(default_factory=dict)
    """Policy observation term -> std of a Gaussian offset added to it, drawn per
    episode."""
    action_latency: tuple[int, int] = (0, 0)
    """(low, high) action delay in control steps, drawn per env at reset (integers)."""
    push_interval_s: float | None = None
    """Mean time between pushes in seconds (exponentially distributed; the task's base
    body is pushed); None: no pushes."""
    push_velocity: float = 0.0
    """Max xy base velocity change per push (m/s)."""
    obs_history: int = 1
    """Policy frames stacked, oldest first."""

    def __post_init__(self) -> None:
        # ranges as tuples, whatever they came as (JSON, YAML), so that equal settings
        # compare equal
        for name in ("mass_scale", "friction_scale", "motor_strength", "kp_scale", "kd_scale"):
            setattr(self, name, _check_range(name, getattr(self, name), positive=True))
        self.added_base_mass = _check_range("added_base_mass", self.added_base_mass)
        latency = _check_range("action_latency", self.action_latency)
        lo, hi = latency if latency is not None else (-1, -1)
        if int(lo) != lo or int(hi) != hi or lo < 0 or hi < lo:
            raise ValueError(
                f"action_latency must be integers 0 <= low <= high, got {self.action_latency!r}"
            )
        self.action_latency = (int(lo), int(hi))
        if not _is_number(self.obs_history, integral=True) or self.obs_history < 1:
            raise ValueError(f"obs_history must be an integer >= 1, got {self.obs_history!r}")
        for name in ("obs_noise", "obs_bias"):
            stds = getattr(self, name)
            if not isinstance(stds, dict):
                raise ValueError(f"{name} must map observation terms to stds, got {stds!r}")
            for k, v in stds.items():
                if not (_is_number(v) and np.isfinite(v) and v >= 0):
                    raise ValueError(f"{name}[{k!r}] must be a finite std >= 0, got {v!r}")
        p = self.push_interval_s
        if p is not None and not (_is_number(p) and p > 0):
            raise ValueError(f"push_interval_s must be None or a number > 0, got {p!r}")
        v = self.push_velocity
        if not (_is_number(v) and np.isfinite(v) and v >= 0):
            raise ValueError(f"push_velocity must be a finite speed >= 0, got {v!r}")

    @property
    def randomizes_model(self) -> bool:
        return any(
            getattr(self, n) is not None
            for n in (
                "mass_scale",
                "added_base_mass",
                "friction_scale",
                "motor_strength",
                "kp_scale",
                "kd_scale",
            )
        )


def uniform(rng: np.random.Generator, r: Range | None, shape) -> np.ndarray:
    if r is None:
        return np.ones(shape)
    return rng.uniform(r[0], r[1], size=shape)


class ModelRandomizer:
    """Writes per-env physical parameters into the engine at reset.

    Keeps the nominal values so that draws never compound across episodes, and the
    draws of the current episode so that the critic can observe them (privileged).
    """

    def __init__(
        self, engine, cfg: SimToRealConfig, base_body: int | None, position_actuators: bool
    ):
        self.engine, self.cfg = engine, cfg
        self.base_body = base_body
        self.position_actuators = position_actuators
        m = engine.model
        n = engine.num_envs
        self.nominal_mass = m.body_mass.copy()
        self.nominal_friction = m.geom_friction.copy()
        self.nominal_gear = m.actuator_gear.copy()
        self.nominal_gain = m.actuator_gainprm.copy()
        self.nominal_bias = m.actuator_biasprm.copy()
        self.nominal_force = m.actuator_forcerange.copy()
        # current draws, privileged information
        self.friction = np.ones(n)
        self.added_mass = np.zeros(n)
        self.mass_scale = np.ones(n)
        self.strength = np.ones((n, m.nu))

    def apply(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        cfg, eng, k = self.cfg, self.engine, len(ids)
        if not cfg.randomizes_model or k == 0:
            return
        if cfg.mass_scale is not None or cfg.added_base_mass is not None:
            scale = uniform(rng, cfg.mass_scale, (k, 1))
            mass = self.nominal_mass[None, :] * scale
            added = np.zeros(k)
            if cfg.added_base_mass is not None and self.base_body is not None:
                added = rng.uniform(*cfg.added_base_mass, size=k)
                mass[:, self.base_body] += added
            self.mass_scale[ids], self.added_mass[ids] = scale[:, 0], added
            eng.set_model_field("body_mass", mass, ids)
            # inertia scales with mass so the bodies stay physically consistent
            inertia = (
                eng.model.body_inertia[None]
                * (mass / np.maximum(self.nominal_mass, 1e-12))[..., None]
            )
            eng.set_model_field("body_inertia", inertia, ids)
            eng.set_const(ids)
        if cfg.friction_scale is not None:
            f = uniform(rng, cfg.friction_scale, (k, 1))
            fr = np.repeat(self.nominal_friction[None], k, axis=0)
            fr[:, :, 0] *= f
            self.friction[ids] = f[:, 0]
            eng.set_model_field("geom_friction", fr, ids)
        if cfg.motor_strength is not None or cfg.kp_scale is not None or cfg.kd_scale is not None:
            nu = eng.model.nu
            s = uniform(rng, cfg.motor_strength, (k, nu))
            self.strength[ids] = s
            if self.position_actuators:
                kp = uniform(rng, cfg.kp_scale, (k, nu)) * s
                kd = uniform(rng, cfg.kd_scale, (k, nu)) * s
                gain = np.repeat(self.nominal_gain[None], k, axis=0)
                bias = np.repeat(self.nominal_bias[None], k, axis=0)
                gain[:, :, 0] *= kp
                bias[:, :, 1] *= kp
                bias[:, :, 2] *= kd
                force = self.nominal_force[None] * s[..., None]
                eng.set_model_field("actuator_gainprm", gain, ids)
                eng.set_model_field("actuator_biasprm", bias, ids)
                eng.set_model_field("actuator_forcerange", force, ids)
            else:
                gear = np.repeat(self.nominal_gear[None], k, axis=0)
                gear[:, :, 0] *= s
                eng.set_model_field("actuator_gear", gear, ids)


class LatencyQueue:
    """Per-env action delay of 0..k control steps (a ring of the last k+1 actions)."""

    def __init__(self, num_envs: int, action_size: int, max_delay: int):
        self.buf = np.zeros((max_delay + 1, num_envs, action_size))
        self.delay = np.zeros(num_envs, dtype=np.int64)
        self.head = 0
        self._rows = np.arange(num_envs)

    def reset(self, ids: np.ndarray, delays: np.ndarray, fill: np.ndarray) -> None:
        self.delay[ids] = delays
        self.buf[:, ids] = fill

    def push(self, actions: np.ndarray) -> np.ndarray:
        if self.buf.shape[0] == 1:
            return actions
        depth = self.buf.shape[0]
        self.head = (self.head + 1) % depth
        self.buf[self.head] = actions
        return self.buf[(self.head - self.delay) % depth, self._rows]


class ObsHistory:
    """The last H frames of the policy observation, oldest first."""

    def __init__(self, num_envs: int, frame: int, length: int):
        self.buf = np.zeros((num_envs, length, frame))

    def reset(self, ids: np.ndarray, frames: np.ndarray) -> None:
        self.buf[ids] = frames[:, None, :]

    def push(self, frames: np.ndarray) -> np.ndarray:
        if self.buf.shape[1] > 1:
            self.buf[:, :-1] = self.buf[:, 1:]
        self.buf[:, -1] = frames
        return self.buf.reshape(self.buf.shape[0], -1)
