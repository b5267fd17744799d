"""FPO: flow policy optimization with a flow-matching likelihood ratio.

Flow Policy Optimization (McAllister et al. 2025) needs no likelihood of a sampled chunk.
Its ratio replaces log(p_new / p_old) of a chunk x1 by a difference of conditional
flow-matching losses, estimated with the same draws under both parameters::

    L(theta) = 1/N sum_i l_theta(tau_i, eps_i),   l = reduce_chunk (v_theta(x_tau, tau) - (x1 - eps))^2
    log r = L_old - L_new,   x_tau = (1 - tau) eps + tau x1

(:meth:`policies.flow.FlowPolicy.cfm_loss`; a lower loss is a higher ELBO). Here:

- Acting: the flow's own sampler, Euler with ``flow_steps`` steps from x0 ~ N(0, I)
  (the randomness of x0 is the exploration, as in the paper), optionally plus Gaussian
  noise of std ``explore_std`` on the sampled chunk (off by default). The stored x1 is
  the chunk as sampled (before clipping to the action bounds): the flow's own sample,
  whose loss the ratio compares.
- N (tau, eps) pairs per sampled chunk (tau ~ U[0, 1], eps ~ N(0, I)) are drawn once,
  when the chunk is sampled, and stored with L_cfm under the acting parameters; every
  epoch recomputes L_cfm under the current parameters with the same draws, so the
  ratio is 1 before the first step (to the bit on the CPU: tests/test_fpo.py).
- Granularity (``ratio``): one ratio per chunk, from the mean over its N pairs inside
  the exponent (the paper), or one per pair, each clipped on its own (FPO++, Yi et al.
  2026), so that a pair whose loss moved far stops pulling while the others go on.
- Crediting: the core's elements are the executed env steps. The row of env step t
  holds the ratio of the chunk it executed and t's advantage, so a chunk is credited
  once per executed position (never for positions it did not execute); with the
  token-mean aggregation this weighs a chunk by its executed count, and each env step
  keeps its own advantage sign inside the clip.
- Shortcut models: the ratio moves the instantaneous velocity (d = 0); a few-step
  shortcut sampler follows only through the self-consistency term on the rollout's
  own chunks (``consistency_coef``), which chains every step size back to d = 0. Its
  targets come from a frozen copy of the rollout's parameters: taken from the network
  being trained, they chased its outputs and FPO from scratch diverged.
- Critic on observations, GAE with time-out bootstrap, value loss and the guarded step
  as DPPO; the loss is the core's ``policy_loss`` with ``log_ratio``.

Works from scratch (random networks: the first samples are about N(0, I), clipped) as
well as from a flow BC start; from scratch the observation normalizer learns from the
rollouts (:class:`training.algorithms.chunks.ChunkLearner`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from policies.chunked import REDUCTIONS
from policies.flow import FlowPolicy
from training.algorithms.chunks import (
    ChunkLearner,
    ChunkMinibatch,
    FineTuning,
    FlowLearnerConfig,
    from_scratch,
)
from training.core import PolicyLossConfig, get_loss_config, policy_loss

__all__ = ["FPO", "FPOConfig", "RATIO_GRANULARITIES"]

RATIO_GRANULARITIES = ("chunk", "draw")


@dataclass
class FPOConfig(FlowLearnerConfig):
    """FPO: rollout, the sampler, the flow-matching draws, clipping, rates, value loss."""

    clip: float = 0.05
    """Ratio clip range (the paper's FPO clips more tightly than PPO); SPO's eps."""
    loss: str = "spo"
    """Policy-loss preset of the core. SPO (r A - |A| (r - 1)^2 / (2 eps)) pulls every
    ratio back toward 1 instead of cutting its gradient off beyond the clip: with PPO's
    clip, FPO from scratch on halfcheetah (seed 0) saw ratios of 44 at 83k steps and 6e7
    at 103k and never recovered (every later step non-finite), with dual clipping 1.5e7
    at 83k; with SPO the same run kept KL at 4-6e-4 and ratios under 1.1 to 131k steps
    and went on learning. (FPO++, Yi et al. 2026, takes SPO for
    negative advantages for the same reason.) "ppo" gives the paper's objective."""
    ratio: str = "chunk"
    """"chunk": one ratio per sampled chunk, exp of the mean over its N draws of
    L_old - L_new (the paper); "draw": one ratio per (tau, eps) draw, each in the
    objective and its clip on its own (FPO++), the policy term averaged over the draws."""
    num_draws: int = 8
    """N, the (tau, eps) pairs per sampled chunk that estimate its flow-matching loss."""
    cfm_reduce: str = "mean"
    """A draw's loss from the chunk's dimensions: "mean" (keeps the ratio's scale
    independent of horizon and action size) or "sum" (the squared norm)."""
    explore_std: float = 0.0
    """Std of Gaussian noise added to each sampled chunk (normalized action units) for
    exploration beyond the sampler's own x0 ~ N(0, I) (0: none, as the paper)."""
    clip_chunks: bool | None = None
    """Learn from the chunk as executed, clipped to the action bounds ([-1, 1] normalized),
    instead of the sampler's raw end x1 (None: clipped from scratch, i.e. when the
    policy's normalizer has seen no data; raw from a pretrained start). Beyond the bounds
    every x1 acts alike, so nothing holds it there: in FPO from scratch (1M steps,
    2026-12-05) 60-70% of the entries of x1 lay outside [-1, 1], their largest grew from 7
    to 75 (hopper seed 1, 40k to 290k steps), the flow-matching losses of such chunks
    with them, until one minibatch step moved a chunk's loss by 16 (a ratio of 1.5e7)
    and the run diverged (hopper seed 1 at 300k, halfcheetah seed 1 at 700k); clipped,
    both reran to 1M (1 039, 1 732). From flow BC no run diverged raw (6 of 6 at 1M);
    clipped, hopper seed 0 slowed (861 against 1 491 raw) and halfcheetah seed 0
    diverged at 800k through a runaway of the self-consistency term (0.1 -> 2e4 in 15
    updates; its targets are bounded since, FlowPolicy.consistency_target), hence raw
    there."""
    max_log_ratio: float | None = 0.5
    """Rows whose |log r| exceeds this take no part in the policy loss (their gradient is
    dropped, as PPO's clip drops it beyond its range; `fpo/outlier_frac` counts them).
    SPO pulls a runaway ratio back with a gradient that grows with r**2 and no cut: in
    FPO from scratch with one action per chunk (hopper seed 2, 2026-12-06) ratios left
    1.5 at 460k steps where the healthy seed 1 never passed 1.3 in 1M, a few rows at
    ratios of 1e2-1e8 then set each minibatch's direction (gradient norms 1e8-1e18 before
    clipping) and the return fell from 1 700 to 72 by 1M. None: every row counts."""
    consistency_coef: float = 1.0
    """Weight of the shortcut self-consistency term on the rollout's chunks, which keeps a
    few-step shortcut sampler in step with the fine-tuned velocity (no effect on a plain
    flow-matching policy)."""

    def __post_init__(self) -> None:
        check = self.check_flow()
        check.ints("num_draws")
        check.finite("explore_std", "consistency_coef")
        check.positive_or_none("max_log_ratio")
        check.nonnegative("explore_std", "consistency_coef")
        check.one_of("cfm_reduce", REDUCTIONS)
        check.one_of("ratio", RATIO_GRANULARITIES)
        self.loss_config()

    def loss_config(self) -> PolicyLossConfig:
        return get_loss_config(self.loss, eps_low=self.clip, eps_high=self.clip)


class FPO(ChunkLearner):
    """The FPO learner: chunks from the flow sampler, stored draws, the ratio of losses.

    policy: a FlowPolicy (pretrained or not); its velocity network and the critic train,
    the noise network stays frozen. obs_sizes: the observation groups to store.
    """

    cfg: FPOConfig
    policy: FlowPolicy

    stat_names = (
        "policy_loss",
        "value_loss",
        "consistency_loss",
        "cfm_loss",
        "approx_kl",
        "clip_frac",
        "ratio_max",
        "outlier_frac",
    )

    def _prepare(self) -> FineTuning:
        """The sampler's Euler steps, the velocity network trains; room for the draws."""
        cfg = self.cfg
        actor_params = self.policy.enable_finetuning(cfg.flow_steps, velocity=True, noise=False)
        self.steps = self.policy.steps
        cap = cfg.num_steps * self.num_envs
        n = cfg.num_draws
        z = dict(device=self.device)
        self.tau = torch.zeros(cap, n, **z)
        self.eps = torch.zeros(cap, n, self.horizon, self.action_size, **z)
        self.loss_old = torch.zeros(cap, n, **z)
        self._teacher: FlowPolicy | None = None  # set for the length of an update
        clip = cfg.clip_chunks
        self.clip_chunks = bool(from_scratch(self.policy) if clip is None else clip)
        # the chunk table keeps x1 (a "chain" of one state); the draws live beside it
        return FineTuning(actor_params, 0, cfg.update_obs_normalizer)

    # ------------------------------------------------------------------ acting
    def _new_chunks(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, pol = self.cfg, self.policy
        s = pol.sample(
            obs, self.steps, generator=self.generator, stochastic=False, return_chain=True
        )
        assert s.chain is not None
        x1 = s.chain[:, -1]
        n = obs.shape[0]
        if cfg.explore_std > 0:
            noise = torch.randn(x1.shape, generator=self.generator).to(x1.device)
            x1 = x1 + cfg.explore_std * noise
        if self.clip_chunks:
            x1 = x1.clamp(-1.0, 1.0)
        tau = torch.rand(n, cfg.num_draws, generator=self.generator).to(x1.device)
        eps = torch.randn(n, cfg.num_draws, *x1.shape[1:], generator=self.generator)
        eps = eps.to(x1.device)
        loss = pol.cfm_loss(obs, x1, tau, eps, cfg.cfm_reduce)
        ids = self.storage.add_chunks(obs, x1.unsqueeze(1), x1.new_zeros(n, 0, self.horizon))
        self.tau[ids] = tau
        self.eps[ids] = eps
        self.loss_old[ids] = loss
        return pol.denormalize_actions(x1.clamp(-1.0, 1.0)), ids

    # ------------------------------------------------------------------ update
    def chunk_log_ratio(self, cb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log r [C], L_new [C, N]) of the stored chunks ``cb``: the mean over their N
        draws of L_old - L_new, with gradient through L_new."""
        per_draw, new = self._draw_log_ratios(cb)
        return per_draw.mean(-1), new

    def _draw_log_ratios(self, cb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L_old - L_new [C, N], L_new [C, N]) of the stored chunks ``cb``, per draw."""
        st = self.storage
        new = self.policy.cfm_loss(
            st.chunk_obs[cb], st.chunk_chain[cb, 0], self.tau[cb], self.eps[cb], self.cfg.cfm_reduce
        )
        return self.loss_old[cb] - new, new

    def policy_rows(
        self, cb: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The core's elements for chunks ``cb`` with advantages and executed-position
        mask [c, Tp]: (log-ratio, advantage, mask) flat, and L_new [c, N]. "chunk": one
        row per (chunk, position) with the chunk's ratio; "draw": one per (chunk,
        position, draw) with the draw's ratio; every (chunk, position) then has N rows,
        so the token mean weighs positions as "chunk" does."""
        per_draw, new = self._draw_log_ratios(cb)
        if self.cfg.ratio == "chunk":
            rows = per_draw.mean(-1).unsqueeze(-1).expand(-1, self.horizon)
            return rows.reshape(-1), adv.reshape(-1), mask.reshape(-1), new
        n = new.shape[1]
        rows = per_draw.unsqueeze(1).expand(-1, self.horizon, -1)
        adv_n = adv.unsqueeze(-1).expand(-1, -1, n)
        mask_n = mask.unsqueeze(-1).expand(-1, -1, n)
        return rows.reshape(-1), adv_n.reshape(-1), mask_n.reshape(-1), new

    def state_dict(self) -> dict[str, Any]:
        # the choice made at the start: a resumed run from scratch has a fitted
        # normalizer, which would otherwise read as a pretrained start
        return {**super().state_dict(), "clip_chunks": self.clip_chunks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.clip_chunks = bool(state.get("clip_chunks", self.clip_chunks))

    def update(self) -> dict[str, float]:
        # the self-consistency targets come from the rollout's parameters, frozen for the
        # update (FlowPolicy.consistency_loss says why)
        self._teacher = None
        if self.cfg.consistency_coef > 0 and self.policy.cfg.shortcut:
            self._teacher = copy.deepcopy(self.policy).requires_grad_(False)
        try:
            return super().update()
        finally:
            self._teacher = None

    def _loss(self, mb: ChunkMinibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, st, cb = self.cfg, self.storage, mb.chunks
        rows_lr, adv, mask, new = self.policy_rows(cb, mb.adv, mb.mask)
        outliers = torch.zeros((), device=self.device)
        if cfg.max_log_ratio is not None:
            wild = (mask > 0) & (rows_lr.detach().abs() > cfg.max_log_ratio)
            outliers = wild.sum() / (mask > 0).sum().clamp(min=1)
            mask = mask.masked_fill(wild, 0.0)
        pl, pstats = policy_loss(None, None, adv, self.loss_cfg, mask=mask, log_ratio=rows_lr)
        vl = self._value_loss(self.policy.value(mb.obs), mb.old_values, mb.returns)
        loss = pl + cfg.value_coef * vl
        sc = torch.zeros((), device=self.device)
        if cfg.consistency_coef > 0 and self.policy.cfg.shortcut:
            sc = self.policy.consistency_loss(
                st.chunk_obs[cb], st.chunk_chain[cb, 0], self.generator, self._teacher
            )
            loss = loss + cfg.consistency_coef * sc
        cfm = new.detach().mean()
        stats = {
            "value_loss": vl,
            "consistency_loss": sc,
            "cfm_loss": cfm,
            "outlier_frac": outliers,
        }
        return loss, {**pstats, **stats}

    def _extra_stats(self) -> dict[str, float]:
        c = self.storage.num_chunks
        lo = self.loss_old[:c]
        return {"cfm_loss_old": float(lo.mean()) if c else math.nan}
