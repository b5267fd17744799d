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
  belong to no row (:func:`credit_chunks`). Every step of a row gets its env step's
  advantage (no per-step weights: with 1 to 4 steps every step matters alike).
- Advantages: GAE over env steps with time-outs bootstrapped from the true final
  observation; a critic on observations (asymmetric if the policy has one).
- What trains: the velocity network (``train_velocity``), the noise network and the
  critic; the observation normalizer stays as pretrained. An optional entropy bonus on
  the per-step Gaussians (the core's ``entropy`` term) keeps the noise from collapsing.
- One optimizer (Adam) with two rates: the actor networks and the critic; the guarded
  step of the core (non-finite steps are skipped, never rolled back).

:class:`ChunkLearner` holds what every chunk-executing on-policy learner shares (acting
with chunks, the env-step bookkeeping, crediting, the epoch loop); FPO
(:mod:`training.algorithms.fpo`) subclasses it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from policies.flow import FlowPolicy, check_steps
from training.algorithms.base import OnPolicyConfig, OnPolicyLearnerState
from training.core import PolicyLossConfig, gae, get_loss_config, kl_early_stop, policy_loss
from training.storage import ChunkRolloutStorage

REDUCTIONS = ("mean", "sum")

__all__ = ["ChunkLearner", "ReinFlow", "ReinFlowConfig", "credit_chunks"]


def credit_chunks(
    storage: ChunkRolloutStorage, adv: torch.Tensor, horizon: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter env-step advantages [T, N] onto the chunk positions that executed them.

    Returns (advantages [C, horizon], mask [C, horizon]); positions never executed stay
    masked, so only the executed part of a chunk is credited, once per env step.
    """
    c = storage.num_chunks
    adv_c = torch.zeros(c, horizon, device=adv.device)
    mask_c = torch.zeros(c, horizon, device=adv.device)
    ci = storage.chunk_index.reshape(-1)
    pj = storage.position.reshape(-1)
    adv_c[ci, pj] = adv.reshape(-1).to(adv_c.dtype)
    mask_c[ci, pj] = 1.0
    return adv_c, mask_c


class ChunkLearner(OnPolicyLearnerState):
    """Acting with action chunks, env-step rows, crediting and the epoch loop.

    A subclass sets up ``cfg``, ``policy``, ``optimizer``, ``params``, ``storage`` (a
    ChunkRolloutStorage), ``horizon``, ``act_steps``, ``action_size``, ``num_envs`` and
    calls :meth:`_init_chunk_state`; it provides :meth:`_new_chunks` (sample chunks for
    some envs and store them) and :meth:`_minibatch_step`, and names its statistics in
    ``stat_names``.

    Observation normalizer (``fit_obs``): a policy pretrained by behaviour cloning keeps
    its statistics, so fine-tuning starts from exactly what was pretrained; a policy
    whose normalizer has seen nothing (training from scratch) folds each rollout in
    after the update, as PPO does (acting and re-evaluation of one rollout always use
    the same statistics). The choice is made once and kept in the learner's state.
    """

    storage: ChunkRolloutStorage
    stat_names: tuple[str, ...]
    horizon: int
    act_steps: int
    action_size: int
    num_envs: int

    def _init_chunk_state(self, update_obs_normalizer: bool | None) -> None:
        self._init_learner_state()
        n = self.num_envs
        self.position = torch.zeros(n, dtype=torch.long, device=self.device)
        self.current_chunk = torch.zeros(n, dtype=torch.long, device=self.device)
        self.chunk_actions = torch.zeros(n, self.act_steps, self.action_size, device=self.device)
        if update_obs_normalizer is None:
            count = getattr(self.policy.obs_normalizer, "count", None)
            update_obs_normalizer = count is not None and int(count) == 0
        self.fit_obs = bool(update_obs_normalizer)

    # ------------------------------------------------------------------ acting
    def _new_chunks(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample chunks for policy observations [n, O], store them; (actions [n, Tp, A]
        in env units, their ids in the storage's chunk table)."""
        raise NotImplementedError

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
            actions, ids = self._new_chunks(obs["policy"][idx])
            self.current_chunk[idx] = ids
            self.chunk_actions[idx] = actions[:, : self.act_steps]
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
    def _minibatch_step(
        self,
        cb: torch.Tensor,
        adv_c: torch.Tensor,
        mask_c: torch.Tensor,
        obs: dict[str, torch.Tensor],
        target: torch.Tensor,
        old_v: torch.Tensor,
    ) -> list[float] | None:
        """One guarded step on chunks ``cb`` and the env-step rows of ``obs``; the values
        of ``stat_names`` (then the grad norm), or None if the guard skipped it."""
        raise NotImplementedError

    def _extra_stats(self) -> dict[str, float]:
        """Rollout statistics of the subclass, read before the storage is cleared."""
        return {}

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
                f"{type(self).__name__}.update needs a full rollout: {st.step} of "
                f"{cfg.num_steps} steps"
            )
        adv, returns = gae(
            st.rewards, st.values, st.next_values, st.terminated, st.dones, cfg.gamma, cfg.lam
        )
        names = (*self.stat_names, "grad_norm")
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
            adv_c, mask_c = credit_chunks(st, adv, self.horizon)
            executed = float(mask_c.sum()) / max(c * self.act_steps, 1)
            rows = cfg.num_steps * self.num_envs
            flat_obs = {k: v.reshape(rows, -1) for k, v in st.obs.items()}
            flat_ret = returns.reshape(-1)
            flat_val = st.values.reshape(-1)
            m = cfg.num_minibatches
            kl_at = names.index("approx_kl")
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
                    if kl_early_stop(vals[kl_at], cfg.target_kl):
                        early = True
                        break
                if early:
                    break
        self.policy.update_critic_normalizer(st.obs)
        if self.fit_obs:
            # after the update: acting and re-evaluation used the same statistics
            self.policy.update_obs_normalizer(st.obs["policy"])
        stats = {k: s / max(steps, 1) for k, s in sums.items()}
        stats.update(self._extra_stats())
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

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy's weights (the runner stores those once)."""
        return {**self._learner_state(), "fit_obs": self.fit_obs}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_learner_state(state)
        self.fit_obs = bool(state.get("fit_obs", self.fit_obs))
        self.storage.clear()


@dataclass
class ReinFlowConfig(OnPolicyConfig):
    """ReinFlow: rollout, the noisy Euler chain, clipping, rates, value loss.

    Rollout, epochs, clip and rates follow this project's DPPO settings (the closest
    measured learner on the same tasks); not yet tuned on ReinFlow's own benchmark.
    """

    num_steps: int = 64
    num_epochs: int = 8
    clip: float = 0.1
    value_coef: float = 0.5
    value_clip: float | None = None
    value_normalization: bool = True
    flow_steps: int | None = None
    """Euler steps of the chain while fine-tuning, 1 to 10 (None: the policy's
    sample_steps); the policy keeps it for evaluation and export. ReinFlow uses 1 to 4."""
    noise_min: float | None = None
    """Lower bound of the noise network's std (normalized action units; None: the
    policy's); a floor keeps the log-probabilities finite and the policy exploring."""
    noise_max: float | None = None
    """Upper bound of the noise network's std (None: the policy's)."""
    logprob_reduce: str = "mean"
    """A chunk position's log-probability from its action dimensions: "sum" (the exact
    log-density) or "mean" (per-dimension average, as DPPO does, which keeps the ratio's
    scale independent of the action size)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus of the per-step Gaussians (0: off; the noise bounds
    already keep the policy exploring)."""
    train_velocity: bool = True
    """Fine-tune the velocity network; False: only the noise network (and the critic)."""
    actor_lr: float = 3e-4
    """Learning rate of the velocity and the noise network."""
    critic_lr: float = 1e-3
    """Learning rate of the critic."""
    update_obs_normalizer: bool | None = None
    """Fold each rollout's observations into the actor's normalizer after the update
    (None: only when the policy's normalizer has seen no data, i.e. from scratch)."""

    def __post_init__(self) -> None:
        check = self.check_common()
        check.finite("actor_lr", "critic_lr", "entropy_coef")
        check.positive("actor_lr", "critic_lr")
        check.nonnegative("entropy_coef")
        check.one_of("logprob_reduce", REDUCTIONS)
        if self.flow_steps is not None:
            check_steps(self.flow_steps, "ReinFlowConfig.flow_steps")
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

    stat_names = (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",
        "ratio_max",
        "noise_std",
    )

    def __init__(
        self,
        policy: FlowPolicy,
        cfg: ReinFlowConfig,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        pcfg = policy.cfg
        lo, hi = (float(v) for v in policy.noise_bounds)
        policy.set_noise_bounds(
            lo if cfg.noise_min is None else cfg.noise_min,
            hi if cfg.noise_max is None else cfg.noise_max,
        )
        actor_params = policy.enable_finetuning(cfg.flow_steps, velocity=cfg.train_velocity)
        self.steps = policy.steps
        self.num_envs = int(num_envs)
        self.horizon, self.act_steps = pcfg.horizon, pcfg.act_steps
        self.action_size = policy.action_size
        self.loss_cfg = cfg.loss_config()
        critic_params = list(policy.critic.parameters())
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
                f"ReinFlowConfig.num_minibatches ({cfg.num_minibatches}) exceeds the rollout "
                f"size ({cfg.num_steps} x {self.num_envs})"
            )
        self.storage = ChunkRolloutStorage(
            cfg.num_steps,
            self.num_envs,
            obs_sizes,
            policy.policy_obs_size,
            self.steps,
            self.horizon,
            self.action_size,
            self.device,
        )
        self._init_chunk_state(cfg.update_obs_normalizer)

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
    def _minibatch_step(
        self,
        cb: torch.Tensor,
        adv_c: torch.Tensor,
        mask_c: torch.Tensor,
        obs: dict[str, torch.Tensor],
        target: torch.Tensor,
        old_v: torch.Tensor,
    ) -> list[float] | None:
        cfg, st, k = self.cfg, self.storage, self.steps
        terms = self.policy.chain_terms(st.chunk_obs[cb], st.chunk_chain[cb], cfg.logprob_reduce)
        # rows: one per (chunk, position); columns: the K Euler steps
        new_r = terms.log_prob.permute(0, 2, 1).reshape(-1, k)
        old_r = st.chunk_logp[cb].permute(0, 2, 1).reshape(-1, k)
        ent_r = terms.entropy.permute(0, 2, 1).reshape(-1, k)
        mask = mask_c[cb].reshape(-1, 1).expand(-1, k)
        pl, pstats = policy_loss(
            new_r, old_r, adv_c[cb].reshape(-1), self.loss_cfg, mask=mask, entropy=ent_r
        )
        vl = self._value_loss(self.policy.value(obs), old_v, target)
        loss = pl + cfg.value_coef * vl  # the entropy bonus is inside pl
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats = [
            loss,
            pstats["policy_loss"],
            vl,
            pstats["entropy"],
            pstats["approx_kl"],
            pstats["clip_frac"],
            pstats["ratio_max"],
            terms.std.detach().mean(),
        ]
        values = self.guard.step(stats)
        return None if values is None else values[1:]
