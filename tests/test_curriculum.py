"""The quadruped's command-range curriculum: levels follow tracking, and resume exactly.

(The terrain curriculum of go1_rough is tested in test_sim_go1.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.registry import make


def _env(n=3, **kw):
    return make("quadruped", n, seed=0, max_episode_steps=20, command_curriculum=4, **kw)


def _end_episodes(env, tracking):
    """End every env's episode as if it had tracked this well (mean kernel per step)."""
    env.episode_length[:] = 5
    env._tracking_sum[:] = np.asarray(tracking) * env.max_episode_steps
    env._reset_envs(env._all)


def test_levels_move_up_and_down_with_tracking():
    env = _env()
    env.reset()
    assert env.command_levels.tolist() == [0, 0, 0]
    _end_episodes(env, [0.9, 0.6, 0.1])  # good, middling, poor
    assert env.command_levels.tolist() == [1, 0, 0]
    env.command_levels[:] = 3
    _end_episodes(env, [0.9, 0.6, 0.1])  # the top level holds; poor tracking steps down
    assert env.command_levels.tolist() == [3, 3, 2]
    assert (env._tracking_sum == 0).all()


def test_commands_widen_with_the_level():
    env = make("quadruped", 256, seed=1, command_curriculum=4, command_vx=(-1.0, 1.0))
    env.reset()
    assert np.abs(env.commands[:, 0]).max() <= 0.25 + 1e-12
    env.command_levels[:] = 3
    env._sample_commands(env._all, env._rng)
    assert np.abs(env.commands[:, 0]).max() > 0.5


def test_tracking_is_summed_and_logged():
    env = _env(2)
    env.reset()
    _, _, _, _, info = env.step(torch.zeros(2, env.action_spec.size))
    assert info["command_level"].tolist() == [0.0, 0.0]
    assert (env._tracking_sum > 0).all()


def test_resume_continues_exactly():
    a = _env(4)
    a.reset()
    rng = np.random.default_rng(0)
    actions = [torch.as_tensor(rng.normal(size=(4, 12)), dtype=torch.float32) for _ in range(60)]
    for act in actions[:25]:
        a.step(act)
    a.command_levels[:] = [0, 1, 2, 3]
    b = _env(4)
    b.load_state_dict(a.state_dict())
    for act in actions[25:]:
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(act)
        assert torch.equal(oa["policy"], ob["policy"]) and torch.equal(ra, rb)
    np.testing.assert_array_equal(a.command_levels, b.command_levels)
    np.testing.assert_array_equal(a._tracking_sum, b._tracking_sum)


def test_bad_level_count_is_a_clear_error():
    with pytest.raises(ValueError, match="command_curriculum"):
        make("quadruped", 1, command_curriculum=-1)
