"""Advantage estimators: GAE over time and envs, and group baselines over samples.

Everything here is vectorized over envs and groups (the only Python loop is GAE's walk
back through time) and runs without gradient: advantages are targets, not functions of
the parameters being trained.
"""

from __future__ import annotations

import numpy as np
import torch


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) over a rollout shaped [T, N] (time first); returns (advantages, returns).

    next_values[t] is V(s_{t+1}); for an episode that ended at t the runner passes the
    value of the true final observation, not of the reset one. ``dones`` (terminated or
    truncated) cuts the lambda chain; ``terminated`` alone zeroes the bootstrap, so a
    time-out still bootstraps from its last observation and a real termination does not:

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lam * (1 - dones_t) * (1 - terminated_t) * A_{t+1}

    ``terminated`` may be a float probability in [0, 1] (constraints as terminations,
    training.constraints): the episode goes on, but everything after step t counts
    (1 - terminated_t) times, in the bootstrap and in the lambda chain alike. Boolean
    terminations (or their 0/1 floats) give the same numbers: the extra factor is 1
    wherever the chain is not cut.
    """
    shape = rewards.shape
    for name, x in (
        ("values", values),
        ("next_values", next_values),
        ("terminated", terminated),
        ("dones", dones),
    ):
        if x.shape != shape:
            raise ValueError(
                f"gae: {name} has shape {tuple(x.shape)} but rewards has {tuple(shape)}"
            )
    if rewards.dim() == 0 or shape[0] == 0:
        raise ValueError(f"gae: need at least one time step, got shape {tuple(shape)}")
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    done = dones.to(torch.bool)
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    rewards, values, next_values = (x.to(dtype) for x in (rewards, values, next_values))
    carry = gamma * lam * (~done).to(dtype)
    if terminated.is_floating_point():
        # a probability of 1 that is not done is a hard constraint: the episode goes on
        # in the simulator, but nothing after it counts
        if bool(((terminated < 0) | (terminated > 1)).any()):
            raise ValueError("gae: termination probabilities must lie in [0, 1]")
        not_term = 1.0 - terminated.to(dtype)
        carry = carry * not_term
    else:
        term = terminated.to(torch.bool)
        if bool((term & ~done).any()):
            raise ValueError(
                "gae: a terminated step must also be done (dones = terminated | truncated)"
            )
        not_term = (~term).to(dtype)
    deltas = rewards + gamma * not_term * next_values - values
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def _grouped(
    rewards: torch.Tensor, group_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten rewards and give each its group index; returns (flat, index, counts)."""
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if group_ids is None:
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards must be [num_groups, group_size] (or flat with group_ids), "
                f"got shape {tuple(rewards.shape)}"
            )
        num_groups, size = rewards.shape
        index = torch.arange(num_groups, device=rewards.device).repeat_interleave(size)
        counts = torch.full((num_groups,), size, device=rewards.device)
        return rewards.reshape(-1), index, counts
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"with group_ids, rewards must be flat and shaped like group_ids; got rewards "
            f"{tuple(rewards.shape)}, group_ids {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be integers, got {group_ids.dtype}")
    _, index = torch.unique(group_ids, return_inverse=True)
    counts = torch.bincount(index)
    return rewards, index, counts


def _group_sum(flat: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=flat.dtype, device=flat.device).index_add_(0, index, flat)


def _centered(flat: torch.Tensor, index: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    mean = _group_sum(flat, index, counts.numel()) / counts.to(flat.dtype)
    return flat - mean[index]


@torch.no_grad()
def group_relative(
    rewards: torch.Tensor, eps: float = 1e-6, *, group_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """GRPO: (R - group mean) / (group std + eps), std unbiased (n - 1) as in TRL.

    rewards is [num_groups, group_size], or flat [N] with integer ``group_ids`` (groups
    may then differ in size). A group without spread (all rewards equal, or a single
    member) gets advantage 0, also when eps is 0.
    """
    flat, index, counts = _grouped(rewards, group_ids)
    centered = _centered(flat, index, counts)
    dof = (counts - 1).clamp_min(1).to(flat.dtype)
    std = torch.sqrt(_group_sum(centered.square(), index, counts.numel()) / dof)
    spread = std[index]
    # A group without spread (all equal, or a single member) carries no signal: 0, not 0/0.
    adv = torch.where(spread > 0, centered / (spread + eps), torch.zeros_like(centered))
    return adv.reshape(rewards.shape)


@torch.no_grad()
def dr_grpo(rewards: torch.Tensor, *, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Dr. GRPO: R - group mean; no std division, which would favour easy/hard groups."""
    flat, index, counts = _grouped(rewards, group_ids)
    return _centered(flat, index, counts).reshape(rewards.shape)


@torch.no_grad()
def rloo(rewards: torch.Tensor, *, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out: R - mean of the other members, a baseline independent of R itself."""
    flat, index, counts = _grouped(rewards, group_ids)
    if bool((counts < 2).any()):
        raise ValueError("rloo needs at least 2 members in every group (got a group of 1)")
    others = (_group_sum(flat, index, counts.numel())[index] - flat) / (counts[index] - 1).to(
        flat.dtype
    )
    return (flat - others).reshape(rewards.shape)


@torch.no_grad()
def dynamic_sampling_mask(group_rewards: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """DAPO: True for groups worth training on, False where all rewards are equal.

    A group with identical rewards has zero group-relative advantage everywhere and only
    dilutes the batch; the runner drops it and samples more to refill.
    """
    if group_rewards.dim() != 2:
        raise ValueError(
            f"group_rewards must be [num_groups, group_size], got {tuple(group_rewards.shape)}"
        )
    spread = group_rewards.amax(dim=1) - group_rewards.amin(dim=1)
    return spread > atol


def zero_variance_fraction(group_rewards: torch.Tensor, atol: float = 0.0) -> float:
    """Share of groups that dynamic sampling would drop (a health figure for logs)."""
    keep = dynamic_sampling_mask(group_rewards, atol)
    return float(1.0 - keep.to(torch.float32).mean()) if keep.numel() else 0.0


@torch.no_grad()
def variance_curriculum_weights(
    scores: torch.Tensor, temperature: float = 1.0, floor: float = 0.1
) -> torch.Tensor:
    """VCRL-style sampling probabilities that favour prompts/start states with high reward variance.

    scores: per-prompt variance [P], or rewards [P, K] (a group or a history; NaN marks a
    missing entry) whose population variance is taken per row. A row with fewer than two
    observed rewards is unexplored and gets the highest variance seen (optimism).

        v_i = var_i / max_j var_j            (0 for all when every variance is 0)
        p_i = (1 - floor) * softmax(v / temperature)_i + floor / P

    so every probability is at least floor / P > 0 and the scale of rewards does not
    matter; lower temperature concentrates on the most uncertain prompts.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}")
    scores = scores.to(torch.float64)
    if scores.dim() == 2:
        observed = ~torch.isnan(scores)
        n = observed.sum(dim=1)
        filled = torch.where(observed, scores, torch.zeros_like(scores))
        mean = filled.sum(dim=1, keepdim=True) / n.clamp_min(1).unsqueeze(1)
        sq = torch.where(observed, (scores - mean).square(), torch.zeros_like(scores))
        var = sq.sum(dim=1) / n.clamp_min(1)
        seen = n >= 2
        top = var[seen].max() if bool(seen.any()) else var.new_zeros(())
        var = torch.where(seen, var, top)
    elif scores.dim() == 1:
        var = scores
    else:
        raise ValueError(f"scores must be [P] or [P, K], got shape {tuple(scores.shape)}")
    if var.numel() == 0:
        raise ValueError("scores is empty")
    if not bool(torch.isfinite(var).all()) or bool((var < 0).any()):
        raise ValueError("variances must be finite and non-negative")
    top = var.max()
    v = var / top if top > 0 else torch.zeros_like(var)
    probs = (1.0 - floor) * torch.softmax(v / temperature, dim=0) + floor / var.numel()
    return probs.to(torch.float32)


def prune_advantages(advantages: torch.Tensor, threshold: float) -> torch.Tensor:
    """CPPO: mask that keeps samples with |A| >= threshold; near-zero ones teach little."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    return advantages.detach().abs() >= threshold


def anchor_state_groups(
    states: torch.Tensor | np.ndarray, decimals: int | None = 6
) -> torch.Tensor:
    """GiGPO anchor groups: one integer id per row, equal for rows with equal states.

    States are compared after rounding to ``decimals`` (None: exact), so float noise in
    a simulator that resets many envs to the same state does not split a group. Ids are
    dense (0..G-1), in the lexicographic order of the states. To keep steps of different
    episode groups apart, append the episode group id to the state.
    """
    x = torch.as_tensor(states)
    if x.dim() != 2:
        raise ValueError(f"states must be [N, D], got shape {tuple(x.shape)}")
    if x.is_floating_point():
        if not bool(torch.isfinite(x).all()):
            raise ValueError("states must be finite to be grouped")
        if decimals is not None:
            x = torch.round(x, decimals=decimals)
        x = x + 0.0  # -0.0 and 0.0 are the same state
    _, ids = torch.unique(x, dim=0, return_inverse=True)
    return ids


@torch.no_grad()
def gigpo_advantages(
    episode_advantages: torch.Tensor,
    step_returns: torch.Tensor,
    state_group_ids: torch.Tensor,
    weight: float = 1.0,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO: episode-level group advantage + weight * step-level group advantage.

    The step-level part compares steps taken from the same anchor state (same id) by
    their rewards or discounted returns: group_relative when ``normalize`` else
    dr_grpo. A state visited once has no peer and adds 0. All inputs share one shape.
    """
    shape = episode_advantages.shape
    if step_returns.shape != shape or state_group_ids.shape != shape:
        raise ValueError(
            f"episode_advantages {tuple(shape)}, step_returns {tuple(step_returns.shape)} "
            f"and state_group_ids {tuple(state_group_ids.shape)} must have the same shape"
        )
    flat_r = step_returns.reshape(-1)
    flat_ids = state_group_ids.reshape(-1)
    if normalize:
        step_adv = group_relative(flat_r, eps, group_ids=flat_ids)
    else:
        step_adv = dr_grpo(flat_r, group_ids=flat_ids)
    return episode_advantages + weight * step_adv.reshape(shape)
