"""Our batched simulator seen through other libraries' interfaces.

- `GymnasiumEnv`: one env as a `gymnasium.Env` (episodes end; the caller resets).
- `GymnasiumVectorEnv`: the batch as a `gymnasium.vector.VectorEnv` (same-step autoreset).
- `SB3VecEnv`: the batch as a Stable-Baselines3 `VecEnv`, so SB3 algorithms train on it.

Each takes either an existing `MujocoVecEnv` or a task name plus the arguments of
`sim.make`. Observations are the `policy` group as float32 numpy arrays.
`register_gymnasium_envs()` (called on import) registers `sim2real/<task>-v0` ids:
`gymnasium.make(id)` gives one env, `gymnasium.make_vec(id, num_envs=n)` a
`GymnasiumVectorEnv` over one batched simulator of n copies.
(rsl_rl's VecEnv interface is in `sim.rsl_rl_env`, which needs the optional rsl-rl-lib.)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from sim.registry import make, task_class, task_names
from sim.vec_env import MujocoVecEnv

__all__ = ["GymnasiumEnv", "GymnasiumVectorEnv", "SB3VecEnv", "register_gymnasium_envs"]

# the simulator's episode limit when an outer TimeLimit ends the episodes instead: an
# int64 step counter never reaches it
_NO_LIMIT = 2**62


def as_vec_env(
    env: MujocoVecEnv | str, num_envs: int | None, seed: int | None, kwargs: dict
) -> MujocoVecEnv:
    """`env` itself (seed and `sim.make` arguments refused), or `sim.make(env, ...)` for a
    task name: what every adapter's first argument means."""
    if isinstance(env, MujocoVecEnv):
        if kwargs or seed is not None:
            raise ValueError(
                "pass seed and sim.make arguments only with a task name, not with an existing env "
                f"(got seed={seed!r}, {sorted(kwargs)})"
            )
        if num_envs is not None and num_envs != env.num_envs:
            raise ValueError(f"num_envs={num_envs} but the given env has {env.num_envs}")
        return env
    if not isinstance(env, str):
        raise TypeError(f"expected a MujocoVecEnv or a task name, got {type(env).__name__}")
    return make(env, 1 if num_envs is None else num_envs, seed=seed, **kwargs)


def _spaces(env: MujocoVecEnv) -> tuple[spaces.Box, spaces.Box]:
    size = env.observation_spec.policy.size
    obs = spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)
    spec = env.action_spec
    act = spaces.Box(
        np.asarray(spec.low, dtype=np.float32),
        np.asarray(spec.high, dtype=np.float32),
        shape=(spec.size,),
        dtype=np.float32,
    )
    return obs, act


def _np(x: torch.Tensor, dtype=None) -> np.ndarray:
    """A numpy array of the tensor's values (a view where no conversion is needed)."""
    a = x.detach().cpu().numpy()
    return a if dtype is None else a.astype(dtype, copy=False)


def _check_render_mode(mode: str | None) -> str | None:
    if mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be None or 'rgb_array', got {mode!r}")
    return mode


# ---------------------------------------------------------------------- Gymnasium (single)
class GymnasiumEnv(gymnasium.Env):
    """One env of the batched simulator with Gymnasium's semantics.

    The batched env resets an ended episode inside `step`; here the ending step returns the
    episode's true final observation and the caller calls `reset()`, which then hands out
    the already-drawn initial state (so a run here equals the batched run with one env for
    the same seed and actions). `np_random` is the simulator's own generator.

    time_limit: True (default): the simulator truncates episodes at the task's limit (or
    the `max_episode_steps` given here). False: it never truncates, because an outer
    `gymnasium.wrappers.TimeLimit` does; `gymnasium.make` adds one from the spec.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        env: MujocoVecEnv | str = "halfcheetah",
        *,
        seed: int | None = None,
        render_mode: str | None = None,
        width: int = 480,
        height: int = 360,
        time_limit: bool = True,
        **kwargs: Any,
    ):
        if "num_envs" in kwargs and kwargs.pop("num_envs") != 1:
            raise ValueError("GymnasiumEnv holds exactly one env (num_envs=1)")
        if not time_limit:
            if isinstance(env, MujocoVecEnv) or "max_episode_steps" in kwargs:
                raise ValueError(
                    "time_limit=False leaves the episode length to an outer TimeLimit: pass a "
                    "task name without max_episode_steps (gymnasium.make(id, "
                    "max_episode_steps=N) sets it)"
                )
            kwargs["max_episode_steps"] = _NO_LIMIT
        self.env = as_vec_env(env, None if isinstance(env, MujocoVecEnv) else 1, seed, kwargs)
        if self.env.num_envs != 1:
            raise ValueError(
                f"GymnasiumEnv needs a batched env with num_envs=1, got {self.env.num_envs}; "
                "use GymnasiumVectorEnv for a batch"
            )
        self.observation_space, self.action_space = _spaces(self.env)
        self.render_mode = _check_render_mode(render_mode)
        self.metadata = {**self.metadata, "render_fps": int(round(self.env.control_rate_hz))}
        self._size = (width, height)
        self._np_random = self.env._rng
        self._np_random_seed = seed if seed is not None else -1
        self._pending: np.ndarray | None = None  # first obs of the episode the env began
        self._started = False

    def _obs(self, obs: dict[str, torch.Tensor]) -> np.ndarray:
        return np.array(_np(obs["policy"][0]), dtype=np.float32)  # always a new array

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None and self._pending is not None:
            obs, self._pending = self._pending, None
            return obs, {}
        self.env._rng = self.np_random  # one generator: a user-set np_random is honoured too
        self._pending = None
        self._started = True
        return self._obs(self.env.reset()), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(action)
        if a.shape != self.action_space.shape:
            raise ValueError(
                f"action must have shape {self.action_space.shape}, got {tuple(a.shape)}"
            )
        obs, reward, terminated, truncated, info = self.env.step(a[None])
        term, trunc = bool(terminated[0]), bool(truncated[0])
        out: dict[str, Any] = {}
        for k, v in info.items():
            if isinstance(v, torch.Tensor) and v.ndim == 1:
                out[k] = v[0].item()
        if term or trunc:
            # the batched env has already begun the next episode: keep its first obs
            # for the caller's reset() and return the true final observation
            self._pending = self._obs(obs)
            final = self._obs(info["final_obs"])
        else:
            self._pending = None
            final = self._obs(obs)
        return final, float(reward[0]), term, trunc, out

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without render_mode='rgb_array'")
            return None
        w, h = self._size
        return self.env.render(0, width=w, height=h)

    def close(self) -> None:
        self.env.close()
        super().close()


class _TimeLimitedGymnasiumEnv(GymnasiumEnv):
    """`gymnasium.make`'s entry point: a `GymnasiumEnv` whose episodes Gymnasium's
    TimeLimit ends (the spec's `max_episode_steps`, or make's own argument), so that the
    one limit a user sets is the one that applies and an episode truncates once."""

    def __init__(self, env: str = "halfcheetah", **kwargs: Any):
        super().__init__(env, time_limit=False, **kwargs)


def register_gymnasium_envs(tasks: Sequence[str] | None = None) -> list[str]:
    """Register `sim2real/<task>-v0` for every (or the given) task; returns the ids.

    - `gymnasium.make(id)`: one env; `spec.max_episode_steps` is the task's limit and
      Gymnasium's TimeLimit truncates there (`max_episode_steps=N` changes it, `-1` removes
      it); the simulator's own limit is off on this path, so the two never disagree.
    - `gymnasium.make_vec(id, num_envs=n)` (default vectorization mode): a
      `GymnasiumVectorEnv` over ONE batched simulator of n copies, which truncates at
      `max_episode_steps` itself (no TimeLimit wrappers). `vectorization_mode="sync"`
      still gives n one-env copies, each with its TimeLimit.

    Sim-to-real settings and the seed pass through as keywords (`s2r=`, `seed=`, ...).
    """
    ids = []
    for task in task_names() if tasks is None else tasks:
        env_id = f"sim2real/{task}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(
                id=env_id,
                entry_point="sim.adapters:_TimeLimitedGymnasiumEnv",
                vector_entry_point="sim.adapters:GymnasiumVectorEnv",
                max_episode_steps=int(task_class(task).max_episode_steps),
                kwargs={"env": task},
                nondeterministic=False,
            )
        ids.append(env_id)
    return ids


# ---------------------------------------------------------------------- Gymnasium (vector)
class GymnasiumVectorEnv(gymnasium.vector.VectorEnv):
    """The batched env as a Gymnasium vector env, with same-step autoreset.

    On a step where some envs end, the returned observation of those envs is the first of
    their next episode; as Gymnasium documents for `AutoresetMode.SAME_STEP`,
    `info["final_obs"]` (object array, None where not ended) holds the true last
    observation and `info["final_info"]` the step info of the ended envs (with an
    `episode` entry: return `r` and length `l`), each with its `_`-prefixed mask.
    The step's per-env terms (e.g. `x_velocity`) are also at the top level for all envs.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(
        self,
        env: MujocoVecEnv | str = "halfcheetah",
        num_envs: int | None = None,
        seed: int | None = None,
        *,
        render_mode: str | None = None,
        **kwargs: Any,
    ):
        self.env = as_vec_env(env, num_envs, seed, kwargs)
        self.num_envs = self.env.num_envs
        self.single_observation_space, self.single_action_space = _spaces(self.env)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = _check_render_mode(render_mode)
        self._started = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._started = True
        return _np(self.env.reset(seed=seed)["policy"], np.float32), {}

    def step(self, actions: Any):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions))
        term = _np(terminated)
        trunc = _np(truncated)
        out: dict[str, Any] = {}
        per_env: dict[str, np.ndarray] = {}
        for k, v in info.items():
            if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == self.num_envs:
                per_env[k] = _np(v)
                out[k] = per_env[k]
        done = term | trunc
        if done.any():
            final = _np(info["final_obs"]["policy"], np.float32)
            final_obs = np.full(self.num_envs, None, dtype=object)
            final_info: dict[str, Any] = {}
            for i in np.nonzero(done)[0]:
                final_obs[i] = final[i].copy()
            for k, v in per_env.items():
                final_info[k] = np.where(done.reshape(-1, *[1] * (v.ndim - 1)), v, 0).astype(
                    v.dtype
                )
                final_info[f"_{k}"] = done.copy()
            ep = info["episode"]
            final_info["episode"] = {
                "r": np.where(done, _np(ep["return"], np.float64), 0.0),
                "l": np.where(done, _np(ep["length"]), 0),
            }
            final_info["_episode"] = done.copy()
            out["final_obs"], out["_final_obs"] = final_obs, done.copy()
            out["final_info"], out["_final_info"] = final_info, done.copy()
        return (
            _np(obs["policy"], np.float32),
            _np(reward, np.float64),
            term,
            trunc,
            out,
        )

    def render(self) -> tuple[np.ndarray, ...] | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without render_mode='rgb_array'")
            return None
        return tuple(self.env.render(i) for i in range(self.num_envs))

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


# ---------------------------------------------------------------------- Stable-Baselines3
try:
    from stable_baselines3.common.monitor import Monitor as _SB3Monitor
    from stable_baselines3.common.vec_env import VecEnv as _SB3VecEnvBase
except ImportError:  # the sb3 extra is not installed
    _SB3VecEnvBase = None  # type: ignore[assignment,misc]
    _SB3Monitor = None  # type: ignore[assignment,misc]

if _SB3VecEnvBase is not None:

    class SB3VecEnv(_SB3VecEnvBase):
        """The batched env as a Stable-Baselines3 `VecEnv`.

        `dones = terminated | truncated`; an ended env's info holds `terminal_observation`
        (the true last observation), `TimeLimit.truncated` and, as SB3's `Monitor` writes
        it, `episode` = {"r", "l", "t"}, so the SB3 logger shows episode returns. Envs that
        did not end get a fresh empty dict every step. Every sub-env lives in the one
        batched simulator, so attributes are shared: `get_attr` reads the batched env's
        attribute, `set_attr` sets it for all envs at once (a subset is refused), and
        `env_method` calls the batched method once (with `render`, per env index).
        `seed(s)` takes effect at the next `reset()`, which reseeds the whole batch with `s`.
        """

        def __init__(
            self,
            env: MujocoVecEnv | str = "halfcheetah",
            num_envs: int | None = None,
            seed: int | None = None,
            *,
            render_mode: str | None = None,
            **kwargs: Any,
        ):
            self.env = as_vec_env(env, num_envs, seed, kwargs)
            self._render_mode = _check_render_mode(render_mode)
            obs_space, act_space = _spaces(self.env)
            super().__init__(self.env.num_envs, obs_space, act_space)
            self._actions: np.ndarray | None = None
            self._t0 = time.perf_counter()
            self._started = False

        # -- core ---------------------------------------------------------------------
        def reset(self) -> np.ndarray:
            seed = self._seeds[0]
            obs = self.env.reset(seed=seed)
            self._reset_seeds()
            self._reset_options()
            self.reset_infos = [{} for _ in range(self.num_envs)]
            self._started = True
            return _np(obs["policy"], np.float32)

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = actions

        def step_wait(self):
            if self._actions is None:
                raise RuntimeError("step_wait() called without step_async()")
            actions, self._actions = self._actions, None
            obs, reward, terminated, truncated, info = self.env.step(actions)
            term = _np(terminated)
            trunc = _np(truncated)
            dones = term | trunc
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            done_ids = np.nonzero(dones)[0]
            if len(done_ids):
                final = _np(info["final_obs"]["policy"], np.float32)
                ep = info["episode"]
                ep_r, ep_l = _np(ep["return"]), _np(ep["length"])
                t = round(time.perf_counter() - self._t0, 6)
                for i in done_ids.tolist():
                    infos[i] = {
                        "terminal_observation": final[i].copy(),
                        "TimeLimit.truncated": bool(trunc[i] and not term[i]),
                        "episode": {"r": float(ep_r[i]), "l": int(ep_l[i]), "t": t},
                    }
            return (
                _np(obs["policy"], np.float32),
                _np(reward, np.float32),
                dones,
                infos,
            )

        def close(self) -> None:
            self.env.close()

        # -- rendering ------------------------------------------------------------------
        def get_images(self) -> Sequence[np.ndarray | None]:
            if self.render_mode != "rgb_array":
                warnings.warn(
                    f"render_mode is {self.render_mode!r}; images need render_mode='rgb_array'",
                    stacklevel=2,
                )
                return [None] * self.num_envs
            return [self.env.render(i) for i in range(self.num_envs)]

        # -- attributes and methods of the sub-envs -------------------------------------
        def _indices(self, indices) -> list[int]:
            idx = list(self._get_indices(indices))
            for i in idx:
                if not 0 <= int(i) < self.num_envs:
                    raise IndexError(f"env index {i} out of range [0, {self.num_envs})")
            return [int(i) for i in idx]

        def _all_envs(self, idx: list[int], what: str) -> None:
            if sorted(idx) != list(range(self.num_envs)):
                raise ValueError(
                    f"{what} acts on the one batched simulator that all {self.num_envs} envs "
                    f"share; pass indices=None (got {idx})"
                )

        def get_attr(self, attr_name: str, indices=None) -> list[Any]:
            idx = self._indices(indices)
            if attr_name == "render_mode":
                return [self._render_mode] * len(idx)
            value = getattr(self.env, attr_name)
            return [value] * len(idx)

        def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
            idx = self._indices(indices)
            if attr_name == "render_mode":
                self._all_envs(idx, "set_attr")
                self._render_mode = self.render_mode = _check_render_mode(value)
                return
            self._all_envs(idx, "set_attr")
            setattr(self.env, attr_name, value)

        def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs):
            idx = self._indices(indices)
            if method_name == "render":
                return [self.env.render(i, *method_args, **method_kwargs) for i in idx]
            self._all_envs(idx, "env_method")
            result = getattr(self.env, method_name)(*method_args, **method_kwargs)
            return [result] * len(idx)

        def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
            # no gymnasium wrappers are involved, but the infos are those of SB3's Monitor,
            # so Monitor-aware code (e.g. evaluate_policy) may read info["episode"]
            idx = self._indices(indices)
            return [_SB3Monitor is not None and wrapper_class is _SB3Monitor] * len(idx)

        def __repr__(self) -> str:
            return f"SB3VecEnv({self.env!r})"

else:  # pragma: no cover

    class SB3VecEnv:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any):
            raise ImportError("SB3VecEnv needs stable-baselines3: pip install 'sim2real[sb3]'")


register_gymnasium_envs()
