"""Proximal Policy Optimization for Gaussian actor-critics on batched simulators.

The loop, per iteration: ``act`` and ``process_env_step`` num_steps times, then
``update``. The policy loss comes from the optimizer core (``training.core``) and is
selected by name, so PPO variants (dual clip, SPO, ...) are a config switch; GAE,
value loss, adaptive-KL and the schedules come from the core as well.

On the acting path (``act``, ``process_env_step``) nothing leaves the device: no
``.item()``, no ``.cpu()``; ``update`` synchronizes once per minibatch step, in the
core's guarded step (training.core.guard), which also averages gradients across
processes under torchrun. With ``compile`` a minibatch's forward pass, losses and
backward pass run under torch.compile; the guarded step after them stays eager, so the
non-finite rule and the checkpoints are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from policies.base import Policy
from policies.gaussian import gaussian_kl
from training.algorithms.base import OnPolicyConfig, OnPolicyLearnerState
from training.core import (
    AdaptiveKL,
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    PolicyLossConfig,
    get_loss_config,
    kl_early_stop,
    policy_loss,
)
from training.storage import Batch, RolloutStorage

SCHEDULES = ("adaptive", "fixed", "linear", "cosine")


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO: rollout, epochs and minibatches, clipping, value loss, learning rate.

    Defaults follow rsl_rl's legged-robot settings; per-task presets live in
    training.presets.PPO_PRESETS.
    """

    RENAMED: ClassVar[dict[str, str]] = {"max_kl": "target_kl"}

    clip_high: float | None = None
    """Upper ratio clip range (asymmetric "clip-higher"); None: symmetric."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    lr: float = 1e-3
    """Learning rate (the start of a linear/cosine schedule, the first adaptive rate)."""
    schedule: str = "adaptive"
    """adaptive (follows the measured KL, see desired_kl), fixed, linear or cosine."""
    desired_kl: float = 0.01
    """Adaptive schedule: the KL between rollout and current policy it aims at."""
    lr_min: float = 1e-5
    """Adaptive schedule: lowest rate."""
    lr_max: float = 1e-2
    """Adaptive schedule: highest rate."""
    lr_final: float = 0.0
    """Linear/cosine schedules: the rate at the end."""
    std_lr_scale: float = 1.0
    """The action std's parameter (a Gaussian policy's ``log_std``) learns at this multiple
    of the rate. Adam steps every weight by about the rate, so with hundreds of inputs
    the mean's weights set the KL that an adaptive rate follows, and a rate held low by
    them leaves the std where it started: humanoid's preset (rate 2e-5, std 1 against
    actions bounded at 0.4) still had std 0.94 at 1M steps, 0.71 with a scale of 10,
    which walked one seed of three by 1M and left the other two where the preset is
    (docs/benchmarks_ppo.md), so no preset sets it."""
    total_updates: int | None = None
    """Linear/cosine schedules: their length in updates; None: derived from run.total_steps, so a
    changed step budget keeps the schedule ending on time."""
    warmup_updates: int = 0
    """Cosine schedule: updates of linear warm-up."""
    compile: bool = False
    """Run each minibatch's forward pass, losses and backward pass under torch.compile
    (MLP policies only, a recurrent one is refused; on the CPU it needs a C++ compiler).
    Off by default because it is not bit-identical to eager: the last bits differ from
    the first step on. 2-core CPU, (64, 64) MLPs, minibatches of 256: 2.8 ms per step
    against 4.5 ms eager, after a first step that compiles for ~20 s (2-4 s from
    Inductor's on-disk cache); benchmarks/ppo_vs_sb3.py --parts m measures it."""

    def __post_init__(self) -> None:
        check = self.check_common()
        check.finite("entropy_coef", "lr", "desired_kl", "lr_min", "lr_max", "lr_final")
        check.positive_or_none("clip_high")
        check.nonnegative("entropy_coef", "lr_final")
        check.positive("lr", "desired_kl", "lr_min", "lr_max", "std_lr_scale")
        check.finite("std_lr_scale")
        check.one_of("schedule", SCHEDULES)
        if self.schedule == "adaptive" and not self.lr_min <= self.lr <= self.lr_max:
            raise check.fail("lr", f"must be in [lr_min, lr_max] = [{self.lr_min}, {self.lr_max}]")
        if self.total_updates is not None:
            check.ints("total_updates")
        check.ints("warmup_updates", low=0)
        if self.total_updates is not None and self.warmup_updates >= self.total_updates:
            raise check.fail("warmup_updates", "must be in [0, total_updates)")
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


class PPO(OnPolicyLearnerState):
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
        self.optimizer = torch.optim.Adam(self._param_groups(cfg), lr=cfg.lr, fused=True)
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
        self._loss_fn = self._compiled_losses() if cfg.compile else self._losses
        self._init_learner_state()
        self._set_lr(self.learning_rate)

    # ------------------------------------------------------------------ learning rate
    @property
    def learning_rate(self) -> float:
        if self.adaptive is not None:
            return self.adaptive.lr
        assert self.schedule is not None
        return self.schedule(self.num_updates)

    def set_schedule_length(self, total_updates: int) -> None:
        """Stretch or shrink a linear/cosine schedule, e.g. when a resumed run's budget grew."""
        if not isinstance(self.schedule, LinearSchedule | CosineSchedule):
            raise ValueError(f"schedule {self.cfg.schedule!r} has no length to set")
        self.schedule.total = total_updates
        self._set_lr(self.learning_rate)

    def _param_groups(self, cfg: PPOConfig) -> list[dict[str, Any]]:
        """One group of every trained parameter, or, with ``std_lr_scale``, the std's
        parameter in a second group whose rate is scaled."""
        if cfg.std_lr_scale == 1.0:
            return [{"params": self.params}]
        log_std = getattr(self.policy, "log_std", None)
        if not isinstance(log_std, torch.nn.Parameter) or not log_std.requires_grad:
            raise ValueError(
                f"PPOConfig.std_lr_scale={cfg.std_lr_scale} needs a policy with a trained "
                f"log_std parameter (a Gaussian policy); {type(self.policy).__name__} has none"
            )
        rest = [p for p in self.params if p is not log_std]
        return [{"params": rest}, {"params": [log_std], "lr_scale": cfg.std_lr_scale}]

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

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
        if self.value_normalizer is not None:  # the critic predicts normalized returns
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
        next_values = self._bootstrap(next_obs, info)
        terminated, dones = self._ends(terminated, truncated, info)
        self.storage.add_env_step(reward, terminated, dones, next_values)
        self.policy.reset_hidden(dones)

    # ------------------------------------------------------------------ update
    def _compiled_losses(self) -> Callable[[Batch], tuple[torch.Tensor, list[torch.Tensor]]]:
        if self.policy.is_recurrent:
            # torch.compile does not trace nn.GRU/LSTM (torch._dynamo.config.allow_rnn is
            # off): the graph would break at every step of the memory's loop over time and
            # gain nothing. An error, not a silent fallback to eager, so that no run is
            # timed or reported as compiled when it is not
            raise ValueError(
                "PPOConfig.compile=True needs an MLP policy; this policy is recurrent "
                "(set ppo.compile=false)"
            )
        # compile the function, not the module: a compiled module wraps the policy and
        # renames every state_dict key ("_orig_mod." prefix), which breaks checkpoints.
        # dynamic=False: an uneven split gives at most two minibatch sizes, one graph each.
        # cpp_wrapper: the generated code calls its kernels from C++ instead of Python,
        # ~0.2 ms less per minibatch step of (64, 64) MLPs on this project's 2-core CPU
        return torch.compile(self._losses, dynamic=False, options={"cpp_wrapper": True})

    def _losses(self, batch: Batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The minibatch's loss (with gradient) and the statistics the guard checks and
        logs, the loss first; pure in the policy's parameters and buffers, so that
        torch.compile can trace it (cfg.compile)."""
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
        vl = self._value_loss(
            ev.value.reshape(-1), batch.values.reshape(-1), batch.returns.reshape(-1)
        )
        loss = pg + cfg.value_coef * vl
        with torch.no_grad():
            kl = gaussian_kl(batch.mean, batch.std, ev.mean, ev.std).mean()
        entropy = pstats.get("entropy", ev.entropy.mean().detach())
        return loss, [
            loss,
            kl,
            pstats["policy_loss"],
            vl,
            entropy,
            pstats["approx_kl"],
            pstats["clip_frac"],
        ]

    def _minibatch_step(self, batch: Batch) -> list[float] | None:
        """One guarded gradient step; its statistics, or None if it was skipped."""
        loss, stats = self._loss_fn(batch)
        # every parameter takes part in the loss, so fresh gradients equal zeroed ones
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()

        def adapt_rate(values: list[float]) -> None:
            if self.adaptive is not None:
                self._set_lr(self.adaptive.update(values[1]))

        return self.guard.step(stats, before_step=adapt_rate)

    def update(self) -> dict[str, float]:
        """Learn from the full rollout; returns statistics (means over minibatch steps).

        Never raises on numbers (training.core.guard): a minibatch step whose loss or
        gradient is not finite is skipped, a rollout whose returns or advantages are not
        finite is not learned from; both are counted in "nonfinite_steps".
        """
        cfg = self.cfg
        if not self.storage.is_full:
            raise RuntimeError(
                f"PPO.update needs a full rollout: {self.storage.step} of {cfg.num_steps} steps"
            )
        self.storage.compute_advantages(cfg.gamma, cfg.lam, cfg.normalize_advantages)
        names = (
            "loss",
            "kl",
            "policy_loss",
            "value_loss",
            "entropy",
            "approx_kl",
            "clip_frac",
            "grad_norm",
        )
        sums = [0.0] * len(names)
        steps = 0
        early_stopped = False
        if self.guard.finite_batch(self.storage.returns, self.storage.advantages):
            if self.value_normalizer is not None:
                self.value_normalizer.update(self.storage.returns)
            self._set_lr(self.learning_rate)
            for _ in range(cfg.num_epochs):
                for batch in self.storage.minibatches(cfg.num_minibatches, self.generator):
                    values = self._minibatch_step(batch)
                    if values is None:
                        continue
                    sums = [s + v for s, v in zip(sums, values)]
                    steps += 1
                    if kl_early_stop(values[1], cfg.target_kl):
                        early_stopped = True
                        break
                if early_stopped:
                    break
        # fold this rollout into the observation statistics only now, so that acting
        # and re-evaluating used the same normalization
        self.policy.update_normalizers(self.storage.obs)
        self.storage.clear()
        self.num_updates += 1
        self._set_lr(self.learning_rate)  # the rate the next update starts from
        stats = {n: s / max(steps, 1) for n, s in zip(names, sums) if n != "loss"}
        stats.update(
            lr=self.learning_rate,
            nonfinite_steps=float(self.guard.nonfinite_steps),
            early_stopped=float(early_stopped),
            minibatch_steps=float(steps),
            action_std=float(self.storage.std.mean()),
            returns_mean=float(self.storage.returns.mean()),
            values_mean=float(self.storage.values.mean()),
        )
        return stats

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy's weights (the runner stores those once) needed to
        continue exactly: optimizer, schedule, value statistics, shuffling, counters."""
        return {
            **self._learner_state(),
            "schedule": {
                "kind": self.cfg.schedule,
                "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
                "schedule": None if self.schedule is None else self.schedule.state_dict(),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        sched = state["schedule"]
        if sched["kind"] != self.cfg.schedule:
            raise ValueError(
                f"checkpoint was trained with schedule {sched['kind']!r}, this PPO uses "
                f"{self.cfg.schedule!r}"
            )
        self._load_learner_state(state)
        if self.adaptive is not None:
            self.adaptive.load_state_dict(sched["adaptive"])
        if self.schedule is not None:
            self.schedule.load_state_dict(sched["schedule"])
            if self.cfg.total_updates is not None and hasattr(self.schedule, "total"):
                # the length this run was configured with (derived from a step budget that
                # a resume may have extended), not the saved one
                self.set_schedule_length(self.cfg.total_updates)
        self.storage.clear()
        self._set_lr(self.learning_rate)
