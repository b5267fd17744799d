"""Checks of Isaac Lab 3.0's tasks behind our contract, run in .venv-isaac by
tests/test_sim_isaac.py (Isaac Lab needs Python 3.12 and torch 2.11, so they cannot run
in the main venv's pytest).

    .venv-isaac/bin/python tests/isaac_checks.py OUT_DIR

Measures, and writes as JSON into OUT_DIR/checks.json for the test to assert on:
- the env builds from the stand-in assets (sim/isaac_assets.py) with nothing fetched,
  cold and warm build times, and steps per second at 4 envs through our adapter;
- the adapter changes nothing: our env and Isaac Lab's own rsl_rl wrapper, same seed and
  actions, give the same observations, rewards and episode ends; and our env is
  deterministic (same seed twice, same trajectory);
- the robot description and observation terms read from Isaac Lab;
- PPO trains through our runner, saves, resumes, exports;
- the ONNX file's metadata, its parity with the torch policy, and sim2sim's return of the
  file against the checkpoint's evaluation on the same seed.

And the same for the project's own Isaac Lab task, Isaac Lab's flat velocity task with our
quadruped (sim/isaac_quadruped.py): the USD written from the MJCF read back with pxr;
the env built through our adapter at 4 envs, what Isaac Lab read from the USD (bodies,
joints, masses, the bodies its contact terms address), the robot description, standing
still and speed; same seed, same trajectory; PPO, resume, export, parity, sim2sim.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from external_checks import train_export_sim2sim  # beside this script

TASK = "Isaac-Cartpole"
# past the 300-step time-out, with env 2 pushed off its rail (a termination)
N, STEPS = 4, 320
QUADRUPED_TASK = "Isaac-Velocity-Flat-Sim2real-Quadruped"
# control steps of the quadruped standing (zero actions) and of the repeat check
STAND, REPEAT = 50, 20


def _register() -> bool:
    """Whether the `isaac` entry point is installed; registered by hand if not, so that
    the checks run before pyproject.toml declares it."""
    from sim.external import _entry_points, register_external
    from sim.isaac_env import make_isaac_env

    declared = "isaac" in _entry_points()
    if not declared:
        register_external("isaac", make_isaac_env)
    return declared


def _rollout(env, actions, obs0: torch.Tensor, adapter: bool):
    o, r, ends, kinds = [obs0.clone()], [], [], {"terminated": 0, "truncated": 0}
    for a in actions:
        if adapter:
            obs, rew, term, trunc, _ = env.step(a)
            done = term | trunc
            kinds["terminated"] += int(term.sum())
            kinds["truncated"] += int(trunc.sum())
        else:
            obs, rew, done, _ = env.step(a)
        o.append(obs["policy"].clone())
        r.append(rew.clone())
        ends.append(done.bool().clone())
    return torch.stack(o), torch.stack(r), torch.stack(ends), kinds


def standin_assets(tmp: Path) -> dict:
    """What the stand-in writer puts where Isaac Lab looks, read back with pxr."""
    from pxr import Usd, UsdGeom, UsdPhysics

    from sim.isaac_assets import CARTPOLE, GROUND, STANDIN_FILES, write_standin_assets

    root = write_standin_assets(tmp / "assets")
    stamps = {rel: (root / rel).stat().st_mtime_ns for rel in STANDIN_FILES}
    write_standin_assets(tmp / "assets")  # a second call finds them and writes nothing
    rewritten = [rel for rel, t in stamps.items() if (root / rel).stat().st_mtime_ns != t]
    cart = Usd.Stage.Open(str(root / CARTPOLE))
    joints = {p.GetName(): p.GetTypeName() for p in cart.Traverse() if p.IsA(UsdPhysics.Joint)}
    bodies = sorted(p.GetName() for p in cart.Traverse() if p.HasAPI(UsdPhysics.RigidBodyAPI))
    ground = Usd.Stage.Open(str(root / GROUND))
    planes = [
        p.GetName() for p in ground.Traverse()
        if p.IsA(UsdGeom.Plane) and p.HasAPI(UsdPhysics.CollisionAPI)
    ]  # fmt: skip
    return {
        "joints": joints,
        "bodies": bodies,
        "articulation_root": cart.GetDefaultPrim().HasAPI(UsdPhysics.ArticulationRootAPI),
        "collision_planes": planes,
        "rewritten": rewritten,
    }


def quadruped_asset(tmp: Path) -> dict:
    """The quadruped's USD as written, read back with pxr, beside what it was written
    from (sim.isaac_assets.quadruped_model, the compiled MJCF)."""
    from pxr import Usd, UsdGeom, UsdPhysics

    from sim.isaac_assets import QUADRUPED, quadruped_model, write_standin_assets

    stage = Usd.Stage.Open(str(write_standin_assets(tmp / "assets") / QUADRUPED))
    root = stage.GetDefaultPrim()
    bodies, joints, shapes = {}, {}, {}
    for p in stage.Traverse():
        if p.HasAPI(UsdPhysics.RigidBodyAPI):
            mass = UsdPhysics.MassAPI(p)
            bodies[p.GetName()] = {
                "parent": p.GetParent().GetName(),
                "mass": mass.GetMassAttr().Get(),
                "inertia": list(mass.GetDiagonalInertiaAttr().Get()),
            }
        elif p.IsA(UsdPhysics.RevoluteJoint):
            j = UsdPhysics.RevoluteJoint(p)
            drive = UsdPhysics.DriveAPI(p, "angular")
            joints[p.GetName()] = {
                "body0": str(j.GetBody0Rel().GetTargets()[0].name),
                "body1": str(j.GetBody1Rel().GetTargets()[0].name),
                "axis": j.GetAxisAttr().Get(),
                "limits_deg": [j.GetLowerLimitAttr().Get(), j.GetUpperLimitAttr().Get()],
                "stiffness_per_deg": drive.GetStiffnessAttr().Get(),
                "max_force": drive.GetMaxForceAttr().Get(),
            }
        elif p.IsA(UsdPhysics.Joint):
            joints[p.GetName()] = {"type": p.GetTypeName()}
        elif p.IsA(UsdGeom.Gprim) and p.HasAPI(UsdPhysics.CollisionAPI):
            shapes[p.GetName()] = {"body": p.GetParent().GetName(), "type": p.GetTypeName()}
    model = quadruped_model()
    return {
        "articulation_root": root.HasAPI(UsdPhysics.ArticulationRootAPI),
        "root_name": root.GetName(),
        "bodies": bodies,
        "joints": joints,
        "shapes": shapes,
        "model_links": [link.name for link in model.links],
        "model_joints": [j.name for j in model.joints],
        "model_mass": sum(link.mass for link in model.links),
    }


def quadruped_env() -> dict:
    """Our quadruped in Isaac Lab's velocity task through our adapter, 4 envs."""
    import sim

    t0 = time.perf_counter()
    env = sim.make(f"isaac:{QUADRUPED_TASK}", N, seed=5)
    build = time.perf_counter() - t0
    base = env.env.unwrapped
    robot = base.scene["robot"]
    contacts = base.scene["contact_forces"]
    rewards, terms = base.reward_manager, base.termination_manager

    def sensed(cfg) -> list[str]:
        # the contact sensor's bodies a term's SceneEntityCfg resolved to
        return [contacts.sensor_names[i] for i in cfg.params["sensor_cfg"].body_ids]

    masses = robot.data.body_mass.torch[0].cpu().tolist()
    out = {
        "build_s": build,
        "robot": env.robot.to_dict(),
        "obs_terms": [[t.name, t.size] for t in env.observation_spec.policy.terms],
        "action_joints": list(env.action_spec.joint_names),
        "max_episode_steps": env.max_episode_steps,
        "dt": env.dt,
        "body_names": list(robot.body_names),
        "joint_names": list(robot.joint_names),
        "body_mass": dict(zip(robot.body_names, masses, strict=True)),
        "armature": robot.data.joint_armature.torch[0].cpu().tolist(),
        "friction": robot.data.joint_friction_coeff.torch[0].cpu().tolist(),
        "viscous_friction": robot.data.joint_viscous_friction_coeff.torch[0].cpu().tolist(),
        "contact_sensors": list(contacts.sensor_names),
        "feet_air_time_bodies": sensed(rewards.get_term_cfg("feet_air_time")),
        "undesired_contact_bodies": sensed(rewards.get_term_cfg("undesired_contacts")),
        "base_contact_bodies": sensed(terms.get_term_cfg("base_contact")),
    }
    # standing: zero actions hold the default pose under PD; the trunk stays up
    env.reset(seed=5)
    zeros = torch.zeros(N, 12)
    env.step(zeros)  # the first step after a build compiles nothing, but measure after it
    ends = 0
    t0 = time.perf_counter()
    for _ in range(STAND):
        _, _, term, trunc, _ = env.step(zeros)
        ends += int((term | trunc).sum())
    out["steps_per_s"] = STAND * N / (time.perf_counter() - t0)
    out["stand_ends"] = ends
    out["stand_base_height"] = robot.data.root_pos_w.torch[:, 2].cpu().tolist()
    out["stand_joint_err"] = float(
        (robot.data.joint_pos.torch - robot.data.default_joint_pos.torch).abs().max()
    )
    # a second Isaac env while one is open: Isaac Lab holds one simulation per process
    try:
        sim.make(f"isaac:{TASK}", 1)
        out["second_env_error"] = "no error"
    except RuntimeError as e:
        out["second_env_error"] = str(e)
    out["still_steps"] = bool(torch.isfinite(env.step(zeros)[1]).all())
    env.close()

    # same seed, same actions, twice: the same trajectory
    actions = torch.randn(REPEAT, N, 12, generator=torch.Generator().manual_seed(2))
    runs = []
    for _ in range(2):
        env = sim.make(f"isaac:{QUADRUPED_TASK}", N, seed=7)
        obs = [env.reset(seed=7)["policy"].clone()]
        rew = []
        for a in actions:
            o, r, _, _, _ = env.step(a)
            obs.append(o["policy"].clone())
            rew.append(r.clone())
        env.close()
        runs.append((torch.stack(obs), torch.stack(rew)))
    (o1, r1), (o2, r2) = runs
    out["repeat_obs_max_diff"] = float((o1 - o2).abs().max())
    out["repeat_reward_max_diff"] = float((r1 - r2).abs().max())
    out["repeat_obs_std"] = float(o1.std())
    return out


def unknown_task() -> str:
    import sim

    try:
        sim.make("isaac:No-Such-Task", 1)
    except ValueError as e:
        return str(e)
    return "no error"


def build_and_compare() -> dict:
    import gymnasium as gym

    import sim

    actions = torch.randn(STEPS, N, 1, generator=torch.Generator().manual_seed(1)) * 0.5
    actions[:, 2] = 1.0
    t0 = time.perf_counter()
    ours = sim.make(f"isaac:{TASK}", N, seed=3)
    cold = time.perf_counter() - t0
    robot = ours.robot.to_dict()
    spec = {
        "obs_terms": [[t.name, t.size] for t in ours.observation_spec.policy.terms],
        "groups": sorted(ours.observation_spec.groups),
        "action_joints": list(ours.action_spec.joint_names),
        "action_high": float(ours.action_spec.high[0]),
        "dt": ours.dt,
        "max_episode_steps": ours.max_episode_steps,
    }
    o, r, ends, kinds = _rollout(ours, actions, ours.reset()["policy"], adapter=True)
    # speed: steps of the 4 envs after the first (Warp kernels compiled) rollout
    zeros = torch.zeros(N, 1)
    t0 = time.perf_counter()
    for _ in range(200):
        ours.step(zeros)
    steps_per_s = 200 * N / (time.perf_counter() - t0)
    ours.close()

    t0 = time.perf_counter()
    again = sim.make(f"isaac:{TASK}", N, seed=3)
    warm = time.perf_counter() - t0
    o_again, r_again, ends_again, _ = _rollout(
        again, actions, again.reset()["policy"], adapter=True
    )
    again.close()

    # Isaac Lab's own path, as its train script takes it: the same config resolver and
    # launch context, its rsl_rl wrapper, no adapter
    from isaaclab.app import launch_simulation
    from isaaclab_rl.rsl_rl import RslRlVecEnvWrapper
    from isaaclab_tasks.utils.hydra import resolve_task_config

    cfg, _ = resolve_task_config(TASK, "rsl_rl_cfg_entry_point", overrides=[])
    cfg.scene.num_envs, cfg.seed, cfg.sim.device = N, 3, "cpu"
    with launch_simulation(cfg, {"headless": True, "device": "cpu"}):
        theirs = RslRlVecEnvWrapper(gym.make(TASK, cfg=cfg))
        obs0 = theirs.reset()[0]["policy"]
        o2, r2, ends2, _ = _rollout(theirs, actions, obs0, adapter=False)
        articulation = theirs.unwrapped.scene["robot"]
        actuators = {
            name: {
                "joints": list(act.joint_names),
                "effort": act.cfg.joint_effort_limit,
                "kp": act.cfg.stiffness,
                "kd": act.cfg.damping,
            }
            for name, act in articulation.actuators.items()
        }
        theirs.close()
    from isaaclab.utils import assets

    return {
        "asset_root": assets.NUCLEUS_ASSET_ROOT_DIR,
        "cold_build_s": cold,
        "warm_build_s": warm,
        "steps_per_s": steps_per_s,
        "obs_max_diff": float((o - o2).abs().max()),
        "reward_max_diff": float((r - r2).abs().max()),
        "ends_equal": bool(torch.equal(ends, ends2)),
        "repeat_obs_max_diff": float((o - o_again).abs().max()),
        "repeat_reward_max_diff": float((r - r_again).abs().max()),
        "repeat_ends_equal": bool(torch.equal(ends, ends_again)),
        "reward_std": float(r.std()),
        "obs_std": float(o.std()),
        "ends": int(ends.sum()),
        "ends_by_kind": kinds,
        "robot": robot,
        "spec": spec,
        "actuators": actuators,
    }


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    declared = _register()
    result = {
        "entry_point_declared": declared,
        "assets": standin_assets(out),
        "adapter": build_and_compare(),
        "unknown_task": unknown_task(),
    }
    result["training"] = train_export_sim2sim(f"isaac:{TASK}", out, 16)
    result["quadruped_asset"] = quadruped_asset(out / "quadruped")
    result["quadruped"] = quadruped_env()
    result["quadruped_training"] = train_export_sim2sim(
        f"isaac:{QUADRUPED_TASK}", out / "quadruped", 8
    )
    (out / "checks.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
