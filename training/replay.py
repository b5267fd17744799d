"""The replay buffer of off-policy learners: transitions of a batched env, sampled as
short sequences that stay inside one episode.

A batched env steps all its envs at once, so the buffer is a ring of time slots, each
holding one transition of every env: ``[slot, env]``. A sequence is ``horizon``
consecutive transitions of one env; it is *valid* when all of them are in the buffer,
in time order (it does not run across the ring's write position), and no episode ends
before its last transition. So a sequence never spans a reset, and an episode's last
transition can still end a sequence, with its true last observation (``info
["final_obs"]``) as the next observation and its end flags kept apart: a time-out
(``truncated``) bootstraps, a termination does not.

Which starts are valid is kept in a boolean map, refreshed only around the slot just
written, so sampling costs the same whatever the buffer holds. Everything in the buffer,
its sampling generator included, is in :meth:`state_dict`: a resumed run samples the
same batches it would have sampled without the interruption.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["ReplayError", "SequenceBatch", "SequenceReplay"]


class ReplayError(RuntimeError):
    """A replay buffer asked for what it cannot give (no valid sequence yet)."""


class SequenceBatch(dict):
    """``obs`` [H+1, B, O]: the observation before each transition, then the true one
    after the last; ``action`` [H, B, A]; ``reward``, ``terminated``, ``truncated``
    [H, B] (float flags)."""


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
        self.valid = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.pos = 0
        self.size = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._starts: torch.Tensor | None = None

    def __len__(self) -> int:
        """Transitions held."""
        return self.size * self.num_envs

    @property
    def num_sequences(self) -> int:
        return int(self._valid_starts().numel())

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
        # only the windows that hold slot p changed: the one it completes became
        # valid, those it overwrote or that now run past the newest slot are not
        starts = (p - torch.arange(self.horizon)) % self.slots
        self.valid[starts] = self._window_valid(starts)
        self._starts = None

    def _window_valid(self, starts: torch.Tensor) -> torch.Tensor:
        """[len(starts), num_envs]: whether the window from each start is a sequence."""
        age = (self.pos - 1 - starts) % self.slots  # 0: the slot written last
        inside = (age >= self.horizon - 1) & (age < self.size)
        ok = inside[:, None].expand(-1, self.num_envs).clone()
        done = self.terminated | self.truncated
        for k in range(self.horizon - 1):  # an episode may end only at the last transition
            ok &= ~done[(starts + k) % self.slots]
        return ok

    def _valid_starts(self) -> torch.Tensor:
        if self._starts is None:
            self._starts = self.valid.flatten().nonzero().squeeze(1)
        return self._starts

    def sample(self, batch_size: int) -> SequenceBatch:
        """``batch_size`` valid sequences drawn uniformly (with replacement)."""
        starts = self._valid_starts()
        if starts.numel() == 0:
            raise ReplayError(
                f"the replay buffer holds no sequence of {self.horizon} transitions within "
                f"one episode yet ({len(self)} transitions)"
            )
        pick = torch.randint(starts.numel(), (batch_size,), generator=self.generator)
        flat = starts[pick.to(starts.device)]
        slot, env = flat // self.num_envs, flat % self.num_envs
        t = (slot[None] + torch.arange(self.horizon, device=self.device)[:, None]) % self.slots
        e = env[None].expand_as(t)
        return SequenceBatch(
            obs=torch.cat([self.obs[t[:1], e[:1]], self.next_obs[t, e]]),
            action=self.action[t, e],
            reward=self.reward[t, e],
            terminated=self.terminated[t, e].float(),
            truncated=self.truncated[t, e].float(),
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
        everything = torch.arange(self.slots)
        self.valid[:] = self._window_valid(everything)
        self._starts = None
