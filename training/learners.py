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
from training.algorithms.fpo import FPO
from training.algorithms.ppo import PPO
from training.algorithms.reinflow import ReinFlow
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
    """The config field naming a pretrained run to start from (None: always from scratch)."""
    init_required: bool = True
    """Whether that field must name a run (False: empty starts from scratch)."""


def _obs_sizes(env) -> dict[str, int]:
    return {g: s.size for g, s in env.observation_spec.groups.items()}


def _build_ppo(cfg: Any, policy: Any, env, device: torch.device, world: int) -> PPO:
    ppo = cfg.ppo
    if ppo.schedule in ("linear", "cosine") and ppo.total_updates is None:
        # a decaying rate spans the run's step budget, which a resume may extend
        per_update = env.num_envs * ppo.num_steps * world
        iterations = max(1, math.ceil(cfg.run.total_steps / per_update))
        adversary = getattr(cfg, "adversary", None)
        if adversary is not None and adversary.enabled:
            # RARL: the protagonist updates in its phases only, iterations 0..n-1 of a cycle
            full, rest = divmod(iterations, adversary.cycle)
            total = full * adversary.protagonist_iterations + min(
                rest, adversary.protagonist_iterations
            )
        else:
            total = iterations
        total = max(1, total)
        ppo = dataclasses.replace(ppo, total_updates=max(total, ppo.warmup_updates + 1))
    return PPO(
        policy,
        ppo,
        num_envs=env.num_envs,
        obs_sizes=_obs_sizes(env),
        action_size=env.action_spec.size,
        device=device,
    )


def _chunk_learner(cls: type, section: str) -> Callable[..., OnPolicyAlgorithm]:
    """The builder of a chunked generative learner (DPPO, ReinFlow, FPO): same arguments."""

    def build(cfg: Any, policy: Any, env, device: torch.device, world: int) -> OnPolicyAlgorithm:
        return cls(
            policy,
            getattr(cfg, section),
            num_envs=env.num_envs,
            obs_sizes=_obs_sizes(env),
            device=device,
        )

    return build


LEARNERS: dict[str, OnPolicyLearner] = {
    "ppo": OnPolicyLearner("ppo", CHECKPOINT_KINDS["ppo"], "ppo", _build_ppo),
    "dppo": OnPolicyLearner(
        "dppo", CHECKPOINT_KINDS["dppo"], "dppo", _chunk_learner(DPPO, "dppo"), init_field="init"
    ),
    "reinflow": OnPolicyLearner(
        "reinflow",
        CHECKPOINT_KINDS["reinflow"],
        "reinflow",
        _chunk_learner(ReinFlow, "reinflow"),
        init_field="init",
    ),
    "fpo": OnPolicyLearner(
        "fpo",
        CHECKPOINT_KINDS["fpo"],
        "fpo",
        _chunk_learner(FPO, "fpo"),
        init_field="init",
        init_required=False,
    ),
}
