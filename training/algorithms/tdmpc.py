"""TD-MPC2-style learning of a latent world model and its policy prior from replay.

One update takes a batch of sequences of ``horizon`` transitions (training.replay) and
makes two guarded steps (training.core.UpdateGuard):

1. The model. The first observation is encoded and rolled forward through the latent
   dynamics with the stored actions. Each predicted latent must match the encoding of
   the observation that really followed (joint-embedding *consistency*, no decoder);
   from each latent the reward head predicts the reward, the Q ensemble the TD target
   ``r + gamma * (1 - terminated) * min of two random target Qs (next latent, prior's
   action)``, both as two-hot distributions in symlog space (training.core.twohot), and
   the termination head whether the episode terminated. A time-out bootstraps; a
   termination does not. Later steps of the rollout weigh ``rho**t`` less: their
   latents carry the dynamics' compounding error. A sequence may run past its episode's
   end (training.replay): the batch's ``mask`` drops every loss after it.
2. The policy prior, on the (detached) latents: maximize the average of two random Qs
   of its own action, scaled by the running percentile range of Q
   (training.core.PercentileScale), with a small entropy bonus, so one coefficient
   serves tasks whose returns are 10 or 10 000.

The target Q ensemble follows the online one by Polyak averaging after each update.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from policies.world_model import WorldModel
from training.config import FieldChecks
from training.core import PercentileScale, UpdateGuard, two_hot_decode, two_hot_loss
from training.replay import SequenceBatch

__all__ = ["TDMPC", "TDMPCConfig"]


@dataclass
class TDMPCConfig:
    """Replay, update-to-data ratio, and the world-model and policy-prior losses."""

    horizon: int = 3
    """Transitions per training sequence: latent rollout length of the model loss, and
    the planner's horizon."""
    batch_size: int = 128
    """Sequences per update (TD-MPC2: 256)."""
    buffer_size: int = 1_000_000
    """Transitions the replay buffer keeps (all envs together); the oldest go first."""
    seed_steps: int = 5000
    """Env steps (all envs together) of uniformly random actions before learning starts;
    the first update then catches up to utd_ratio x the steps so far."""
    utd_ratio: float = 0.25
    """Gradient updates per env step (all envs together): the update-to-data ratio
    (TD-MPC2: 1; 0.25 fits a 300k-step run into about 3 hours of one CPU core)."""
    lr: float = 3e-4
    """Adam learning rate of model and policy prior."""
    encoder_lr_scale: float = 0.3
    """The encoder learns at lr x this (a slower encoder keeps the latent targets of
    the consistency loss from chasing themselves)."""
    gamma: float = 0.99
    """Discount factor."""
    rho: float = 0.5
    """Weight decay over the rollout: step t of the sequence weighs rho**t."""
    consistency_coef: float = 20.0
    """Weight of the latent consistency loss."""
    reward_coef: float = 0.1
    """Weight of the reward loss (two-hot cross-entropy)."""
    value_coef: float = 0.1
    """Weight of the Q loss (two-hot cross-entropy against the TD target)."""
    termination_coef: float = 1.0
    """Weight of the termination loss (binary cross-entropy)."""
    entropy_coef: float = 1e-4
    """Weight of the policy prior's entropy bonus (Q is scaled to about 1)."""
    target_tau: float = 0.01
    """Polyak rate of the target Q ensemble per update."""
    scale_decay: float = 0.99
    """Decay of the running percentile range of Q that scales the policy loss."""
    max_grad_norm: float | None = 20.0
    """Clip each step's global gradient norm to it (None: no clipping)."""

    def __post_init__(self) -> None:
        check = FieldChecks(self)
        check.ints("horizon", "batch_size", "buffer_size")
        check.ints("seed_steps", low=0)
        check.finite("utd_ratio", "lr", "encoder_lr_scale", "gamma", "rho", "target_tau")
        check.positive("utd_ratio", "lr", "encoder_lr_scale", "target_tau")
        check.within(0, 1, "gamma", "rho", "target_tau")
        check.within(0, 0.999999, "scale_decay")
        check.finite("consistency_coef", "reward_coef", "value_coef", "termination_coef")
        check.nonnegative(
            "consistency_coef", "reward_coef", "value_coef", "termination_coef", "entropy_coef"
        )
        check.positive_or_none("max_grad_norm")
        if self.batch_size > self.buffer_size:
            raise check.fail(
                "batch_size",
                f"must be <= buffer_size ({self.buffer_size}): a batch larger than the buffer",
            )


class TDMPC:
    """The learner's state beside the model: target Qs, optimizers, guards, Q scale."""

    def __init__(self, model: WorldModel, cfg: TDMPCConfig) -> None:
        self.model = model
        self.cfg = cfg
        # no dropout in the targets: the bootstrap should not be noisier than the data
        self.target_q = copy.deepcopy(model.q).requires_grad_(False).eval()
        encoder = list(model.encoder.parameters())
        enc_ids = {id(p) for p in encoder}
        rest = [p for p in model.model_parameters() if id(p) not in enc_ids]
        self.model_opt = torch.optim.Adam(
            [{"params": encoder, "lr": cfg.lr * cfg.encoder_lr_scale}, {"params": rest}],
            lr=cfg.lr,
        )
        actor = list(model.actor.parameters())
        self.actor_opt = torch.optim.Adam(actor, lr=cfg.lr, eps=1e-5)
        self.model_guard = UpdateGuard(self.model_opt, encoder + rest, cfg.max_grad_norm)
        self.actor_guard = UpdateGuard(self.actor_opt, actor, cfg.max_grad_norm)
        self.scale = PercentileScale(cfg.scale_decay)
        self.num_updates = 0

    def _weights(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return self.cfg.rho ** torch.arange(n, device=like.device, dtype=like.dtype)

    def q_value(
        self, z: torch.Tensor, a: torch.Tensor, how: str, target: bool = False
    ) -> torch.Tensor:
        """Q of (z, a) from two members of the ensemble drawn at random: their ``min``
        (TD targets: the ensemble's overestimation stays out of the bootstrap) or
        ``avg`` (the policy loss)."""
        cfg = self.model.cfg
        net = self.target_q if target else self.model.q
        pair = torch.randperm(cfg.num_q, device=z.device)[:2]
        logits = net(torch.cat([z, a], -1))[pair]
        q = two_hot_decode(logits, cfg.vmin, cfg.vmax)
        return q.min(0).values if how == "min" else q.mean(0)

    @torch.no_grad()
    def td_target(self, batch: SequenceBatch, next_z: torch.Tensor | None = None) -> torch.Tensor:
        """[H, B]: r + gamma * (1 - terminated) * min of two random target Qs at the
        encoded next observation and the prior's action there. A time-out is not a
        termination: it bootstraps from the true last observation. ``next_z``: those
        encodings when the caller has them."""
        if next_z is None:
            next_z = self.model.encode(batch["obs"][1:])
        next_a = self.model.pi(next_z)[0]
        target = self.q_value(next_z, next_a, "min", target=True)
        return batch["reward"] + self.cfg.gamma * (1 - batch["terminated"]) * target

    def losses(
        self, batch: SequenceBatch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """(total model loss, its parts, the rolled-out latents [H+1, B, Z])."""
        cfg, m = self.cfg, self.model
        obs, action, reward = batch["obs"], batch["action"], batch["reward"]
        terminated, mask = batch["terminated"], batch["mask"]
        h = action.shape[0]
        vmin, vmax = m.cfg.vmin, m.cfg.vmax
        with torch.no_grad():
            next_z = m.encode(obs[1:])
        td = self.td_target(batch, next_z)
        z = m.encode(obs[0])
        zs = [z]
        for t in range(h):
            z = m.next(z, action[t])
            zs.append(z)
        latents = torch.stack(zs)
        w = self._weights(h, z)

        def weighted(per_step: torch.Tensor) -> torch.Tensor:
            # [H, B] -> scalar: steps after the episode's end count nothing
            return ((per_step * mask).mean(1) * w).sum() / h

        consistency = (latents[1:] - next_z).square().mean(-1)
        reward_ce = two_hot_loss(m.reward_logits(latents[:-1], action), reward, vmin, vmax)
        q_ce = two_hot_loss(m.q_logits(latents[:-1], action), td.unsqueeze(0), vmin, vmax)
        term_bce = F.binary_cross_entropy_with_logits(
            m.termination_logit(latents[1:]), terminated, reduction="none"
        )
        parts = {
            "consistency": weighted(consistency),
            "reward": weighted(reward_ce),
            "value": weighted(q_ce.mean(0)),
            "termination": weighted(term_bce),
        }
        total = (
            cfg.consistency_coef * parts["consistency"]
            + cfg.reward_coef * parts["reward"]
            + cfg.value_coef * parts["value"]
            + cfg.termination_coef * parts["termination"]
        )
        return total, parts, latents

    def actor_loss(
        self, latents: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy-prior loss, mean Q) on detached latents [T, B, Z]; the Q ensemble
        passes gradient to the action only. ``mask`` [T, B]: 1 where the latent is a
        state of the sequence's first episode (no action is chosen after its end)."""
        m = self.model
        a, log_prob, _ = m.pi(latents)
        m.q.requires_grad_(False)
        try:
            q = self.q_value(latents, a, "avg")
        finally:
            m.q.requires_grad_(True)
        self.scale.update(q[0])
        per_step = ((self.cfg.entropy_coef * log_prob - q / self.scale.value) * mask).mean(-1)
        w = self._weights(latents.shape[0], per_step)
        q_mean = (q * mask).sum() / mask.sum().clamp_min(1)
        return (per_step * w).sum() / w.sum(), q_mean

    def update(self, batch: SequenceBatch) -> dict[str, float]:
        """One model step and one policy-prior step on a batch; statistics for the log
        (NaN where a step was skipped as non-finite)."""
        self.model.train()
        try:
            total, parts, latents = self.losses(batch)
            self.model_opt.zero_grad(set_to_none=True)
            total.backward()
            model_stats = self.model_guard.step([total, *parts.values()])
            # the latent after a sequence's last transition is a state of its episode
            # unless that transition ended it
            ended = batch["terminated"][-1:] + batch["truncated"][-1:]
            alive = torch.cat([batch["mask"], batch["mask"][-1:] * (1 - ended)])
            pi_loss, q_mean = self.actor_loss(latents.detach(), alive)
            self.actor_opt.zero_grad(set_to_none=True)
            pi_loss.backward()
            actor_stats = self.actor_guard.step([pi_loss, q_mean])
            with torch.no_grad():
                for p, tp in zip(
                    self.model.q.parameters(), self.target_q.parameters(), strict=True
                ):
                    tp.lerp_(p, self.cfg.target_tau)
        finally:
            self.model.eval()
        self.num_updates += 1
        nan = float("nan")
        names = ["model_loss", *(f"{k}_loss" for k in parts), "model_grad_norm"]
        out = dict(zip(names, model_stats or [nan] * len(names), strict=True))
        pi = dict(zip(["pi_loss", "q_mean", "pi_grad_norm"], actor_stats or [nan] * 3, strict=True))
        out.update(pi)
        out["q_scale"] = self.scale.value
        # steps taken (model, prior): none, and the runner's stall watch counts the update
        out["minibatch_steps"] = float((model_stats is not None) + (actor_stats is not None))
        out["nonfinite_steps"] = float(
            self.model_guard.nonfinite_steps + self.actor_guard.nonfinite_steps
        )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "target_q": self.target_q.state_dict(),
            "model_opt": self.model_opt.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "model_guard": self.model_guard.state_dict(),
            "actor_guard": self.actor_guard.state_dict(),
            "scale": self.scale.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target_q.load_state_dict(state["target_q"])
        self.model_opt.load_state_dict(state["model_opt"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.model_guard.load_state_dict(state["model_guard"])
        self.actor_guard.load_state_dict(state["actor_guard"])
        self.scale.load_state_dict(state["scale"])
        self.num_updates = int(state["num_updates"])
