"""sim.evaluation's episode statistics against hand-computed values on a scripted env."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sim.evaluation import evaluate


class ScriptedEnv:
    """Two envs whose rewards, ends and constraint violations follow a fixed script:
    env 0 falls at step 3, env 1 runs to its time-out at step 4."""

    num_envs = 2
    max_episode_steps = 4
    device = "cpu"
    action_spec = SimpleNamespace(low=np.array([-1.0]), high=np.array([1.0]))
    # step -> (cstr_a, cstr_b) per env
    violations = [
        ([0.0, 0.5], [0.0, 0.0]),
        ([0.2, 0.0], [0.3, 0.0]),
        ([0.0, 0.0], [0.0, 0.1]),
        ([9.0, 0.0], [9.0, 9.0]),  # env 0 has ended: not counted
    ]

    def reset(self):
        self.t = 0
        return {"policy": torch.zeros(2, 1)}

    def step(self, actions):
        a, b = self.violations[self.t]
        self.t += 1
        terminated = torch.tensor([self.t == 3, False])
        truncated = torch.tensor([False, self.t == 4])
        info = {"cstr_a": torch.tensor(a), "cstr_b": torch.tensor(b)}
        return {"policy": torch.zeros(2, 1)}, torch.ones(2), terminated, truncated, info


def test_constraint_violation_rates_are_shares_of_the_episodes_steps():
    stats = evaluate(lambda obs, reset: torch.zeros(2, 1), ScriptedEnv(), episodes=2)
    assert stats["lengths"] == [3, 4] and stats["terminated"] == 1
    # 7 steps in all; a: env 0 step 2, env 1 step 1; b: env 0 step 2, env 1 steps 3, 4
    assert stats["violation_rate_a"] == pytest.approx(2 / 7)
    assert stats["violation_rate_b"] == pytest.approx(3 / 7)
    # any: env 0 step 2; env 1 steps 1, 3, 4
    assert stats["violation_rate"] == pytest.approx(4 / 7)


def test_no_constraints_no_violation_rates():
    env = ScriptedEnv()
    env.violations = [([], [])] * 4

    def step(actions, inner=env.step):
        obs, r, term, trunc, _ = inner(actions)
        return obs, r, term, trunc, {}

    env.step = step
    stats = evaluate(lambda obs, reset: torch.zeros(2, 1), env, episodes=2)
    assert not any(k.startswith("violation_rate") for k in stats)
