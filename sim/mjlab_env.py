"""mjlab's tasks (Unitree Go1/G1 velocity tracking, cartpole, ...) behind our VecEnv contract.

`sim.make("mjlab:Velocity-Flat-Unitree-Go1", num_envs)` and `sim2real train ppo --task
mjlab:Velocity-Flat-Unitree-Go1` build mjlab's own env (its managers, rewards,
randomization and MuJoCo Warp physics) wrapped in mjlab's rsl_rl wrapper, and adapt it
through `sim.external.RslRlStyleEnv`, so our learners, evaluation, export and ROS nodes
run it unchanged.

mjlab pins MuJoCo 3.11, our C backend needs MuJoCo 4: this runs in `.venv-mjlab`
(`scripts/setup_mjlab.sh`), where this module imports mjlab and nothing of the C backend.
The factory is declared as the entry point `mjlab` of `sim2real.external_envs`.

What the adapter reads from mjlab, so that the exported metadata describes the robot:
the action term's joints, scale and offset (mjlab's `JointPositionAction`: target =
offset + scale * action, the offset being the default pose), the position actuators'
stiffness, damping and force range from the compiled model, the joints' ranges, the
physics and control periods, and the names and sizes of the observation terms.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sim.external import RslRlStyleEnv, framework_task_id, manager_observation_terms
from sim.spec import RobotDescription

__all__ = ["make_mjlab_env", "mjlab_task_id"]

# mjlab 1.6 names the policy's observation group "actor"
GROUP_NAMES = {"policy": "actor", "critic": "critic"}
PREFIX = "Mjlab-"


def _import_mjlab():
    try:
        import mjlab.tasks  # noqa: F401  (registers mjlab's tasks)
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.rl import RslRlVecEnvWrapper
        from mjlab.tasks import registry
    except ImportError as e:
        raise ImportError(
            f"mjlab tasks need the mjlab package, which is not importable here ({e}); it pins "
            "MuJoCo 3.11 and lives in its own venv: run `bash scripts/setup_mjlab.sh`, then "
            "`.venv-mjlab/bin/sim2real ...`"
        ) from e
    return ManagerBasedRlEnv, RslRlVecEnvWrapper, registry


def mjlab_task_id(name: str, known: list[str]) -> str:
    """mjlab's id for `name`, which may leave out the "Mjlab-" prefix."""
    return framework_task_id(name, known, PREFIX, "mjlab")


def make_mjlab_env(
    name: str,
    num_envs: int,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    play: bool = False,
    **options: Any,
) -> RslRlStyleEnv:
    """Build mjlab's task `name` with `num_envs` envs (`play`: its evaluation variant,
    no randomization pushes or curriculum)."""
    if options:
        raise ValueError(
            f"mjlab:{name}: unknown option(s) {sorted(options)}; an mjlab task takes `play`, "
            "the rest of its settings are mjlab's own config"
        )
    ManagerBasedRlEnv, RslRlVecEnvWrapper, registry = _import_mjlab()
    task_id = mjlab_task_id(name, registry.list_tasks())
    cfg = registry.load_env_cfg(task_id, play=play)
    rl_cfg = registry.load_rl_cfg(task_id)
    cfg.scene.num_envs = int(num_envs)
    if seed is not None:
        cfg.seed = int(seed)
    env = ManagerBasedRlEnv(cfg=cfg, device=str(device))
    wrapped = RslRlVecEnvWrapper(env, clip_actions=rl_cfg.clip_actions)
    clip = rl_cfg.clip_actions
    return RslRlStyleEnv(
        wrapped,
        f"mjlab:{name}",
        robot=robot_description(env),
        dt=float(env.step_dt),
        action_clip=float(clip) if clip else 100.0,
        device=device,
        group_names=GROUP_NAMES,
        obs_terms=observation_terms(env),
        render=lambda: _render(env),
    )


def _render(env: Any) -> np.ndarray:
    """Env 0 through mjlab's offscreen renderer, built at the first frame: an env made
    for training never pays for a GL context."""
    if env._offline_renderer is None:
        from mjlab.viewer.offscreen_renderer import OffscreenRenderer

        renderer = OffscreenRenderer(
            model=env.sim.mj_model,
            cfg=env.cfg.viewer,
            scene=env.scene,
            sim_model=env.sim.model,
            expanded_fields=env.sim.expanded_fields,
        )
        renderer.initialize()
        env._offline_renderer = renderer
        env.render_mode = "rgb_array"
    return env.render()


def observation_terms(env: Any) -> dict[str, list[tuple[str, int]]]:
    """Our group -> [(term, size)] from mjlab's observation manager."""
    return manager_observation_terms(env.observation_manager, GROUP_NAMES)


def robot_description(env: Any) -> RobotDescription | None:
    """The robot as deployment needs it, for an env driven by one joint-position action
    term (mjlab's legged tasks); None (a torque-level description) otherwise."""
    terms = list(env.action_manager._terms.values())
    if len(terms) != 1 or type(terms[0]).__name__ != "JointPositionAction":
        return None
    term = terms[0]
    model = env.sim.mj_model
    robot = term._entity
    names = tuple(term.target_names)
    # the action term indexes the entity's joints; the entity knows their model ids
    entity_joints = robot.indexing.joint_ids.detach().cpu().numpy()
    joint_ids = entity_joints[term.target_ids.detach().cpu().numpy()]
    kp, kd, force = (np.zeros(len(names)) for _ in range(3))
    for a in range(model.nu):
        j = int(model.actuator_trnid[a, 0])
        hits = np.flatnonzero(joint_ids == j)
        if hits.size:
            i = hits[0]
            kp[i] = model.actuator_gainprm[a, 0]
            kd[i] = -model.actuator_biasprm[a, 2]
            force[i] = model.actuator_forcerange[a, 1] if model.actuator_forcelimited[a] else np.inf
    scale = term.scale[0].detach().cpu().numpy().astype(np.float64)
    offset = term.offset[0].detach().cpu().numpy().astype(np.float64)
    rng = model.jnt_range[joint_ids]
    return RobotDescription(
        joint_names=names,
        default_joint_pos=offset.copy(),
        kp=kp,
        kd=kd,
        action_scale=scale,
        action_offset=offset,
        joint_pos_lower=rng[:, 0].astype(np.float64),
        joint_pos_upper=rng[:, 1].astype(np.float64),
        torque_limit=force,
        physics_dt=float(model.opt.timestep),
        control_dt=float(env.step_dt),
        control_mode="position",
    )
