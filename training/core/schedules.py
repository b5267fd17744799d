"""Learning-rate schedules and KL-based step control.

Schedules are small dataclasses, callable as ``schedule(step) -> lr``: picklable, and
with ``state_dict``/``load_state_dict`` so that a checkpoint restores them exactly. The
step counter itself belongs to the runner.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


class _Stateful:
    """state_dict/load_state_dict over the dataclass fields."""

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        if set(state) != names:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: expected keys {sorted(names)}, "
                f"got {sorted(state)}"
            )
        for name, value in state.items():
            setattr(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        pass


def _check_step(step: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


@dataclass
class ConstantSchedule(_Stateful):
    """The same rate at every step."""

    value: float

    def __call__(self, step: int) -> float:
        _check_step(step)
        return self.value


@dataclass
class LinearSchedule(_Stateful):
    """From start to end over ``total`` steps, then held at end."""

    start: float
    end: float
    total: int

    def __post_init__(self) -> None:
        if self.total <= 0:
            raise ValueError(f"LinearSchedule.total must be > 0, got {self.total}")

    def __call__(self, step: int) -> float:
        _check_step(step)
        frac = min(step, self.total) / self.total
        return self.start + (self.end - self.start) * frac


@dataclass
class CosineSchedule(_Stateful):
    """Linear warm-up from 0 to start over ``warmup`` steps, then half a cosine to end.

    lr(step) = start * step / warmup                                  for step < warmup
             = end + (start - end) * (1 + cos(pi * p)) / 2,
               p = min(1, (step - warmup) / (total - warmup))         afterwards
    """

    start: float
    end: float
    total: int
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.total <= 0:
            raise ValueError(f"CosineSchedule.total must be > 0, got {self.total}")
        if not 0 <= self.warmup < self.total:
            raise ValueError(
                f"CosineSchedule.warmup must be in [0, total), got {self.warmup} "
                f"(total {self.total})"
            )

    def __call__(self, step: int) -> float:
        _check_step(step)
        if step < self.warmup:
            return self.start * step / self.warmup
        progress = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Warmup(_Stateful):
    """A linear warm-up in front of another schedule, which then starts at step 0.

    lr(step) = peak * (step + 1) / (steps + 1)     for step < steps
             = after(step - steps)                 afterwards

    peak: the rate the ramp climbs to; None: ``after(0)``.

    The ramp never gives a zero rate (the first step already learns, at 1/(steps+1) of
    the rate), unlike CosineSchedule's own warm-up from 0; the language-model learners
    use it in front of a constant, linear or cosine schedule.
    """

    after: ConstantSchedule | LinearSchedule | CosineSchedule
    steps: int
    peak: float | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"Warmup.steps must be >= 0, got {self.steps}")

    def __call__(self, step: int) -> float:
        _check_step(step)
        if step < self.steps:
            peak = self.after(0) if self.peak is None else self.peak
            return peak * (step + 1) / (self.steps + 1)
        return self.after(step - self.steps)

    def state_dict(self) -> dict[str, Any]:
        return {"after": self.after.state_dict(), "steps": self.steps, "peak": self.peak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.after.load_state_dict(state["after"])
        self.steps = int(state["steps"])
        self.peak = state["peak"]
        self.__post_init__()


def constant(value: float) -> ConstantSchedule:
    """A fixed learning rate."""
    return ConstantSchedule(value)


def linear(start: float, end: float, total: int) -> LinearSchedule:
    """A linear ramp from start to end over total steps."""
    return LinearSchedule(start, end, total)


def cosine(start: float, end: float, total: int, warmup: int = 0) -> CosineSchedule:
    """Cosine decay from start to end, after an optional linear warm-up."""
    return CosineSchedule(start, end, total, warmup)


@dataclass
class AdaptiveKL(_Stateful):
    """Adapt the rate to the measured KL between the old and the updated policy.

    Divide by ``factor`` when KL > 2 * target_kl, multiply when KL < target_kl / 2,
    keep it otherwise; always within [lr_min, lr_max]. Calling it with a step returns
    the current rate, so it can stand where a schedule stands.
    """

    lr: float
    target_kl: float
    factor: float = 1.5
    lr_min: float = 1e-6
    lr_max: float = 1e-2

    def __post_init__(self) -> None:
        if self.target_kl <= 0:
            raise ValueError(f"AdaptiveKL.target_kl must be > 0, got {self.target_kl}")
        if self.factor <= 1:
            raise ValueError(f"AdaptiveKL.factor must be > 1, got {self.factor}")
        if not 0 < self.lr_min <= self.lr_max:
            raise ValueError(
                f"AdaptiveKL needs 0 < lr_min <= lr_max, got {self.lr_min}, {self.lr_max}"
            )
        if not self.lr_min <= self.lr <= self.lr_max:
            raise ValueError(
                f"AdaptiveKL.lr={self.lr} is outside [lr_min, lr_max] = "
                f"[{self.lr_min}, {self.lr_max}]"
            )

    def update(self, measured_kl: float) -> float:
        """Adjust the rate for one measured KL and return the new rate."""
        kl = float(measured_kl)
        if not math.isfinite(kl):
            raise ValueError(f"AdaptiveKL.update: measured KL is not finite ({kl})")
        if kl > 2.0 * self.target_kl:
            self.lr = max(self.lr_min, self.lr / self.factor)
        elif kl < 0.5 * self.target_kl:
            self.lr = min(self.lr_max, self.lr * self.factor)
        return self.lr

    def __call__(self, step: int) -> float:
        _check_step(step)
        return self.lr


def kl_early_stop(measured_kl: float, limit: float | None) -> bool:
    """True when the epoch loop should stop: the measured KL is past the limit (or not finite)."""
    if limit is None:
        return False
    kl = float(measured_kl)
    return not math.isfinite(kl) or kl > limit
