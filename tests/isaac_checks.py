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

    from sim.isaac_assets import CARTPOLE, GROUND, write_standin_assets

    root = write_standin_assets(tmp / "assets")
    stamps = {rel: (root / rel).stat().st_mtime_ns for rel in (CARTPOLE, GROUND)}
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
    (out / "checks.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
