"""The batched env refuses bad input with errors that say what was expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sim

ACT = 6  # halfcheetah


def _env(n=3, **kw):
    env = sim.make("halfcheetah", n, seed=0, **kw)
    env.reset()
    return env


def _acts(steps, n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=(steps, n, ACT))


def _same_state(a, b):
    sa, sb = a.get_state(), b.get_state()
    return all(np.array_equal(sa[k], sb[k]) for k in sa)


def test_wrong_action_shape():
    env = _env()
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        env.step(np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        env.step(np.zeros(ACT))
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        env.step(torch.zeros(2, ACT))


def test_integer_actions():
    env = _env()
    with pytest.raises(TypeError, match="floating"):
        env.step(np.zeros((3, ACT), dtype=np.int64))
    with pytest.raises(TypeError, match="floating"):
        env.step(torch.zeros(3, ACT, dtype=torch.int32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_actions_raise_and_leave_state_unchanged(bad):
    env, ref = _env(), _env()
    acts = _acts(4, 3)
    for t in range(2):
        env.step(acts[t])
        ref.step(acts[t])
    before = env.get_state()
    poisoned = acts[2].copy()
    poisoned[1, 3] = bad
    poisoned[2, 0] = bad
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        env.step(poisoned)
    after = env.get_state()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    np.testing.assert_array_equal(env.episode_length, ref.episode_length)
    # stepping on with finite actions equals a run that never saw the bad actions
    for t in range(2, 4):
        o, r, *_ = env.step(acts[t])
        ro, rr, *_ = ref.step(acts[t])
        assert torch.equal(o["policy"], ro["policy"]) and torch.equal(r, rr)
    assert _same_state(env, ref)


def test_nan_action_reset_terminates_only_the_bad_env():
    env, ref = _env(4, nan_action="reset"), _env(4, nan_action="reset")
    acts = _acts(6, 4)
    for t in range(2):
        env.step(acts[t])
        ref.step(acts[t])
    poisoned = acts[2].copy()
    poisoned[2, 1] = np.nan
    o, r, term, trunc, info = env.step(poisoned)
    ro, rr, rterm, *_ = ref.step(acts[2])
    assert term.tolist() == [False, False, True, False]
    assert bool(info["unstable"][2]) and float(r[2]) == 0.0
    assert int(info["episode"]["length"][2]) == 3
    assert int(env.episode_length[2]) == 0  # it already began a new episode
    keep = [0, 1, 3]
    for t in range(3, 6):
        assert torch.equal(o["policy"][keep], ro["policy"][keep])
        assert torch.equal(r[keep], rr[keep])
        o, r, term, *_ = env.step(acts[t])
        ro, rr, *_ = ref.step(acts[t])
        assert not term.any()
    sa, sb = env.get_state(), ref.get_state()
    for k in sa:
        np.testing.assert_array_equal(sa[k][keep], sb[k][keep])


def test_unknown_task_lists_known_and_suggests():
    with pytest.raises(ValueError) as e:
        sim.make("halfcheeta", 1)
    msg = str(e.value)
    assert "did you mean 'halfcheetah'" in msg
    assert "Known tasks" in msg and "halfcheetah" in msg


@pytest.mark.parametrize("n", [0, -1])
def test_num_envs_must_be_positive(n):
    with pytest.raises(ValueError, match="num_envs"):
        sim.make("halfcheetah", n)


def test_step_before_reset():
    env = sim.make("halfcheetah", 2, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((2, ACT)))


def test_unknown_s2r_field():
    with pytest.raises(ValueError, match="bogus"):
        sim.make("halfcheetah", 1, s2r={"bogus": 1})


def test_bad_nan_action_mode():
    with pytest.raises(ValueError, match="nan_action"):
        sim.make("halfcheetah", 1, nan_action="ignore")
