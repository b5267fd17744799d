"""The registry of on-policy learners: one entry per algorithm the runner can drive.

An entry names the checkpoint kind its runs write (and so the policy family it trains),
the config section of its algorithm, and how to build the algorithm for a policy and an
env. The algorithm itself speaks the runner's protocol
(:class:`training.algorithms.base.OnPolicyAlgorithm`). A
new on-policy learner is an algorithm file, a checkpoint kind and one entry here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from training.algorithms.base import OnPolicyAlgorithm
from training.algorithms.dppo import DPPO
from training.algorithms.ppo import PPO
from training.policy_kinds import CHECKPOINT_KINDS, CheckpointKind

__all__ = ["LEARNERS", "OnPolicyLearner"]


@dataclass(frozen=True)
class OnPolicyLearner:
    name: str
    kind: CheckpointKind
    """The checkpoints its runs write (and so the policy family it trains)."""
    section: str
    """The train config's section with the algorithm's settings (num_steps among them)."""
    build: Callable[[Any, torch.nn.Module, Any, torch.device, int], OnPolicyAlgorithm]
    """(train config, policy, env, device, world size) -> the algorithm."""
    init_field: str | None = None
    """The config field naming a pretrained run to start from (None: from scratch)."""


def _obs_sizes(env) -> dict[str, int]:
    return {g: s.size for g, s in env.observation_spec.groups.items()}


def _build_ppo(cfg: Any, policy: Any, env, device: torch.device, world: int) -> PPO:
    ppo = cfg.ppo
    if ppo.schedule in ("linear", "cosine") and ppo.total_updates is None:
        # a decaying rate spans the run's step budget, which a resume may extend
        per_update = env.num_envs * ppo.num_steps * world
        total = max(1, math.ceil(cfg.run.total_steps / per_update))
        ppo = dataclasses.replace(ppo, total_updates=max(total, ppo.warmup_updates + 1))
    return PPO(
        policy,
        ppo,
        num_envs=env.num_envs,
        obs_sizes=_obs_sizes(env),
        action_size=env.action_spec.size,
        device=device,
    )


def _build_dppo(cfg: Any, policy: Any, env, device: torch.device, world: int) -> DPPO:
    return DPPO(policy, cfg.dppo, num_envs=env.num_envs, obs_sizes=_obs_sizes(env), device=device)


LEARNERS: dict[str, OnPolicyLearner] = {
    "ppo": OnPolicyLearner("ppo", CHECKPOINT_KINDS["ppo"], "ppo", _build_ppo),
    "dppo": OnPolicyLearner(
        "dppo", CHECKPOINT_KINDS["dppo"], "dppo", _build_dppo, init_field="init"
    ),
}
