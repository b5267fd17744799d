"""Our batched simulator as an rsl_rl 5.x `VecEnv`, so rsl_rl's own runners train on it.

Needs the optional rsl-rl-lib (`pip install 'sim2real[rsl]'`); nothing else in `sim`
imports this module, so the rest of the package works without it::

    from rsl_rl.runners import OnPolicyRunner
    from sim.rsl_rl_env import RslRlVecEnv

    env = RslRlVecEnv("cartpole", num_envs=16, seed=0)
    runner = OnPolicyRunner(env, train_cfg, log_dir="logs/cartpole", device="cpu")
    runner.learn(100)

`sim2real export --rsl-rl logs/cartpole/model_99.pt --task cartpole` then turns the
saved checkpoint into our ONNX file with deployment metadata (training.rsl_rl_import).

What rsl_rl reads, and where it comes from here:

- observations: a TensorDict (batch `num_envs`) of the env's observation groups, float32:
  `policy` and, where the task has one, the privileged `critic` group; a train cfg maps
  them with `obs_groups = {"actor": ["policy"], "critic": ["critic"]}`.
- `step(actions)`: actions are clipped to the action bounds (rsl_rl samples an unbounded
  Gaussian; the sampled, unclipped action is what PPO stores), then
  `(obs, rewards, dones, extras)`; `dones` (int64) is terminated or truncated, and the
  observation of an ended env is already the first of its next episode (rsl_rl's
  convention, as Isaac Lab's). `extras["time_outs"]` (bool) marks the envs whose episode
  hit the time limit without terminating, which PPO bootstraps.
- `extras["log"]`: what rsl_rl's logger averages over an iteration and writes under the
  key: `Episode/return`, `Episode/length`, `Episode/time_out` for each episode that
  ended on the step (absent on steps where none did), and `Step/<term>` for each
  per-env term the task reports every step (reward terms, `unstable`, ...).
- `episode_length_buf`: the simulator's per-env step counters (which decide time-outs);
  assigning to it (the runner's `init_at_random_ep_len`) writes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from sim.adapters import as_vec_env
from sim.vec_env import MujocoVecEnv

__all__ = ["RslRlVecEnv"]


class RslRlVecEnv(VecEnv):
    """A `MujocoVecEnv` (or `sim.make(task, num_envs, seed=seed, **kwargs)`) behind
    rsl_rl's `VecEnv` interface. The env is reset on construction (with `seed`, where the
    env is built here), since rsl_rl's runner asks for observations before any step."""

    def __init__(
        self,
        env: MujocoVecEnv | str = "cartpole",
        num_envs: int | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.env = as_vec_env(env, num_envs, seed, kwargs)
        self.num_envs = self.env.num_envs
        self.num_actions = self.env.action_spec.size
        self.device = self.env.device
        spec = self.env.action_spec
        self._low = torch.as_tensor(spec.low, dtype=torch.float32, device=self.device)
        self._high = torch.as_tensor(spec.high, dtype=torch.float32, device=self.device)
        self.cfg = {
            "task": self.env.name,
            "num_envs": self.num_envs,
            "control_dt": self.env.dt,
            "max_episode_steps": self.env.max_episode_steps,
            "observation_groups": {g: s.size for g, s in self.env.observation_spec.groups.items()},
            "action_size": self.num_actions,
            "action_joint_names": list(spec.joint_names),
            "s2r": dataclasses.asdict(self.env.s2r),
        }
        self._obs = self._tensordict(self.env.reset())

    # -- what rsl_rl reads ----------------------------------------------------------------
    @property
    def max_episode_length(self) -> int:
        return int(self.env.max_episode_steps)

    @property
    def step_dt(self) -> float:
        """Control period in seconds (rsl_rl's RND scales its weight by it)."""
        return float(self.env.dt)

    @property
    def unwrapped(self) -> RslRlVecEnv:
        """This env: rsl_rl extensions read `env.unwrapped.step_dt`, as on Isaac Lab. The
        simulator itself is `self.env`."""
        return self

    @property
    def episode_length_buf(self) -> torch.Tensor:
        """Steps taken in each env's current episode (int64, on `device`). On the CPU it is
        a view of the simulator's counters, so in-place writes reach them too."""
        counters = torch.from_numpy(self.env.episode_length)
        return counters if self.device.type == "cpu" else counters.to(self.device)

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        value = torch.as_tensor(value)
        if value.shape != (self.num_envs,):
            raise ValueError(
                f"episode_length_buf must have shape ({self.num_envs},), got {tuple(value.shape)}"
            )
        if bool((value < 0).any()):
            raise ValueError("episode_length_buf must be >= 0")
        self.env.episode_length[:] = value.detach().to("cpu", torch.int64).numpy()

    def get_observations(self) -> TensorDict:
        return self._obs

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs, self.num_actions):
            raise ValueError(
                f"actions must have shape ({self.num_envs}, {self.num_actions}), got "
                f"{tuple(actions.shape)}"
            )
        clipped = torch.clamp(actions.to(torch.float32), self._low, self._high)
        obs, reward, terminated, truncated, info = self.env.step(clipped)
        self._obs = self._tensordict(obs)
        done = terminated | truncated
        extras: dict[str, Any] = {"time_outs": truncated.clone(), "log": self._log(info, truncated)}
        return self._obs, reward.to(torch.float32), done.to(torch.long), extras

    # -- conveniences -----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Start every env's episode anew (reseeding the simulator's generator with `seed`);
        (observations, extras) as Isaac Lab's rsl_rl wrapper returns them."""
        self._obs = self._tensordict(self.env.reset(seed=seed))
        return self._obs, {}

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"RslRlVecEnv({self.env!r})"

    # -- helpers ------------------------------------------------------------------------------
    def _tensordict(self, obs: dict[str, torch.Tensor]) -> TensorDict:
        # rsl_rl's networks are float32; the simulator may hand out float64
        return TensorDict(
            {k: v.to(torch.float32) for k, v in obs.items()},
            batch_size=[self.num_envs],
            device=self.device,
        )

    def _log(self, info: dict[str, Any], truncated: torch.Tensor) -> dict[str, torch.Tensor]:
        log: dict[str, torch.Tensor] = {}
        for k, v in info.items():
            if isinstance(v, torch.Tensor) and v.shape == (self.num_envs,):
                log[f"Step/{k}"] = v.to(torch.float32)
        ep = info.get("episode")  # present on the steps where some episode ended
        if ep is not None:
            ended = ep["done"]
            log["Episode/return"] = ep["return"][ended].to(torch.float32)
            log["Episode/length"] = ep["length"][ended].to(torch.float32)
            # the share of ended episodes that hit the time limit (the rest terminated)
            log["Episode/time_out"] = truncated[ended].to(torch.float32)
        return log
