"""Preallocated on-policy rollout storages, time first: every tensor is [T, N, ...].

``RolloutStorage`` holds one action per env step (Gaussian policies); ``ChunkRolloutStorage``
holds env-step rows plus a table of sampled action chunks with their denoising or flow
chains (generative policies). ``bootstrap_values`` is the time-out rule both use.

Everything lives on the learner's device and is written in place, so a rollout costs
no allocation and no host-device copy per env step. Minibatches are drawn with a
torch.Generator of the learner's, so a run is reproducible from its seed and the
generator's state can go into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from training.core import gae


def bootstrap_values(
    value: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
    next_obs: Mapping[str, torch.Tensor],
    info: Mapping[str, Any] | None,
    denormalize: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """V of the true next observation, the bootstrap of GAE.

    For envs whose episode ended this step ``info["final_obs"]`` holds the real last
    observation (``next_obs`` is already the reset one), so a time-out bootstraps from
    where the episode really was; GAE drops the bootstrap of terminations itself.
    ``denormalize``: the value normalizer's, when the critic predicts normalized returns.
    """
    final = next_obs
    if info is not None and info.get("final_obs") is not None:
        final = info["final_obs"]
    values = value(final)
    return values if denormalize is None else denormalize(values)


@dataclass
class Batch:
    """One minibatch. Flat ([B, ...]) for MLP policies; [T, B, ...] env-wise for recurrent
    ones, with ``hidden`` the state at the rollout's start and ``dones`` the episode ends."""

    obs: dict[str, torch.Tensor]
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    hidden: tuple[torch.Tensor, ...] | None = None
    dones: torch.Tensor | None = None


class RolloutStorage:
    """One rollout of num_steps x num_envs transitions.

    Per step the learner calls ``add_action`` (what the policy did at obs_t) and then
    ``add_env_step`` (what the env answered), which advances the step counter.
    next_values[t] is V of the true next observation: the final observation for envs
    whose episode ended at t, so that time-outs bootstrap from it (GAE zeroes the
    bootstrap of terminations itself).

    hidden_shapes: shapes [L, N, H] of the policy's recurrent state tensors (None: MLP);
    the state at the rollout's first step is kept in ``hidden0``.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_sizes: Mapping[str, int],
        action_size: int,
        device: torch.device | str = "cpu",
        hidden_shapes: list[tuple[int, ...]] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"num_steps and num_envs must be >= 1, got {num_steps}, {num_envs}")
        if "policy" not in obs_sizes:
            raise ValueError(f"obs_sizes needs a 'policy' group, got {sorted(obs_sizes)}")
        self.num_steps = int(num_steps)
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.action_size = int(action_size)
        t, n = self.num_steps, self.num_envs

        def zeros(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros((t, n, *shape), dtype=dt, device=self.device)

        self.obs = {k: zeros(int(size)) for k, size in obs_sizes.items()}
        self.actions = zeros(self.action_size)
        self.log_probs = zeros()
        self.values = zeros()
        self.mean = zeros(self.action_size)
        self.std = zeros(self.action_size)
        self.rewards = zeros()
        # a probability (constraints as terminations); 1.0 for a real termination
        self.terminated = zeros()
        self.dones = zeros(dt=torch.bool)
        self.next_values = zeros()
        self.advantages = zeros()
        self.returns = zeros()
        self.hidden0: tuple[torch.Tensor, ...] | None = (
            None
            if hidden_shapes is None
            else tuple(torch.zeros(s, dtype=dtype, device=self.device) for s in hidden_shapes)
        )
        self.step = 0
        self._acted = False

    @property
    def is_recurrent(self) -> bool:
        return self.hidden0 is not None

    @property
    def is_full(self) -> bool:
        return self.step >= self.num_steps

    def clear(self) -> None:
        self.step = 0
        self._acted = False

    def set_hidden0(self, hidden: tuple[torch.Tensor, ...] | None) -> None:
        """Keep the recurrent state at the rollout's first step (None: zeros)."""
        if self.hidden0 is None:
            return
        for i, dst in enumerate(self.hidden0):
            if hidden is None:
                dst.zero_()
            else:
                dst.copy_(hidden[i])

    def add_action(
        self,
        obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
        mean: torch.Tensor,
        std: torch.Tensor,
    ) -> None:
        if self.is_full:
            raise RuntimeError(
                f"rollout storage is full ({self.num_steps} steps); run the update first"
            )
        if self._acted:
            raise RuntimeError("add_action twice without add_env_step in between")
        t = self.step
        for k, buf in self.obs.items():
            if k not in obs:
                raise KeyError(f"observation group {k!r} missing; got {sorted(obs)}")
            buf[t].copy_(obs[k])
        self.actions[t].copy_(actions)
        self.log_probs[t].copy_(log_probs)
        self.values[t].copy_(values)
        self.mean[t].copy_(mean)
        self.std[t].copy_(std)
        self._acted = True

    def add_env_step(
        self,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        dones: torch.Tensor,
        next_values: torch.Tensor,
    ) -> None:
        if not self._acted:
            raise RuntimeError("add_env_step before add_action for this step")
        t = self.step
        self.rewards[t].copy_(rewards)
        self.terminated[t].copy_(terminated)
        self.dones[t].copy_(dones)
        self.next_values[t].copy_(next_values)
        self._acted = False
        self.step += 1

    def compute_advantages(
        self, gamma: float, lam: float, normalize: bool = False, eps: float = 1e-8
    ) -> None:
        """GAE over the full rollout (via the core); optionally normalize advantages.

        Returns are kept unnormalized (they are the critic's targets).
        """
        if not self.is_full:
            raise RuntimeError(
                f"rollout incomplete: {self.step} of {self.num_steps} steps collected"
            )
        adv, ret = gae(
            self.rewards, self.values, self.next_values, self.terminated, self.dones, gamma, lam
        )
        self.returns.copy_(ret)
        if normalize:
            adv = (adv - adv.mean()) / (adv.std() + eps)
        self.advantages.copy_(adv)

    def minibatches(
        self,
        num_minibatches: int,
        generator: torch.Generator | None = None,
    ) -> Iterator[Batch]:
        """One epoch of minibatches, shuffled with ``generator`` (a CPU generator).

        MLP: transitions are shuffled over time and envs and flattened. Recurrent: envs
        are shuffled and each minibatch keeps whole rollouts of its envs, so the memory
        can be re-run from hidden0 through the episode boundaries.
        """
        if num_minibatches < 1:
            raise ValueError(f"num_minibatches must be >= 1, got {num_minibatches}")
        t, n = self.num_steps, self.num_envs
        if self.is_recurrent:
            if num_minibatches > n:
                raise ValueError(
                    f"recurrent minibatches split envs: num_minibatches ({num_minibatches}) "
                    f"must be <= num_envs ({n})"
                )
            perm = torch.randperm(n, generator=generator).to(self.device)
            for idx in perm.chunk(num_minibatches):
                assert self.hidden0 is not None
                yield Batch(
                    obs={k: v[:, idx] for k, v in self.obs.items()},
                    actions=self.actions[:, idx],
                    log_probs=self.log_probs[:, idx],
                    values=self.values[:, idx],
                    advantages=self.advantages[:, idx],
                    returns=self.returns[:, idx],
                    mean=self.mean[:, idx],
                    std=self.std[:, idx],
                    hidden=tuple(h[:, idx] for h in self.hidden0),
                    dones=self.dones[:, idx],
                )
            return
        total = t * n
        if num_minibatches > total:
            raise ValueError(
                f"num_minibatches ({num_minibatches}) exceeds the rollout size ({total})"
            )
        # one CPU permutation per epoch, copied once: the same order on every device
        perm = torch.randperm(total, generator=generator).to(self.device)

        def flat(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(total, *x.shape[2:])

        obs = {k: flat(v) for k, v in self.obs.items()}
        fields = [
            flat(x)
            for x in (
                self.actions,
                self.log_probs,
                self.values,
                self.advantages,
                self.returns,
                self.mean,
                self.std,
            )
        ]
        for idx in perm.chunk(num_minibatches):
            a, lp, v, adv, ret, mu, sd = (f[idx] for f in fields)
            yield Batch({k: o[idx] for k, o in obs.items()}, a, lp, v, adv, ret, mu, sd)


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
        self.terminated = torch.zeros(t, n, **z)  # a probability, as in RolloutStorage
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
