"""Behaviour cloning from demonstrations: diffusion (DDPM loss) and Gaussian (mean MSE).

Both fit the actor's observation normalizer to the demonstration observations first
(the statistics then stay fixed: fine-tuning starts from exactly what was pretrained),
then take ``num_updates`` AdamW steps on random minibatches, with the learning rate
from the core's cosine schedule and an optional exponential moving average of the
weights (the EMA weights are what the trained policy ends up with).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.core import CosineSchedule, UpdateGuard


@dataclass
class BCConfig:
    """Behaviour cloning: updates, batches, the cosine rate, the weight average."""

    num_updates: int = 5000
    """Gradient steps of the whole run."""
    batch_size: int = 256
    """(observation, action chunk) windows per step."""
    lr: float = 1e-3
    """Peak learning rate (AdamW), reached after the warm-up."""
    lr_final: float = 1e-5
    """Learning rate at the end of the cosine decay."""
    warmup: int = 100
    """Steps of linear warm-up from 0 (cut to num_updates - 1 when longer)."""
    weight_decay: float = 1e-6
    """AdamW weight decay."""
    ema_decay: float = 0.995
    """Decay of the exponential moving average of the weights, which is what the trained
    policy ends up with; 0 disables the average."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to it (None: no clipping)."""
    seed: int = 0
    """Seed of the minibatch draws and the denoising noise."""

    def __post_init__(self) -> None:
        for name in ("num_updates", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"BCConfig.{name} must be an integer >= 1, got {v!r}")
        for name in ("lr", "lr_final", "weight_decay", "ema_decay"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"BCConfig.{name} must be a finite number >= 0, got {v!r}")
        if self.lr <= 0:
            raise ValueError(f"BCConfig.lr must be > 0, got {self.lr}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"BCConfig.ema_decay must be in [0, 1), got {self.ema_decay}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"BCConfig.warmup must be an integer >= 0, got {self.warmup!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"BCConfig.max_grad_norm must be None or > 0, got {self.max_grad_norm}"
            )


class BC:
    """Behaviour cloning of a policy's actor on (obs, action) windows.

    policy: a DiffusionPolicy (loss = ``policy.bc_loss``, actions [M, horizon, A]) or a
    Gaussian ActorCritic (loss = squared error of the mean action, actions [M, A] or
    [M, 1, A]). obs: [M, obs_size] policy observations (history stacked).
    """

    def __init__(self, policy: nn.Module, cfg: BCConfig, obs: torch.Tensor, actions: torch.Tensor):
        if obs.shape[0] != actions.shape[0] or obs.shape[0] < 1:
            raise ValueError(
                f"BC needs as many observation windows as action windows (>= 1), got "
                f"{obs.shape[0]} and {actions.shape[0]}"
            )
        self.cfg = cfg
        self.policy = policy
        self.obs = obs
        self.actions = actions
        self.diffusion = hasattr(policy, "bc_loss")
        if self.diffusion:
            policy.update_obs_normalizer(obs)
        else:
            if actions.dim() == 3:
                self.actions = actions[:, 0]
            policy.actor_obs_normalizer.update(obs)
        # the trained sub-modules, by their name in the policy (the EMA's state keys)
        self.module_names = ["actor"]
        self.modules: list[nn.Module] = [getattr(policy, n) for n in self.module_names]
        self.params = [p for m in self.modules for p in m.parameters()]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True
        )
        # a warm-up longer than the run is cut to fit it
        warmup = min(cfg.warmup, cfg.num_updates - 1)
        self.schedule = CosineSchedule(cfg.lr, cfg.lr_final, cfg.num_updates, warmup)
        self.ema = [copy.deepcopy(m) for m in self.modules] if cfg.ema_decay > 0 else None
        if self.ema is not None:
            for m in self.ema:
                for p in m.parameters():
                    p.requires_grad_(False)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.guard = UpdateGuard(self.optimizer, self.params, cfg.max_grad_norm)
        self.num_updates = 0

    def _loss(self, idx: torch.Tensor) -> torch.Tensor:
        obs, act = self.obs[idx], self.actions[idx]
        if self.diffusion:
            return self.policy.bc_loss(obs, act, generator=self.generator)
        mean = self.policy.actor(self.policy.actor_obs_normalizer(obs))
        return (mean - act).square().mean()

    def update(self) -> dict[str, float]:
        """One guarded gradient step on a random minibatch; returns loss, lr and grad norm
        (a step whose loss or gradient is not finite is skipped: NaN for both, and
        counted in ``nonfinite_steps``)."""
        lr = self.schedule(min(self.num_updates, self.cfg.num_updates))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, self.obs.shape[0], (self.cfg.batch_size,), generator=self.generator)
        loss = self._loss(idx)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stepped = self.guard.step([loss])
        self.num_updates += 1
        if stepped is None:
            return {
                "loss": math.nan,
                "lr": lr,
                "grad_norm": math.nan,
                "nonfinite_steps": float(self.guard.nonfinite_steps),
            }
        if self.ema is not None:
            # the usual warm-up of the decay: early weights are forgotten quickly
            d = min(self.cfg.ema_decay, (1 + self.num_updates) / (10 + self.num_updates))
            with torch.no_grad():
                for m, e in zip(self.modules, self.ema):
                    for p, q in zip(m.parameters(), e.parameters()):
                        q.mul_(d).add_(p.detach(), alpha=1 - d)
        return {
            "loss": stepped[0],
            "lr": lr,
            "grad_norm": stepped[1],
            "nonfinite_steps": float(self.guard.nonfinite_steps),
        }

    @torch.no_grad()
    def validation_loss(self, batches: int = 8) -> float:
        """Mean loss of the (EMA) weights on a few random minibatches (fixed seed)."""
        g = torch.Generator().manual_seed(12345)
        saved = self.generator
        self.generator = g
        with self.averaged():
            total = 0.0
            for _ in range(batches):
                idx = torch.randint(0, self.obs.shape[0], (self.cfg.batch_size,), generator=g)
                total += float(self._loss(idx))
        self.generator = saved
        return total / batches

    class _Swap:
        def __init__(self, bc: BC) -> None:
            self.bc = bc
            self.saved: list[dict[str, Any]] = []

        def __enter__(self):
            if self.bc.ema is not None:
                for m, e in zip(self.bc.modules, self.bc.ema):
                    self.saved.append(copy.deepcopy(m.state_dict()))
                    m.load_state_dict(e.state_dict())
            return self

        def __exit__(self, *exc) -> None:
            for m, s in zip(self.bc.modules, self.saved):
                m.load_state_dict(s)

    def averaged(self) -> BC._Swap:
        """Context in which the policy's actor holds the EMA weights."""
        return BC._Swap(self)

    def finalize(self) -> None:
        """Copy the EMA weights into the policy (the result of training)."""
        if self.ema is not None:
            for m, e in zip(self.modules, self.ema):
                m.load_state_dict(e.state_dict())

    def ema_state(self) -> dict[str, torch.Tensor] | None:
        """The averaged weights under the policy's own keys ("actor.<...>"), so that
        ``{**policy.state_dict(), **ema_state()}`` is the trained policy."""
        if self.ema is None:
            return None
        return {
            f"{name}.{k}": v
            for name, e in zip(self.module_names, self.ema)
            for k, v in e.state_dict().items()
        }

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, averaged weights, sampling state, counters (not the raw weights,
        which the runner stores)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "ema": self.ema_state(),
            "generator": self.generator.get_state(),
            "num_updates": self.num_updates,
            "guard": self.guard.state_dict(),
            "config": dataclasses.asdict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ema is not None:
            saved = state["ema"]
            if saved is None:
                raise ValueError("checkpoint has no EMA weights; ema_decay > 0 here")
            for name, e in zip(self.module_names, self.ema):
                if isinstance(saved, list):  # checkpoints before the keyed layout
                    e.load_state_dict(saved[self.module_names.index(name)])
                else:
                    prefix = f"{name}."
                    e.load_state_dict(
                        {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
                    )
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        self.guard.load_state_dict(state.get("guard", {"nonfinite_steps": 0}))
