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
from dataclasses import dataclass

import torch

from policies.chunked import REDUCTIONS, reduce_last
from policies.diffusion import DiffusionPolicy
from training.algorithms.base import OnPolicyConfig
from training.algorithms.chunks import ChunkLearner, ChunkMinibatch, FineTuning
from training.core import PolicyLossConfig, get_loss_config, policy_loss


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


class DPPO(ChunkLearner):
    """The DPPO learner: denoising-chain chunks, storage, the update through the core.

    policy: a DiffusionPolicy (fine-tuning is enabled here with cfg.ft_steps). obs_sizes:
    the observation groups to store (the critic may read "critic"). The observation
    normalizer stays as pretrained.
    """

    cfg: DPPOConfig
    policy: DiffusionPolicy

    stat_names = ("policy_loss", "value_loss", "bc_loss", "approx_kl", "clip_frac", "ratio_max")

    def _prepare(self) -> FineTuning:
        """The trainable copy for the chain's last K' steps, their weights and clip scales."""
        cfg, policy = self.cfg, self.policy
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
        ks = range(self.start, n_steps)
        # denoising discount gamma_d^(N-1-k): the last step weighs 1, noisier steps less
        self.weights = torch.tensor(
            [cfg.denoising_gamma ** (n_steps - 1 - k) for k in ks], device=self.device
        ).view(1, -1)
        self.clip_scale = torch.tensor(
            [e / cfg.clip for e in cfg.clip_schedule()], device=self.device
        ).view(1, -1)
        # the storage keeps the fine-tuned part of each chain; the normalizer stays as BC
        # left it
        return FineTuning(policy.actor_parameters(), cfg.ft_steps, update_obs_normalizer=False)

    # ------------------------------------------------------------------ log-probs
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
        return reduce_last(lp, self.cfg.logprob_reduce)

    # ------------------------------------------------------------------ acting
    def _new_chunks(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.policy.sample(obs, chain=self.chain, min_std=self.cfg.min_std, return_chain=True)
        assert s.chain is not None
        chain_ft = s.chain[:, self.start :]
        ids = self.storage.add_chunks(obs, chain_ft, self.chunk_log_prob(obs, chain_ft))
        return s.actions, ids

    # ------------------------------------------------------------------ update
    def _loss(self, mb: ChunkMinibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Policy loss over the executed positions and fine-tuned steps, value loss, and
        the BC term when bc_coef > 0."""
        cfg, st, k_ft, cb = self.cfg, self.storage, self.cfg.ft_steps, mb.chunks
        new = self.chunk_log_prob(st.chunk_obs[cb], st.chunk_chain[cb])
        old = st.chunk_logp[cb]
        # rows: one per (chunk, position); columns: the K' fine-tuned steps
        new_r = new.permute(0, 2, 1).reshape(-1, k_ft)
        old_r = old.permute(0, 2, 1).reshape(-1, k_ft)
        mask = mb.mask.reshape(-1, 1).expand(-1, k_ft)
        pl, pstats = policy_loss(
            new_r,
            old_r,
            mb.adv.reshape(-1),
            self.loss_cfg,
            mask=mask,
            weights=self.weights,
            clip_scale=self.clip_scale,
        )
        vl = self._value_loss(self.policy.value(mb.obs), mb.old_values, mb.returns)
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
        return loss, {**pstats, "value_loss": vl, "bc_loss": bc}
