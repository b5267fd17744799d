"""The GRPO family as configurations of the shared optimizer core.

Nothing here computes a loss: ``loss_config`` turns the algorithm settings into a
core ``PolicyLossConfig`` (a preset plus overrides), ``advantages`` calls the core's
group estimators, and ``grpo_loss`` hands per-token tensors to ``policy_loss``.

| algo.loss | ratio    | clip (low/high) | aggregation             | KL (k3)  | advantage      |
| --------- | -------- | --------------- | ----------------------- | -------- | -------------- |
| grpo      | token    | 0.2 / 0.2       | seq_mean_token_mean     | 0.04     | group_relative |
| dapo      | token    | 0.2 / 0.28      | token_mean              | 0        | group_relative |
| dr_grpo   | token    | 0.2 / 0.2       | seq_mean_token_sum_norm | 0        | dr_grpo        |
| gspo      | sequence | 3e-4 / 4e-4     | seq_mean_token_mean     | 0        | group_relative |

Dr. GRPO divides each sequence's token sum by a constant; here it is the generation
limit (sampling.max_new_tokens) unless algo.norm_constant says otherwise.
"""

from __future__ import annotations

import torch

from training.core import (
    PolicyLossConfig,
    dr_grpo,
    get_loss_config,
    group_relative,
    policy_loss,
    rloo,
)
from training.grpo.config import AlgoConfig


def loss_config(algo: AlgoConfig, max_new_tokens: int) -> PolicyLossConfig:
    """The core loss config for ``algo``: its preset, with the fields the user set."""
    overrides: dict[str, object] = {
        "kl_estimator": algo.kl_estimator,
        "entropy_coef": algo.entropy_coef,
    }
    for name in ("eps_low", "eps_high", "aggregation", "kl_coef"):
        value = getattr(algo, name)
        if value is not None:
            overrides[name] = value
    cfg = get_loss_config(algo.loss, **overrides)
    if cfg.aggregation == "seq_mean_token_sum_norm":
        const = algo.norm_constant if algo.norm_constant is not None else float(max_new_tokens)
        cfg = get_loss_config(algo.loss, **overrides, norm_constant=const)
    elif algo.norm_constant is not None:
        cfg = get_loss_config(algo.loss, **overrides, norm_constant=algo.norm_constant)
    return cfg


@torch.no_grad()
def advantages(rewards: torch.Tensor, estimator: str, eps: float = 1e-4) -> torch.Tensor:
    """Per-sample advantages [P, G] from group rewards [P, G] (one row per prompt)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got {tuple(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite; invalid samples are handled before this")
    if estimator == "group_relative":
        return group_relative(rewards, eps=eps)
    if estimator == "dr_grpo":
        return dr_grpo(rewards)
    if estimator == "rloo":
        return rloo(rewards)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
    *,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one minibatch of completions: [N, T] token tensors, advantages [N]."""
    if advantages.dim() != 1 or advantages.shape[0] != logp.shape[0]:
        raise ValueError(
            f"advantages must be one value per completion ({logp.shape[0]},), got "
            f"{tuple(advantages.shape)}"
        )
    return policy_loss(
        logp,
        logp_old,
        advantages,
        cfg,
        mask=mask,
        logp_ref=logp_ref,
        entropy=entropy,
    )


__all__ = ["advantages", "grpo_loss", "loss_config"]
