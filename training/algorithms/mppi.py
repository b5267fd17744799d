"""MPPI planning in the latent space of a world model, seeded by its policy prior.

For every env at once: encode the observation, then for a few iterations sample action
sequences of ``horizon`` steps (some from the policy prior rolled through the dynamics,
the rest from a Gaussian around the current plan), score each by the model's discounted
reward plus the Q ensemble's value at the end, and refit the Gaussian to the best
(elite) sequences weighted by exp(temperature x score). A predicted termination masks
everything after it: the rewards and the bootstrap of a sequence are weighted by the
probability that the episode is still running. The plan's mean is kept per env and
shifted by one step to warm-start the next call; an env that started a new episode
starts from scratch.

Planning runs the model in eval mode and draws its noise from its own generator (saved
with the run), so planning never changes the training's random stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policies.world_model import WorldModel
from training.config import FieldChecks
from training.core import two_hot_decode

__all__ = ["MPPIPlanner", "PlannerConfig"]


@dataclass
class PlannerConfig:
    """MPPI over the learned latent model (the horizon is tdmpc.horizon)."""

    act: bool = True
    """Collect experience with the planner (TD-MPC2's way: its sampling std is the
    exploration); false: with the policy prior alone, cheaper per env step, but the
    prior's own std explores little. Evaluation reports both either way."""
    iterations: int = 3
    """Refits of the sampling distribution per env step (TD-MPC2: 6)."""
    num_samples: int = 64
    """Action sequences sampled from the Gaussian per iteration and env (TD-MPC2: 512)."""
    num_pi_trajs: int = 8
    """Action sequences of the policy prior added to each iteration's samples (TD-MPC2:
    24)."""
    num_elites: int = 8
    """Best sequences the Gaussian is refitted to (TD-MPC2: 64)."""
    temperature: float = 0.5
    """Sharpness of the elites' weights, exp(temperature x (score - best))."""
    min_std: float = 0.05
    """Floor of the sampling std (actions in [-1, 1])."""
    max_std: float = 2.0
    """Initial and largest sampling std."""

    def __post_init__(self) -> None:
        check = FieldChecks(self)
        check.ints("iterations", "num_samples", "num_elites")
        check.ints("num_pi_trajs", low=0)
        check.finite("temperature", "min_std", "max_std").positive(
            "temperature", "min_std", "max_std"
        )
        if self.min_std > self.max_std:
            raise check.fail("min_std", f"must be <= max_std ({self.max_std})")
        if self.num_elites > self.num_samples + self.num_pi_trajs:
            raise check.fail(
                "num_elites",
                f"must be <= num_samples + num_pi_trajs ({self.num_samples + self.num_pi_trajs})",
            )


class MPPIPlanner:
    """Plans for ``num_envs`` envs; actions in [-1, 1] (WorldModel.to_env maps them)."""

    def __init__(
        self,
        model: WorldModel,
        cfg: PlannerConfig,
        horizon: int,
        gamma: float,
        num_envs: int,
        seed: int = 0,
    ) -> None:
        self.model, self.cfg = model, cfg
        self.horizon, self.gamma = horizon, gamma
        dev = model.action_low.device
        self.mean = torch.zeros(num_envs, horizon, model.action_size, device=dev)
        self.warm = torch.zeros(num_envs, dtype=torch.bool, device=dev)
        self.generator = torch.Generator().manual_seed(seed)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator).to(self.mean.device)

    def _value(self, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Discounted model return of action sequences [N, H, A] from latents [N, Z],
        masked after a predicted termination, plus the discounted Q bootstrap."""
        m, lo, hi = self.model, self.model.cfg.vmin, self.model.cfg.vmax
        ret = torch.zeros(z.shape[0], device=z.device)
        alive = torch.ones_like(ret)
        discount = 1.0
        for t in range(actions.shape[1]):
            a = actions[:, t]
            ret = ret + discount * alive * two_hot_decode(m.reward_logits(z, a), lo, hi)
            z = m.next(z, a)
            alive = alive * (1 - torch.sigmoid(m.termination_logit(z)))
            discount *= self.gamma
        a = self._prior(z)
        q = two_hot_decode(m.q_logits(z, a), lo, hi).mean(0)
        return ret + discount * alive * q

    def _prior(self, z: torch.Tensor) -> torch.Tensor:
        return self.model.pi(z, self.generator)[0]

    def reset(self, done: torch.Tensor) -> None:
        """Envs whose episode ended: their next plan starts from scratch."""
        self.warm &= ~done.to(self.warm.device).bool()

    @torch.no_grad()
    def plan(self, obs: torch.Tensor, explore: bool = False) -> torch.Tensor:
        """First actions of the plans for observations [E, O]: [E, A] in [-1, 1].
        ``explore``: add the final sampling std's noise (collection), else not (eval)."""
        m = self.model
        was_training = m.training
        m.eval()
        try:
            return self._plan(m.encode(obs.float()), explore)
        finally:
            m.train(was_training)

    def _plan(self, z: torch.Tensor, explore: bool) -> torch.Tensor:
        cfg, m = self.cfg, self.model
        e, h, a_dim = z.shape[0], self.horizon, m.action_size
        n_pi, n = cfg.num_pi_trajs, cfg.num_samples
        pi_actions = torch.empty(e, n_pi, h, a_dim, device=z.device)
        if n_pi:
            zz = z.repeat_interleave(n_pi, 0)
            for t in range(h):
                a = self._prior(zz)
                pi_actions[:, :, t] = a.view(e, n_pi, a_dim)
                zz = m.next(zz, a)
        mean = torch.zeros(e, h, a_dim, device=z.device)
        mean[:, :-1] = torch.where(self.warm[:, None, None], self.mean[:, 1:], mean[:, :-1])
        std = torch.full_like(mean, cfg.max_std)
        z_all = z.repeat_interleave(n + n_pi, 0)
        for _ in range(cfg.iterations):
            sampled = (mean[:, None] + std[:, None] * self._randn(e, n, h, a_dim)).clamp(-1, 1)
            actions = torch.cat([pi_actions, sampled], 1)
            value = self._value(z_all, actions.view(-1, h, a_dim)).view(e, n + n_pi)
            value = torch.nan_to_num(value, nan=-1e9)
            elite_value, idx = value.topk(cfg.num_elites, dim=1)
            elites = actions.gather(1, idx[:, :, None, None].expand(-1, -1, h, a_dim))
            score = torch.exp(cfg.temperature * (elite_value - elite_value[:, :1]))
            score = score / score.sum(1, keepdim=True)
            w = score[:, :, None, None]
            mean = (w * elites).sum(1)
            std = ((w * (elites - mean[:, None]).square()).sum(1)).sqrt()
            std = std.clamp(cfg.min_std, cfg.max_std)
        # one elite drawn by its weight, not the weighted mean: the mean of two good
        # but different plans can be a bad one
        choice = torch.multinomial(score.cpu(), 1, generator=self.generator).to(z.device)
        plan = elites.gather(1, choice[:, :, None, None].expand(-1, -1, h, a_dim))[:, 0]
        self.mean, self.warm = mean, torch.ones_like(self.warm)
        first = plan[:, 0]
        if explore:
            first = (first + std[:, 0] * self._randn(e, a_dim)).clamp(-1, 1)
        return first

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.cpu().clone(),
            "warm": self.warm.cpu().clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = state["mean"].to(self.mean.device)
        self.warm = state["warm"].to(self.warm.device)
        self.generator.set_state(state["generator"])
