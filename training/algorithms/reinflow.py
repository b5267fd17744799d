"""ReinFlow: policy-gradient fine-tuning of a flow policy through its noisy Euler chain.

ReinFlow (Zhang et al. 2025) makes a flow policy's K-step Euler sampler stochastic with a
learned noise network: after every step, ``x_{k+1} ~ N(x_k + v(x_k, t_k) / K,
sigma_phi(x_k, t_k, obs)^2)`` with sigma bounded in [noise_min, noise_max]
(:mod:`policies.flow`). Every step is then a Gaussian policy of an inner MDP and a stored
chain has an exact log-likelihood, so PPO applies step by step, as in DPPO. Here:

- Elements of the core's loss: rows are env-step samples, columns the K Euler steps.
  The per-step Gaussian factorizes over the chunk's positions, so the row of env step t
  holds, for each step, the log-probability of the chunk position that was executed at
  t; positions never executed (beyond ``act_steps``, or cut short by an episode's end)
  belong to no row (:func:`training.algorithms.chunks.credit_chunks`). Every step of a
  row gets its env step's advantage (no per-step weights: with 1 to 4 steps every step
  matters alike).
- Advantages: GAE over env steps with time-outs bootstrapped from the true final
  observation; a critic on observations (asymmetric if the policy has one).
- What trains: the velocity network (``train_velocity``), the noise network and the
  critic; the observation normalizer stays as pretrained. An optional entropy bonus on
  the per-step Gaussians (the core's ``entropy`` term) keeps the noise from collapsing.
- One optimizer (Adam) with two rates: the actor networks and the critic; the guarded
  step of the core (non-finite steps are skipped, never rolled back).

Acting with chunks, the env-step bookkeeping, crediting and the epoch loop are
:class:`training.algorithms.chunks.ChunkLearner`'s, shared with DPPO and FPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policies.chunked import REDUCTIONS
from policies.flow import FlowPolicy
from training.algorithms.chunks import (
    ChunkLearner,
    ChunkMinibatch,
    FineTuning,
    FlowLearnerConfig,
    credit_chunks,
)
from training.core import PolicyLossConfig, get_loss_config, policy_loss

# ChunkLearner and credit_chunks lived here before training.algorithms.chunks
__all__ = ["ChunkLearner", "ReinFlow", "ReinFlowConfig", "credit_chunks"]


@dataclass
class ReinFlowConfig(FlowLearnerConfig):
    """ReinFlow: rollout, the noisy Euler chain (ReinFlow uses 1 to 4 flow_steps),
    clipping, rates, value loss.

    The defaults of the rate, the epochs, the noise bounds and the entropy bonus were
    measured on the flow benchmark (halfcheetah and hopper from flow BC, 250k steps,
    seed 0; docs/benchmarks_flow.md "ReinFlow's step size"): with DPPO's rate (3e-4, 8
    epochs) and the policy's bounds (0.05-0.2) the noise network fell to its floor
    within 30k steps, the clip cut 42% of the ratios, and halfcheetah ended at 1 115
    against 2 136 with these (hopper 625 against 1 093). ReinFlow's paper takes the same
    direction on hopper: bounds 0.10-0.24, an entropy bonus, a small actor rate.
    """

    num_epochs: int = 4
    """Passes over each rollout (4 against 8 at 3e-5 gave 2 136 against 1 857 on
    halfcheetah, in two thirds of the time)."""
    actor_lr: float = 6e-5
    """Learning rate of the velocity and noise networks (3e-4: 1 115, 1e-4: 1 393 with 8
    epochs and the policy's bounds; 1e-4: 1 952 with 4 epochs and these bounds)."""
    clip: float = 0.1
    noise_min: float | None = 0.1
    """Lower bound of the noise network's std (normalized action units; None: the
    policy's); a floor keeps the log-probabilities finite and the policy exploring."""
    noise_max: float | None = 0.24
    """Upper bound of the noise network's std (None: the policy's)."""
    logprob_reduce: str = "mean"
    """A chunk position's log-probability from its action dimensions: "sum" (the exact
    log-density) or "mean" (per-dimension average, as DPPO does, which keeps the ratio's
    scale independent of the action size)."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus of the per-step Gaussians (0: off). Without it the
    noise network shrinks to its floor; 0.03 (the paper's) pins it at the ceiling."""
    train_velocity: bool = True
    """Fine-tune the velocity network; False: only the noise network (and the critic)."""

    def __post_init__(self) -> None:
        check = self.check_flow()
        check.finite("entropy_coef")
        check.nonnegative("entropy_coef")
        check.one_of("logprob_reduce", REDUCTIONS)
        check.positive_or_none("noise_min", "noise_max")
        if (
            self.noise_min is not None
            and self.noise_max is not None
            and self.noise_max < self.noise_min
        ):
            raise check.fail("noise_max", f"must be >= noise_min ({self.noise_min})")
        self.loss_config()

    def loss_config(self) -> PolicyLossConfig:
        return get_loss_config(
            self.loss, eps_low=self.clip, eps_high=self.clip, entropy_coef=self.entropy_coef
        )


class ReinFlow(ChunkLearner):
    """The ReinFlow learner: noisy-chain chunks, storage, the update through the core.

    policy: a FlowPolicy (fine-tuning is enabled here: the chain's steps are fixed, the
    noise bounds set). obs_sizes: the observation groups to store (the critic may read
    "critic").
    """

    cfg: ReinFlowConfig
    policy: FlowPolicy

    stat_names = (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",
        "ratio_max",
        "noise_std",
    )

    def _prepare(self) -> FineTuning:
        """The noise bounds, the chain's Euler steps, which actor networks train."""
        cfg, policy = self.cfg, self.policy
        lo, hi = (float(v) for v in policy.noise_bounds)
        policy.set_noise_bounds(
            lo if cfg.noise_min is None else cfg.noise_min,
            hi if cfg.noise_max is None else cfg.noise_max,
        )
        actor_params = policy.enable_finetuning(cfg.flow_steps, velocity=cfg.train_velocity)
        self.steps = policy.steps
        return FineTuning(actor_params, self.steps, cfg.update_obs_normalizer)

    # ------------------------------------------------------------------ log-probs
    def chunk_log_prob(self, obs: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """[C, K, Tp] log-probabilities of stored chains (cfg.logprob_reduce), with gradient."""
        return self.policy.chain_log_prob(obs, chain, self.cfg.logprob_reduce)

    def _new_chunks(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.policy.sample(
            obs, self.steps, generator=self.generator, stochastic=True, return_chain=True
        )
        assert s.chain is not None
        ids = self.storage.add_chunks(obs, s.chain, self.chunk_log_prob(obs, s.chain))
        return s.actions, ids

    # ------------------------------------------------------------------ update
    def _loss(self, mb: ChunkMinibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, st, k, cb = self.cfg, self.storage, self.steps, mb.chunks
        terms = self.policy.chain_terms(st.chunk_obs[cb], st.chunk_chain[cb], cfg.logprob_reduce)
        # rows: one per (chunk, position); columns: the K Euler steps
        new_r = terms.log_prob.permute(0, 2, 1).reshape(-1, k)
        old_r = st.chunk_logp[cb].permute(0, 2, 1).reshape(-1, k)
        ent_r = terms.entropy.permute(0, 2, 1).reshape(-1, k)
        mask = mb.mask.reshape(-1, 1).expand(-1, k)
        pl, pstats = policy_loss(
            new_r, old_r, mb.adv.reshape(-1), self.loss_cfg, mask=mask, entropy=ent_r
        )
        vl = self._value_loss(self.policy.value(mb.obs), mb.old_values, mb.returns)
        loss = pl + cfg.value_coef * vl  # the entropy bonus is inside pl
        return loss, {**pstats, "value_loss": vl, "noise_std": terms.std.detach().mean()}
