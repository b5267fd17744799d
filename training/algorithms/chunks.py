"""What every on-policy learner of a chunk-executing policy shares (DPPO, ReinFlow, FPO).

A chunked generative policy samples a chunk of ``horizon`` actions and executes the first
``act_steps`` of them, one per env step. The learner keeps, per env, the chunk being
executed and the position in it; a storage row per env step records which chunk and
which position the executed action came from (:class:`training.storage.ChunkRolloutStorage`).

- Acting: envs at a chunk boundary (or whose episode just ended) get a new chunk from
  the subclass's :meth:`ChunkLearner._new_chunks`; a rollout starts every env on a fresh
  chunk, so no chunk spans two rollouts.
- Crediting (:func:`credit_chunks`): GAE advantages over env steps are scattered onto the
  chunk positions that executed them; positions never executed (beyond ``act_steps``,
  or cut short by an episode's end) stay masked, so only the executed part of a chunk
  is credited, once per env step.
- Update: the epoch/minibatch loop over chunks and env-step rows (one shuffle of each per
  epoch, from the learner's generator), KL early stop, statistics as means over the
  minibatch steps; each step is the core's guarded step on the loss of one
  :class:`ChunkMinibatch` (the subclass's :meth:`ChunkLearner._loss`).
- Construction: the optimizer (Adam, two rates: the actor and the critic), the storage
  and the learner state; the subclass's :meth:`ChunkLearner._prepare` says what trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from policies.chunked import ChunkPolicy
from policies.flow import check_steps
from training.algorithms.base import OnPolicyConfig, OnPolicyLearnerState
from training.core import gae, kl_early_stop
from training.storage import ChunkRolloutStorage

__all__ = [
    "ChunkLearner",
    "ChunkMinibatch",
    "FineTuning",
    "FlowLearnerConfig",
    "credit_chunks",
    "from_scratch",
]


@dataclass
class FlowLearnerConfig(OnPolicyConfig):
    """What the flow learners (ReinFlow, FPO) share: the rollout and value settings of
    this project's DPPO (the closest measured learner on the same tasks; not yet tuned on
    their own benchmarks), the chain's step count and the two learning rates."""

    num_steps: int = 64
    num_epochs: int = 8
    value_coef: float = 0.5
    value_clip: float | None = None
    value_normalization: bool = True
    flow_steps: int | None = None
    """Euler steps of the chain while fine-tuning, 1 to 10 (None: the policy's
    sample_steps); the policy keeps it for evaluation and export."""
    actor_lr: float = 3e-4
    """Learning rate of the trained actor networks."""
    critic_lr: float = 1e-3
    """Learning rate of the critic."""
    update_obs_normalizer: bool | None = None
    """Fold each rollout's observations into the actor's normalizer after the update
    (None: only when the policy's normalizer has seen no data, i.e. from scratch)."""

    def check_flow(self):
        """Validate the shared fields; the checker, for the subclass's own."""
        check = self.check_common()
        check.finite("actor_lr", "critic_lr")
        check.positive("actor_lr", "critic_lr")
        if self.flow_steps is not None:
            check_steps(self.flow_steps, f"{type(self).__name__}.flow_steps")
        return check


class FineTuning(NamedTuple):
    """What a chunk learner trains and stores (:meth:`ChunkLearner._prepare`)."""

    actor_params: list[torch.nn.Parameter]
    """The actor parameters that train (the learner adds the critic's)."""
    chain_steps: int
    """Transitions of each sampled chunk's chain that the storage keeps (0: the chunk)."""
    update_obs_normalizer: bool | None
    """Fold each rollout into the actor's observation normalizer after the update (None:
    only when the normalizer has seen no data, i.e. training from scratch)."""


class ChunkMinibatch(NamedTuple):
    """One minibatch of the update: chunks of the table and env-step rows, each drawn
    from its own shuffle."""

    chunks: torch.Tensor
    """Indices [c] of the minibatch's chunks in the storage's chunk table."""
    adv: torch.Tensor
    """Their advantages [c, Tp], credited to the executed positions."""
    mask: torch.Tensor
    """Which of their positions were executed [c, Tp] (1.0 / 0.0)."""
    obs: dict[str, torch.Tensor]
    """Observations of the minibatch's env-step rows, for the critic."""
    returns: torch.Tensor
    """The rows' value targets [r]."""
    old_values: torch.Tensor
    """The rows' values at acting time [r] (for the clipped value loss)."""


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


def from_scratch(policy: ChunkPolicy) -> bool:
    """Whether ``policy`` starts untrained: its observation normalizer has seen no data
    (a behaviour-cloned policy's has)."""
    count = getattr(policy.obs_normalizer, "count", None)
    return count is not None and int(count) == 0


class ChunkLearner(OnPolicyLearnerState):
    """Acting with action chunks, env-step rows, crediting and the epoch loop.

    policy: the chunked policy to train (moved to ``device``); cfg: the learner's config
    (an OnPolicyConfig with ``loss_config()``, ``actor_lr`` and ``critic_lr``);
    obs_sizes: the observation groups to store (the critic may read "critic").

    A subclass provides :meth:`_prepare` (make the policy ready to train, set up its own
    state), :meth:`_new_chunks` (sample chunks for some envs and store them) and
    :meth:`_loss` (a minibatch's loss and statistics), and names its statistics in
    ``stat_names`` (``approx_kl`` among them, for the early stop).

    Observation normalizer (``fit_obs``): a policy pretrained by behaviour cloning keeps
    its statistics, so fine-tuning starts from exactly what was pretrained; a policy
    whose normalizer has seen nothing (training from scratch) folds each rollout in
    after the update, as PPO does (acting and re-evaluation of one rollout always use
    the same statistics). The choice is made once and kept in the learner's state.
    """

    stat_names: tuple[str, ...]

    def __init__(
        self,
        policy: ChunkPolicy,
        cfg: Any,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        self.num_envs = int(num_envs)
        self.horizon, self.act_steps = policy.cfg.horizon, policy.cfg.act_steps
        self.action_size = policy.action_size
        tuning = self._prepare()
        self.loss_cfg = cfg.loss_config()
        actor_params = list(tuning.actor_params)
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
                f"{type(cfg).__name__}.num_minibatches ({cfg.num_minibatches}) exceeds the "
                f"rollout size ({cfg.num_steps} x {self.num_envs})"
            )
        self.storage = ChunkRolloutStorage(
            cfg.num_steps,
            self.num_envs,
            obs_sizes,
            policy.policy_obs_size,
            tuning.chain_steps,
            self.horizon,
            self.action_size,
            self.device,
        )
        self._init_learner_state()
        n = self.num_envs
        self.position = torch.zeros(n, dtype=torch.long, device=self.device)
        self.current_chunk = torch.zeros(n, dtype=torch.long, device=self.device)
        self.chunk_actions = torch.zeros(n, self.act_steps, self.action_size, device=self.device)
        fit = tuning.update_obs_normalizer
        self.fit_obs = bool(from_scratch(policy) if fit is None else fit)

    def _prepare(self) -> FineTuning:
        """Make ``self.policy`` ready to train (which networks train, the chain it runs)
        and set up the subclass's own state; ``cfg``, ``device``, ``num_envs`` and the
        chunk shapes are set. What trains and what the storage keeps."""
        raise NotImplementedError

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
        terminated, dones = self._ends(terminated, truncated, info)
        self.storage.add_env_step(reward, terminated, dones, next_values)
        pos = self.position + 1
        pos = torch.where((pos >= self.act_steps) | dones, torch.zeros_like(pos), pos)
        self.position.copy_(pos)

    # ------------------------------------------------------------------ update
    def _credit(self, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages [C, Tp], mask [C, Tp]) of this rollout's chunks (:func:`credit_chunks`)."""
        return credit_chunks(self.storage, adv, self.horizon)

    def _loss(self, mb: ChunkMinibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch's loss (with gradient) and scalar statistics by name, those of
        ``stat_names`` among them (the core's policy-loss statistics may come whole)."""
        raise NotImplementedError

    def _minibatch_step(self, mb: ChunkMinibatch) -> list[float] | None:
        """One guarded step on a minibatch; the values of ``stat_names`` (then the grad
        norm), or None if the guard skipped it."""
        loss, stats = self._loss(mb)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        values = self.guard.step([loss, *(stats[name] for name in self.stat_names)])
        return None if values is None else values[1:]

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
            adv_c, mask_c = self._credit(adv)
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
                    mb = ChunkMinibatch(
                        cb, adv_c[cb], mask_c[cb], mb_obs, flat_ret[rb], flat_val[rb]
                    )
                    vals = self._minibatch_step(mb)
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
