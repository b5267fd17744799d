"""What every on-policy algorithm shares: the runner's protocol, the config fields of a
clipped policy-gradient update over rollouts (rollout length, epochs, minibatches,
discounting, value loss, early stop) and the state beside the policy (optimizer, value
statistics, shuffling, the guard, counters). A learner's own config subclasses
:class:`OnPolicyConfig`, redeclaring a field to change its default; the learner itself
subclasses :class:`OnPolicyLearnerState`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from training.config import FieldChecks
from training.core import POLICY_LOSS_PRESETS, UpdateGuard, ValueNormalizer, value_loss
from training.storage import bootstrap_values

__all__ = ["OnPolicyAlgorithm", "OnPolicyConfig", "OnPolicyLearnerState"]


class OnPolicyAlgorithm(Protocol):
    """What the on-policy runner asks of an algorithm (rsl_rl's protocol)."""

    policy: torch.nn.Module

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Actions for this env step; stores what the update needs."""

    def process_env_step(
        self,
        next_obs: Mapping[str, torch.Tensor],
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        info: Mapping[str, Any],
    ) -> None:
        """Record the env's answer to the last act."""

    def update(self) -> dict[str, float]:
        """Learn from the full rollout; statistics for the log."""

    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy's weights needed to continue exactly."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass
class OnPolicyConfig:
    """Rollout, epochs and minibatches, discounting, clipping, value loss, early stop."""

    num_steps: int = 24
    """Env steps per env per rollout."""
    num_epochs: int = 5
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per pass (recurrent policies split envs, so at most num_envs)."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda."""
    clip: float = 0.2
    """Ratio clip range; replaces the loss preset's eps_low (and eps_high unless stated)."""
    value_coef: float = 1.0
    """Weight of the value loss."""
    value_clip: float | None = 0.2
    """Clip range of the clipped value loss; None: plain squared error."""
    value_normalization: bool = False
    """The critic regresses normalized returns (running statistics)."""
    normalize_advantages: bool = True
    """Normalize advantages over the rollout."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to it (None: no clipping)."""
    target_kl: float | None = None
    """Stop an update's epoch loop once a minibatch's KL exceeds it (None: never)."""
    loss: str = "ppo"
    """Policy-loss preset of the optimizer core (training.core.POLICY_LOSS_PRESETS)."""
    seed: int = 0
    """Seed of the minibatch shuffling."""

    def check_common(self) -> FieldChecks:
        """Validate the shared fields; the checker, for the subclass's own."""
        check = FieldChecks(self)
        check.ints("num_steps", "num_epochs", "num_minibatches")
        check.finite("gamma", "lam", "clip", "value_coef")
        check.within(0.0, 1.0, "gamma", "lam")
        if not 0.0 < self.clip < 1.0:
            raise check.fail("clip", "must be in (0, 1)")
        check.nonnegative("value_coef")
        check.positive_or_none("value_clip", "max_grad_norm", "target_kl")
        check.one_of("loss", POLICY_LOSS_PRESETS)
        return check


class OnPolicyLearnerState:
    """The state every on-policy algorithm keeps beside its policy, and its critic chores.

    A subclass sets, in its ``__init__``: ``cfg`` (an OnPolicyConfig), ``policy`` (with a
    ``value(obs)`` critic), ``optimizer`` and ``params``, then calls
    :meth:`_init_learner_state`; it saves and restores the shared part with
    :meth:`_learner_state` / :meth:`_load_learner_state`.
    """

    cfg: OnPolicyConfig
    policy: Any
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    device: torch.device

    def _init_learner_state(self) -> None:
        self.value_normalizer = (
            ValueNormalizer().to(self.device) if self.cfg.value_normalization else None
        )
        self.generator = torch.Generator().manual_seed(self.cfg.seed)
        self.guard = UpdateGuard(self.optimizer, self.params, self.cfg.max_grad_norm)
        self.num_updates = 0

    # ------------------------------------------------------------------ critic
    def _values(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """V(obs) in return units (denormalized when the critic predicts normalized ones)."""
        values = self.policy.value(obs)
        return values if self.value_normalizer is None else self.value_normalizer.denormalize(values)

    def _bootstrap(
        self, next_obs: Mapping[str, torch.Tensor], info: Mapping[str, Any] | None
    ) -> torch.Tensor:
        denormalize = None if self.value_normalizer is None else self.value_normalizer.denormalize
        return bootstrap_values(self.policy.value, next_obs, info, denormalize)

    def _ends(
        self, terminated: torch.Tensor, truncated: torch.Tensor, info: Mapping[str, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(termination probability, dones) of an env step for the rollout storage.

        The probability is 1 where the episode terminated, else the soft termination
        probability the runner put in ``info["termination_prob"]`` (constraints as
        terminations, training.constraints), else 0; only real ends are ``dones``.
        """
        hard = terminated.to(torch.bool)
        prob = hard.to(torch.float32)
        soft = None if info is None else info.get("termination_prob")
        if soft is not None:
            prob = torch.maximum(prob, soft.to(prob))
        return prob, hard | truncated.to(torch.bool)

    def _value_loss(
        self, predicted: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor
    ) -> torch.Tensor:
        """The core's value loss, on normalized targets when value normalization is on."""
        if self.value_normalizer is not None:
            returns = self.value_normalizer.normalize(returns)
            old_values = self.value_normalizer.normalize(old_values)
        return value_loss(predicted, old_values, returns, clip_eps=self.cfg.value_clip)

    # ------------------------------------------------------------------ checkpoints
    def _learner_state(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "value_normalizer": None
            if self.value_normalizer is None
            else self.value_normalizer.state_dict(),
            "generator": self.generator.get_state(),
            "num_updates": self.num_updates,
            "guard": self.guard.state_dict(),
            "config": dataclasses.asdict(self.cfg),
        }

    def _load_learner_state(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.value_normalizer is not None:
            if state["value_normalizer"] is None:
                raise ValueError("checkpoint has no value normalizer; value_normalization is on")
            self.value_normalizer.load_state_dict(state["value_normalizer"])
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        # checkpoints before the shared guard: DPPO counted skipped steps, PPO rolled back
        legacy = {"nonfinite_steps": state.get("skipped_steps", 0)}
        self.guard.load_state_dict(state.get("guard", legacy))
