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

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from policies.diffusion import DiffusionPolicy
from training.core import (
    POLICY_LOSS_PRESETS,
    PolicyLossConfig,
    ValueNormalizer,
    gae,
    get_loss_config,
    kl_early_stop,
    policy_loss,
    value_loss,
)

REDUCTIONS = ("mean", "sum")


@dataclass
class DPPOConfig:
    """DPPO hyper-parameters (after DPPO's Gym settings, scaled to small CPUs).

    The clip range, exploration floor and actor rate are wider than the paper's (clip
    0.001 -> 0.01, floor 0.1, lr 1e-4), which go with far larger rollouts per update:
    with those, hopper did not move from its BC return in 1M env steps; with these,
    from the same kind of start, hopper went from 662 to 1 477 and halfcheetah from 592
    to 1 278 (means of 3 seeds, 1M steps, docs/benchmarks_dppo.md). Per-task changes
    live in training.presets.DPPO_PRESETS (halfcheetah: twice the clip range, 1 842).

    num_steps: env steps per env per rollout; num_epochs x num_minibatches updates.
    ft_steps: K', the fine-tuned last steps of the chain (<= policy sample_steps).
    eta: DDIM eta of the chain while fine-tuning (None: the policy's); min_std: the std
        floor of every denoising step, for sampling and for the log-probabilities.
    denoising_gamma: gamma_d of the per-step weights gamma_d^(N-1-k).
    clip / clip_base / clip_rate: the clip range at the last step, at the noisiest
        fine-tuned step, and the exponential rate of the growth between them:
        eps_i = base + (clip - base) * (exp(rate * i/(K'-1)) - 1) / (exp(rate) - 1).
    logprob_reduce: how a chunk position's log-probability is formed from its action
        dimensions: "sum" (the exact log-density) or "mean" (per-dimension average, as
        DPPO does, which keeps the ratio's scale independent of the action size).
    actor_lr / critic_lr: learning rates of the two parameter groups.
    bc_coef: weight of the behaviour-cloning term (0: off).
    target_kl: stop the epoch loop when a minibatch's approx_kl exceeds it (None: never).
    loss: policy-loss preset of the core (clip ranges replaced by the above).
    """

    num_steps: int = 64
    num_epochs: int = 8
    num_minibatches: int = 4
    gamma: float = 0.99
    lam: float = 0.95
    ft_steps: int = 5
    eta: float | None = None
    min_std: float = 0.2
    denoising_gamma: float = 0.99
    clip: float = 0.1
    clip_base: float = 0.01
    clip_rate: float = 3.0
    logprob_reduce: str = "mean"
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    value_coef: float = 0.5
    value_clip: float | None = None
    value_normalization: bool = True
    normalize_advantages: bool = True
    bc_coef: float = 0.0
    max_grad_norm: float | None = 1.0
    target_kl: float | None = None
    loss: str = "ppo"
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"DPPOConfig.{name} {why}, got {getattr(self, name)!r}")

        for name in ("num_steps", "num_epochs", "num_minibatches", "ft_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, "must be an integer >= 1")
        for name in (
            "gamma",
            "lam",
            "min_std",
            "denoising_gamma",
            "clip",
            "clip_base",
            "clip_rate",
            "actor_lr",
            "critic_lr",
            "value_coef",
            "bc_coef",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        for name in ("gamma", "lam", "denoising_gamma"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        if self.min_std <= 0:
            raise bad("min_std", "must be > 0 (the log-probabilities need a std floor)")
        if not 0.0 < self.clip < 1.0:
            raise bad("clip", "must be in (0, 1)")
        if not 0.0 < self.clip_base <= self.clip:
            raise bad("clip_base", f"must be in (0, clip={self.clip}]")
        if self.clip_rate <= 0:
            raise bad("clip_rate", "must be > 0")
        for name in ("actor_lr", "critic_lr"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("value_coef", "bc_coef"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.eta is not None and not (math.isfinite(self.eta) and 0.0 <= self.eta <= 1.0):
            raise bad("eta", "must be None or in [0, 1]")
        for name in ("value_clip", "max_grad_norm", "target_kl"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise bad(name, "must be None or a positive number")
        if self.logprob_reduce not in REDUCTIONS:
            raise bad("logprob_reduce", f"must be one of {list(REDUCTIONS)}")
        if self.loss not in POLICY_LOSS_PRESETS:
            raise bad("loss", f"must name a preset in {sorted(POLICY_LOSS_PRESETS)}")
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


class ChunkRolloutStorage:
    """One rollout: per env step (rows [T, N]) and per sampled chunk (a table of C entries).

    Rows: observations, values, rewards, terminations, bootstrap values, and which chunk
    (index into the table) and which position in it the executed action came from.
    Chunks: the conditioning observation, the fine-tuned part of the chain
    [K'+1, Tp, A] and its log-probabilities [K', Tp] (reduced over action dimensions).
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        policy_obs_size: int,
        ft_steps: int,
        horizon: int,
        action_size: int,
        device: torch.device,
    ) -> None:
        t, n = num_steps, num_envs
        self.num_steps, self.num_envs, self.device = t, n, device
        z = dict(device=device)
        self.obs = {k: torch.zeros(t, n, int(s), **z) for k, s in obs_sizes.items()}
        self.values = torch.zeros(t, n, **z)
        self.rewards = torch.zeros(t, n, **z)
        self.terminated = torch.zeros(t, n, dtype=torch.bool, **z)
        self.dones = torch.zeros(t, n, dtype=torch.bool, **z)
        self.next_values = torch.zeros(t, n, **z)
        self.chunk_index = torch.zeros(t, n, dtype=torch.long, **z)
        self.position = torch.zeros(t, n, dtype=torch.long, **z)
        cap = t * n
        self.chunk_obs = torch.zeros(cap, policy_obs_size, **z)
        self.chunk_chain = torch.zeros(cap, ft_steps + 1, horizon, action_size, **z)
        self.chunk_logp = torch.zeros(cap, ft_steps, horizon, **z)
        self.step = 0
        self.num_chunks = 0

    @property
    def is_full(self) -> bool:
        return self.step >= self.num_steps

    def clear(self) -> None:
        self.step = 0
        self.num_chunks = 0

    def add_chunks(
        self, obs: torch.Tensor, chain: torch.Tensor, logp: torch.Tensor
    ) -> torch.Tensor:
        n = obs.shape[0]
        start = self.num_chunks
        if start + n > self.chunk_obs.shape[0]:
            raise RuntimeError(
                "chunk table is full; a rollout samples at most one chunk per env step"
            )
        sl = slice(start, start + n)
        self.chunk_obs[sl] = obs
        self.chunk_chain[sl] = chain
        self.chunk_logp[sl] = logp
        self.num_chunks += n
        return torch.arange(start, start + n, device=self.device)

    def add_row(
        self,
        obs: Mapping[str, torch.Tensor],
        values: torch.Tensor,
        chunk_index: torch.Tensor,
        position: torch.Tensor,
    ) -> None:
        if self.is_full:
            raise RuntimeError(f"rollout storage is full ({self.num_steps} steps)")
        t = self.step
        for k, buf in self.obs.items():
            if k not in obs:
                raise KeyError(f"observation group {k!r} missing; got {sorted(obs)}")
            buf[t] = obs[k]
        self.values[t] = values
        self.chunk_index[t] = chunk_index
        self.position[t] = position

    def add_env_step(
        self, rewards: torch.Tensor, terminated: torch.Tensor, dones: torch.Tensor, next_values
    ) -> None:
        t = self.step
        self.rewards[t] = rewards
        self.terminated[t] = terminated
        self.dones[t] = dones
        self.next_values[t] = next_values
        self.step += 1


class DPPO:
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
        self.value_normalizer = (
            ValueNormalizer().to(self.device) if cfg.value_normalization else None
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
        self.generator = torch.Generator().manual_seed(cfg.seed)
        n = self.num_envs
        self.position = torch.zeros(n, dtype=torch.long, device=self.device)
        self.current_chunk = torch.zeros(n, dtype=torch.long, device=self.device)
        self.chunk_actions = torch.zeros(n, self.act_steps, self.action_size, device=self.device)
        self.num_updates = 0
        self.skipped_steps = 0

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
        values = self.policy.value(obs)
        if self.value_normalizer is not None:
            values = self.value_normalizer.denormalize(values)
        st.add_row(obs, values, self.current_chunk, self.position)
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
        final = next_obs
        if info is not None and info.get("final_obs") is not None:
            final = info["final_obs"]
        next_values = self.policy.value(final)
        if self.value_normalizer is not None:
            next_values = self.value_normalizer.denormalize(next_values)
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
        cfg = self.cfg
        st = self.storage
        if not st.is_full:
            raise RuntimeError(
                f"DPPO.update needs a full rollout: {st.step} of {cfg.num_steps} steps"
            )
        adv, returns = gae(
            st.rewards, st.values, st.next_values, st.terminated, st.dones, cfg.gamma, cfg.lam
        )
        if self.value_normalizer is not None:
            self.value_normalizer.update(returns)
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        adv_c, mask_c = self._credit(adv)
        c = st.num_chunks
        rows = cfg.num_steps * self.num_envs
        flat_obs = {k: v.reshape(rows, -1) for k, v in st.obs.items()}
        flat_ret = returns.reshape(-1)
        flat_val = st.values.reshape(-1)
        k_ft = cfg.ft_steps
        m = cfg.num_minibatches
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
        for _ in range(cfg.num_epochs):
            chunk_perm = torch.randperm(c, generator=self.generator).to(self.device)
            row_perm = torch.randperm(rows, generator=self.generator).to(self.device)
            for cb, rb in zip(chunk_perm.chunk(m), row_perm.chunk(m)):
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
                mb_obs = {k: v[rb] for k, v in flat_obs.items()}
                v = self.policy.value(mb_obs)
                target = flat_ret[rb]
                old_v = flat_val[rb]
                if self.value_normalizer is not None:
                    target = self.value_normalizer.normalize(target)
                    old_v = self.value_normalizer.normalize(old_v)
                vl = value_loss(v, old_v, target, clip_eps=cfg.value_clip)
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
                max_norm = math.inf if cfg.max_grad_norm is None else cfg.max_grad_norm
                norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm, foreach=True)
                vals = [
                    float(pstats["policy_loss"]),
                    float(vl.detach()),
                    float(bc.detach()),
                    float(pstats["approx_kl"]),
                    float(pstats["clip_frac"]),
                    float(pstats["ratio_max"]),
                    float(norm),
                ]
                if not all(math.isfinite(x) for x in vals) or not bool(torch.isfinite(loss)):
                    self.optimizer.zero_grad(set_to_none=True)
                    self.skipped_steps += 1
                    continue
                self.optimizer.step()
                for name, x in zip(names, vals):
                    sums[name] += x
                steps += 1
                if kl_early_stop(vals[3], cfg.target_kl):
                    early = True
                    break
            if early:
                break
        self.policy.update_critic_normalizer(st.obs)
        executed = float(mask_c.sum()) / max(c * self.act_steps, 1)
        stats = {k: s / max(steps, 1) for k, s in sums.items()}
        stats.update(
            minibatch_steps=float(steps),
            early_stopped=float(early),
            skipped_steps_total=float(self.skipped_steps),
            chunks=float(c),
            executed_fraction=executed,
            returns_mean=float(returns.mean()),
            values_mean=float(st.values.mean()),
            actor_lr=self.optimizer.param_groups[0]["lr"],
        )
        st.clear()
        self.num_updates += 1
        return stats

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "value_normalizer": None
            if self.value_normalizer is None
            else self.value_normalizer.state_dict(),
            "generator": self.generator.get_state(),
            "num_updates": self.num_updates,
            "skipped_steps": self.skipped_steps,
            "config": dataclasses.asdict(self.cfg),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.value_normalizer is not None:
            if state["value_normalizer"] is None:
                raise ValueError("checkpoint has no value normalizer; value_normalization is on")
            self.value_normalizer.load_state_dict(state["value_normalizer"])
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        self.skipped_steps = int(state["skipped_steps"])
        self.storage.clear()
