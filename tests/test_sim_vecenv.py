"""VecEnv contract of the Gymnasium-v5 tasks: determinism, auto-reset, episode stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sim

TASKS = ["halfcheetah", "hopper", "walker2d", "ant", "humanoid", "cartpole"]


def _actions(env, rng):
    return rng.uniform(
        env.action_spec.low, env.action_spec.high, size=(env.num_envs, env.action_spec.size)
    )


def _rollout(task, num_threads, steps=40, seed=5):
    env = sim.make(
        task,
        num_envs=4,
        seed=seed,
        num_threads=num_threads,
        dtype=torch.float64,
        max_episode_steps=15,
    )
    rng = np.random.default_rng(0)
    frames = [env.reset()["policy"].numpy().copy()]
    for _ in range(steps):
        obs, rew, term, trunc, info = env.step(_actions(env, rng))
        frames += [
            obs["policy"].numpy().copy(),
            info["final_obs"]["policy"].numpy().copy(),
            rew.numpy().copy(),
            term.numpy().copy(),
            trunc.numpy().copy(),
        ]
        frames.append(env.get_state()["qpos"].copy())
    return frames


@pytest.mark.parametrize("task", ["hopper", "ant"])  # BatchEngine, PoolEngine
def test_same_seed_same_trajectory_any_thread_count(task):
    a = _rollout(task, num_threads=1)
    b = _rollout(task, num_threads=1)
    c = _rollout(task, num_threads=2)
    for x, y, z in zip(a, b, c, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    d = _rollout(task, num_threads=1, seed=6)
    assert not np.array_equal(a[0], d[0])


@pytest.mark.parametrize("task", TASKS)
def test_reset_states_follow_the_seed(task):
    env = sim.make(task, num_envs=3, dtype=torch.float64)
    env.reset(seed=11)
    s1 = env.get_state()
    env.reset(seed=11)
    s2 = env.get_state()
    env.reset(seed=12)
    s3 = env.get_state()
    other = sim.make(task, num_envs=3, dtype=torch.float64)
    other.reset(seed=11)
    s4 = other.get_state()
    for k in ("qpos", "qvel"):
        np.testing.assert_array_equal(s1[k], s2[k])
        np.testing.assert_array_equal(s1[k], s4[k])
        assert not np.array_equal(s1[k], s3[k])
        # each env draws its own noise
        assert not np.array_equal(s1[k][0], s1[k][1])
    # the noise stays within v5's reset noise around the initial pose
    scale = env.reset_noise_scale
    dq = s1["qpos"] - env.model.qpos0
    assert np.abs(dq).max() <= scale
    if task in ("ant", "halfcheetah"):  # v5 draws qvel from a normal distribution
        assert np.abs(s1["qvel"]).max() > 0
    else:  # and uniformly for the others
        assert np.abs(s1["qvel"]).max() <= scale


@pytest.mark.parametrize("task", ["hopper", "ant", "cartpole"])
def test_time_limit_truncates_and_resets(task):
    env = sim.make(task, num_envs=2, seed=3, dtype=torch.float64, max_episode_steps=5)
    twin = sim.make(task, num_envs=2, seed=3, dtype=torch.float64)  # no time limit
    env.reset()
    twin.reset()
    zeros = np.zeros((2, env.action_spec.size))
    total = torch.zeros(2, dtype=torch.float64)
    for t in range(5):
        obs, rew, term, trunc, info = env.step(zeros)
        tobs, trew, *_ = twin.step(zeros)
        total += rew
        assert not term.any()
        assert bool(trunc.all()) == (t == 4)
        assert ("episode" in info) == (t == 4)
    # the final observation is the last one of the episode, not the reset one
    torch.testing.assert_close(info["final_obs"]["policy"], tobs["policy"], rtol=0, atol=0)
    assert not torch.equal(obs["policy"], tobs["policy"])
    # and the returned one is a fresh reset observation of the new state
    qpos = env.get_state()["qpos"]
    assert np.abs(qpos - env.model.qpos0).max() <= env.reset_noise_scale
    ep = info["episode"]
    assert ep["done"].all()
    assert ep["length"].tolist() == [5, 5]
    torch.testing.assert_close(ep["return"], total)
    # the new episode runs on
    obs, rew, term, trunc, info = env.step(zeros)
    assert not trunc.any() and "episode" not in info


def test_hopper_fall_terminates_not_truncates():
    env = sim.make("hopper", num_envs=3, seed=0, dtype=torch.float64)
    env.reset()
    state = env.get_state()
    qpos, qvel = state["qpos"].copy(), state["qvel"].copy()
    qpos[1, 1] = 0.3  # env 1's torso far below the healthy z range
    env.set_state(qpos, qvel)
    obs, rew, term, trunc, info = env.step(np.zeros((3, 3)))
    assert term.tolist() == [False, True, False]
    assert not trunc.any()
    final = info["final_obs"]["policy"]
    assert final[1, 0] < 0.7  # observed z (x is excluded) at the fall
    assert obs["policy"][1, 0] == pytest.approx(1.25, abs=env.reset_noise_scale)
    torch.testing.assert_close(final[[0, 2]], obs["policy"][[0, 2]], rtol=0, atol=0)
    assert info["episode"]["done"].tolist() == [False, True, False]
    assert info["episode"]["length"][1] == 1
    # an unhealthy step earns no survival reward
    assert info["reward_survive"].tolist() == [1.0, 0.0, 1.0]
    assert env.episode_length.tolist() == [1, 0, 1]


@pytest.mark.parametrize("task", ["ant", "humanoid"])
def test_contact_forces_observed_zero_right_after_reset(task):
    """Gymnasium's reset runs mj_forward only, so cfrc_ext is zero in its first observation."""
    env = sim.make(task, num_envs=2, seed=0, dtype=torch.float64, max_episode_steps=30)
    sl = env.observation_spec.policy.slices()["cfrc_ext"]
    obs = env.reset()
    assert (obs["policy"][:, sl] == 0).all()
    rng = np.random.default_rng(0)
    seen, resets = False, 0
    for _ in range(30):
        obs, rew, term, trunc, info = env.step(_actions(env, rng))
        seen |= bool((info["final_obs"]["policy"][:, sl] != 0).any())
        done = term | trunc
        resets += int(done.sum())
        assert (obs["policy"][done][:, sl] == 0).all()
    assert seen, "contacts should produce non-zero cfrc_ext while stepping"
    assert resets >= 2  # the time limit (if nothing else) ended both first episodes


@pytest.mark.parametrize("task", TASKS)
def test_registered_and_described(task):
    assert task in sim.task_names()
    env = sim.make(task, num_envs=2)
    assert env.name == task
    assert env.max_episode_steps == 1000
    assert len(env.robot.joint_names) == env.action_spec.size
    names = [t.name for t in env.observation_spec.policy.terms]
    assert names[:2] == ["qpos", "qvel"]
    obs = env.reset(seed=0)
    assert obs["policy"].shape == (2, env.observation_spec.policy.size)
    assert obs["policy"].dtype == torch.float32


@pytest.mark.parametrize("task", ["hopper", "ant"])  # BatchEngine, PoolEngine
def test_engine_state_round_trip_includes_the_scalar_time(task):
    # MjData.time is a Python float in the bindings, not a view of MuJoCo's memory: an
    # engine that cached a raw address for it read garbage and wrote into freed memory
    from sim.engine import engine_state, load_engine_state

    env = sim.make(task, 3, seed=0)
    env.reset(seed=0)
    env.engine.set("time", np.array([1.5, 2.5, 3.5]))
    np.testing.assert_array_equal(env.engine.get("time"), [1.5, 2.5, 3.5])
    for _ in range(3):
        env.step(torch.zeros(3, env.action_spec.size))
    saved = engine_state(env.engine)
    times = env.engine.get("time").copy()
    qpos = env.engine.get("qpos").copy()
    assert np.all(times > [1.5, 2.5, 3.5])

    other = sim.make(task, 3, seed=1)
    other.reset(seed=1)
    load_engine_state(other.engine, saved)
    np.testing.assert_array_equal(other.engine.get("time"), times)
    np.testing.assert_array_equal(other.engine.get("qpos"), qpos)
    assert [other.engine.get_data(i).time for i in range(3)] == list(times)
