"""Checks of mjlab's tasks behind our contract, run in .venv-mjlab by tests/test_sim_mjlab.py
(mjlab pins MuJoCo 3.11, so they cannot run in the main venv's pytest).

    .venv-mjlab/bin/python tests/mjlab_checks.py OUT_DIR

Measures, and writes as JSON into OUT_DIR/checks.json for the test to assert on:
- the adapter changes nothing: our env and mjlab's own rsl_rl wrapper, same seed and
  actions, give the same observations, rewards and episode ends;
- the robot description and observation terms read from mjlab;
- PPO trains through our runner (from mjlab's rsl_rl settings), saves, resumes, exports;
- the ONNX file's metadata, its parity with the torch policy, and sim2sim's return of the
  file against the checkpoint's evaluation on the same seed;
- a rendered frame.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from external_checks import train_export_sim2sim  # beside this script

TASK = "Velocity-Flat-Unitree-Go1"
N, STEPS = 4, 30


def adapter_matches_mjlab() -> dict:
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg

    import sim

    actions = torch.randn(STEPS, N, 12, generator=torch.Generator().manual_seed(1)) * 0.5
    ours = sim.make(f"mjlab:{TASK}", N, seed=3)
    o = [ours.reset()["policy"].clone()]
    r, ends = [], []
    for a in actions:
        obs, rew, term, trunc, _ = ours.step(a)
        o.append(obs["policy"].clone())
        r.append(rew.clone())
        ends.append((term | trunc).clone())
    frame = ours.render()
    ours.close()

    cfg = load_env_cfg("Mjlab-" + TASK)
    cfg.scene.num_envs, cfg.seed = N, 3
    theirs = RslRlVecEnvWrapper(ManagerBasedRlEnv(cfg=cfg, device="cpu"))
    theirs.reset()
    o2 = [theirs.get_observations()["actor"].clone()]
    r2, ends2 = [], []
    for a in actions:
        obs, rew, done, _ = theirs.step(a)
        o2.append(obs["actor"].clone())
        r2.append(rew.clone())
        ends2.append(done.bool().clone())
    robot = theirs.unwrapped.scene["robot"].cfg.articulation.actuators
    return {
        "obs_max_diff": float((torch.stack(o) - torch.stack(o2)).abs().max()),
        "reward_max_diff": float((torch.stack(r) - torch.stack(r2)).abs().max()),
        "ends_equal": bool(torch.equal(torch.stack(ends), torch.stack(ends2))),
        "reward_std": float(torch.stack(r).std()),
        "frame_shape": list(frame.shape),
        "frame_std": float(np.asarray(frame, dtype=np.float64).std()),
        "actuators": [
            {"expr": list(a.target_names_expr), "kp": a.stiffness, "kd": a.damping,
             "effort": a.effort_limit}
            for a in robot
        ],  # fmt: skip
    }


def cli_resolves_the_documented_command() -> dict:
    """README's `.venv-mjlab/bin/sim2real train ppo --task mjlab:...`, resolved through
    the CLI with --print-config (the preset and the entry point; training is above)."""
    import contextlib
    import io

    from training.cli import main as cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli(["train", "ppo", "--task", f"mjlab:{TASK}", "--print-config"])
    return {"rc": rc, "printed_actor_hidden": "512" in buf.getvalue()}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "adapter": adapter_matches_mjlab(),
        "training": train_export_sim2sim(f"mjlab:{TASK}", out, 24, critic_size=72),
        "cli": cli_resolves_the_documented_command(),
    }
    (out / "checks.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
