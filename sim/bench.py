"""Simulator throughput against its peers and against the hardware limit.

Peers, measured in the same run on the same task: Gymnasium's SyncVectorEnv and
AsyncVectorEnv, and the hardware limit: MuJoCo's own single-thread stepping rate
for the task's model (`mujoco.rollout` on the calling thread, no Python per physics
step) times the number of cores, divided by the physics steps per env step.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import mujoco
import numpy as np
import torch
from mujoco import rollout

from sim.engine import default_threads
from sim.registry import make


@dataclass
class Row:
    task: str
    num_envs: int
    ours: float
    gym_sync: float | None
    gym_async: float | None
    hw_limit: float

    @property
    def frac_of_limit(self) -> float:
        return self.ours / self.hw_limit


def _random_actions(env, steps: int, rng: np.random.Generator) -> list[torch.Tensor]:
    lo, hi = env.action_spec.low, env.action_spec.high
    return [
        torch.from_numpy(
            rng.uniform(lo, hi, size=(env.num_envs, env.action_spec.size)).astype(np.float32)
        )
        for _ in range(steps)
    ]


def _steps_per_second(step, actions: list, seconds: float, min_steps: int) -> float:
    """Batch steps per second of `step`, cycling `actions`, after a short warm-up."""
    for a in actions[:3]:  # warm-up: numba compile, caches, worker start
        step(a)
    steps, t0 = 0, time.perf_counter()
    while True:
        step(actions[steps % len(actions)])
        steps += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and steps >= min_steps:
            return steps / dt


def ours_rate(task: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    env = make(task, num_envs, seed=seed)
    env.reset()
    rng = np.random.default_rng(seed)
    acts = _random_actions(env, 8, rng)
    rate = _steps_per_second(env.step, acts, seconds, min_steps=5)
    env.close()
    return rate * num_envs


def hardware_limit(task: str, seconds: float, seed: int = 0) -> tuple[float, float]:
    """(single-thread physics steps/s, env steps/s limit for all cores)."""
    env = make(task, 1, seed=seed)
    env.reset()
    m = env.model
    d = mujoco.MjData(m)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.empty((1, mujoco.mj_stateSize(m, spec)))
    mujoco.mj_getState(m, env.engine.get_data(0), state[0], spec)
    rng = np.random.default_rng(seed)
    lo, hi = env.action_spec.low, env.action_spec.high
    nenv_steps = 200
    acts = rng.uniform(lo, hi, size=(nenv_steps, env.action_spec.size))
    # the same controls the env would apply, held for frame_skip physics steps
    ctrl = np.repeat(np.stack([env._task_ctrl(a[None])[0] for a in acts]), env.frame_skip, axis=0)[
        None
    ]
    nstep = ctrl.shape[1]
    rollout.rollout(m, d, state, ctrl[:, :10])
    total, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        rollout.rollout(m, d, state, ctrl)
        total += nstep
    single = total / (time.perf_counter() - t0)
    return single, single * default_threads() / env.frame_skip


GYMNASIUM_IDS = {
    "halfcheetah": "HalfCheetah-v5",
    "hopper": "Hopper-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
    "cartpole": "InvertedPendulum-v5",
}


def _gym_vector(task: str, num_envs: int, kind: str):
    """Gymnasium's own env where one exists; else our single-env adapter of the task."""
    import gymnasium

    if task in GYMNASIUM_IDS:
        fns = [lambda: gymnasium.make(GYMNASIUM_IDS[task]) for _ in range(num_envs)]
    else:
        from sim.adapters import GymnasiumEnv

        fns = [lambda i=i: GymnasiumEnv(task, seed=i) for i in range(num_envs)]
    if kind == "sync":
        return gymnasium.vector.SyncVectorEnv(fns)
    return gymnasium.vector.AsyncVectorEnv(fns, context="fork")


def gym_rate(task: str, num_envs: int, kind: str, seconds: float, seed: int = 0) -> float:
    venv = _gym_vector(task, num_envs, kind)
    venv.reset(seed=seed)
    rng = np.random.default_rng(seed)
    sp = venv.action_space
    acts = [rng.uniform(sp.low, sp.high).astype(np.float32) for _ in range(8)]
    rate = _steps_per_second(venv.step, acts, seconds, min_steps=3)
    venv.close()
    return rate * num_envs


def run(
    tasks: list[str],
    envs: list[int],
    seconds: float = 2.0,
    async_max_envs: int = 16,
    sync_max_envs: int = 1024,
    progress=print,
) -> list[Row]:
    rows = []
    for task in tasks:
        for n in envs:
            # the limit is measured right before each of our figures, so that a
            # shared machine's changing load hits both alike
            single, limit = hardware_limit(task, seconds / 2)
            ours = ours_rate(task, n, seconds)
            sync = gym_rate(task, n, "sync", seconds) if n <= sync_max_envs else None
            asyn = gym_rate(task, n, "async", seconds) if n <= async_max_envs else None
            row = Row(task, n, ours, sync, asyn, limit)
            rows.append(row)
            progress(format_row(row))
    return rows


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


HEADER = f"{'task':<12}{'envs':>6}{'ours':>12}{'gym sync':>12}{'gym async':>12}{'hw limit':>12}{'% limit':>9}{'x best gym':>11}"


def format_row(r: Row, best_gym: float | None = None) -> str:
    peers = [x for x in (r.gym_sync, r.gym_async) if x is not None]
    best = best_gym if best_gym is not None else (max(peers) if peers else None)
    ratio = "-" if not best else f"{r.ours / best:.1f}x"
    return (
        f"{r.task:<12}{r.num_envs:>6}{_fmt(r.ours):>12}{_fmt(r.gym_sync):>12}{_fmt(r.gym_async):>12}"
        f"{_fmt(r.hw_limit):>12}{100 * r.frac_of_limit:>8.0f}%{ratio:>11}"
    )


def best_gym_rate(rows: list[Row], task: str) -> float:
    """The fastest Gymnasium figure for the task at any env count (its ceiling here)."""
    vals = [x for r in rows if r.task == task for x in (r.gym_sync, r.gym_async) if x is not None]
    return max(vals) if vals else float("nan")


def report(
    tasks: list[str],
    envs: list[int],
    seconds: float = 2.0,
    async_max_envs: int = 16,
    json_out: str | None = None,
) -> int:
    """Measure and print the table (``sim2real bench sim``); optionally write the rows."""
    print(
        f"machine: {os.cpu_count()} CPUs visible, {default_threads()} usable; mujoco {mujoco.__version__}"
    )
    print(HEADER)
    rows = run(tasks, envs, seconds, async_max_envs, progress=lambda s: print(s, flush=True))
    print("\nsummary\n" + HEADER)
    for task in tasks:
        best = best_gym_rate(rows, task)
        for r in rows:
            if r.task == task:
                print(format_row(r, best))
    print(
        "x best gym: ours divided by the fastest Gymnasium vector env of the task at any env count"
    )
    if json_out:
        with open(json_out, "w") as f:
            json.dump([asdict(r) | {"frac_of_limit": r.frac_of_limit} for r in rows], f, indent=1)
    return 0
