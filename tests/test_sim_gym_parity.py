"""Our batched tasks against `gymnasium.make("<Task>-v5")`, step by step.

Env 0's state is copied into Gymnasium, both take the same random actions, and
observations, rewards and terminated flags must agree (they agree to the bit for
observations; rewards differ at most by a rounding in the order of a sum). When
Gymnasium's episode ends, our env has already reset env 0 in the same step: the
comparison uses `info["final_obs"]`, then Gymnasium restarts from our new state.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

import sim

TOL = 1e-6
PAIRS = [
    ("halfcheetah", "HalfCheetah-v5"),
    ("hopper", "Hopper-v5"),
    ("walker2d", "Walker2d-v5"),
    ("ant", "Ant-v5"),
    ("humanoid", "Humanoid-v5"),
    ("cartpole", "InvertedPendulum-v5"),
]
# Gymnasium's own options that leave observation terms out, as our tasks take them too
HUMANOID_SMALL_OBS = {
    "include_cinert_in_observation": False,
    "include_cvel_in_observation": False,
    "include_qfrc_actuator_in_observation": False,
    "include_cfrc_ext_in_observation": False,
}
OPTION_PAIRS = [
    ("humanoid", "Humanoid-v5", HUMANOID_SMALL_OBS),
    ("humanoid", "Humanoid-v5", {"include_cinert_in_observation": False}),
]
STEPS = 300
# per-step numbers Gymnasium reports in `info` that our env reports too
INFO_KEYS = (
    "x_velocity",
    "y_velocity",
    "reward_forward",
    "reward_ctrl",
    "reward_contact",
    "reward_survive",
)


def _close(ours, theirs, what):
    np.testing.assert_allclose(
        np.asarray(ours), np.asarray(theirs), rtol=TOL, atol=TOL, err_msg=what
    )


@pytest.mark.parametrize(
    "task,gym_id,options",
    [(*p, {}) for p in PAIRS] + OPTION_PAIRS,
    ids=[p[0] for p in PAIRS] + [f"{p[0]}-{'-'.join(sorted(p[2]))}" for p in OPTION_PAIRS],
)
def test_matches_gymnasium_v5(task, gym_id, options):
    env = sim.make(task, num_envs=3, seed=0, dtype=torch.float64, **options)
    genv = gymnasium.make(gym_id, disable_env_checker=True, **options)
    g = genv.unwrapped
    assert env.observation_spec.policy.size == genv.observation_space.shape[0]
    assert env.action_spec.size == genv.action_space.shape[0]
    # Gymnasium's Box holds the model's ctrlrange as float32
    space = genv.action_space
    np.testing.assert_array_equal(env.action_spec.low.astype(space.dtype), space.low)
    np.testing.assert_array_equal(env.action_spec.high.astype(space.dtype), space.high)
    assert env.dt == pytest.approx(g.dt)
    assert env.max_episode_steps == genv.spec.max_episode_steps

    def sync(obs, seed):
        # Gymnasium's own reset path (mj_resetData, then set_state -> mj_forward)
        genv.reset(seed=seed)
        state = env.get_state()
        g.set_state(state["qpos"][0], state["qvel"][0])
        _close(obs["policy"][0], g._get_obs(), f"{task}: reset observation")

    obs = env.reset(seed=123)
    sync(obs, 0)
    rng = np.random.default_rng(1)
    low, high = env.action_spec.low, env.action_spec.high
    episodes = 0
    for t in range(STEPS):
        actions = rng.uniform(low, high, size=(env.num_envs, env.action_spec.size))
        obs, reward, terminated, truncated, info = env.step(actions)
        gobs, greward, gterm, gtrunc, ginfo = genv.step(actions[0])
        _close(info["final_obs"]["policy"][0], gobs, f"{task}: observation at step {t}")
        _close(reward[0], greward, f"{task}: reward at step {t}")
        assert bool(terminated[0]) == gterm, f"{task}: terminated at step {t}"
        assert not bool(truncated[0]) and not gtrunc
        for k in INFO_KEYS:
            if k in ginfo:
                _close(info[k][0], ginfo[k], f"{task}: info[{k!r}] at step {t}")
        if gterm:
            episodes += 1
            sync(obs, t + 1)
    genv.close()
    # the falling tasks must have crossed at least one termination and auto-reset
    if task not in ("halfcheetah",):
        assert episodes >= 1, f"{task}: no episode ended in {STEPS} random steps"
