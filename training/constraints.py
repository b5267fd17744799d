"""Constraints as terminations (CaT; Chane-Sane et al., 2024), for every on-policy learner.

A task declares constraints beside its reward terms (``env.constraint_names``; e.g.
sim/tasks/quadruped.py's CONSTRAINT_LIMITS) and reports, each step, how far each one is
violated: the info term ``cstr_<name>`` (>= 0 per env, 0 when satisfied). CaT turns a
violation into a probability that the episode ends, from the learner's point of view
(the simulation goes on):

    c_max_i <- c_max_i * tau + (1 - tau) * max over envs of c_i     (the first step: that max)
    p_i      = p_max_i * clip(c_i / c_max_i, 0, 1)   where c_i > 0, else 0
    delta    = max over constraints i of p_i

with c_max_i floored at 1e-6 before it enters the average, as in the authors' code. The
reward of the step becomes r * (1 - delta), and every reward after it counts (1 - delta)
times: the runner puts delta in ``info["termination_prob"]``, which each learner hands
its rollout storage as a soft termination (training.algorithms.base ``_ends``), and GAE
(training.core.gae) scales the bootstrap and the lambda chain by (1 - delta). So the
return is sum_t gamma^t prod_{t' <= t} (1 - delta_t') r_t, CaT's objective. Rewards
should be non-negative (the quadruped clips its reward at zero), as CaT assumes.

The runner logs per constraint the share of steps that violate it (``env/cat_violated_
<name>``) and the mean violation (``env/cstr_<name>``), with CaT on or off, so that runs
with and without it compare; the mean delta (``env/termination_prob``) with CaT on. The running
maxima go into the checkpoint, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from training.config import FieldChecks

__all__ = ["ConstraintTerminations", "ConstraintsConfig"]

MIN_RUNNING_MAX = 1e-6
"""Floor of a step's largest violation before it enters the running maximum."""


@dataclass
class ConstraintsConfig:
    """Constraints as terminations (CaT): a constraint violation sets a probability of
    termination that scales down the step's reward and all future ones."""

    enabled: bool = False
    """Turn CaT on (the task must declare constraints, e.g. quadruped, go1)."""
    p_max: float = 0.25
    """Largest termination probability a violation sets (at the running maximum)."""
    p_max_of: dict[str, float] = field(default_factory=dict)
    """Constraint name -> its own p_max over p_max, e.g. {"torque": 1.0} makes that
    constraint hard; 0 leaves a constraint out."""
    tau: float = 0.95
    """Decay of each constraint's running maximum violation (CaT's Polyak average)."""

    def __post_init__(self) -> None:
        check = FieldChecks(self)
        check.finite("p_max", "tau")
        check.within(0.0, 1.0, "p_max")
        if not 0.0 <= self.tau < 1.0:
            raise check.fail("tau", "must be in [0, 1)")
        if not isinstance(self.p_max_of, dict):
            raise check.fail(
                "p_max_of", f"must map constraint names to p_max, got {self.p_max_of!r}"
            )
        for name, p in self.p_max_of.items():
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
                raise check.fail("p_max_of", f"{name!r} must be a probability in [0, 1], got {p!r}")


class ConstraintTerminations:
    """The runner's CaT: per env step, the termination probability from the task's
    violations, the scaled reward, and the per-constraint log terms."""

    def __init__(self, cfg: ConstraintsConfig, names: Sequence[str], task: str = "") -> None:
        names = tuple(names)
        if cfg.enabled and not names:
            raise ValueError(
                f"constraints.enabled: task {task!r} declares no constraints to terminate on"
            )
        unknown = sorted(set(cfg.p_max_of) - set(names))
        if unknown:
            raise ValueError(
                f"constraints.p_max_of names {unknown}, which task {task!r} does not declare; "
                f"its constraints: {list(names)}"
            )
        self.cfg = cfg
        self.names = names
        self.p_max = {n: float(cfg.p_max_of.get(n, cfg.p_max)) for n in names}
        self.running_max: dict[str, torch.Tensor] = {}

    def step(self, reward: torch.Tensor, info: dict[str, Any]) -> torch.Tensor:
        """The reward the learner sees; puts ``termination_prob`` (CaT on) and the log
        terms into ``info``."""
        violations = {}
        for name in self.names:
            key = f"cstr_{name}"
            if key not in info:
                raise KeyError(f"the env declares constraint {name!r} but gave no info[{key!r}]")
            c = info[key].to(reward.dtype).clamp(min=0.0)
            violations[name] = c
            info[f"cat_violated_{name}"] = (c > 0).to(reward.dtype)
        if not self.cfg.enabled:
            return reward
        delta = self.probabilities(violations)
        info["termination_prob"] = delta
        return reward * (1.0 - delta)

    def probabilities(self, violations: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """delta per env: the largest p_i, after updating the running maxima."""
        delta: torch.Tensor | None = None
        tau = self.cfg.tau
        for name in self.names:
            c = violations[name]
            step_max = c.max().clamp(min=MIN_RUNNING_MAX)
            old = self.running_max.get(name)
            running = step_max if old is None else tau * old + (1.0 - tau) * step_max
            self.running_max[name] = running
            p = torch.where(
                c > 0, self.p_max[name] * torch.clamp(c / running, 0.0, 1.0), torch.zeros_like(c)
            )
            delta = p if delta is None else torch.maximum(delta, p)
        assert delta is not None
        return delta

    def state_dict(self) -> dict[str, Any]:
        return {"running_max": {k: float(v) for k, v in self.running_max.items()}}

    def load_state_dict(self, state: Mapping[str, Any], device: torch.device | str = "cpu") -> None:
        saved = dict(state.get("running_max", {}))
        unknown = sorted(set(saved) - set(self.names))
        if unknown:
            raise ValueError(f"checkpoint has running maxima of unknown constraints {unknown}")
        self.running_max = {
            k: torch.tensor(v, dtype=torch.float32, device=device)
            for k, v in saved.items()
            if math.isfinite(v)
        }
