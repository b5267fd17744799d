"""Advantage estimators and running normalizers against plain-Python references."""

import math
import pickle

import numpy as np
import pytest
import torch

from training.core import (
    RunningMeanStd,
    ValueNormalizer,
    anchor_state_groups,
    dr_grpo,
    dynamic_sampling_mask,
    gae,
    gigpo_advantages,
    group_relative,
    prune_advantages,
    rloo,
    variance_curriculum_weights,
    zero_variance_fraction,
)


def close(actual: torch.Tensor, expected, tol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol
    )


def reference_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """One env at a time, one step at a time, in plain Python floats."""
    T, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for step in reversed(range(T)):
            bootstrap = 0.0 if terminated[step][n] else gamma * next_values[step][n]
            delta = rewards[step][n] + bootstrap - values[step][n]
            running = delta + (0.0 if dones[step][n] else gamma * lam * running)
            adv[step][n] = running
    return adv


def test_gae_matches_reference_loop_with_terminations_and_truncations():
    gen = torch.Generator().manual_seed(3)
    T, N = 9, 6
    rewards = torch.randn(T, N, generator=gen, dtype=torch.float64)
    values = torch.randn(T, N, generator=gen, dtype=torch.float64)
    next_values = torch.randn(T, N, generator=gen, dtype=torch.float64)
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    terminated[2, 0] = terminated[6, 0] = terminated[4, 3] = terminated[8, 5] = True
    truncated[5, 1] = truncated[0, 2] = truncated[4, 4] = truncated[7, 3] = True
    dones = terminated | truncated
    adv, ret = gae(rewards, values, next_values, terminated, dones, gamma=0.97, lam=0.9)
    expected = reference_gae(
        rewards.tolist(),
        values.tolist(),
        next_values.tolist(),
        terminated.tolist(),
        dones.tolist(),
        0.97,
        0.9,
    )
    close(adv, expected, 1e-12)
    close(ret, torch.tensor(expected, dtype=torch.float64) + values, 1e-12)


def test_truncation_bootstraps_and_termination_does_not():
    gamma, lam = 0.9, 0.95
    rewards = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5], [0.5]], dtype=torch.float64)
    next_values = torch.tensor([[0.5], [2.0]], dtype=torch.float64)  # 2.0: true last obs
    end = torch.tensor([[False], [True]])
    no = torch.zeros(2, 1, dtype=torch.bool)
    # delta_1 = 1 + 0.9 * 2.0 - 0.5 = 2.3 ; delta_0 = 1 + 0.9 * 0.5 - 0.5 = 0.95
    truncated_adv, _ = gae(rewards, values, next_values, no, end, gamma, lam)
    close(truncated_adv, [[0.95 + 0.9 * 0.95 * 2.3], [2.3]], 1e-12)
    # terminated: delta_1 = 1 - 0.5 = 0.5
    terminated_adv, terminated_ret = gae(rewards, values, next_values, end, end, gamma, lam)
    close(terminated_adv, [[0.95 + 0.9 * 0.95 * 0.5], [0.5]], 1e-12)
    close(terminated_ret, [[0.95 + 0.855 * 0.5 + 0.5], [1.0]], 1e-12)
    # an episode ending at t=0 cuts the chain: A_0 = delta_0
    cut = torch.tensor([[True], [False]])
    cut_adv, _ = gae(rewards, values, next_values, no, cut, gamma, lam)
    close(cut_adv, [[0.95], [1 + 0.9 * 2.0 - 0.5]], 1e-12)


def test_gae_rejects_bad_input():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="next_values"):
        gae(x, x, torch.zeros(3, 3), x.bool(), x.bool(), 0.99, 0.95)
    with pytest.raises(ValueError, match="must also be done"):
        gae(x, x, x, torch.ones(3, 2, dtype=torch.bool), x.bool(), 0.99, 0.95)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, x.bool(), x.bool(), 1.5, 0.95)


GROUPS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)


def test_group_relative_uses_unbiased_std():
    # group 0: mean 0.5, std sqrt((4 * 0.25) / 3); group 1: mean 0.75, std sqrt(0.75 / 3) = 0.5
    s0 = math.sqrt(1.0 / 3.0)
    expected = [[0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0], [0.5, 0.5, 0.5, -1.5]]
    close(group_relative(GROUPS, eps=0.0), expected, 1e-12)
    close(group_relative(GROUPS), expected, 1e-5)


def test_group_estimators_with_flat_rewards_and_ids():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([5, 5, 7, 7, 7, 7, 5, 5])
    s0 = math.sqrt(1.0 / 3.0)
    close(
        group_relative(rewards, 0.0, group_ids=ids),
        [0.5 / s0, -0.5 / s0, 0.5, 0.5, 0.5, -1.5, -0.5 / s0, 0.5 / s0],
        1e-12,
    )
    close(dr_grpo(rewards, group_ids=ids), [0.5, -0.5, 0.25, 0.25, 0.25, -0.75, -0.5, 0.5])
    # uneven groups: [3, 1, 2] and a singleton [4]
    uneven = torch.tensor([3.0, 1.0, 4.0, 2.0], dtype=torch.float64)
    uneven_ids = torch.tensor([0, 0, 1, 0])
    close(group_relative(uneven, 0.0, group_ids=uneven_ids), [1.0, -1.0, 0.0, 0.0], 1e-12)
    close(rloo(uneven[[0, 1, 3]], group_ids=uneven_ids[[0, 1, 3]]), [1.5, -1.5, 0.0])


def test_dr_grpo_and_rloo_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    close(dr_grpo(r), [[-1.0, 0.0, 1.0], [-2.0, -2.0, 4.0]])
    # leave-one-out baselines: (2+3)/2, (1+3)/2, (1+2)/2 and 3, 3, 0
    close(rloo(r), [[-1.5, 0.0, 1.5], [-3.0, -3.0, 6.0]])
    with pytest.raises(ValueError, match="at least 2"):
        rloo(torch.tensor([[1.0], [2.0]]))
    with pytest.raises(ValueError, match="num_groups, group_size"):
        dr_grpo(torch.tensor([1.0, 2.0]))


def test_dynamic_sampling():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert dynamic_sampling_mask(r).tolist() == [False, True, False]
    assert zero_variance_fraction(r) == pytest.approx(2 / 3)
    # the dropped groups are exactly those whose group-relative advantage is all zero
    # ([0, 1, 0]: deviations -1/3, 2/3, -1/3 over an unbiased std of sqrt(1/3))
    spread = (4 / 3) / math.sqrt(1 / 3)
    assert group_relative(r, eps=0.0).abs().sum(dim=1).tolist() == pytest.approx([0, spread, 0])


def test_variance_curriculum_weights():
    probs = variance_curriculum_weights(torch.tensor([0.0, 0.25, 0.0625]), 1.0, 0.1)
    e = [math.exp(0.0), math.exp(1.0), math.exp(0.25)]  # variances / max variance
    expected = [0.9 * v / sum(e) + 0.1 / 3 for v in e]
    close(probs, expected)
    assert probs.sum().item() == pytest.approx(1.0)
    # a reward history with gaps; the unseen prompt is treated as the most uncertain
    history = torch.tensor([[1.0, 0.0, float("nan")], [1.0, 1.0, 1.0], [float("nan")] * 3])
    from_history = variance_curriculum_weights(history, temperature=0.5, floor=0.2)
    e = [math.exp(1.0 / 0.5), math.exp(0.0), math.exp(1.0 / 0.5)]
    close(from_history, [0.8 * v / sum(e) + 0.2 / 3 for v in e])
    # all-zero variance: uniform; every probability stays above the floor
    close(variance_curriculum_weights(torch.zeros(4), 0.01, 0.1), [0.25] * 4)
    assert (variance_curriculum_weights(torch.tensor([0.0, 100.0]), 1e-3, 0.1) >= 0.05).all()
    with pytest.raises(ValueError, match="temperature"):
        variance_curriculum_weights(torch.ones(2), 0.0)


def test_prune_advantages_cppo():
    adv = torch.tensor([0.05, -0.2, 0.1, -0.01])
    assert prune_advantages(adv, 0.1).tolist() == [False, True, True, False]
    assert prune_advantages(adv, 0.0).all()


def test_anchor_state_groups_and_gigpo():
    states = np.array([[0.0, 1.0], [0.1, 0.2], [0.0, 1.0], [0.1000000001, 0.2], [-0.0, 1.0]])
    ids = anchor_state_groups(states, decimals=6)
    assert ids[0] == ids[2] == ids[4] and ids[1] == ids[3] and ids[0] != ids[1]
    assert sorted(set(ids.tolist())) == [0, 1]
    exact = anchor_state_groups(torch.tensor(states), decimals=None)
    assert exact[1] != exact[3]

    episode_adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    step_returns = torch.tensor([2.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 2])  # steps 2 and 3 have no peer
    close(
        gigpo_advantages(episode_adv, step_returns, groups, 0.5, normalize=False),
        [1.5, 0.5, -1.0, -1.0],
    )
    # normalized: group [2, 0] has mean 1 and unbiased std sqrt(2)
    half = 0.5 / math.sqrt(2.0)
    close(
        gigpo_advantages(episode_adv, step_returns, groups, 0.5, eps=0.0),
        [1 + half, 1 - half, -1.0, -1.0],
    )


def test_running_mean_std_matches_numpy_over_concatenated_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) for n in (1, 7, 64, 5)]
    rms = RunningMeanStd(shape=3, dtype=torch.float64)
    for b in batches:
        rms.update(torch.from_numpy(b))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), everything.var(0), rtol=1e-12)
    assert int(rms.count) == len(everything)

    x = torch.from_numpy(rng.normal(size=(4, 3)))
    expected = (x.numpy() - everything.mean(0)) / np.sqrt(everything.var(0) + 1e-8)
    np.testing.assert_allclose(rms(x).numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(rms.denormalize(rms(x)).numpy(), x.numpy(), rtol=1e-10)

    clipped = RunningMeanStd(shape=(3,), clip=0.5, dtype=torch.float64)
    clipped.load_state_dict(rms.state_dict())
    assert clipped(x).abs().max() <= 0.5
    # leading dims are flattened: [T, N, 3] counts T * N samples
    rms.update(torch.zeros(2, 5, 3, dtype=torch.float64))
    assert int(rms.count) == len(everything) + 10
    with pytest.raises(ValueError, match="ending in shape"):
        rms.update(torch.zeros(4, 2))


def test_running_mean_std_is_a_plain_tensor_graph_and_pickles():
    rms = RunningMeanStd(shape=2, clip=5.0)
    rms.update(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    graph = torch.fx.symbolic_trace(rms)
    x = torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(graph(x), rms(x))
    assert {str(n.op) for n in graph.graph.nodes} <= {
        "placeholder",
        "get_attr",
        "call_function",
        "call_method",
        "output",
    }
    again = pickle.loads(pickle.dumps(rms))
    torch.testing.assert_close(again(x), rms(x))
    # float32 stats merged in float64 stay accurate; the count survives a dtype cast
    rms.double()
    assert rms.count.dtype == torch.int64 and int(rms.count) == 2


def test_value_normalizer_round_trip():
    vn = ValueNormalizer()
    returns = torch.tensor([10.0, 20.0, 30.0, 40.0])
    vn.update(returns)
    close(vn.mean, 25.0)
    close(vn.var, 125.0)
    normed = vn.normalize(returns)
    close(normed, (returns - 25.0) / math.sqrt(125.0 + 1e-8))
    close(vn.denormalize(normed), returns, 1e-5)
