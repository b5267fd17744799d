"""Velocity tracking of an exported legged-robot policy, in sim2sim.

Runs the ONNX file through the robot-side runtime and safety layer (deploy.sim2sim) on
its task (quadruped, go1, ...: the file's metadata says which) with a fixed forward
command per row, nominal and with the task's
training randomization (masses, friction, motor strength, PD gains, sensor noise,
action latency, pushes). Per command: mean |v_cmd - v_xy| after the first `--skip`
seconds, mean forward speed, and falls. The peer in the same run is a robot that holds
its standing pose (zero action), whose error is the command's speed.

    python benchmarks/quadruped_tracking.py tests/data/quadruped_policy.onnx
    python benchmarks/quadruped_tracking.py tests/data/go1_policy.onnx
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from deploy.metadata import read_metadata
from deploy.runtime import OnnxPolicy
from deploy.sim2sim import Sim2SimActor
from sim.randomization import SimToRealConfig
from sim.registry import make


def track(
    task: str,
    path: str | None,
    cmd: tuple[float, float, float],
    randomize: bool,
    envs: int,
    seconds: float,
    skip: float,
    seed: int,
) -> dict[str, float]:
    """Tracking figures of the policy file (None: hold the standing pose) on one command."""
    env = make(
        task,
        envs,
        seed=seed,
        s2r=None if randomize else SimToRealConfig(),
        fixed_command=cmd,
    )
    try:
        actor = None
        if path is not None:
            actor = Sim2SimActor(OnnxPolicy(path, deterministic=True), envs, env.dt)
        obs = env.reset()
        reset = torch.ones(envs, dtype=torch.bool)
        zeros = torch.zeros(envs, env.action_spec.size)
        # forward speed from the critic's privileged (noise-free) base velocity term,
        # in the newest frame of the group
        critic = env.observation_spec["critic"]
        vx_col = (critic.history - 1) * critic.frame_size + critic.slices()["base_lin_vel"].start
        errs, vx, falls = [], [], 0
        for k in range(int(round(seconds / env.dt))):
            act = zeros if actor is None else torch.as_tensor(actor(obs, reset))
            obs, _, term, trunc, info = env.step(act)
            reset = term | trunc
            falls += int(term.sum())
            if k * env.dt >= skip:
                errs.append(info["lin_vel_error"].numpy())
                vx.append(obs["critic"][:, vx_col].numpy())
        return {
            "lin_vel_error": float(np.mean(errs)),
            "vx_mean": float(np.mean(vx)),
            "falls": falls,
        }
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("policy", help="exported velocity-tracking policy (.onnx)")
    p.add_argument("--task", default=None, help="default: the task in the file's metadata")
    p.add_argument("--speeds", nargs="+", type=float, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--skip", type=float, default=3.0, help="seconds left out at the start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not Path(a.policy).is_file():
        p.error(f"no policy file {a.policy}")
    task = a.task or read_metadata(a.policy).task
    print(f"task {task}, policy {a.policy}")
    rows = []
    print(
        f"{'vx cmd':>7} {'randomized':>10} {'error m/s':>10} {'vx m/s':>8} {'falls':>6} {'standing peer error':>20}"
    )
    for randomize in (False, True):
        for v in a.speeds:
            cmd = (v, 0.0, 0.0)
            ours = track(task, a.policy, cmd, randomize, a.envs, a.seconds, a.skip, a.seed)
            peer = track(task, None, cmd, randomize, a.envs, a.seconds, a.skip, a.seed)
            rows.append({"command": cmd, "randomize": randomize, "ours": ours, "standing": peer})
            print(
                f"{v:>7.2f} {str(randomize):>10} {ours['lin_vel_error']:>10.3f} "
                f"{ours['vx_mean']:>8.3f} {ours['falls']:>6} {peer['lin_vel_error']:>20.3f}",
                flush=True,
            )
    if a.json:
        out = {"task": task, "policy": a.policy, "rows": rows}
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
