"""Our PPO against mjlab's own runner (rsl_rl's OnPolicyRunner, as `mjlab.scripts.train`
builds it) on the same mjlab task: end-to-end env steps/s of training (rollout + update),
in interleaved rounds, with mjlab's rsl_rl settings on both sides (our preset mirrors
them: training/presets.py). Runs in .venv-mjlab (mjlab pins MuJoCo 3.11):

    bash scripts/setup_mjlab.sh
    .venv-mjlab/bin/python benchmarks/mjlab_ppo.py --envs 64 --iterations 2 --rounds 3
    # on a GPU machine
    .venv-mjlab/bin/python benchmarks/mjlab_ppo.py --device cuda --envs 4096 --iterations 10

On a CPU, mjlab's physics (MuJoCo Warp on Warp's CPU device) dominates both sides, so the
ratio measures what each runner adds around the same simulator. Results in
docs/benchmarks_gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.machine_load import LoadMonitor, interleaved_rounds, median_ratio  # noqa: E402


def mjlab_runner(task: str, num_envs: int, seed: int, log_dir: str, device: str = "cpu"):
    """mjlab's runner on mjlab's env, configured as `mjlab.scripts.train` does, logging
    to TensorBoard instead of W&B."""
    import mjlab.tasks  # noqa: F401  (registers the tasks)
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import MjlabOnPolicyRunner, RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg, load_rl_cfg

    from sim.mjlab_env import mjlab_task_id

    tid = mjlab_task_id(task, mjlab.tasks.registry.list_tasks())
    cfg, rl = load_env_cfg(tid), load_rl_cfg(tid)
    cfg.scene.num_envs, cfg.seed = num_envs, seed
    rl.logger, rl.upload_model, rl.seed = "tensorboard", False, seed
    env = RslRlVecEnvWrapper(ManagerBasedRlEnv(cfg=cfg, device=device), clip_actions=rl.clip_actions)
    runner = MjlabOnPolicyRunner(env, asdict(rl), log_dir, device)
    return runner, rl.num_steps_per_env


def ours_runner(task: str, num_envs: int, seed: int, run_dir: str, device: str = "cpu"):
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = [f"env.num_envs={num_envs}", f"run.seed={seed}", "run.progress=false"]
    over += ["run.video=false", "run.eval_every=0", f"run.device={device}"]
    cfg = build_ppo_config(f"mjlab:{task}", over)
    return OnPolicyRunner(cfg, run_dir), cfg.ppo.num_steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="Velocity-Flat-Unitree-Go1")
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--iterations", type=int, default=2, help="PPO iterations per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    monitor = LoadMonitor(own_threads=os.cpu_count() or 1)
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        theirs, their_steps = mjlab_runner(a.task, a.envs, 0, f"{tmp}/mjlab", a.device)
        ours, our_steps = ours_runner(a.task, a.envs, 0, f"{tmp}/ours", a.device)
        build_s = time.perf_counter() - t0
        if their_steps != our_steps:
            raise SystemExit(f"rollout lengths differ: mjlab {their_steps}, ours {our_steps}")
        per_round = a.iterations * a.envs * our_steps

        def run_theirs() -> float:
            t = time.perf_counter()
            theirs.learn(num_learning_iterations=a.iterations)
            return per_round / (time.perf_counter() - t)

        def run_ours() -> float:
            t = time.perf_counter()
            for _ in range(a.iterations):
                ours._iteration(total_iters=10**9)  # no evaluation, no final steps
            return per_round / (time.perf_counter() - t)

        rates = interleaved_rounds({"ours": run_ours, "mjlab": run_theirs}, a.rounds, monitor)
        ours.close()
    result = {
        "task": a.task,
        "device": a.device,
        "num_envs": a.envs,
        "steps_per_env": our_steps,
        "iterations_per_round": a.iterations,
        "ours_steps_per_s": statistics.median(rates["ours"]),
        "mjlab_steps_per_s": statistics.median(rates["mjlab"]),
        "ours_over_mjlab": median_ratio(rates["ours"], rates["mjlab"]),
        "rounds": rates,
        "build_s": build_s,
        "load_after": os.getloadavg(),
        "machine_load": {"verdict": monitor.describe(), "busy": monitor.busy},
    }
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
