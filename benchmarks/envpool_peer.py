"""EnvPool's stepping rate for one (task, env count): the simulator benchmark's peer.

Runs inside .venv-envpool (scripts/setup_envpool.sh), imports nothing of ours, and
prints one JSON line: ``{"rate": env steps per second, "envpool": version}``. Random
actions, synchronous mode (the whole batch each step, as our simulator steps it),
auto-resets as EnvPool does them, the same thread count as ours.

    .venv-envpool/bin/python benchmarks/envpool_peer.py HalfCheetah-v5 256 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import envpool
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", help="EnvPool task id, e.g. HalfCheetah-v5")
    p.add_argument("num_envs", type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    env = envpool.make(
        a.task,
        env_type="gymnasium",
        num_envs=a.num_envs,
        batch_size=a.num_envs,
        num_threads=min(a.threads, a.num_envs),
        seed=a.seed,
    )
    env.reset()
    rng = np.random.default_rng(a.seed)
    space = env.action_space
    acts = [
        rng.uniform(space.low, space.high, (a.num_envs, *space.shape)).astype(np.float32)
        for _ in range(8)
    ]
    for act in acts[:3]:  # warm-up, as for ours
        env.step(act)
    steps, t0 = 0, time.perf_counter()
    while True:
        env.step(acts[steps % len(acts)])
        steps += 1
        dt = time.perf_counter() - t0
        if dt >= a.seconds and steps >= 5:
            break
    env.close()
    print(json.dumps({"rate": steps * a.num_envs / dt, "envpool": envpool.__version__}))


if __name__ == "__main__":
    main()
