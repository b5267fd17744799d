"""DPPO: policy-gradient fine-tuning of a diffusion policy through its denoising chain.

The denoising chain is an inner MDP (Ren et al., 2024, "Diffusion Policy Policy
Optimization"): every denoising step k is a Gaussian policy
``x_{k+1} ~ N(mu_theta(x_k, k, obs), max(sigma_k, min_std)^2)``, so a stored chain has an
exact, finite log-likelihood and PPO applies step by step. Here:

- Only the last K' = ``ft_steps`` steps are fine-tuned (``policy.actor_ft``); a frozen
  copy of the pretrained network runs the earlier ones.
- Elements of the core's loss: rows are env-step samples, columns the K' fine-tuned
  denoising steps. The per-step Gaussian factorizes over the chunk's positions, so
  the row of env step t holds, for each fine-tuned step, the log-probability of the
  chunk position that was executed at t; positions of a chunk that were never executed
  (the tail beyond ``act_steps``, or the rest of a chunk cut short by an episode's end)
  belong to no row: only the executed part of a chunk is credited.
- Advantages: GAE over env steps (the core's ``gae``; time-outs bootstrap from the true
  final observation), with a critic on observations; every fine-tuned step of a row
  gets its env step's advantage, weighted by the denoising discount
  ``gamma_d^(N-1-k)`` (``weights``), with a clip range growing from ``clip_base`` at
  the noisiest fine-tuned step to ``clip`` at the last (``clip_scale``).
- Optional behaviour-cloning term: the negative log-likelihood, under the fine-tuned
  steps, of chains sampled by the frozen pretrained network, times ``bc_coef``.
- One optimizer (Adam) with two rates: the fine-tuned actor copy and the critic.

The loss itself is the core's ``policy_loss`` (no private copy); ``value_loss``, ``gae``
and the value normalizer come from the core as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from policies.diffusion import DiffusionPolicy
from training.algorithms.base import OnPolicyConfig, OnPolicyLearnerState
from training.core import (
    PolicyLossConfig,
    gae,
    get_loss_config,
    kl_early_stop,
    policy_loss,
)
from training.storage import ChunkRolloutStorage

REDUCTIONS = ("mean", "sum")


@dataclass
class DPPOConfig(OnPolicyConfig):
    """DPPO: rollout, the fine-tuned denoising steps, clipping, rates, value loss.

    After DPPO's Gym settings, scaled to small CPUs: the clip range, exploration floor
    and actor rate are wider than the paper's (clip 0.001 -> 0.01, floor 0.1, lr 1e-4),
    which go with far larger rollouts per update: with those, hopper did not move from
    its BC return in 1M env steps; with these, from the same kind of start, hopper went
    from 662 to 1 477 and halfcheetah from 592 to 1 278 (means of 3 seeds, 1M steps,
    docs/benchmarks_dppo.md). Per-task changes live in training.presets.DPPO_PRESETS
    (halfcheetah: twice the clip range, 1 842).
    """

    num_steps: int = 64
    num_epochs: int = 8
    clip: float = 0.1
    """Clip range at the last denoising step."""
    value_coef: float = 0.5
    value_clip: float | None = None
    value_normalization: bool = True
    ft_steps: int = 5
    """K', the fine-tuned last steps of the denoising chain (<= policy.sample_steps)."""
    eta: float | None = None
    """DDIM eta of the chain while fine-tuning (None: the policy's)."""
    min_std: float = 0.2
    """Std floor of every denoising step, for sampling and for the log-probabilities."""
    denoising_gamma: float = 0.99
    """gamma_d of the per-step weights gamma_d^(N-1-k)."""
    clip_base: float = 0.01
    """Clip range at the noisiest fine-tuned step; between the two it grows as
    eps_i = base + (clip - base) * (exp(rate * i/(K'-1)) - 1) / (exp(rate) - 1)."""
    clip_rate: float = 3.0
    """The exponential rate of that growth."""
    logprob_reduce: str = "mean"
    """A chunk position's log-probability from its action dimensions: "sum" (the exact
    log-density) or "mean" (per-dimension average, as DPPO does, which keeps the
    ratio's scale independent of the action size)."""
    actor_lr: float = 3e-4
    """Learning rate of the fine-tuned actor copy."""
    critic_lr: float = 1e-3
    """Learning rate of the critic."""
    bc_coef: float = 0.0
    """Weight of the behaviour-cloning term that keeps the policy near its pretraining (0: off)."""

    def __post_init__(self) -> None:
        check = self.check_common()
        check.ints("ft_steps")
        check.finite("min_std", "denoising_gamma", "clip_base", "clip_rate", "actor_lr")
        check.finite("critic_lr", "bc_coef")
        check.within(0.0, 1.0, "denoising_gamma")
        if self.min_std <= 0:
            raise check.fail("min_std", "must be > 0 (the log-probabilities need a std floor)")
        if not 0.0 < self.clip_base <= self.clip:
            raise check.fail("clip_base", f"must be in (0, clip={self.clip}]")
        check.positive("clip_rate", "actor_lr", "critic_lr")
        check.nonnegative("bc_coef")
        if self.eta is not None and not (math.isfinite(self.eta) and 0.0 <= self.eta <= 1.0):
            raise check.fail("eta", "must be None or in [0, 1]")
        check.one_of("logprob_reduce", REDUCTIONS)
        self.loss_config()

    def loss_config(self) -> PolicyLossConfig:
        return get_loss_config(self.loss, eps_low=self.clip, eps_high=self.clip)

    def clip_schedule(self) -> list[float]:
        """Clip range of each fine-tuned step, noisiest first, ending at ``clip``."""
        k = self.ft_steps
        if k == 1:
            return [self.clip]
        denom = math.exp(self.clip_rate) - 1.0
        return [
            self.clip_base
            + (self.clip - self.clip_base) * (math.exp(self.clip_rate * i / (k - 1)) - 1.0) / denom
            for i in range(k)
        ]


class DPPO(OnPolicyLearnerState):
    """The DPPO learner: acting with chunks, storage, and the update through the core.

    policy: a DiffusionPolicy (fine-tuning is enabled here with cfg.ft_steps). obs_sizes:
    the observation groups to store (the critic may read "critic").
    """

    def __init__(
        self,
        policy: DiffusionPolicy,
        cfg: DPPOConfig,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        pcfg = policy.cfg
        if cfg.ft_steps > pcfg.sample_steps:
            raise ValueError(
                f"DPPOConfig.ft_steps ({cfg.ft_steps}) exceeds the chain's steps "
                f"(policy.sample_steps = {pcfg.sample_steps})"
            )
        policy.enable_finetuning(cfg.ft_steps)
        self.chain = policy.chain(eta=cfg.eta)
        n_steps = self.chain.num_steps
        self.start = n_steps - cfg.ft_steps
        self.num_envs = int(num_envs)
        self.horizon, self.act_steps = pcfg.horizon, pcfg.act_steps
        self.action_size = policy.action_size
        ks = range(self.start, n_steps)
        # denoising discount gamma_d^(N-1-k): the last step weighs 1, noisier steps less
        self.weights = torch.tensor(
            [cfg.denoising_gamma ** (n_steps - 1 - k) for k in ks], device=self.device
        ).view(1, -1)
        self.clip_scale = torch.tensor(
            [e / cfg.clip for e in cfg.clip_schedule()], device=self.device
        ).view(1, -1)
        self.loss_cfg = cfg.loss_config()
        actor_params = policy.actor_parameters()
        critic_params = [p for p in policy.critic.parameters()]
        self.params = actor_params + critic_params
        self.optimizer = torch.optim.Adam(
            [
                {"params": actor_params, "lr": cfg.actor_lr},
                {"params": critic_params, "lr": cfg.critic_lr},
            ],
            fused=True,
        )
        if cfg.num_minibatches > cfg.num_steps * self.num_envs:
            raise ValueError(
                f"DPPOConfig.num_minibatches ({cfg.num_minibatches}) exceeds the rollout "
                f"size ({cfg.num_steps} x {self.num_envs})"
            )
        self.storage = ChunkRolloutStorage(
            cfg.num_steps,
            self.num_envs,
            obs_sizes,
            policy.policy_obs_size,
            cfg.ft_steps,
            self.horizon,
            self.action_size,
            self.device,
        )
        self._init_learner_state()
        n = self.num_envs
        self.position = torch.zeros(n, dtype=torch.long, device=self.device)
        self.current_chunk = torch.zeros(n, dtype=torch.long, device=self.device)
        self.chunk_actions = torch.zeros(n, self.act_steps, self.action_size, device=self.device)

    # ------------------------------------------------------------------ log-probs
    def _reduce(self, logp: torch.Tensor) -> torch.Tensor:
        """[..., A] per-dimension log-probs -> [...] per chunk position."""
        return logp.mean(-1) if self.cfg.logprob_reduce == "mean" else logp.sum(-1)

    def chunk_log_prob(
        self, obs: torch.Tensor, chain_ft: torch.Tensor, reference: bool = False
    ) -> torch.Tensor:
        """[C, K', Tp] log-probs of the fine-tuned part of stored chains, with gradient."""
        lp = self.policy.chain_log_prob(
            obs,
            chain_ft,
            chain=self.chain,
            start=self.start,
            min_std=self.cfg.min_std,
            reference=reference,
        )
        return self._reduce(lp)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Actions [N, A] for this env step; new chunks for envs at a chunk boundary.

        A rollout starts every env on a fresh chunk, so no chunk spans two rollouts (the
        unexecuted rest of the last chunk is simply not credited).
        """
        st = self.storage
        if st.step == 0:
            self.position.zero_()
        need = self.position == 0
        if bool(need.any()):
            idx = need.nonzero().squeeze(-1)
            x = obs["policy"][idx]
            s = self.policy.sample(x, chain=self.chain, min_std=self.cfg.min_std, return_chain=True)
            assert s.chain is not None
            chain_ft = s.chain[:, self.start :]
            logp = self.chunk_log_prob(x, chain_ft)
            ids = st.add_chunks(x, chain_ft, logp)
            self.current_chunk[idx] = ids
            self.chunk_actions[idx] = s.actions[:, : self.act_steps]
        rows = torch.arange(self.num_envs, device=self.device)
        actions = self.chunk_actions[rows, self.position]
        st.add_row(obs, self._values(obs), self.current_chunk, self.position)
        return actions

    @torch.no_grad()
    def process_env_step(
        self,
        next_obs: Mapping[str, torch.Tensor],
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the env's answer; envs whose episode ended start a new chunk next."""
        next_values = self._bootstrap(next_obs, info)
        terminated = terminated.to(torch.bool)
        dones = terminated | truncated.to(torch.bool)
        self.storage.add_env_step(reward, terminated, dones, next_values)
        pos = self.position + 1
        pos = torch.where((pos >= self.act_steps) | dones, torch.zeros_like(pos), pos)
        self.position.copy_(pos)

    # ------------------------------------------------------------------ update
    def _credit(self, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter env-step advantages [T, N] onto the chunk positions that executed them.

        Returns (advantages [C, Tp], mask [C, Tp]); positions never executed stay masked.
        """
        st = self.storage
        c = st.num_chunks
        adv_c = torch.zeros(c, self.horizon, device=self.device)
        mask_c = torch.zeros(c, self.horizon, device=self.device)
        ci = st.chunk_index.reshape(-1)
        pj = st.position.reshape(-1)
        adv_c[ci, pj] = adv.reshape(-1).to(adv_c.dtype)
        mask_c[ci, pj] = 1.0
        return adv_c, mask_c

    def update(self) -> dict[str, float]:
        """Learn from the full rollout; statistics are means over minibatch steps.

        Never raises on numbers (training.core.guard): a step whose loss or gradient is
        not finite is skipped, a rollout whose returns or advantages are not finite is
        not learned from; both are counted in "nonfinite_steps".
        """
        cfg = self.cfg
        st = self.storage
        if not st.is_full:
            raise RuntimeError(
                f"DPPO.update needs a full rollout: {st.step} of {cfg.num_steps} steps"
            )
        adv, returns = gae(
            st.rewards, st.values, st.next_values, st.terminated, st.dones, cfg.gamma, cfg.lam
        )
        names = (
            "policy_loss",
            "value_loss",
            "bc_loss",
            "approx_kl",
            "clip_frac",
            "ratio_max",
            "grad_norm",
        )
        sums = dict.fromkeys(names, 0.0)
        steps = 0
        early = False
        c = st.num_chunks
        executed = 0.0
        if self.guard.finite_batch(returns, adv):
            if self.value_normalizer is not None:
                self.value_normalizer.update(returns)
            if cfg.normalize_advantages:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            adv_c, mask_c = self._credit(adv)
            executed = float(mask_c.sum()) / max(c * self.act_steps, 1)
            rows = cfg.num_steps * self.num_envs
            flat_obs = {k: v.reshape(rows, -1) for k, v in st.obs.items()}
            flat_ret = returns.reshape(-1)
            flat_val = st.values.reshape(-1)
            m = cfg.num_minibatches
            for _ in range(cfg.num_epochs):
                chunk_perm = torch.randperm(c, generator=self.generator).to(self.device)
                row_perm = torch.randperm(rows, generator=self.generator).to(self.device)
                for cb, rb in zip(chunk_perm.chunk(m), row_perm.chunk(m)):
                    mb_obs = {k: v[rb] for k, v in flat_obs.items()}
                    vals = self._minibatch_step(
                        cb, adv_c, mask_c, mb_obs, flat_ret[rb], flat_val[rb]
                    )
                    if vals is None:
                        continue
                    for name, x in zip(names, vals):
                        sums[name] += x
                    steps += 1
                    if kl_early_stop(vals[3], cfg.target_kl):
                        early = True
                        break
                if early:
                    break
        self.policy.update_critic_normalizer(st.obs)
        stats = {k: s / max(steps, 1) for k, s in sums.items()}
        stats.update(
            minibatch_steps=float(steps),
            early_stopped=float(early),
            nonfinite_steps=float(self.guard.nonfinite_steps),
            chunks=float(c),
            executed_fraction=executed,
            returns_mean=float(returns.mean()),
            values_mean=float(st.values.mean()),
            actor_lr=self.optimizer.param_groups[0]["lr"],
        )
        st.clear()
        self.num_updates += 1
        return stats

    def _minibatch_step(
        self,
        cb: torch.Tensor,
        adv_c: torch.Tensor,
        mask_c: torch.Tensor,
        obs: dict[str, torch.Tensor],
        target: torch.Tensor,
        old_v: torch.Tensor,
    ) -> list[float] | None:
        """One guarded step on the chunks ``cb`` and the env-step rows of ``obs``; its
        statistics (policy, value and BC losses, approx_kl, clip_frac, ratio_max, grad
        norm), or None if it was skipped."""
        cfg, st, k_ft = self.cfg, self.storage, self.cfg.ft_steps
        new = self.chunk_log_prob(st.chunk_obs[cb], st.chunk_chain[cb])
        old = st.chunk_logp[cb]
        # rows: one per (chunk, position); columns: the K' fine-tuned steps
        new_r = new.permute(0, 2, 1).reshape(-1, k_ft)
        old_r = old.permute(0, 2, 1).reshape(-1, k_ft)
        mask = mask_c[cb].reshape(-1, 1).expand(-1, k_ft)
        pl, pstats = policy_loss(
            new_r,
            old_r,
            adv_c[cb].reshape(-1),
            self.loss_cfg,
            mask=mask,
            weights=self.weights,
            clip_scale=self.clip_scale,
        )
        vl = self._value_loss(self.policy.value(obs), old_v, target)
        loss = pl + cfg.value_coef * vl
        bc = torch.zeros((), device=self.device)
        if cfg.bc_coef > 0:
            with torch.no_grad():
                ref = self.policy.sample(
                    st.chunk_obs[cb],
                    chain=self.chain,
                    min_std=cfg.min_std,
                    return_chain=True,
                    reference=True,
                ).chain
            assert ref is not None
            bc_lp = self.chunk_log_prob(st.chunk_obs[cb], ref[:, self.start :])
            bc = -bc_lp.mean()
            loss = loss + cfg.bc_coef * bc
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats = [
            loss,
            pstats["policy_loss"],
            vl,
            bc,
            pstats["approx_kl"],
            pstats["clip_frac"],
            pstats["ratio_max"],
        ]
        values = self.guard.step(stats)
        return None if values is None else values[1:]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy's weights (the runner stores those once)."""
        return self._learner_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_learner_state(state)
        self.storage.clear()
