"""Envs of other frameworks behind our VecEnv contract, through rsl_rl's interface.

Isaac Lab (`RslRlVecEnvWrapper`), mjlab and any env written for rsl_rl 5.x offer the
same small interface: `num_envs`, `num_actions`, `device`, `max_episode_length`,
`get_observations()` returning a TensorDict of observation groups, and `step(actions)`
returning `(observations, rewards, dones, extras)` with `extras["time_outs"]`. One
adapter, `RslRlStyleEnv`, turns that into what our learners, evaluation and export read
(`sim.vec_env.MujocoVecEnv`'s contract), so every such framework plugs in through one
path; `register_external(prefix, factory)`, or an entry point in the group
`sim2real.external_envs` named `prefix`, makes `sim.make("prefix:Name", n)` build one.

What the interface does not carry, and what the adapter does about it:

- **Final observations.** Such envs reset an ended episode inside `step` and return the
  first observation of the next one. A time-out must bootstrap from the last observation
  of its episode; the adapter hands out the observation *before* the step for ended
  envs (`info["final_obs"]`), one step early: the approximation rsl_rl's own PPO makes
  (it bootstraps time-outs with the value of that same observation).
- **Terminations.** `terminated = dones & ~time_outs`, `truncated = time_outs`.
- **Episode statistics.** Returns and lengths are summed here from rewards and dones.
  Scalars the env logs in `extras["log"]` become per-step terms (`log/<key>`).
- **Simulator state.** Another framework's simulator cannot be snapshot here:
  `state_dict()` keeps only the adapter's counters, and a resumed run starts the envs'
  episodes afresh (the policy, optimizer and logs resume exactly).
- **The robot.** Export needs joint names, default pose, gains and the control period
  (`sim.spec.RobotDescription`); the factory passes them (Isaac Lab and mjlab know them
  from the articulation). Without one, the adapter describes a torque-level robot with
  joints named `action_<i>` and the env's step period as control period.
- **Action bounds.** Such envs scale and clip actions themselves; the default bounds are
  +-`action_clip` (rsl_rl's and Isaac Lab's usual clip), used by our runner's clamp and
  written into the exported metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from sim.randomization import SimToRealConfig
from sim.spec import ActionSpec, ObservationSpec, ObsGroup, ObsTerm, RobotDescription

__all__ = [
    "RslRlStyle",
    "RslRlStyleEnv",
    "external_prefixes",
    "framework_task_id",
    "make_external",
    "manager_observation_terms",
    "register_external",
]


class RslRlStyle(Protocol):
    """The interface an env needs to be adapted (rsl_rl 5.x's `VecEnv`)."""

    num_envs: int
    num_actions: int
    max_episode_length: int | float
    device: str | torch.device

    def get_observations(self) -> Mapping[str, torch.Tensor]: ...

    def step(
        self, actions: torch.Tensor
    ) -> tuple[Mapping[str, torch.Tensor], torch.Tensor, torch.Tensor, dict[str, Any]]: ...


_GROUPS = ("policy", "critic")


class RslRlStyleEnv:
    """An rsl_rl-style env behind our VecEnv contract (see the module docstring)."""

    # a resumed run cannot restore this simulator: the runner resets it instead
    restarts_on_resume = True

    def __init__(
        self,
        env: RslRlStyle,
        name: str,
        robot: RobotDescription | None = None,
        dt: float | None = None,
        action_clip: float = 100.0,
        device: str | torch.device | None = None,
        group_names: Mapping[str, str] | None = None,
        obs_terms: Mapping[str, Sequence[tuple[str, int]]] | None = None,
        render: Callable[[], np.ndarray] | None = None,
    ):
        """`group_names` maps our groups to the env's (mjlab 1.6 calls the policy's group
        "actor"); `obs_terms` names the terms of each group in order, with their sizes
        (what the exported metadata shows a robot integrator), where the env knows them;
        `render` returns an RGB frame of env 0 (videos of runs), where the env can."""
        for attr in ("num_envs", "num_actions", "max_episode_length", "get_observations", "step"):
            if not hasattr(env, attr):
                raise TypeError(
                    f"{name}: {type(env).__name__} lacks {attr!r}, part of rsl_rl's VecEnv "
                    "interface that the adapter needs"
                )
        if not (isinstance(action_clip, int | float) and action_clip > 0):
            raise ValueError(f"{name}: action_clip must be a number > 0, got {action_clip!r}")
        self.env = env
        self.name = name
        self._render = render
        self._group_names = {g: g for g in _GROUPS}
        for ours, theirs in (group_names or {}).items():
            if ours not in _GROUPS:
                raise ValueError(
                    f"{name}: group_names maps {ours!r}; our groups are {', '.join(_GROUPS)}"
                )
            self._group_names[ours] = theirs
        self.num_envs = int(env.num_envs)
        self.device = torch.device(device if device is not None else env.device)
        self.dtype = torch.float32
        self.max_episode_steps = int(env.max_episode_length)
        if dt is None:
            dt = getattr(env, "step_dt", None) or (robot.control_dt if robot is not None else None)
        if not (isinstance(dt, int | float) and dt > 0):
            # the control period goes into the exported metadata: never guess it
            raise ValueError(
                f"{name}: the env's control period is unknown (no step_dt, no robot "
                f"description); pass dt= in seconds, got {dt!r}"
            )
        self.dt = float(dt)
        self.s2r = SimToRealConfig()  # randomization, noise, latency: the env's own
        self.backend = "external"
        obs = self._obs(env.get_observations())
        self.observation_spec = ObservationSpec(
            {g: ObsGroup(_terms(name, g, int(t.shape[1]), obs_terms)) for g, t in obs.items()}
        )
        a = int(env.num_actions)
        bound = np.full(a, float(action_clip))
        self._robot = robot if robot is not None else _torque_robot(a, self.dt)
        if len(self._robot.joint_names) != a:
            raise ValueError(
                f"{name}: the robot description names {len(self._robot.joint_names)} joints, "
                f"the env takes {a} actions"
            )
        self.action_spec = ActionSpec(a, -bound, bound, tuple(self._robot.joint_names))
        self._last = obs
        self.episode_return = torch.zeros(self.num_envs, device=self.device)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    @property
    def robot(self) -> RobotDescription:
        return self._robot

    @property
    def control_rate_hz(self) -> float:
        return 1.0 / self.dt

    def render(self, i: int = 0, camera: int = -1) -> np.ndarray:
        """An RGB frame of env 0, from the framework's own renderer and camera."""
        if self._render is None:
            raise NotImplementedError(f"{self.name}: this env gives no rendering hook")
        if i != 0:
            raise ValueError(f"{self.name}: only env 0 renders, got env {i}")
        return np.asarray(self._render())

    def _obs(self, td: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        policy = self._group_names["policy"]
        if policy not in td.keys():
            raise ValueError(
                f"{self.name}: the env's observations have no {policy!r} group for the "
                f"policy (groups: {sorted(td.keys())})"
            )
        out = {}
        for g in _GROUPS:
            if self._group_names[g] not in td.keys():
                continue
            t = td[self._group_names[g]]
            if t.ndim != 2 or t.shape[0] != self.num_envs:
                raise ValueError(
                    f"{self.name}: observation group {g!r} must be (num_envs, size) = "
                    f"({self.num_envs}, n), got {tuple(t.shape)}"
                )
            out[g] = t.to(self.device, self.dtype)
        return out

    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        """Observations to start from. Such envs reset themselves when built and reset
        ended episodes inside `step`; one with a `reset` of its own (rsl_rl's wrappers)
        has every episode started anew by it, with `seed` where given."""
        reset = getattr(self.env, "reset", None)
        if callable(reset):
            reset() if seed is None else reset(seed=seed)
        self.episode_return.zero_()
        self.episode_length.zero_()
        self._last = self._obs(self.env.get_observations())
        return self._last

    def step(self, actions: torch.Tensor):
        if not isinstance(actions, torch.Tensor) or not actions.is_floating_point():
            raise TypeError(f"actions must be a floating-point tensor, got {type(actions)}")
        want = (self.num_envs, self.action_spec.size)
        if tuple(actions.shape) != want:
            raise ValueError(f"actions must have shape {want}, got {tuple(actions.shape)}")
        if not bool(torch.isfinite(actions).all()):
            raise ValueError("non-finite actions (NaN or inf); nothing was stepped")
        before = self._last
        obs_td, rewards, dones, extras = self.env.step(actions.to(self.env.device))
        obs = self._obs(obs_td)
        reward = rewards.to(self.device, torch.float32).reshape(self.num_envs)
        done = dones.to(self.device).reshape(self.num_envs).to(torch.bool)
        time_outs = extras.get("time_outs")
        if time_outs is None:
            time_outs = torch.zeros_like(done)
        truncated = time_outs.to(self.device).reshape(self.num_envs).to(torch.bool) & done
        terminated = done & ~truncated
        self.episode_return += reward
        self.episode_length += 1
        info: dict[str, Any] = {}
        for k, v in (extras.get("log") or {}).items():
            value = torch.as_tensor(v, dtype=torch.float32, device=self.device)
            if value.ndim == 0:
                info[f"log/{k}"] = value.expand(self.num_envs)
        if bool(done.any()):
            mask = done[:, None]
            info["final_obs"] = {k: torch.where(mask, before[k], obs[k]) for k in obs}
            info["episode"] = {
                "done": done.clone(),
                "return": self.episode_return.clone(),
                "length": self.episode_length.clone(),
            }
            self.episode_return[done] = 0.0
            self.episode_length[done] = 0
        else:
            info["final_obs"] = obs
        self._last = obs
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {
            "external": self.name,
            "episode_return": self.episode_return.cpu(),
            "episode_length": self.episode_length.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The counters only: the simulator of another framework restarts its episodes
        (module docstring)."""
        if state.get("external") != self.name:
            raise ValueError(
                f"env state is of {state.get('external', 'a simulator of ours')!r}, "
                f"this env is {self.name!r}"
            )

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _terms(
    name: str, group: str, size: int, obs_terms: Mapping[str, Sequence[tuple[str, int]]] | None
) -> tuple[ObsTerm, ...]:
    if not obs_terms or group not in obs_terms:
        return (ObsTerm(group, size),)
    terms = tuple(ObsTerm(str(n), int(k)) for n, k in obs_terms[group])
    if sum(t.size for t in terms) != size:
        raise ValueError(
            f"{name}: the terms of group {group!r} add up to "
            f"{sum(t.size for t in terms)} values, the env's observation has {size}"
        )
    return terms


def framework_task_id(name: str, known: Sequence[str], prefix: str, framework: str) -> str:
    """The framework's id for `name`, which may leave out the framework's `prefix`
    ("Mjlab-", "Isaac-"); an unknown name is an error listing the known ones."""
    for candidate in (name, prefix + name):
        if candidate in known:
            return candidate
    short = ", ".join(sorted(k.removeprefix(prefix) for k in known))
    raise ValueError(f"{framework} has no task {name!r}; its tasks: {short}")


def manager_observation_terms(
    manager: Any, group_names: Mapping[str, str]
) -> dict[str, list[tuple[str, int]]]:
    """Our group -> [(term, size)] from an observation manager of Isaac Lab's design
    (Isaac Lab's and mjlab's: `active_terms` and `group_obs_term_dim` per group);
    `group_names` maps our groups to the framework's."""
    ours = {theirs: our for our, theirs in group_names.items()}
    out = {}
    for group, names in manager.active_terms.items():
        if group not in ours:
            continue
        dims = manager.group_obs_term_dim[group]
        out[ours[group]] = [(n, int(np.prod(d))) for n, d in zip(names, dims, strict=True)]
    return out


def _torque_robot(num_actions: int, dt: float) -> RobotDescription:
    zeros = np.zeros(num_actions)
    return RobotDescription(
        joint_names=tuple(f"action_{i}" for i in range(num_actions)),
        default_joint_pos=zeros.copy(),
        kp=zeros.copy(),
        kd=zeros.copy(),
        action_scale=np.ones(num_actions),
        action_offset=zeros.copy(),
        joint_pos_lower=np.full(num_actions, -np.inf),
        joint_pos_upper=np.full(num_actions, np.inf),
        torque_limit=np.full(num_actions, np.inf),
        physics_dt=dt,
        control_dt=dt,
    )


# prefix -> factory(name, num_envs=, seed=, device=, **options) -> RslRlStyleEnv
_EXTERNAL: dict[str, Callable[..., RslRlStyleEnv]] = {}


def register_external(prefix: str, factory: Callable[..., RslRlStyleEnv]) -> None:
    """Make `sim.make(f"{prefix}:{name}", num_envs, seed=, device=, **options)` call
    `factory(name, num_envs=..., seed=..., device=..., **options)`."""
    if not prefix.isidentifier():
        raise ValueError(f"an external prefix must be an identifier, got {prefix!r}")
    _EXTERNAL[prefix] = factory


# packages declare factories as entry points in this group (name = prefix), so that
# `sim2real train ppo --task prefix:Name` finds them without an import of the user's
ENTRY_POINT_GROUP = "sim2real.external_envs"


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def external_prefixes() -> list[str]:
    return sorted(set(_EXTERNAL) | set(_entry_points()))


def make_external(
    task: str, num_envs: int, seed: int | None, device: torch.device, **options: Any
) -> RslRlStyleEnv:
    prefix, _, name = task.partition(":")
    if prefix not in _EXTERNAL and prefix in (eps := _entry_points()):
        register_external(prefix, eps[prefix].load())
    if prefix not in _EXTERNAL:
        known = ", ".join(external_prefixes()) or "none registered"
        raise ValueError(f"unknown env source {prefix!r} in task {task!r}; sources: {known}")
    if not name:
        raise ValueError(f"task {task!r} names no env after {prefix!r}:")
    env = _EXTERNAL[prefix](name, num_envs=num_envs, seed=seed, device=device, **options)
    if not isinstance(env, RslRlStyleEnv):
        env = RslRlStyleEnv(env, task)
    return env
