"""What the cheap step must keep: fresh outputs every step, views that follow the state,
the per-step memo confined to its step, unstable envs handled as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.randomization import SimToRealConfig
from sim.registry import make


def _actions(env, rng):
    lo, hi = env.action_spec.low, env.action_spec.high
    a = rng.uniform(lo, hi, size=(env.num_envs, env.action_spec.size))
    return torch.from_numpy(a.astype(np.float32))


@pytest.mark.parametrize("task", ["halfcheetah", "quadruped"])
def test_returned_tensors_are_not_overwritten_by_later_steps(task):
    env = make(task, 3, seed=0, max_episode_steps=4)  # episodes end inside the test
    rng = np.random.default_rng(0)
    env.reset()
    kept, copies = [], []
    for _ in range(9):
        obs, rew, term, trunc, info = env.step(_actions(env, rng))
        out = (obs, rew, term, trunc, {k: v for k, v in info.items() if k != "episode"})
        kept.append(out)
        copies.append(_clone(out))
    for a, b in zip(kept, copies):
        _assert_equal(a, b)


def test_writing_a_returned_tensor_changes_no_other():
    env = make("halfcheetah", 2, seed=0)
    env.reset()
    obs, rew, term, trunc, info = env.step(torch.zeros(2, env.action_spec.size))
    before = _clone((obs, trunc, info))
    rew.fill_(123.0)
    term.fill_(True)
    _assert_equal((obs, trunc, info), before)
    assert not env.step(torch.zeros(2, env.action_spec.size))[2].any()


def test_state_views_follow_a_loaded_state():
    env = make("quadruped", 2, seed=1)
    env.reset()
    rng = np.random.default_rng(1)
    env.step(_actions(env, rng))
    state = env.state_dict()
    qpos = env.engine.get("qpos").copy()
    for _ in range(3):
        env.step(_actions(env, rng))
    assert not np.array_equal(env.engine.get("qpos"), qpos)
    env.load_state_dict(state)
    np.testing.assert_array_equal(env.engine.get("qpos"), qpos)


def test_same_seed_same_outputs_bit_for_bit():
    def run():
        env = make("quadruped", 4, seed=5, max_episode_steps=6)
        rng = np.random.default_rng(2)
        outs = [env.reset()]
        for _ in range(15):
            outs.append(env.step(_actions(env, rng)))
        return outs

    _assert_equal(run(), run())


def test_the_step_memo_never_outlives_its_step():
    # without noise the observation is a function of the state: after set_state it must
    # describe the new state, not the one the last step memoized
    quiet = SimToRealConfig()
    env = make("quadruped", 2, seed=0, s2r=quiet)
    ref = make("quadruped", 2, seed=0, s2r=quiet)
    env.reset()
    ref.reset()
    rng = np.random.default_rng(3)
    env.step(_actions(env, rng))
    assert env._memo is None
    s = ref.get_state()
    env.last_action[...] = 0.0  # ref has taken no action
    env.set_state(s["qpos"], s["qvel"])
    ref.set_state(s["qpos"], s["qvel"])
    np.testing.assert_array_equal(env._obs["critic"].numpy(), ref._obs["critic"].numpy())


def test_a_diverged_env_ends_with_zero_reward_and_the_others_go_on():
    env = make("halfcheetah", 3, seed=0)
    env.reset()
    task_reward = env._task_reward

    def diverging(pre, actions):  # a NaN reward alone, the state sane
        reward, terminated, extras = task_reward(pre, actions)
        reward[1] = np.nan
        return reward, terminated, extras

    env._task_reward = diverging
    obs, rew, term, trunc, info = env.step(torch.zeros(3, env.action_spec.size))
    assert info["unstable"].tolist() == [False, True, False]
    assert term.tolist() == [False, True, False]
    assert rew[1].item() == 0.0 and torch.isfinite(rew).all()
    assert info["episode"]["done"].tolist() == [False, True, False]
    assert torch.isfinite(obs["policy"]).all()


@pytest.mark.parametrize("task", ["halfcheetah", "ant", "quadruped"])
def test_a_diverged_simulation_ends_its_episode_with_its_last_sane_observation(task):
    """MuJoCo's auto-reset would put a diverged simulation back to the model's default
    pose mid-episode, silently (the episode went on, unflagged, before 2026-12-07).
    Now it ends: reward 0, terminated, unstable; its final observation is the one
    before the step and its per-env info terms are 0 (no 1e30 or NaN leaves the env);
    the other envs step exactly as a twin that never saw it (ant: the per-env MjData
    engine, the others: mujoco.batch)."""
    nominal = SimToRealConfig()
    env, twin = make(task, 3, seed=0, s2r=nominal), make(task, 3, seed=0, s2r=nominal)
    rng = np.random.default_rng(1)
    acts = [_actions(env, rng) for _ in range(3)]
    env.reset(seed=0)
    twin.reset(seed=0)
    for a in acts[:2]:
        before, *_ = env.step(a)
        twin.step(a)
    qvel = env.engine.get("qvel").copy()
    qvel[1] = 1e30
    env.engine.set("qvel", qvel, np.arange(3))
    obs, rew, term, trunc, info = env.step(acts[2])
    tobs, trew, tterm, _, tinfo = twin.step(acts[2])
    assert info["unstable"].tolist() == [False, True, False]
    assert term.tolist() == [False, True, False] and not trunc.any()
    assert rew[1].item() == 0.0
    assert int(info["episode"]["length"][1]) == 3 and int(env.episode_length[1]) == 0
    for k, v in info["final_obs"].items():
        assert torch.equal(v[1], before[k][1])  # the last sane observation
        assert torch.isfinite(v).all() and torch.isfinite(obs[k]).all()
    terms = [k for k, v in info.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert terms  # every task reports per-env terms
    for k in terms:
        assert torch.isfinite(info[k]).all() and info[k][1].item() == 0.0, k
    keep = [0, 2]
    assert torch.equal(rew[keep], trew[keep]) and torch.equal(term[keep], tterm[keep])
    for k in obs:
        assert torch.equal(obs[k][keep], tobs[k][keep])
    for k in terms:
        assert torch.equal(info[k][keep], tinfo[k][keep]), k


def test_bad_actions_reset_only_their_env():
    env = make("halfcheetah", 2, seed=0, nan_action="reset")
    env.reset()
    a = torch.zeros(2, env.action_spec.size)
    a[0, 2] = float("inf")
    _, rew, term, _, info = env.step(a)
    assert term.tolist() == [True, False] and info["unstable"].tolist() == [True, False]
    assert rew[0].item() == 0.0
    np.testing.assert_array_equal(env.last_action[0], 0.0)


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return type(x)(_clone(v) for v in x)
    return x


def _assert_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.is_floating_point():
            a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _assert_equal(u, v)
    else:
        assert a == b


def test_reset_merge_follows_the_env_axis_of_non_flat_groups():
    """An ended episode's fresh observation replaces only that env's slice of every
    group, an image-like [N, H, W] group with H == N included."""
    env = make("cartpole", 3, seed=0)
    plain = env._observe

    def observe(reset_ids):
        out = plain(reset_ids)
        fresh = 1.0 if reset_ids is not None else 0.0
        out["grid"] = torch.full((env.num_envs, env.num_envs, 2), fresh)
        return out

    env._observe = observe
    env.reset()
    env.episode_length[1] = env.max_episode_steps - 1  # env 1 times out at this step
    obs, _, _, truncated, _ = env.step(torch.zeros(3, env.action_spec.size))
    env.close()
    assert truncated.tolist() == [False, True, False]
    assert obs["grid"][1].eq(1.0).all()
    assert obs["grid"][0].eq(0.0).all() and obs["grid"][2].eq(0.0).all()
