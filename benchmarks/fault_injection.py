"""Kill -9 training runs of PPO, DPPO and GRPO at chosen and random moments, resume them,
and count the runs that ended exactly as an uninterrupted one (docs/reliability.md).

    python benchmarks/fault_injection.py --random 10 --out runs/faults

Each case: a reference run without fault, then for every fault a run killed by it and
resumed (started over when it died before its first checkpoint) until done; "lost
nothing" means the final weights and every metric row (timings aside) are the
reference's. The child processes are tests/fault_support.py.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fault_support import run_child, same_result, train_until_done  # noqa: E402

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]


def ppo_args() -> list[str]:
    return ["train", "ppo", "--task", "cartpole", "--steps", "2048", "--no-artifacts", *QUIET,
            "env.num_envs=4", "ppo.num_steps=16", "run.checkpoint_every=1"]  # fmt: skip


def dppo_args(out: Path) -> list[str]:
    from demo_support import random_demos

    from training.bc_runner import BCRunner
    from training.train_configs import build_bc_config

    bc = out / "bc"
    if not (bc / "checkpoints" / "latest.pt").exists():
        demos = random_demos(out / "demos.hdf5")
        over = ["run.progress=false", "run.tensorboard=false", "bc.num_updates=10",
                "bc.batch_size=8", "policy.hidden=8,8", "policy.critic_hidden=8",
                "policy.sample_steps=3", "policy.horizon=4", "policy.act_steps=2"]  # fmt: skip
        BCRunner(build_bc_config("hopper", str(demos), over), bc).train()
    return ["train", "dppo", "--init", str(bc), "--steps", "512", "--no-artifacts", *QUIET,
            "env.num_envs=2", "dppo.num_steps=8", "dppo.num_epochs=1", "dppo.ft_steps=2",
            "run.checkpoint_every=1", "env.max_episode_steps=30"]  # fmt: skip


def grpo_args(out: Path) -> list[str]:
    from training.grpo.tiny import addition_rows, build_tiny_model, write_jsonl

    model = build_tiny_model(out / "model", chars="0123456789+=", seed=0)
    data = write_jsonl(out / "add.jsonl", addition_rows(9))
    return ["train", "grpo", "--model", str(model), "--data", str(data), "--steps", "12",
            "run.progress=false", "run.tensorboard=false", "run.checkpoint_every=1",
            "sampling.prompts_per_step=2", "sampling.group_size=4", "sampling.max_new_tokens=3",
            "run.threads=1", "run.save_final_model=false"]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random", type=int, default=10, help="random kills per learner (PPO)")
    p.add_argument("--random-slow", type=int, default=3, help="random kills for DPPO and GRPO")
    p.add_argument("--out", default="runs/faults")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(a.seed)
    # the random moments fall between the start of training and its end (measured by
    # the reference run), so that most random kills hit a running learner
    learners = {
        "ppo": (ppo_args(), "policy", a.random),
        "dppo": (dppo_args(out), "policy", a.random_slow),
        "grpo": (grpo_args(out), "trainable", a.random_slow),
    }
    table: dict[tuple[str, str], list[int]] = {}
    for name, (args, weights, n_random) in learners.items():
        ref = out / name / "ref"
        t0 = time.perf_counter()
        assert run_child("none", [*args, "--run-dir", str(ref)], out) == 0
        window = (2.0, time.perf_counter() - t0)
        faults = [("before the first checkpoint", "checkpoint:1"),
                  ("during a checkpoint write", "checkpoint:3"),
                  ("during a metrics write", "metrics:2")]  # fmt: skip
        faults += [("at a random moment", f"after:{rng.uniform(*window):.2f}") for _ in range(n_random)]
        for i, (what, fault) in enumerate(faults):
            run = out / name / f"case{i}"
            t0 = time.perf_counter()
            kills = train_until_done(fault, args, run, out)
            same, why = same_result(run, ref, weights)
            row = table.setdefault((name, what), [0, 0, 0])
            row[0] += 1
            row[1] += int(same)
            row[2] += kills
            print(f"{name:5} {what:28} {fault:14} killed {kills}x -> "
                  f"{'same as uninterrupted' if same else 'DIFFERENT: ' + why} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    print("\n| learner | kill -9 | runs | killed | lost nothing |\n| --- | --- | --: | --: | --: |")
    for (name, what), (tried, ok, kills) in table.items():
        print(f"| {name} | {what} | {tried} | {kills} | {ok} |")
    return 0 if all(ok == tried for tried, ok, _ in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
