"""Task names to environment classes, and `make`."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable

import torch

from sim.randomization import SimToRealConfig
from sim.vec_env import MujocoVecEnv

_TASKS: dict[str, Callable[[], type[MujocoVecEnv]]] = {}
# tasks whose hooks are also written in torch, for the step that stays on the device
# (sim.device_step): task name -> that class
_TORCH_TASKS: dict[str, Callable[[], type[MujocoVecEnv]]] = {}
HOOKS = ("auto", "numpy", "torch")


def register(name: str, loader: Callable[[], type[MujocoVecEnv]]) -> None:
    """Register a task class lazily (so importing `sim` does not build every model)."""
    _TASKS[name] = loader


def register_torch(name: str, loader: Callable[[], type[MujocoVecEnv]]) -> None:
    """Register the torch-hooks class of task `name` (sim.device_step), lazily."""
    _TORCH_TASKS[name] = loader


def torch_hook_tasks() -> list[str]:
    """Tasks that can run their hooks in torch on the simulator's device."""
    return sorted(_TORCH_TASKS)


def resolve_hooks(
    task: str, hooks: str, backend: str, device: torch.device, options: dict | None = None
) -> str:
    """'numpy' or 'torch': where task `task` (built with `options`) runs its hooks.
    'auto' is torch for a MuJoCo Warp batch on a CUDA device where the task has torch
    hooks for those options (no host round trip per step), numpy elsewhere. ValueError
    naming what is wrong with a request."""
    if hooks not in HOOKS:
        raise ValueError(f"hooks must be one of {list(HOOKS)}, got {hooks!r}")

    def why_not() -> str | None:
        return _TORCH_TASKS[task]().torch_unsupported(options or {})

    if hooks == "auto":
        fast = backend == "warp" and device.type == "cuda" and task in _TORCH_TASKS
        return "torch" if fast and why_not() is None else "numpy"
    if hooks == "torch":
        if backend != "warp":
            raise ValueError(
                f"hooks='torch' runs on the MuJoCo Warp engine's memory: use backend='warp', "
                f"not {backend!r}"
            )
        if task not in _TORCH_TASKS:
            raise ValueError(
                f"task {task!r} has no torch hooks; tasks with them: {', '.join(torch_hook_tasks())}"
            )
        reason = why_not()
        if reason is not None:
            raise ValueError(f"task {task!r}: {reason}")
    return hooks


def task_names() -> list[str]:
    return sorted(_TASKS)


def task_class(name: str) -> type[MujocoVecEnv]:
    if name not in _TASKS:
        close = difflib.get_close_matches(str(name), _TASKS, n=3)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {name!r}{hint} Known tasks: {', '.join(task_names())}")
    return _TASKS[name]()


# set by `make` itself, so never a task option
_MAKE_ARGS = frozenset({"self", "num_envs", "seed", "device", "s2r"})


def is_external(task: str) -> bool:
    """Whether `task` names an env of another framework ("prefix:name", sim.external)."""
    return ":" in str(task)


def task_options(name: str) -> set[str] | None:
    """Keyword options the task's constructor accepts besides those `make` sets (None for
    an external env, "prefix:name": its factory takes what it takes)."""
    if is_external(name):
        return None
    names: set[str] = set()
    for klass in task_class(name).__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        # a constructor without **kwargs ends the chain of forwarded options
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names - _MAKE_ARGS


def sim_to_real_config(task: str, s2r: SimToRealConfig | dict | None = None) -> SimToRealConfig:
    """The sim-to-real config `make(task, s2r=s2r)` builds the env with: the task's
    defaults (None), with a dict's fields over them, or a `SimToRealConfig` as it is.

    ValueError naming an unknown field or a bad value, e.g. to check settings before an
    env is built.
    """
    if isinstance(s2r, SimToRealConfig):
        return s2r
    if is_external(task):
        s2r = {k: v for k, v in (s2r or {}).items() if not (k == "obs_history" and v == 1)}
        if s2r:
            raise ValueError(
                f"{task} is an external env: it randomizes itself; sim-to-real settings "
                f"{sorted(s2r)} do not apply"
            )
        return SimToRealConfig()
    base = task_class(task).default_s2r()
    if s2r is None:
        return base
    if not isinstance(s2r, dict):
        raise ValueError(f"sim-to-real settings must be a mapping of fields, got {s2r!r}")
    known = base.__dataclass_fields__
    unknown = set(s2r) - set(known)
    if unknown:
        raise ValueError(f"unknown sim-to-real fields {sorted(unknown)}; known: {sorted(known)}")
    return SimToRealConfig(**{**base.__dict__, **s2r})


def make(
    task: str,
    num_envs: int = 1,
    *,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    s2r: SimToRealConfig | dict | None = None,
    hooks: str = "auto",
    **kwargs,
) -> MujocoVecEnv:
    """Build a batched environment of `task` with `num_envs` copies.

    `s2r` overrides the task's sim-to-real defaults: a `SimToRealConfig` replaces
    them, a dict updates individual fields. A task "prefix:name" is an env of another
    framework, built by the factory registered for the prefix (sim.external).
    `hooks` says where the task's observation, reward and reset code runs with
    backend="warp" (resolve_hooks): "torch" keeps the whole step on the device.
    """
    if is_external(task):
        if hooks != "auto":
            raise ValueError(
                f"{task} is an external env: hooks={hooks!r} applies to our tasks only"
            )
        return _make_external(task, num_envs, seed, device, s2r, kwargs)
    cls = task_class(task)
    if isinstance(s2r, dict):
        s2r = sim_to_real_config(task, s2r)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    hooks = resolve_hooks(task, hooks, kwargs.get("backend", "c"), device, kwargs)
    if hooks == "torch":
        cls = _TORCH_TASKS[task]()
    return cls(num_envs=num_envs, seed=seed, device=device, s2r=s2r, **kwargs)


def _make_external(task, num_envs, seed, device, s2r, kwargs):
    from sim.external import make_external

    if isinstance(s2r, dict):
        s2r = sim_to_real_config(task, s2r)
    # what a config sets for every env; for an external env only the defaults make sense
    defaults = {"num_threads": 0, "max_episode_steps": None, "backend": "c", "s2r": None}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in defaults}
    given["s2r"] = s2r
    nominal = [None, SimToRealConfig()]
    bad = sorted(
        k for k, v in given.items() if not (v == defaults[k] or (k == "s2r" and v in nominal))
    )
    if bad:
        raise ValueError(
            f"{task} is an external env (sim.external): {bad} apply to our simulator only; "
            "the env's own config sets its episode length, randomization and engine"
        )
    return make_external(task, num_envs, seed, torch.device(device), **kwargs)


def _lazy(module: str, cls: str) -> Callable[[], type[MujocoVecEnv]]:
    def load() -> type[MujocoVecEnv]:
        import importlib

        return getattr(importlib.import_module(module), cls)

    return load


register("halfcheetah", _lazy("sim.tasks.halfcheetah", "HalfCheetah"))
register("hopper", _lazy("sim.tasks.hopper", "Hopper"))
register("walker2d", _lazy("sim.tasks.walker2d", "Walker2d"))
register("ant", _lazy("sim.tasks.ant", "Ant"))
register("humanoid", _lazy("sim.tasks.humanoid", "Humanoid"))
register("cartpole", _lazy("sim.tasks.cartpole", "CartPole"))
register("quadruped", _lazy("sim.tasks.quadruped", "Quadruped"))
register("go1", _lazy("sim.tasks.go1", "Go1"))
register("go1_rough", _lazy("sim.tasks.go1", "Go1Rough"))
register("instructed_reach", _lazy("sim.tasks.instructed_reach", "InstructedReach"))

register_torch("cartpole", _lazy("sim.tasks.gym_torch", "CartPoleTorch"))
register_torch("halfcheetah", _lazy("sim.tasks.gym_torch", "HalfCheetahTorch"))
register_torch("hopper", _lazy("sim.tasks.gym_torch", "HopperTorch"))
register_torch("walker2d", _lazy("sim.tasks.gym_torch", "Walker2dTorch"))
register_torch("ant", _lazy("sim.tasks.gym_torch", "AntTorch"))
register_torch("quadruped", _lazy("sim.tasks.quadruped_torch", "QuadrupedTorch"))
register_torch("go1", _lazy("sim.tasks.quadruped_torch", "Go1Torch"))
register_torch("go1_rough", _lazy("sim.tasks.quadruped_torch", "Go1RoughTorch"))
