"""Isaac Lab 3.0's manager-based tasks (Isaac-Cartpole, ...) behind our VecEnv contract.

`sim.make("isaac:Isaac-Cartpole", num_envs)` and `sim2real train ppo --task
isaac:Isaac-Cartpole` build Isaac Lab's own env (its managers, rewards, events and
physics) wrapped in Isaac Lab's rsl_rl wrapper (`isaaclab_rl.rsl_rl.RslRlVecEnvWrapper`),
and adapt it through `sim.external.RslRlStyleEnv`, so our learners, evaluation, export and
ROS nodes run it unchanged.

Isaac Lab 3.0 needs Python 3.12 and pins torch 2.11: this runs in `.venv-isaac`
(`scripts/setup_isaac.sh`), where this module imports Isaac Lab and nothing of our C
backend. The factory is declared as the entry point `isaac` of `sim2real.external_envs`.

How the env is built, and why:
- **Kit-less.** Isaac Lab 3.0 runs its Newton (MuJoCo Warp) physics without Omniverse
  Kit, on the CPU too. The task's config comes from Isaac Lab's own resolver
  (`resolve_task_config`, with its rsl_rl agent config), and the env is built inside
  `isaaclab.app.launch_simulation`, which starts whatever runtime the config names
  (nothing for Newton) and is left open until the env closes.
- **Assets.** Task configs name their USD files under NVIDIA's asset server. Unless the
  user points `ISAACSIM_ASSET_ROOT` at assets of their own, the factory writes stand-ins
  (`sim.isaac_assets`: a ground plane and a cart-pole) into a local cache and points Isaac
  Lab there, so that nothing downloads at run time. Tasks whose assets have no stand-in
  need the user's asset root.
- **Our quadruped.** `Isaac-Velocity-Flat-Sim2real-Quadruped` is Isaac Lab's flat
  velocity-tracking task with the project's quadruped, from its MJCF
  (`sim.isaac_quadruped`, registered here when Isaac Lab is imported).
- **Groups.** Isaac Lab calls the policy's observation group "policy" and the privileged
  one "critic", as we do.

What the adapter reads from Isaac Lab, so that the exported metadata describes the
robot: the action term's joints, scale and offset (target = offset + scale * action, for
`JointPositionAction`), the joints' stiffness, damping, effort and position limits from
the articulation, the physics and control periods, and the names and sizes of the
observation terms. A `JointEffortAction` (force = scale * action, Isaac-Cartpole) is
described as our torque tasks are: the action is the actuator command (scale 1), the
force limit is the joint's effort limit, and Isaac Lab's scale plays the role of the
actuator's gear, which the metadata does not carry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sim.external import RslRlStyleEnv, framework_task_id, manager_observation_terms
from sim.spec import RobotDescription

__all__ = ["isaac_task_id", "make_isaac_env", "observation_terms", "robot_description"]

GROUP_NAMES = {"policy": "policy", "critic": "critic"}
PREFIX = "Isaac-"
# the rsl_rl agent config's entry point in Isaac Lab's task registry: its clip_actions
AGENT_ENTRY_POINT = "rsl_rl_cfg_entry_point"


def _import_isaaclab():
    # Isaac Lab turns the asset root into path constants at its first import: the
    # stand-ins must be in place before, unless the user has assets of their own
    if not os.environ.get("ISAACSIM_ASSET_ROOT"):
        from sim.isaac_assets import use_standin_assets

        try:
            use_standin_assets()
        except ImportError as e:
            raise _missing(e) from e
    try:
        import gymnasium as gym
        import isaaclab_tasks  # noqa: F401  (registers Isaac Lab's tasks with gymnasium)
        from isaaclab.app import launch_simulation
        from isaaclab.utils import assets
        from isaaclab_rl.rsl_rl import RslRlVecEnvWrapper
        from isaaclab_tasks.utils.hydra import resolve_task_config

        # the project's own Isaac Lab task (our quadruped), beside Isaac Lab's
        from sim.isaac_quadruped import register
    except ImportError as e:
        raise _missing(e) from e
    register()
    if assets.NUCLEUS_ASSET_ROOT_DIR != os.environ["ISAACSIM_ASSET_ROOT"].rstrip("/\\"):
        raise RuntimeError(
            f"Isaac Lab was imported before sim.isaac_env set its asset root: it reads assets "
            f"from {assets.NUCLEUS_ASSET_ROOT_DIR!r}, not {os.environ['ISAACSIM_ASSET_ROOT']!r}; "
            "build Isaac envs through sim.make before importing isaaclab, or set "
            "ISAACSIM_ASSET_ROOT yourself"
        )
    return gym, launch_simulation, RslRlVecEnvWrapper, resolve_task_config


def _missing(e: ImportError) -> ImportError:
    return ImportError(
        f"Isaac Lab tasks need the isaaclab package (3.0, Python 3.12, with usd-core's pxr), "
        f"which is not importable here ({e}); it pins torch 2.11 and lives in its own venv: run "
        "`bash scripts/setup_isaac.sh`, then `.venv-isaac/bin/sim2real ...`"
    )


def isaac_task_id(name: str, known: Sequence[str]) -> str:
    """Isaac Lab's id for `name`, which may leave out the "Isaac-" prefix."""
    return framework_task_id(name, known, PREFIX, "Isaac Lab")


def _wrapper_class(base: type) -> type:
    class SeededWrapper(base):
        """Isaac Lab's rsl_rl wrapper, whose `reset` also takes the seed (our contract's
        `reset(seed=)`; the env's gymnasium `reset` takes it, the wrapper drops it)."""

        def reset(self, seed: int | None = None):
            from tensordict import TensorDict

            obs, extras = self.env.reset(seed=seed)
            return TensorDict(obs, batch_size=[self.num_envs]), extras

    return SeededWrapper


def make_isaac_env(
    name: str,
    num_envs: int,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    play: bool = False,
    overrides: Sequence[str] = (),
    **options: Any,
) -> RslRlStyleEnv:
    """Build Isaac Lab's task `name` with `num_envs` envs on `device` (`play`: its
    evaluation variant; `overrides`: Isaac Lab's own config overrides, as its train
    script takes them, e.g. `["physics=newton_mjwarp"]`)."""
    if options:
        raise ValueError(
            f"isaac:{name}: unknown option(s) {sorted(options)}; an Isaac Lab task takes "
            "`play` and `overrides`, the rest of its settings are Isaac Lab's own config"
        )
    if isinstance(overrides, str):
        raise TypeError(f"isaac:{name}: overrides must be a list of strings, got {overrides!r}")
    gym, launch_simulation, RslRlVecEnvWrapper, resolve_task_config = _import_isaaclab()
    known = [k for k in gym.registry if k.startswith(PREFIX)]
    task_id = isaac_task_id(name, known)
    from isaaclab.sim import SimulationContext

    if SimulationContext.instance() is not None:
        # checked before the launch context opens: closing a failed second launch would
        # end the open env's simulation too
        raise RuntimeError(
            f"isaac:{name}: another Isaac Lab env is open in this process, and Isaac Lab "
            "holds one simulation per process: close it (env.close()) before building "
            "this one"
        )
    # overrides=[] rather than None: None makes Isaac Lab parse this process's argv
    cfg, agent_cfg = resolve_task_config(
        task_id, AGENT_ENTRY_POINT, play_mode=play, overrides=list(overrides)
    )
    cfg.scene.num_envs = int(num_envs)
    cfg.sim.device = str(device)
    if seed is not None:
        cfg.seed = int(seed)
    # held open for the env's life, not a `with` block: the runtime a config names (Kit
    # for PhysX) must outlive this call; it ends when the env is closed (_Closing)
    launch = launch_simulation(cfg, {"headless": True, "device": str(device)})
    launch.__enter__()
    env = None
    try:
        env = gym.make(task_id, cfg=cfg)
        clip = getattr(agent_cfg, "clip_actions", None)
        wrapped = _wrapper_class(RslRlVecEnvWrapper)(env, clip_actions=clip)
        base = env.unwrapped
        adapted = RslRlStyleEnv(
            _Closing(wrapped, launch),
            f"isaac:{name}",
            robot=robot_description(base),
            dt=float(base.step_dt),
            action_clip=float(clip) if clip else 100.0,
            device=device,
            group_names=GROUP_NAMES,
            obs_terms=observation_terms(base),
        )
    except BaseException:
        try:
            # Isaac Lab holds one simulation per process: a half-built env must not keep it
            if env is not None:
                env.close()
        finally:
            launch.__exit__(None, None, None)
        raise
    return adapted


class _Closing:
    """The wrapped env, whose `close` also ends Isaac Lab's simulation launch context."""

    def __init__(self, wrapped: Any, launch: Any):
        self._wrapped = wrapped
        self._launch = launch

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._wrapped, attr)

    def close(self) -> None:
        try:
            self._wrapped.close()
        finally:
            launch, self._launch = self._launch, None
            if launch is not None:
                launch.__exit__(None, None, None)


def observation_terms(env: Any) -> dict[str, list[tuple[str, int]]]:
    """Our group -> [(term, size)] from Isaac Lab's observation manager."""
    return manager_observation_terms(env.observation_manager, GROUP_NAMES)


def _array(x: Any) -> np.ndarray:
    """Isaac Lab 3 keeps asset data in Warp arrays behind `ProxyArray` (`.torch`)."""
    if hasattr(x, "torch"):
        x = x.torch
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def _per_joint(value: Any, n: int) -> np.ndarray:
    """An action term's scale or offset (a float, or a per-env tensor) for env 0."""
    a = _array(value)
    return np.broadcast_to(a if a.ndim < 2 else a[0], (n,)).astype(np.float64).copy()


def robot_description(env: Any) -> RobotDescription | None:
    """The robot as deployment needs it, for an env driven by one joint-position or
    joint-effort action term; None (a torque-level description) otherwise."""
    terms = list(env.action_manager._terms.values())
    if len(terms) != 1:
        return None
    kind = type(terms[0]).__name__
    if kind not in ("JointPositionAction", "JointEffortAction"):
        return None
    term = terms[0]
    names = tuple(term._joint_names)
    n = len(names)
    scale = _per_joint(term._scale, n)
    offset = _per_joint(term._offset, n)
    position = kind == "JointPositionAction"
    if not position:
        if np.any(offset != 0):
            return None
        # our torque robots' convention (sim.spec, training.metadata): the policy's action
        # is the actuator command and the force per unit is the actuator's gear, as in
        # MuJoCo's gym tasks. Isaac Lab's effort scale is that gear (force = scale *
        # action): described as scale 1, the safety layer clamps the command to the
        # action bounds, as the env's own clip does, rather than the force
        scale, offset = np.ones(n), np.zeros(n)
    asset = term._asset
    # the term addresses its joints by index, or by slice(None) when it drives them all
    ids = term._joint_ids
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    elif isinstance(ids, slice):
        ids = np.arange(len(asset.joint_names))[ids]
    ids = np.asarray(ids, dtype=np.int64)
    data = asset.data
    limits = _array(data.joint_pos_limits)[0][ids]
    zeros = np.zeros(n)
    return RobotDescription(
        joint_names=names,
        default_joint_pos=_array(data.default_joint_pos)[0][ids],
        # an effort-driven joint holds no PD loop of ours, whatever damping the
        # simulator adds to it
        kp=_array(data.joint_stiffness)[0][ids] if position else zeros.copy(),
        kd=_array(data.joint_damping)[0][ids] if position else zeros.copy(),
        action_scale=scale,
        action_offset=offset,
        joint_pos_lower=limits[:, 0].copy(),
        joint_pos_upper=limits[:, 1].copy(),
        torque_limit=_array(data.joint_effort_limits)[0][ids],
        physics_dt=float(env.physics_dt),
        control_dt=float(env.step_dt),
        control_mode="position" if position else "torque",
    )
