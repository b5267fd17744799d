"""Adversarial disturbances: robust adversarial RL (RARL; Pinto et al., 2017).

An adversary policy pushes the robot with bounded external forces (MuJoCo's
``xfrc_applied`` on the base body, or on the bodies ``adversary.bodies`` names) in a
zero-sum game with the protagonist: its reward is minus the protagonist's reward of each
step (the reward the protagonist's learner sees, after constraints as terminations), so
it learns the pushes that hurt the current protagonist most, and the protagonist learns
to withstand them.

The two are trained alternately, as in the paper's Algorithm 1: ``protagonist_
iterations`` runner iterations in which only the protagonist learns, then ``adversary_
iterations`` in which only the adversary does; both act in every rollout, the one that
does not learn with frozen weights. Alternation keeps each learner's problem stationary
during its phase (simultaneous updates chase a moving opponent), and it is the schedule
the paper measured. The phase is a function of the runner's iteration count, which the
checkpoint holds, so a resumed run is in the phase it stopped in.

The adversary is a Gaussian actor-critic that observes the protagonist's critic
observations (the privileged group where the task has one, else the policy group) and
learns with PPO (training.algorithms.ppo) on the protagonist's rollout settings, with
its own rate and shuffling stream. An action is a force per body in units of
``force_limit``; :func:`bounded_forces` scales it to newtons and clips its norm to the
limit, so no output of the network (huge, inf or NaN) pushes harder than the limit.

The runner (training.runner.OnPolicyRunner) drives it when ``adversary.enabled``; its
weights, optimizer and schedule go into the checkpoint under ``adversary``. Export never
sees it: the deployed policy is the protagonist alone. The log has the adversary's PPO
statistics (``adversary/*``), its return (``adversary/return``, the mean of its last 100
episodes), whether it learned in the iteration (``adversary/learning``) and the mean
force it applied (``env/adversary_force``, N).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from policies.gaussian import ActorCritic, ActorCriticConfig
from training.algorithms.base import OnPolicyConfig
from training.algorithms.ppo import PPO, PPOConfig
from training.config import ConfigError, FieldChecks

__all__ = ["Adversary", "AdversaryConfig", "bounded_forces"]

RECENT_EPISODES = 100
"""Episodes the logged adversary return averages over (as the protagonist's)."""


@dataclass
class AdversaryConfig:
    """Adversarial disturbances (RARL): an adversary policy pushes the robot with bounded
    forces in a zero-sum game with the protagonist, trained alternately."""

    enabled: bool = False
    """Train against an adversary (the task needs a base body, or adversary.bodies)."""
    force_limit: float = 25.0
    """Largest force on each pushed body (N, the norm of its 3-D force); 25 N is a fifth of
    the quadruped's and the Go1's weight."""
    bodies: tuple[str, ...] = ()
    """Bodies the adversary pushes (empty: the task's base body)."""
    actor_hidden: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the adversary's actor."""
    critic_hidden: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the adversary's critic."""
    init_std: float = 0.5
    """Initial std of the adversary's actions (in units of force_limit)."""
    protagonist_iterations: int = 1
    """Iterations of each protagonist phase (the adversary frozen)."""
    adversary_iterations: int = 1
    """Iterations of each adversary phase (the protagonist frozen)."""
    lr: float = 1e-3
    """The adversary's learning rate (the first one of the adaptive schedule)."""
    schedule: str = "adaptive"
    """The adversary's rate schedule: adaptive (PPO's adaptive-KL) or fixed."""

    def __post_init__(self) -> None:
        self.bodies = tuple(self.bodies)
        self.actor_hidden = tuple(self.actor_hidden)
        self.critic_hidden = tuple(self.critic_hidden)
        check = FieldChecks(self)
        check.finite("force_limit", "init_std", "lr").positive("force_limit", "init_std", "lr")
        check.ints("protagonist_iterations", "adversary_iterations")
        check.one_of("schedule", ("adaptive", "fixed"))
        for name in ("actor_hidden", "critic_hidden"):
            sizes = getattr(self, name)
            if not sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
            ):
                raise check.fail(name, "must be positive layer sizes")
        if not all(isinstance(b, str) and b for b in self.bodies):
            raise check.fail("bodies", "must be body names")
        bounds = PPOConfig()
        if self.schedule == "adaptive" and not bounds.lr_min <= self.lr <= bounds.lr_max:
            raise check.fail("lr", f"must be in [{bounds.lr_min}, {bounds.lr_max}] (adaptive)")

    @property
    def cycle(self) -> int:
        return self.protagonist_iterations + self.adversary_iterations

    def adversary_learns(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` (0-based) belongs to an adversary phase."""
        return iteration % self.cycle >= self.protagonist_iterations


def bounded_forces(actions: torch.Tensor, limit: float) -> torch.Tensor:
    """Adversary actions (..., 3), in units of ``limit``, as forces (N, float64) whose
    norm is at most ``limit``; a non-finite action pushes with no force."""
    # float64: the squares of float32 actions near their largest value overflow float32
    a = actions.detach().to(torch.float64)
    a = torch.where(torch.isfinite(a).all(dim=-1, keepdim=True), a, torch.zeros_like(a))
    norm = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
    return a * (limit / torch.clamp(norm, min=1.0))


class Adversary:
    """The runner's adversary: acts each env step (sets the env's external forces), learns
    in its phases, and saves and restores itself."""

    def __init__(
        self, cfg: AdversaryConfig, section: OnPolicyConfig, env: Any, device: torch.device
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.device = torch.device(device)
        self.bodies = cfg.bodies or None
        try:
            self.num_bodies = len(env.body_ids(self.bodies))
        except (AttributeError, ValueError) as e:
            raise ConfigError(f"adversary.bodies: {e}") from e
        groups = env.observation_spec.groups
        self.group = "critic" if "critic" in groups else "policy"
        obs_size = groups[self.group].size
        self.policy = ActorCritic(
            obs_size,
            None,
            3 * self.num_bodies,
            ActorCriticConfig(
                actor_hidden=cfg.actor_hidden,
                critic_hidden=cfg.critic_hidden,
                init_std=cfg.init_std,
            ),
        ).to(self.device)
        # the protagonist's rollout and update settings, with the adversary's own rate and
        # a shuffling stream apart from the protagonist's
        shared = {f.name: getattr(section, f.name) for f in dataclasses.fields(OnPolicyConfig)}
        shared["seed"] = section.seed + 1
        ppo = PPOConfig(**shared, lr=cfg.lr, schedule=cfg.schedule)
        self.learner = PPO(
            self.policy,
            ppo,
            num_envs=env.num_envs,
            obs_sizes={"policy": obs_size},
            action_size=3 * self.num_bodies,
            device=self.device,
        )
        n = env.num_envs
        self.episode_return = torch.zeros(n, device=self.device)
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self._finished: list[torch.Tensor] = []
        self._force = torch.zeros(n, device=self.device)

    def _obs(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"policy": obs[self.group]}

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Sample forces for this env step and hand them to the env."""
        actions = self.learner.act(self._obs(obs))
        forces = bounded_forces(
            actions.reshape(self.env.num_envs, self.num_bodies, 3), self.cfg.force_limit
        )
        self.env.set_external_forces(forces, self.bodies)
        self._force = torch.linalg.vector_norm(forces, dim=-1).amax(dim=-1).to(self.episode_return)

    @torch.no_grad()
    def process_env_step(
        self,
        next_obs: Mapping[str, torch.Tensor],
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        info: dict[str, Any],
    ) -> None:
        """Record the step for the adversary (zero-sum: its reward is ``-reward``); puts
        the applied force (N) into ``info["adversary_force"]`` for the log."""
        adv_info = dict(info)
        if info.get("final_obs") is not None:
            adv_info["final_obs"] = self._obs(info["final_obs"])
        self.learner.process_env_step(self._obs(next_obs), -reward, terminated, truncated, adv_info)
        self.episode_return -= reward.to(self.episode_return)
        done = terminated.to(torch.bool) | truncated.to(torch.bool)
        if "episode" in info:  # an episode ended somewhere: keep its return for the log
            self._finished.append(self.episode_return[done])
        self.episode_return = torch.where(done, 0.0, self.episode_return)
        info["adversary_force"] = self._force

    def end_rollout(self, learns: bool) -> dict[str, float]:
        """Learn from the rollout in an adversary phase (else drop it); log rows."""
        if learns:
            stats = {f"adversary/{k}": v for k, v in self.learner.update().items()}
        else:
            self.learner.storage.clear()
            stats = {}
        for r in self._finished:
            self.recent_returns.extend(r.cpu().tolist())
        self._finished = []
        ret = float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")
        return {**stats, "adversary/return": ret, "adversary/learning": float(learns)}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "algorithm": self.learner.state_dict(),
            "episode_return": self.episode_return.cpu(),
            "recent_returns": list(self.recent_returns),
            "schedule": {
                "protagonist_iterations": self.cfg.protagonist_iterations,
                "adversary_iterations": self.cfg.adversary_iterations,
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            self.policy.load_state_dict(state["policy"])
        except RuntimeError as e:
            raise ValueError(f"the checkpoint's adversary does not fit adversary.*: {e}") from e
        self.learner.load_state_dict(state["algorithm"])
        self.episode_return = state["episode_return"].to(self.device)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
