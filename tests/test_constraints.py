"""Constraints as terminations (CaT): probabilities, reward scaling, returns, the runner."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from training.algorithms.base import OnPolicyLearnerState
from training.constraints import ConstraintsConfig, ConstraintTerminations
from training.core import gae
from training.runner import OnPolicyRunner, parameters_vector
from training.train_configs import build_ppo_config

QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]


def _info(a, b):
    return {"cstr_a": torch.tensor(a), "cstr_b": torch.tensor(b)}


def test_probabilities_and_reward_scaling_match_hand_computed_values():
    cat = ConstraintTerminations(
        ConstraintsConfig(enabled=True, p_max=0.25, p_max_of={"b": 1.0}, tau=0.5), ["a", "b"]
    )
    reward = torch.tensor([1.0, 2.0])
    # step 1: running max of a = 0.2 (its first max); b unviolated, its max floored at 1e-6
    info = _info([0.2, 0.0], [0.0, 0.0])
    got = cat.step(reward, info)
    assert torch.allclose(info["termination_prob"], torch.tensor([0.25, 0.0]))
    assert torch.allclose(got, torch.tensor([0.75, 2.0]))
    assert torch.equal(info["cat_violated_a"], torch.tensor([1.0, 0.0]))
    # step 2: a's running max 0.5 * 0.2 + 0.5 * 0.4 = 0.3, so p_a = 0.25 * [0.1 / 0.3, 1];
    # b's 0.5 * 1e-6 + 0.5 * 0.02, so p_b = 1.0 * [clip(0.02 / 0.0100005), 0] = [1, 0]
    info = _info([0.1, 0.4], [0.02, 0.0])
    got = cat.step(reward, info)
    want = torch.tensor([1.0, 0.25])
    assert cat.running_max["b"].item() == pytest.approx(0.5 * 1e-6 + 0.5 * 0.02)
    assert torch.allclose(info["termination_prob"], want)
    assert torch.allclose(got, reward * (1 - want))
    assert cat.running_max["a"].item() == pytest.approx(0.3)
    # step 3: no violation, no termination; the maxima decay
    info = _info([0.0, 0.0], [0.0, 0.0])
    assert torch.equal(cat.step(reward, info), reward)
    assert cat.running_max["a"].item() == pytest.approx(0.5 * 0.3 + 0.5 * 1e-6)


def test_future_rewards_count_one_minus_delta_times():
    # the learner's storage row: a soft termination where the runner set delta, 1 where
    # the episode really terminated
    term, dones = OnPolicyLearnerState._ends(
        None,  # type: ignore[arg-type]
        torch.tensor([False, True]),
        torch.tensor([False, False]),
        {"termination_prob": torch.tensor([0.5, 0.3])},
    )
    assert torch.equal(term, torch.tensor([0.5, 1.0])) and torch.equal(
        dones, torch.tensor([False, True])
    )
    # one env, three steps, V = 0 but V(s_3) = 1: R_t = r_t + gamma (1 - delta_t) R_{t+1}
    delta = torch.tensor([[0.5], [0.0], [0.2]])
    rewards = torch.ones(3, 1)
    no = torch.zeros(3, 1, dtype=torch.bool)
    last = torch.tensor([[0.0], [0.0], [1.0]])
    _, returns = gae(rewards, torch.zeros(3, 1), last, delta, no, 0.9, 1.0)
    r2 = 1 + 0.9 * 0.8 * 1.0
    r1 = 1 + 0.9 * 1.0 * r2
    r0 = 1 + 0.9 * 0.5 * r1
    assert torch.allclose(returns[:, 0], torch.tensor([r0, r1, r2]))
    # boolean terminations as floats: the same numbers as before
    term = torch.tensor([[False], [True], [False]])
    done = term.clone()
    values, nxt = torch.rand(3, 1), torch.rand(3, 1)
    a = gae(rewards, values, nxt, term, done, 0.99, 0.95)
    b = gae(rewards, values, nxt, term.float(), done, 0.99, 0.95)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="p_max"):
        ConstraintsConfig(p_max=1.5)
    with pytest.raises(ValueError, match="tau"):
        ConstraintsConfig(tau=1.0)
    with pytest.raises(ValueError, match="declares no constraints"):
        ConstraintTerminations(ConstraintsConfig(enabled=True), [], "cartpole")
    with pytest.raises(ValueError, match="does not declare"):
        ConstraintTerminations(ConstraintsConfig(p_max_of={"knee": 0.1}), ["torque"], "quadruped")
    with pytest.raises(ValueError, match="unknown constraints"):
        from sim.registry import make

        make("quadruped", 1, constraint_limits={"knee": 1.0})


def test_quadruped_reports_every_declared_constraint():
    from sim.registry import make

    env = make("quadruped", 4, seed=0, constraint_limits={"torque": 0.01})
    env.reset()
    _, _, _, _, info = env.step(torch.ones(4, env.action_spec.size))
    for name in env.constraint_names:
        v = info[f"cstr_{name}"].numpy()
        assert v.shape == (4,) and (v >= 0).all() and np.isfinite(v).all()
    # 1% of the torque limit: a standing robot already exceeds it
    assert (info["cstr_torque"] > 0).all()


QUADRUPED = [
    "env.num_envs=4",
    "ppo.num_steps=8",
    "policy.actor_hidden=16",
    "policy.critic_hidden=16",
    "constraints.enabled=true",
    "constraints.p_max=0.5",
]


def _train(tmp_path, name, steps, resume=None):
    cfg = build_ppo_config("quadruped", QUIET + QUADRUPED + [f"run.total_steps={steps}"])
    runner = OnPolicyRunner(cfg, tmp_path / name, resume=resume)
    runner.train()
    return runner


def test_runner_applies_cat_logs_it_and_resumes_exactly(tmp_path):
    whole = _train(tmp_path, "whole", 4 * 32)
    _train(tmp_path, "split", 2 * 32)
    resumed = _train(tmp_path, "split", 4 * 32, resume=tmp_path / "split")
    assert torch.equal(parameters_vector(resumed.policy), parameters_vector(whole.policy))
    assert resumed.constraints.running_max.keys() == whole.constraints.running_max.keys()
    for k, v in whole.constraints.running_max.items():
        assert torch.equal(resumed.constraints.running_max[k], v), k
    row = json.loads((tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()[-1])
    for name in whole.env.constraint_names:
        assert 0.0 <= row[f"env/cat_violated_{name}"] <= 1.0
        assert f"env/cstr_{name}" in row
    assert 0.0 <= row["env/termination_prob"] <= 0.5


def test_cat_is_off_by_default_and_changes_training_when_on(tmp_path):
    cfg = build_ppo_config("quadruped", QUIET + QUADRUPED[:4] + ["run.total_steps=64"])
    assert not cfg.constraints.enabled
    off = OnPolicyRunner(cfg, tmp_path / "off")
    off.train()
    on = _train(tmp_path, "on", 64)
    assert not torch.equal(parameters_vector(off.policy), parameters_vector(on.policy))
    row = json.loads((tmp_path / "off" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "env/termination_prob" not in row and "env/cat_violated_torque" in row
