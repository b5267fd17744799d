"""The MuJoCo Warp backend against the C backend: env steps/s per task and batch size
(interleaved rounds, the same random actions), and the time Warp takes to build an env
and take its first step (kernel compile on a cold cache, load on a warm one). Warp
runs twice: with the task's numpy hooks on the host, and with its torch hooks on
Warp's device (sim/device_step.py; the tasks that have them).

    python benchmarks/warp_backend.py --tasks halfcheetah quadruped --envs 64 512
    # on a GPU machine: Warp on CUDA against the C backend on all CPU cores
    python benchmarks/warp_backend.py --device cuda --tasks quadruped halfcheetah ant --envs 4096

The C backend always runs on the CPU threads; --device says where Warp runs. Results
in docs/benchmarks_gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.bench import _random_actions  # noqa: E402
from sim.machine_load import LoadMonitor  # noqa: E402
from sim.registry import make, torch_hook_tasks  # noqa: E402
from sim.warp_engine import warp_cache_dir  # noqa: E402


def _cache_files() -> int:
    d = warp_cache_dir()
    return sum(len(files) for _, _, files in os.walk(d)) if d.exists() else 0


def first_step(task: str, device: str) -> dict:
    """Seconds to make a 1-env Warp env, reset it and take one step, and how many files
    the kernel cache gained (0: every kernel was loaded from the cache)."""
    before = _cache_files()
    t0 = time.perf_counter()
    env = make(task, 1, seed=0, backend="warp", device=device)
    env.reset()
    env.step(_random_actions(env, 1, np.random.default_rng(0))[0])
    seconds = time.perf_counter() - t0
    env.close()
    return {"seconds": seconds, "new_cache_files": _cache_files() - before}


def compare(
    task: str,
    num_envs: int,
    device: str,
    rounds: int,
    seconds: float,
    monitor: LoadMonitor | None = None,
) -> dict:
    envs = {
        "c": make(task, num_envs, seed=0),
        "warp": make(task, num_envs, seed=0, backend="warp", device=device, hooks="numpy"),
    }
    if task in torch_hook_tasks():
        envs["warp_torch"] = make(
            task, num_envs, seed=0, backend="warp", device=device, hooks="torch"
        )
    rates: dict[str, list[float]] = {k: [] for k in envs}
    try:
        for e in envs.values():
            e.reset()
        acts = _random_actions(envs["c"], 8, np.random.default_rng(0))
        for _ in range(rounds):  # interleaved: all see the same machine load
            for name, e in envs.items():
                # actions where a policy would make them: on the env's device
                mine = [a.to(e.device) for a in acts]
                rates[name].append(_rate(e, mine, seconds) * num_envs)
                if monitor is not None:
                    monitor.sample()
    finally:
        for e in envs.values():
            e.close()

    def ratio(a: str, b: str) -> float | None:  # the median of the per-round ratios
        if a not in rates:
            return None
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    return {
        "task": task,
        "num_envs": num_envs,
        "c": statistics.median(rates["c"]),
        "warp": statistics.median(rates["warp"]),
        "warp_torch": statistics.median(rates["warp_torch"]) if "warp_torch" in rates else None,
        "warp_over_c": ratio("warp", "c"),
        "warp_torch_over_c": ratio("warp_torch", "c"),
        "torch_over_numpy_hooks": ratio("warp_torch", "warp"),
        "rounds": rates,
        "load": os.getloadavg(),
    }


def _rate(env, actions: list, seconds: float) -> float:
    """Batch steps per second; the torch-hooks env queues its CUDA work without waiting,
    so the clock stops only after the device has finished it."""
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    for a in actions[:3]:
        env.step(a)
    sync()
    steps, t0 = 0, time.perf_counter()
    while True:
        env.step(actions[steps % len(actions)])
        steps += 1
        if steps % 8 == 0:
            sync()
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return steps / dt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["halfcheetah", "quadruped"])
    p.add_argument("--envs", nargs="+", type=int, default=[64, 512])
    p.add_argument("--device", default="cpu", help="where Warp runs: cpu or cuda[:N]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="per round and backend")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    # the C backend steps on every core: that many runnable threads of ours are expected
    monitor = LoadMonitor(own_threads=os.cpu_count() or 1)
    out = {"device": a.device, "cache": str(warp_cache_dir()), "first_step": {}, "rows": []}
    print(f"load before: {os.getloadavg()}, Warp cache {warp_cache_dir()}")
    for task in a.tasks:
        fs = first_step(task, a.device)
        out["first_step"][task] = fs
        state = "cold (compiled)" if fs["new_cache_files"] else "warm (cache)"
        print(f"{task}: make + reset + first step on Warp {fs['seconds']:.1f} s, {state}")
    print(
        f"{'task':<12} {'envs':>6} {'C env steps/s':>14} {'Warp, numpy hooks':>18} "
        f"{'Warp, torch hooks':>18} {'numpy/C':>8} {'torch/C':>8} {'torch/numpy':>11}"
    )
    for task in a.tasks:
        for n in a.envs:
            r = compare(task, n, a.device, a.rounds, a.seconds, monitor)
            out["rows"].append(r)
            wt = "-" if r["warp_torch"] is None else f"{r['warp_torch']:,.0f}"
            tc = "-" if r["warp_torch"] is None else f"{r['warp_torch_over_c']:.3f}"
            tn = "-" if r["warp_torch"] is None else f"{r['torch_over_numpy_hooks']:.3f}"
            print(
                f"{task:<12} {n:>6} {r['c']:>14,.0f} {r['warp']:>18,.0f} {wt:>18} "
                f"{r['warp_over_c']:>8.3f} {tc:>8} {tn:>11}   load {r['load'][0]:.2f}"
            )
    monitor.stop()
    out["machine_load"] = {"verdict": monitor.describe(), "busy": monitor.busy}
    print(monitor.describe())
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
