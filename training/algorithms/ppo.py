"""Proximal Policy Optimization for Gaussian actor-critics on batched simulators.

The loop, per iteration: ``act`` and ``process_env_step`` num_steps times, then
``update``. The policy loss comes from the optimizer core (``training.core``) and is
selected by name, so PPO variants (dual clip, SPO, ...) are a config switch; GAE,
value loss, adaptive-KL and the schedules come from the core as well.

On the acting path (``act``, ``process_env_step``) nothing leaves the device: no
``.item()``, no ``.cpu()``; ``update`` synchronizes once per minibatch to decide on
the learning rate and on the NaN guard.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from policies.base import Policy
from policies.gaussian import gaussian_kl
from training.core import (
    POLICY_LOSS_PRESETS,
    AdaptiveKL,
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    PolicyLossConfig,
    ValueNormalizer,
    get_loss_config,
    kl_early_stop,
    policy_loss,
    value_loss,
)
from training.storage import Batch, RolloutStorage

SCHEDULES = ("adaptive", "fixed", "linear", "cosine")


@dataclass
class PPOConfig:
    """PPO hyper-parameters (defaults follow rsl_rl's legged-robot settings).

    num_steps: env steps per env per rollout. The update runs num_epochs passes over
    the rollout in num_minibatches minibatches each.
    clip / clip_high: the ratio clip range; they replace the loss preset's eps_low /
        eps_high (clip_high None: symmetric).
    value_clip: clip range of the clipped value loss, None for plain squared error.
    schedule: "adaptive" (the rate follows the measured KL between the rollout policy and
        the current one, see desired_kl, lr_min, lr_max; adjusted every minibatch),
        "fixed", "linear" or "cosine" (from lr to lr_final over total_updates updates,
        cosine after warmup_updates; total_updates None: the runner derives it from
        run.total_steps, so a changed step budget keeps the schedule ending on time).
    max_kl: stop the epoch loop early once a minibatch's KL exceeds it (None: never).
    value_normalization: the critic regresses normalized returns (running statistics).
    loss: name of a policy-loss preset in training.core.POLICY_LOSS_PRESETS.
    nan_lr_factor: the rate is multiplied by this after a non-finite update is undone.
    seed: seed of the minibatch shuffling.
    """

    num_steps: int = 24
    num_epochs: int = 5
    num_minibatches: int = 4
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    clip_high: float | None = None
    value_clip: float | None = 0.2
    value_coef: float = 1.0
    entropy_coef: float = 0.0
    lr: float = 1e-3
    schedule: str = "adaptive"
    desired_kl: float = 0.01
    lr_min: float = 1e-5
    lr_max: float = 1e-2
    lr_final: float = 0.0
    total_updates: int | None = None
    warmup_updates: int = 0
    max_kl: float | None = None
    max_grad_norm: float | None = 1.0
    normalize_advantages: bool = True
    value_normalization: bool = False
    loss: str = "ppo"
    nan_lr_factor: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"PPOConfig.{name} {why}, got {getattr(self, name)!r}")

        for name in ("num_steps", "num_epochs", "num_minibatches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, "must be an integer >= 1")
        for name in (
            "gamma",
            "lam",
            "clip",
            "value_coef",
            "entropy_coef",
            "lr",
            "desired_kl",
            "lr_min",
            "lr_max",
            "lr_final",
            "nan_lr_factor",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        if not 0.0 < self.clip < 1.0:
            raise bad("clip", "must be in (0, 1)")
        for name in ("clip_high", "value_clip", "max_kl", "max_grad_norm"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise bad(name, "must be None or a positive number")
        for name in ("value_coef", "entropy_coef", "lr_final"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in ("lr", "desired_kl", "lr_min", "lr_max"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        if not 0.0 < self.nan_lr_factor < 1.0:
            raise bad("nan_lr_factor", "must be in (0, 1)")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"must be one of {list(SCHEDULES)}")
        if self.schedule == "adaptive" and not self.lr_min <= self.lr <= self.lr_max:
            raise bad("lr", f"must be in [lr_min, lr_max] = [{self.lr_min}, {self.lr_max}]")
        if self.total_updates is not None and (
            isinstance(self.total_updates, bool)
            or not isinstance(self.total_updates, int)
            or self.total_updates < 1
        ):
            raise bad("total_updates", "must be None or an integer >= 1")
        if self.warmup_updates < 0:
            raise bad("warmup_updates", "must be >= 0")
        if self.total_updates is not None and self.warmup_updates >= self.total_updates:
            raise bad("warmup_updates", "must be in [0, total_updates)")
        if self.loss not in POLICY_LOSS_PRESETS:
            raise bad("loss", f"must name a preset in {sorted(POLICY_LOSS_PRESETS)}")
        try:
            self.loss_config()
        except ValueError as e:
            raise ValueError(f"PPOConfig.loss={self.loss!r} with clip={self.clip}: {e}") from e

    def loss_config(self) -> PolicyLossConfig:
        """The core's policy-loss config: the preset with PPO's clip and entropy bonus."""
        return get_loss_config(
            self.loss,
            eps_low=self.clip,
            eps_high=self.clip if self.clip_high is None else self.clip_high,
            entropy_coef=self.entropy_coef,
        )


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


class PPO:
    """PPO learner: owns the rollout storage, the optimizer and the rate schedule.

    policy: any Policy (e.g. policies.ActorCritic); it is moved to ``device``.
    obs_sizes: size of each observation group to store, e.g. {"policy": 48,
    "critic": 60}; groups the policy does not read need not be listed.
    """

    def __init__(
        self,
        policy: Policy,
        cfg: PPOConfig,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        action_size: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_envs = int(num_envs)
        self.policy = policy
        self.policy.to(self.device)  # type: ignore[attr-defined]
        self.loss_cfg = cfg.loss_config()
        self.params = [p for p in policy.parameters() if p.requires_grad]
        # fused: one kernel for all parameters; the per-tensor loop costs ~3x as much on
        # the CPU, where small networks make the optimizer step a large share of an update
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, fused=True)
        self.adaptive: AdaptiveKL | None = None
        self.schedule: ConstantSchedule | LinearSchedule | CosineSchedule | None = None
        if cfg.schedule == "adaptive":
            self.adaptive = AdaptiveKL(cfg.lr, cfg.desired_kl, lr_min=cfg.lr_min, lr_max=cfg.lr_max)
        elif cfg.schedule == "fixed":
            self.schedule = ConstantSchedule(cfg.lr)
        elif cfg.total_updates is None:
            raise ValueError(
                f"PPOConfig.schedule={cfg.schedule!r} needs total_updates (the PPO runner "
                "derives it from run.total_steps)"
            )
        elif cfg.schedule == "linear":
            self.schedule = LinearSchedule(cfg.lr, cfg.lr_final, cfg.total_updates)
        else:
            self.schedule = CosineSchedule(
                cfg.lr, cfg.lr_final, cfg.total_updates, cfg.warmup_updates
            )
        self.lr_scale = 1.0  # halved by the NaN guard for non-adaptive schedules
        self.value_normalizer = (
            ValueNormalizer().to(self.device) if cfg.value_normalization else None
        )
        hidden_shapes = None
        if policy.is_recurrent:
            policy.init_hidden(self.num_envs, self.device)
            hidden = policy.get_hidden()
            assert hidden is not None
            hidden_shapes = [tuple(h.shape) for h in hidden]
            if cfg.num_minibatches > self.num_envs:
                raise ValueError(
                    f"PPOConfig.num_minibatches ({cfg.num_minibatches}) must be <= num_envs "
                    f"({self.num_envs}) for a recurrent policy (minibatches split envs)"
                )
        elif cfg.num_minibatches > cfg.num_steps * self.num_envs:
            raise ValueError(
                f"PPOConfig.num_minibatches ({cfg.num_minibatches}) exceeds the rollout size "
                f"({cfg.num_steps} x {self.num_envs})"
            )
        self.storage = RolloutStorage(
            cfg.num_steps, self.num_envs, obs_sizes, action_size, self.device, hidden_shapes
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.num_updates = 0
        self.nan_rollbacks = 0
        self._set_lr(self.learning_rate)
        if _distributed():
            self._broadcast_parameters()

    # ------------------------------------------------------------------ learning rate
    @property
    def learning_rate(self) -> float:
        if self.adaptive is not None:
            return self.adaptive.lr
        assert self.schedule is not None
        return self.schedule(self.num_updates) * self.lr_scale

    def set_schedule_length(self, total_updates: int) -> None:
        """Stretch or shrink a linear/cosine schedule, e.g. when a resumed run's budget grew."""
        if not isinstance(self.schedule, LinearSchedule | CosineSchedule):
            raise ValueError(f"schedule {self.cfg.schedule!r} has no length to set")
        self.schedule.total = total_updates
        self._set_lr(self.learning_rate)

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Sample actions for obs and store what the update needs; returns actions [N, A]."""
        if self.storage.step == 0 and self.policy.is_recurrent:
            hidden = self.policy.get_hidden()
            if hidden is None or hidden[0].shape[1] != self.num_envs:
                # the runner used the policy on another batch (evaluation): start afresh
                self.policy.init_hidden(self.num_envs, self.device)
                hidden = None
            self.storage.set_hidden0(hidden)
        out = self.policy.act(obs)
        values = out.value
        if self.value_normalizer is not None:
            values = self.value_normalizer.denormalize(values)
        self.storage.add_action(obs, out.actions, out.log_prob, values, out.mean, out.std)
        return out.actions

    @torch.no_grad()
    def process_env_step(
        self,
        next_obs: Mapping[str, torch.Tensor],
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the env's answer to the last ``act``.

        The bootstrap value is V(info["final_obs"]): for envs whose episode ended this
        step that is the true last observation (not the reset one), so a time-out
        bootstraps from where the episode really was, and GAE drops the bootstrap of
        terminations. The recurrent state of ended episodes is reset afterwards.
        """
        final = next_obs
        if info is not None and info.get("final_obs") is not None:
            final = info["final_obs"]
        next_values = self.policy.value(final)
        if self.value_normalizer is not None:
            next_values = self.value_normalizer.denormalize(next_values)
        terminated = terminated.to(torch.bool)
        dones = terminated | truncated.to(torch.bool)
        self.storage.add_env_step(reward, terminated, dones, next_values)
        self.policy.reset_hidden(dones)

    # ------------------------------------------------------------------ distributed
    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        """Start every rank from rank 0's weights and normalizer statistics."""
        for t in self.policy.state_dict().values():
            if isinstance(t, torch.Tensor):
                dist.broadcast(t, src=0)

    def _sync_gradients(self, extras: torch.Tensor | None = None) -> torch.Tensor | None:
        """Average gradients (and the scalars in ``extras``) over ranks, in one all-reduce.

        A no-op without torch.distributed. Missing gradients count as zeros so every
        rank reduces a buffer of the same size; a NaN on any rank reaches all ranks, so
        they all take the same rollback decision and stay in lockstep.
        """
        if not _distributed():
            return extras
        world = dist.get_world_size()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        parts = [g.reshape(-1) for g in grads]
        if extras is not None:
            parts.append(extras.reshape(-1).to(parts[0].dtype))
        flat = torch.cat(parts)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return None if extras is None else flat[offset:].view_as(extras)

    # ------------------------------------------------------------------ update
    def _snapshot(self) -> dict[str, Any]:
        return {
            "policy": copy.deepcopy(self.policy.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "value_normalizer": None
            if self.value_normalizer is None
            else copy.deepcopy(self.value_normalizer.state_dict()),
        }

    def _rollback(self, snapshot: dict[str, Any]) -> None:
        """Undo a non-finite update: last good weights/optimizer, a smaller rate."""
        self.policy.load_state_dict(snapshot["policy"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        if self.value_normalizer is not None:
            self.value_normalizer.load_state_dict(snapshot["value_normalizer"])
        self.optimizer.zero_grad(set_to_none=True)
        f = self.cfg.nan_lr_factor
        if self.adaptive is not None:
            self.adaptive.lr = max(self.adaptive.lr_min, self.adaptive.lr * f)
        else:
            self.lr_scale *= f
        self.nan_rollbacks += 1

    def _params_finite(self) -> bool:
        return bool(torch.stack([torch.isfinite(p).all() for p in self.params]).all())

    def _minibatch_step(self, batch: Batch) -> list[float] | None:
        """One gradient step; returns its statistics, or None if anything was not finite."""
        cfg = self.cfg
        ev = self.policy.evaluate(batch.obs, batch.actions, hidden=batch.hidden, dones=batch.dones)
        # every element is one env step, so the core sees flat [B] tensors
        pg, pstats = policy_loss(
            ev.log_prob.reshape(-1),
            batch.log_probs.reshape(-1),
            batch.advantages.reshape(-1),
            self.loss_cfg,
            entropy=ev.entropy.reshape(-1),
        )
        returns, old_values = batch.returns.reshape(-1), batch.values.reshape(-1)
        if self.value_normalizer is not None:
            returns = self.value_normalizer.normalize(returns)
            old_values = self.value_normalizer.normalize(old_values)
        vl = value_loss(ev.value.reshape(-1), old_values, returns, clip_eps=cfg.value_clip)
        loss = pg + cfg.value_coef * vl
        with torch.no_grad():
            kl = gaussian_kl(batch.mean, batch.std, ev.mean, ev.std).mean()
            not_finite = (~torch.isfinite(loss)).to(kl.dtype)
        # every parameter takes part in the loss, so fresh gradients equal zeroed ones
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        synced = self._sync_gradients(torch.stack([kl, not_finite]))
        assert synced is not None
        # with max_norm = inf this only measures the norm (no clipping)
        max_norm = math.inf if cfg.max_grad_norm is None else cfg.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm, foreach=True)
        entropy = pstats.get("entropy", ev.entropy.mean().detach())
        # the one host sync of the step: the rate and the NaN guard both need numbers
        values = torch.stack(
            [
                synced[0],
                synced[1],
                grad_norm.to(kl.dtype),
                pstats["policy_loss"].to(kl.dtype),
                vl.detach().to(kl.dtype),
                entropy.to(kl.dtype),
                pstats["approx_kl"].to(kl.dtype),
                pstats["clip_frac"].to(kl.dtype),
            ]
        ).tolist()
        if values[1] > 0 or not all(math.isfinite(v) for v in values):
            return None
        if self.adaptive is not None:
            self._set_lr(self.adaptive.update(values[0]))
        self.optimizer.step()
        return values

    def update(self) -> dict[str, float]:
        """Learn from the full rollout; returns statistics (means over minibatches).

        Never raises on numbers: a non-finite loss, gradient or parameter undoes the
        whole update (weights, optimizer and value statistics as they were when it
        began), multiplies the rate by nan_lr_factor and is counted in "nan_rollbacks".
        """
        cfg = self.cfg
        if not self.storage.is_full:
            raise RuntimeError(
                f"PPO.update needs a full rollout: {self.storage.step} of {cfg.num_steps} steps"
            )
        snapshot = self._snapshot()
        self.storage.compute_advantages(cfg.gamma, cfg.lam, cfg.normalize_advantages)
        if self.value_normalizer is not None:
            self.value_normalizer.update(self.storage.returns)
        self._set_lr(self.learning_rate)
        names = (
            "kl",
            "_not_finite",
            "grad_norm",
            "policy_loss",
            "value_loss",
            "entropy",
            "approx_kl",
            "clip_frac",
        )
        sums = [0.0] * len(names)
        steps = 0
        rolled_back = early_stopped = False
        for _ in range(cfg.num_epochs):
            for batch in self.storage.minibatches(cfg.num_minibatches, self.generator):
                values = self._minibatch_step(batch)
                if values is None:
                    rolled_back = True
                    break
                sums = [s + v for s, v in zip(sums, values)]
                steps += 1
                if kl_early_stop(values[0], cfg.max_kl):
                    early_stopped = True
                    break
            if rolled_back or early_stopped:
                break
        if not rolled_back and not self._params_finite():
            rolled_back = True
        if rolled_back:
            self._rollback(snapshot)
        # fold this rollout into the observation statistics only now, so that acting
        # and re-evaluating used the same normalization
        self.policy.update_normalizers(self.storage.obs)
        self.storage.clear()
        self.num_updates += 1
        self._set_lr(self.learning_rate)  # the rate the next update starts from
        stats = {n: s / max(steps, 1) for n, s in zip(names, sums) if not n.startswith("_")}
        stats.update(
            lr=self.learning_rate,
            nan_rollbacks=float(rolled_back),
            nan_rollbacks_total=float(self.nan_rollbacks),
            early_stopped=float(early_stopped),
            minibatch_steps=float(steps),
            action_std=float(self.storage.std.mean()),
            returns_mean=float(self.storage.returns.mean()),
            values_mean=float(self.storage.values.mean()),
        )
        return stats

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (tensors and plain Python only)."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": {
                "kind": self.cfg.schedule,
                "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
                "schedule": None if self.schedule is None else self.schedule.state_dict(),
                "lr_scale": self.lr_scale,
            },
            "value_normalizer": None
            if self.value_normalizer is None
            else self.value_normalizer.state_dict(),
            "generator": self.generator.get_state(),
            "num_updates": self.num_updates,
            "nan_rollbacks": self.nan_rollbacks,
            "config": dataclasses.asdict(self.cfg),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        sched = state["schedule"]
        if sched["kind"] != self.cfg.schedule:
            raise ValueError(
                f"checkpoint was trained with schedule {sched['kind']!r}, this PPO uses "
                f"{self.cfg.schedule!r}"
            )
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.adaptive is not None:
            self.adaptive.load_state_dict(sched["adaptive"])
        if self.schedule is not None:
            self.schedule.load_state_dict(sched["schedule"])
        self.lr_scale = float(sched["lr_scale"])
        if self.value_normalizer is not None:
            if state["value_normalizer"] is None:
                raise ValueError("checkpoint has no value normalizer; value_normalization is on")
            self.value_normalizer.load_state_dict(state["value_normalizer"])
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        self.nan_rollbacks = int(state["nan_rollbacks"])
        self.storage.clear()
        self._set_lr(self.learning_rate)
