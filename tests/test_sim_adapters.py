"""Adapters of the batched simulator: Gymnasium (single and vector) and Stable-Baselines3."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import sim
from sim.adapters import GymnasiumEnv, GymnasiumVectorEnv, SB3VecEnv, register_gymnasium_envs

ACT = 6  # halfcheetah


def _actions(steps: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, size=(steps, n, ACT)).astype(np.float32)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# ---------------------------------------------------------------------- GymnasiumEnv
def test_check_env_passes():
    env = GymnasiumEnv("halfcheetah", seed=0)
    check_env(env, skip_render_check=True)
    assert env.observation_space.dtype == np.float32
    assert env.observation_space.shape == (17,)
    assert env.action_space.dtype == np.float32
    np.testing.assert_array_equal(env.action_space.low, -np.ones(ACT, np.float32))
    env.close()


def test_gymnasium_trajectory_equals_batched_and_ends_with_final_obs():
    steps, horizon, seed = 12, 5, 3
    acts = _actions(steps, 1)
    ref = sim.make("halfcheetah", 1, seed=seed, max_episode_steps=horizon)
    ref_obs = _np(ref.reset()["policy"][0])

    env = GymnasiumEnv("halfcheetah", max_episode_steps=horizon)
    obs, info = env.reset(seed=seed)
    assert obs.dtype == np.float32 and isinstance(info, dict)
    np.testing.assert_array_equal(obs, ref_obs.astype(np.float32))
    ends = 0
    for t in range(steps):
        r_obs, r_rew, r_term, r_trunc, r_info = ref.step(acts[t])
        obs, rew, term, trunc, info = env.step(acts[t, 0])
        assert isinstance(rew, float) and isinstance(term, bool) and isinstance(trunc, bool)
        assert rew == pytest.approx(float(r_rew[0]), rel=1e-6, abs=1e-6)
        assert term == bool(r_term[0]) and trunc == bool(r_trunc[0])
        assert info["x_velocity"] == pytest.approx(float(r_info["x_velocity"][0]), rel=1e-6)
        if term or trunc:
            ends += 1
            assert (t + 1) % horizon == 0 and trunc
            # the ending step returns the true final observation, not the next episode's
            np.testing.assert_array_equal(obs, _np(r_info["final_obs"]["policy"][0]))
            assert not np.array_equal(obs, _np(r_obs["policy"][0]))
            obs, _ = env.reset()  # continues like the batched env's own reset
        np.testing.assert_array_equal(obs, _np(r_obs["policy"][0]))
    assert ends == 2


def test_gymnasium_reset_seed_is_deterministic_and_np_random_is_the_sim_rng():
    env = GymnasiumEnv("halfcheetah")
    a, _ = env.reset(seed=5)
    b, _ = env.reset()
    c, _ = env.reset(seed=5)
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)
    assert env.np_random is env.env._rng
    env.np_random = np.random.default_rng(5)  # a user-set generator drives the next reset
    d, _ = env.reset()
    np.testing.assert_array_equal(a, d)


def test_gymnasium_make_and_step_before_reset():
    ids = register_gymnasium_envs()
    assert "sim2real/halfcheetah-v0" in ids
    env = gymnasium.make("sim2real/halfcheetah-v0", max_episode_steps=3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (17,) and obs.dtype == np.float32
    for _ in range(3):
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
    assert trunc and not term  # make's max_episode_steps (3) was used
    env.close()
    raw = GymnasiumEnv("halfcheetah", seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        raw.step(np.zeros(ACT, np.float32))
    with pytest.raises(ValueError, match=r"\(6,\)"):
        raw.reset()
        raw.step(np.zeros(5, np.float32))


def test_gymnasium_env_takes_existing_env_and_refuses_batches():
    base = sim.make("halfcheetah", 1, seed=0)
    env = GymnasiumEnv(base)
    assert env.env is base
    with pytest.raises(ValueError, match="num_envs=1"):
        GymnasiumEnv(sim.make("halfcheetah", 2, seed=0))


# ---------------------------------------------------------------------- registered ids
def test_spec_max_episode_steps_is_the_task_limit():
    from sim.registry import task_class, task_names

    for task in task_names():
        spec = gymnasium.spec(f"sim2real/{task}-v0")
        assert spec.max_episode_steps == task_class(task).max_episode_steps
        assert spec.vector_entry_point == "sim.adapters:GymnasiumVectorEnv"


def _steps_to_truncation(env, steps: int, vector: bool = False) -> list[int]:
    """The 1-based steps at which `env` (zero actions) reported truncated."""
    env.reset(seed=0)
    shape = env.action_space.shape
    found = []
    for t in range(1, steps + 1):
        _, _, term, trunc, _ = env.step(np.zeros(shape, np.float32))
        assert not np.any(term)  # halfcheetah never terminates
        if vector:
            if trunc.any():
                assert trunc.all()
                found.append(t)
        elif trunc:
            found.append(t)
            env.reset()
    return found


def test_make_truncates_exactly_once_at_the_task_limit():
    env = gymnasium.make("sim2real/halfcheetah-v0")
    assert env.spec.max_episode_steps == 1000
    assert _steps_to_truncation(env, 1010) == [1000]
    env.close()
    # make's max_episode_steps is THE limit, above the task's as well as below
    env = gymnasium.make("sim2real/halfcheetah-v0", max_episode_steps=1004)
    assert env.spec.max_episode_steps == 1004
    assert _steps_to_truncation(env, 1010) == [1004]
    env.close()
    with pytest.raises(ValueError, match="TimeLimit"):
        GymnasiumEnv("halfcheetah", time_limit=False, max_episode_steps=3)


def test_make_follows_the_batched_env_across_a_truncation():
    horizon, seed = 4, 2
    ref = sim.make("halfcheetah", 1, seed=seed, max_episode_steps=horizon)
    ref_obs = ref.reset()["policy"]
    env = gymnasium.make("sim2real/halfcheetah-v0", max_episode_steps=horizon)
    obs, _ = env.reset(seed=seed)
    acts = _actions(2 * horizon, 1)
    ends = 0
    np.testing.assert_array_equal(obs, _np(ref_obs[0]))
    for t in range(2 * horizon):
        ref_obs, r_rew, _, r_trunc, r_info = ref.step(acts[t])
        obs, rew, term, trunc, _ = env.step(acts[t, 0])
        assert trunc == bool(r_trunc[0]) and not term
        assert rew == pytest.approx(float(r_rew[0]), rel=1e-6, abs=1e-6)
        if trunc:
            ends += 1
            np.testing.assert_array_equal(obs, _np(r_info["final_obs"]["policy"][0]))
            obs, _ = env.reset()  # TimeLimit ended it: a real reset, same draws
        np.testing.assert_array_equal(obs, _np(ref_obs["policy"][0]))
    assert ends == 2


def test_make_vec_is_one_batched_env_with_the_adapters_trajectory():
    from sim.vec_env import MujocoVecEnv

    n, seed = 3, 4
    venv = gymnasium.make_vec("sim2real/cartpole-v0", num_envs=n, seed=seed)
    assert type(venv) is GymnasiumVectorEnv
    assert isinstance(venv.env, MujocoVecEnv) and venv.env.num_envs == n
    assert venv.spec.max_episode_steps == venv.env.max_episode_steps == 1000
    assert venv.spec.kwargs["vectorization_mode"] == "vector_entry_point"
    ref = GymnasiumVectorEnv("cartpole", n, seed=seed)
    obs, _ = venv.reset()
    r_obs, _ = ref.reset()
    np.testing.assert_array_equal(obs, r_obs)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(60):
        a = rng.uniform(-3, 3, size=(n, 1)).astype(np.float32)
        obs, rew, term, trunc, info = venv.step(a)
        r_obs, r_rew, r_term, r_trunc, r_info = ref.step(a)
        np.testing.assert_array_equal(obs, r_obs)
        np.testing.assert_array_equal(rew, r_rew)
        np.testing.assert_array_equal(term, r_term)
        np.testing.assert_array_equal(trunc, r_trunc)
        if "final_obs" in info:
            ended += int(info["_final_obs"].sum())
            for i in np.nonzero(info["_final_obs"])[0]:
                np.testing.assert_array_equal(info["final_obs"][i], r_info["final_obs"][i])
    assert ended > 0  # random pushes drop the pole: autoreset was exercised
    venv.close()


def test_make_vec_truncates_once_at_the_limit():
    venv = gymnasium.make_vec("sim2real/halfcheetah-v0", num_envs=2)
    assert _steps_to_truncation(venv, 1010, vector=True) == [1000]
    short = gymnasium.make_vec("sim2real/halfcheetah-v0", num_envs=2, max_episode_steps=5)
    assert short.env.max_episode_steps == 5
    assert _steps_to_truncation(short, 12, vector=True) == [5, 10]  # same-step autoreset
    # the sync mode still builds one-env copies, each with its one TimeLimit
    sync = gymnasium.make_vec(
        "sim2real/halfcheetah-v0", num_envs=2, vectorization_mode="sync", max_episode_steps=5
    )
    assert isinstance(sync, gymnasium.vector.SyncVectorEnv)
    # SyncVectorEnv autoresets on the next step, so the second episode ends at step 11
    assert _steps_to_truncation(sync, 12, vector=True) == [5, 11]


# ---------------------------------------------------------------------- GymnasiumVectorEnv
def test_vector_env_shapes_and_same_step_autoreset():
    n, horizon, seed = 3, 4, 1
    ref = sim.make("halfcheetah", n, seed=seed, max_episode_steps=horizon)
    venv = GymnasiumVectorEnv("halfcheetah", n, seed=seed, max_episode_steps=horizon)
    assert venv.metadata["autoreset_mode"] is gymnasium.vector.AutoresetMode.SAME_STEP
    assert venv.num_envs == n
    assert venv.single_observation_space.shape == (17,)
    assert venv.observation_space.shape == (n, 17)
    assert venv.single_action_space.shape == (ACT,)
    assert venv.action_space.shape == (n, ACT)
    obs, info = venv.reset()
    ref.reset()
    ref.episode_length[0] = 2  # env 0 ends two steps before the others
    venv.env.episode_length[0] = 2
    assert obs.shape == (n, 17) and obs.dtype == np.float32 and info == {}
    acts = _actions(horizon, n)
    for t in range(horizon):
        r_obs, r_rew, r_term, r_trunc, r_info = ref.step(acts[t])
        obs, rew, term, trunc, info = venv.step(acts[t])
        assert obs in venv.observation_space
        assert rew.shape == (n,) and term.dtype == bool and trunc.dtype == bool
        np.testing.assert_array_equal(obs, _np(r_obs["policy"]))
        np.testing.assert_allclose(rew, _np(r_rew), rtol=1e-6)
        assert info["x_velocity"].shape == (n,)
        done = term | trunc
        if t in (1, 3):
            want = np.array([True, False, False]) if t == 1 else np.array([False, True, True])
            np.testing.assert_array_equal(done, want)
            np.testing.assert_array_equal(info["_final_obs"], want)
            np.testing.assert_array_equal(info["_final_info"], want)
            for i in range(n):
                if want[i]:
                    np.testing.assert_array_equal(
                        info["final_obs"][i], _np(r_info["final_obs"]["policy"][i])
                    )
                    assert info["final_info"]["episode"]["l"][i] == horizon  # counter started at 2
                else:
                    assert info["final_obs"][i] is None
        else:
            assert not done.any() and "final_obs" not in info
    venv.close()


def test_vector_env_with_record_episode_statistics():
    venv = gymnasium.wrappers.vector.RecordEpisodeStatistics(
        GymnasiumVectorEnv("halfcheetah", 2, seed=0, max_episode_steps=3)
    )
    venv.reset()
    rets = np.zeros(2)
    for _ in range(3):
        _, rew, _, _, info = venv.step(np.zeros((2, ACT), np.float32))
        rets += rew
    np.testing.assert_array_equal(info["episode"]["l"], [3, 3])
    np.testing.assert_allclose(info["episode"]["r"], rets)
    np.testing.assert_allclose(info["final_info"]["episode"]["r"], rets)


# ---------------------------------------------------------------------- SB3
def test_sb3_ppo_learns_on_batched_env():
    from stable_baselines3 import PPO

    venv = SB3VecEnv("halfcheetah", 4, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, device="cpu", seed=0)
    model.learn(256)
    assert model.num_timesteps >= 256
    venv.close()


def test_sb3_infos_on_truncation_and_termination():
    n, horizon = 3, 5
    ref = sim.make("halfcheetah", n, seed=0, max_episode_steps=horizon, nan_action="reset")
    venv = SB3VecEnv("halfcheetah", n, seed=0, max_episode_steps=horizon, nan_action="reset")
    obs = venv.reset()
    np.testing.assert_array_equal(obs, _np(ref.reset()["policy"]))
    acts = _actions(horizon, n)
    acts[1, 2] = np.nan  # env 2 ends (terminated) at the second step
    rets = np.zeros(n)
    held = None
    for t in range(horizon):
        r_obs, r_rew, r_term, r_trunc, r_info = ref.step(acts[t])
        venv.step_async(acts[t])
        obs, rew, dones, infos = venv.step_wait()
        rets += rew
        assert rew.dtype == np.float32 and dones.dtype == bool and len(infos) == n
        np.testing.assert_array_equal(obs, _np(r_obs["policy"]))
        np.testing.assert_array_equal(dones, _np(r_term | r_trunc))
        if held is not None:
            assert held == {"poisoned": 1}  # what a caller kept is not touched by later steps
            assert all("poisoned" not in i for i in infos)
            held = None
        for i in range(n):
            if not dones[i]:
                assert infos[i] == {}
                continue
            info = infos[i]
            np.testing.assert_array_equal(
                info["terminal_observation"], _np(r_info["final_obs"]["policy"][i])
            )
            assert info["terminal_observation"].dtype == np.float32
            if t == 1:
                assert i == 2 and info["TimeLimit.truncated"] is False
                assert info["episode"]["l"] == 2
            else:
                assert t == horizon - 1 and info["TimeLimit.truncated"] is True
                assert info["episode"]["l"] == horizon
                assert info["episode"]["r"] == pytest.approx(rets[i], rel=1e-5)
        if t == 0:
            infos[0]["poisoned"] = 1
            held = infos[0]
    assert dones[:2].all()


def test_sb3_attrs_methods_seed():
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import VecNormalize

    venv = SB3VecEnv("halfcheetah", 2, seed=0)
    assert venv.render_mode is None
    assert venv.get_attr("dt") == [venv.env.dt] * 2
    assert venv.get_attr("max_episode_steps", indices=[1]) == [1000]
    venv.set_attr("max_episode_steps", 7)
    assert venv.env.max_episode_steps == 7
    with pytest.raises(ValueError, match="share"):
        venv.set_attr("max_episode_steps", 8, indices=[0])
    assert venv.env_is_wrapped(Monitor) == [True, True]
    assert venv.env_is_wrapped(gymnasium.Wrapper) == [False, False]
    with pytest.raises(IndexError):
        venv.get_attr("dt", indices=[5])
    venv.seed(11)
    a = venv.reset()
    b = SB3VecEnv("halfcheetah", 2, seed=11).reset()
    np.testing.assert_array_equal(a, b)
    states = venv.env_method("get_state")
    assert len(states) == 2 and states[0]["qpos"].shape == (2, 9)
    norm = VecNormalize(venv)  # a standard SB3 wrapper works on top
    norm.reset()
    norm.step(np.zeros((2, ACT), np.float32))


def test_adapters_take_existing_env():
    base = sim.make("halfcheetah", 2, seed=0)
    assert SB3VecEnv(base).env is base
    assert GymnasiumVectorEnv(base).env is base
    with pytest.raises(ValueError, match="num_envs"):
        SB3VecEnv(base, num_envs=3)
    with pytest.raises(ValueError, match="seed"):
        GymnasiumVectorEnv(base, seed=1)


# ---------------------------------------------------------------------- batched env regressions
def test_obs_history_of_running_envs_survives_other_envs_reset():
    n, h = 2, 3
    env = sim.make("halfcheetah", n, seed=0, s2r={"obs_history": h}, max_episode_steps=10)
    env.reset()
    env.episode_length[1] = 9  # env 1 ends at the first step; env 0 keeps going
    frames = []
    for _ in range(3):
        obs, *_ = env.step(np.zeros((n, ACT)))
        frames.append(_np(obs["policy"][0]).reshape(h, -1))
    last = [f[-1] for f in frames]
    np.testing.assert_array_equal(frames[2], np.stack(last))


def test_float64_observations_are_not_overwritten_by_later_steps():
    env = sim.make("halfcheetah", 2, seed=0, dtype=torch.float64)
    obs = env.reset()["policy"]
    kept = obs.clone()
    env.step(np.zeros((2, ACT)))
    assert torch.equal(obs, kept)
