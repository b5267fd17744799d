"""What acts: torch modules behind one Policy protocol."""

from policies.base import POLICY_FAMILIES, ActionOutput, Evaluation, Policy, PolicyInfo
from policies.gaussian import (
    ActorCritic,
    ActorCriticConfig,
    GaussianInference,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
)

__all__ = [
    "POLICY_FAMILIES",
    "ActionOutput",
    "ActorCritic",
    "ActorCriticConfig",
    "Evaluation",
    "GaussianInference",
    "Policy",
    "PolicyInfo",
    "gaussian_entropy",
    "gaussian_kl",
    "gaussian_log_prob",
]
