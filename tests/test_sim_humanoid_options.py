"""Humanoid's observation options: Gymnasium's include_* flags and the privileged critic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sim

SMALL = {
    "include_cinert_in_observation": False,
    "include_cvel_in_observation": False,
    "include_qfrc_actuator_in_observation": False,
    "include_cfrc_ext_in_observation": False,
}


def _rollout(env, steps=30):
    rng = np.random.default_rng(0)
    out = [env.reset(seed=5)]
    for _ in range(steps):
        a = rng.uniform(env.action_spec.low, env.action_spec.high, (env.num_envs, 17))
        out.append(env.step(a)[0])
    return out


def test_privileged_critic_sees_every_v5_term_and_the_policy_only_joints():
    full = sim.make("humanoid", 2, seed=0, dtype=torch.float64)
    split = sim.make("humanoid", 2, seed=0, dtype=torch.float64, privileged_critic=True, **SMALL)
    assert split.observation_spec.policy.size == 45  # qpos without x, y (22) + qvel (23)
    assert split.observation_spec.groups["critic"].size == full.observation_spec.policy.size
    for a, b in zip(_rollout(full), _rollout(split)):
        # the same physics: the critic's group is the full observation, the policy's its head
        torch.testing.assert_close(b["critic"], a["policy"], rtol=0, atol=0)
        torch.testing.assert_close(b["policy"], a["policy"][:, :45], rtol=0, atol=0)


def test_without_privileged_critic_there_is_one_group():
    env = sim.make("humanoid", 2, seed=0, include_cfrc_ext_in_observation=False)
    assert set(env.observation_spec.groups) == {"policy"}
    assert env.observation_spec.policy.size == 348 - 78


@pytest.mark.parametrize("option", ["include_cvel_in_observation", "privileged_critic"])
def test_non_boolean_options_are_named(option):
    with pytest.raises(ValueError, match=f"humanoid: {option} must be true or false"):
        sim.make("humanoid", 1, seed=0, **{option: "no"})
