"""The replay buffer of off-policy learners: transitions of a batched env, sampled as
short sequences, with a mask that ends each sequence where its first episode ends.

A batched env steps all its envs at once, so the buffer is a ring of time slots, each
holding one transition of every env: ``[slot, env]``. A sequence is ``horizon``
consecutive transitions of one env, all in the buffer in time order (it does not run
across the ring's write position). It may run past an episode's end: ``mask`` is 1 for
the transitions of the episode the sequence starts in (up to and including the one that
ends it) and 0 after, and the learner counts no loss where it is 0. So every transition
starts as many sequences as any other, an episode's last one included, with its true
last observation (``info["final_obs"]``) as the next observation and its end flags
kept apart: a time-out (``truncated``) bootstraps, a termination does not.

Why not keep sequences inside one episode: then an episode's last transition could only
ever sit last in a sequence, where the world model sees it through a latent rolled
``horizon - 1`` steps through its dynamics and weighs it ``rho**(horizon - 1)``. The Q
function at the encoded latent, which every TD target bootstraps from, then never learns
that an episode ends: on hopper (episodes of ~50 steps) it settled near
``reward / (1 - gamma)`` at every state (docs/benchmarks_world_model.md).

Everything in the buffer, its sampling generator included, is in :meth:`state_dict`: a
resumed run samples the same batches it would have sampled without the interruption.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["ReplayError", "SequenceBatch", "SequenceReplay"]


class ReplayError(RuntimeError):
    """A replay buffer asked for what it cannot give (no complete sequence yet)."""


class SequenceBatch(dict):
    """``obs`` [H+1, B, O]: the observation before each transition, then the true one
    after the last; ``action`` [H, B, A]; ``reward``, ``terminated``, ``truncated``,
    ``mask`` [H, B] (float): mask is 1 for the transitions of the sequence's first
    episode and 0 after its end (what follows belongs to the next episode)."""


class SequenceReplay:
    """Sequences of ``horizon`` transitions of ``num_envs`` envs; ``capacity``
    transitions in all (rounded up to whole slots)."""

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_size: int,
        action_size: int,
        horizon: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if horizon < 1 or num_envs < 1 or capacity < 1:
            raise ValueError(
                f"SequenceReplay needs capacity, num_envs and horizon >= 1, got "
                f"{capacity}, {num_envs}, {horizon}"
            )
        self.slots = max(math.ceil(capacity / num_envs), horizon + 1)
        self.num_envs, self.horizon = num_envs, horizon
        self.device = torch.device(device)
        shape = (self.slots, num_envs)
        f32 = {"dtype": torch.float32, "device": self.device}
        self.obs = torch.zeros(*shape, obs_size, **f32)
        self.next_obs = torch.zeros(*shape, obs_size, **f32)
        self.action = torch.zeros(*shape, action_size, **f32)
        self.reward = torch.zeros(*shape, **f32)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.pos = 0
        self.size = 0
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        """Transitions held."""
        return self.size * self.num_envs

    @property
    def num_sequences(self) -> int:
        """Distinct sequences a sample can draw from."""
        return max(self.size - self.horizon + 1, 0) * self.num_envs

    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
    ) -> None:
        """One env step of every env. ``next_obs``: the true observation after the
        action (for an ended episode the last one, not the reset one)."""
        p = self.pos
        self.obs[p] = obs
        self.next_obs[p] = next_obs
        self.action[p] = action
        self.reward[p] = reward
        self.terminated[p] = terminated.bool()
        self.truncated[p] = truncated.bool()
        self.pos = (p + 1) % self.slots
        self.size = min(self.size + 1, self.slots)

    def sample(self, batch_size: int) -> SequenceBatch:
        """``batch_size`` sequences drawn uniformly (with replacement) among the
        complete windows of every env."""
        windows = self.size - self.horizon + 1
        if windows < 1:
            raise ReplayError(
                f"the replay buffer holds no sequence of {self.horizon} transitions yet "
                f"({len(self)} transitions)"
            )
        flat = torch.randint(windows * self.num_envs, (batch_size,), generator=self.generator)
        flat = flat.to(self.device)
        # age of the window's last slot: 0 is the slot written last
        age, env = flat // self.num_envs, flat % self.num_envs
        start = (self.pos - self.horizon - age) % self.slots
        t = (start[None] + torch.arange(self.horizon, device=self.device)[:, None]) % self.slots
        e = env[None].expand_as(t)
        terminated, truncated = self.terminated[t, e], self.truncated[t, e]
        ended = (terminated | truncated).float()
        # 1 up to and including the first end, 0 after it
        mask = torch.cat([torch.ones_like(ended[:1]), 1 - ended[:-1]]).cumprod(0)
        return SequenceBatch(
            obs=torch.cat([self.obs[t[:1], e[:1]], self.next_obs[t, e]]),
            action=self.action[t, e],
            reward=self.reward[t, e],
            terminated=terminated.float(),
            truncated=truncated.float(),
            mask=mask,
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Only the written slots (a buffer that is not full is cheap to save)."""
        n = self.size
        return {
            "slots": self.slots,
            "num_envs": self.num_envs,
            "horizon": self.horizon,
            "pos": self.pos,
            "size": n,
            "obs": self.obs[:n].cpu().clone(),
            "next_obs": self.next_obs[:n].cpu().clone(),
            "action": self.action[:n].cpu().clone(),
            "reward": self.reward[:n].cpu().clone(),
            "terminated": self.terminated[:n].cpu().clone(),
            "truncated": self.truncated[:n].cpu().clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        here = (self.slots, self.num_envs, self.horizon)
        saved = (state["slots"], state["num_envs"], state["horizon"])
        if saved != here:
            raise ValueError(
                f"replay state has (slots, envs, horizon) = {saved}; this buffer has {here}"
            )
        n = int(state["size"])
        for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
            getattr(self, name)[:n] = state[name].to(self.device)
        self.pos, self.size = int(state["pos"]), n
        self.generator.set_state(state["generator"])
