"""Simulator throughput against its peers and against the hardware limit.

Peers, measured in the same run on the same task:

- one Gymnasium env (``gymnasium.make``, reset by hand at episode end), at 1 env;
- Gymnasium's SyncVectorEnv and AsyncVectorEnv (one process per env, up to
  ``async_max_envs``);
- EnvPool, the C++ vector-environment library (sync mode, the same thread count), from
  its own environment (``scripts/setup_envpool.sh`` makes ``.venv-envpool``; it bundles
  its own MuJoCo) through ``benchmarks/envpool_peer.py``, for tasks it has;
- the hardware limit: MuJoCo's own single-thread stepping rate for the task's model
  (``mujoco.rollout`` on the calling thread, no Python per physics step) times the
  number of cores, divided by the physics steps per env step;
- our engine alone: the time "ours" spends inside the batch's physics step, timed in
  place (the env's own states and controls), as env steps per second: the floor under
  "ours", what the batched stepping itself reaches of the limit at that env count
  before any of the task's Python (observation, reward, flags, tensors).

Protocol (:mod:`sim.machine_load`): every figure is measured ``rounds`` times in
interleaved rounds (limit, ours, peers, limit, ours, peers, ...) with the envs built once;
a row reports the median of each and the median over rounds of the per-round ratios; the
load average and the runnable processes are recorded before, between the measurements
and after, and ``--doc`` writes the table only when the machine was idle (or with
``--allow-busy``, marked as busy).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mujoco
import numpy as np
import torch
from mujoco import rollout

from sim.engine import default_threads
from sim.machine_load import LoadMonitor, wait_for_quiet
from sim.registry import make

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ENVPOOL_PYTHON = ROOT / ".venv-envpool" / "bin" / "python"


@dataclass
class Row:
    """Medians over rounds (env steps/s) and the per-round values behind them."""

    task: str
    num_envs: int
    ours: float
    gym_sync: float | None
    gym_async: float | None
    hw_limit: float
    gym_single: float | None = None
    envpool: float | None = None
    engine: float | None = None
    rounds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def frac_of_limit(self) -> float:
        """Median over rounds of ours / the limit measured in the same round."""
        return _median_ratio(self.rounds, "ours", "hw_limit", self.ours / self.hw_limit)

    @property
    def engine_frac_of_limit(self) -> float | None:
        """Median over rounds of the engine alone / the limit (None where not run)."""
        if self.engine is None:
            return None
        return _median_ratio(self.rounds, "engine", "hw_limit", self.engine / self.hw_limit)

    def ratio(self, peer: str) -> float | None:
        """Median over rounds of ours / ``peer`` (None where the peer was not run)."""
        if getattr(self, peer) is None:
            return None
        return _median_ratio(self.rounds, "ours", peer, self.ours / getattr(self, peer))


def _median_ratio(rounds: dict[str, list[float]], a: str, b: str, fallback: float) -> float:
    if a in rounds and b in rounds and len(rounds[a]) == len(rounds[b]) and rounds[a]:
        return statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True))
    return fallback


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


class _Ours:
    """Our batched env, built once; each call times ``seconds`` of stepping, and the
    time spent inside the engine's step during it (``engine_rate``: the env steps per
    second if the task's Python cost nothing, the floor under ours)."""

    def __init__(self, task: str, num_envs: int, seconds: float, seed: int = 0) -> None:
        self.env = make(task, num_envs, seed=seed)
        self.env.reset()
        self.acts = _random_actions(self.env, 8, np.random.default_rng(seed))
        self.seconds, self.n = seconds, num_envs
        self.engine_rate = float("nan")
        # timed in place, on the states and controls of the env's own episodes: a
        # quadruped standing on four feet steps slower than one flailing on fixed torques
        self._physics = [0.0, 0]
        engine_step = self.env.engine.step

        def timed(ctrl: np.ndarray, nsub: int) -> None:
            t0 = time.perf_counter()
            try:
                engine_step(ctrl, nsub)
            finally:
                self._physics[0] += time.perf_counter() - t0
                self._physics[1] += 1

        self.env.engine.step = timed

    def __call__(self) -> float:
        rate = _steps_per_second(self.env.step, self.acts, self.seconds, 5) * self.n
        seconds, calls = self._physics
        # the warm-up steps are in both sums, a few of hundreds or more
        self.engine_rate = calls * self.n / seconds if seconds > 0 else float("nan")
        self._physics[:] = [0.0, 0]
        return rate

    def close(self) -> None:
        self.env.close()


def ours_rate(task: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    meter = _Ours(task, num_envs, seconds, seed)
    try:
        return meter()
    finally:
        meter.close()


class _Limit:
    """MuJoCo's own stepping of the task's model, one thread, times the cores."""

    def __init__(self, task: str, seconds: float, seed: int = 0) -> None:
        env = make(task, 1, seed=seed)
        env.reset()
        self.m = env.model
        self.d = mujoco.MjData(self.m)
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        self.state = np.empty((1, mujoco.mj_stateSize(self.m, spec)))
        mujoco.mj_getState(self.m, env.engine.get_data(0), self.state[0], spec)
        rng = np.random.default_rng(seed)
        lo, hi = env.action_spec.low, env.action_spec.high
        acts = rng.uniform(lo, hi, size=(200, env.action_spec.size))
        # the same controls the env would apply, held for frame_skip physics steps
        per_step = np.stack([env._task_ctrl(a[None])[0] for a in acts])
        self.ctrl = np.repeat(per_step, env.frame_skip, axis=0)[None]
        self.frame_skip = env.frame_skip
        self.seconds = seconds
        env.close()
        rollout.rollout(self.m, self.d, self.state, self.ctrl[:, :10])

    def single(self) -> float:
        """Physics steps per second on one thread."""
        nstep = self.ctrl.shape[1]
        total, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < self.seconds:
            rollout.rollout(self.m, self.d, self.state, self.ctrl)
            total += nstep
        return total / (time.perf_counter() - t0)

    def __call__(self) -> float:
        return self.single() * default_threads() / self.frame_skip


def hardware_limit(task: str, seconds: float, seed: int = 0) -> tuple[float, float]:
    """(single-thread physics steps/s, env steps/s limit for all cores)."""
    meter = _Limit(task, seconds, seed)
    single = meter.single()
    return single, single * default_threads() / meter.frame_skip


GYMNASIUM_IDS = {
    "halfcheetah": "HalfCheetah-v5",
    "hopper": "Hopper-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
    "cartpole": "InvertedPendulum-v5",
}
"""Gymnasium's (and EnvPool's) id of each task we reproduce exactly."""


def _gym_env(task: str, seed: int = 0):
    """Gymnasium's own env where one exists; else our single-env adapter of the task."""
    import gymnasium

    if task in GYMNASIUM_IDS:
        return gymnasium.make(GYMNASIUM_IDS[task])
    from sim.adapters import GymnasiumEnv

    return GymnasiumEnv(task, seed=seed)


def _gym_vector(task: str, num_envs: int, kind: str):
    import gymnasium

    fns = [lambda i=i: _gym_env(task, seed=i) for i in range(num_envs)]
    if kind == "sync":
        return gymnasium.vector.SyncVectorEnv(fns)
    return gymnasium.vector.AsyncVectorEnv(fns, context="fork")


class _GymVector:
    def __init__(self, task: str, num_envs: int, kind: str, seconds: float, seed: int = 0):
        self.venv = _gym_vector(task, num_envs, kind)
        self.venv.reset(seed=seed)
        rng = np.random.default_rng(seed)
        sp = self.venv.action_space
        self.acts = [rng.uniform(sp.low, sp.high).astype(np.float32) for _ in range(8)]
        self.seconds, self.n = seconds, num_envs

    def __call__(self) -> float:
        return _steps_per_second(self.venv.step, self.acts, self.seconds, 3) * self.n

    def close(self) -> None:
        self.venv.close()


class _GymSingle:
    """One Gymnasium env, as a single-env user steps it: reset by hand at episode end."""

    def __init__(self, task: str, seconds: float, seed: int = 0) -> None:
        self.env = _gym_env(task, seed)
        self.env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        sp = self.env.action_space
        self.acts = [rng.uniform(sp.low, sp.high).astype(np.float32) for _ in range(8)]
        self.seconds = seconds

    def _step(self, a: np.ndarray) -> None:
        _, _, terminated, truncated, _ = self.env.step(a)
        if terminated or truncated:
            self.env.reset()

    def __call__(self) -> float:
        return _steps_per_second(self._step, self.acts, self.seconds, 3)

    def close(self) -> None:
        self.env.close()


class _EnvPool:
    """EnvPool in its own interpreter (benchmarks/envpool_peer.py); the child times only
    its stepping, so its start-up is not counted."""

    def __init__(self, python: Path, task: str, num_envs: int, seconds: float) -> None:
        self.cmd = [
            str(python),
            str(ROOT / "benchmarks" / "envpool_peer.py"),
            GYMNASIUM_IDS[task],
            str(num_envs),
            "--threads",
            str(default_threads()),
            "--seconds",
            str(seconds),
        ]
        self.version = ""

    def __call__(self) -> float:
        out = subprocess.run(self.cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"EnvPool peer failed ({' '.join(self.cmd)}):\n{out.stderr}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        self.version = result["envpool"]
        return float(result["rate"])

    def close(self) -> None:
        pass


def envpool_python(path: str | None) -> Path | None:
    """The EnvPool interpreter to use: ``path``, else .venv-envpool if it exists."""
    if path:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(
                f"--envpool {path}: no such interpreter (scripts/setup_envpool.sh makes "
                ".venv-envpool/bin/python)"
            )
        return p
    return DEFAULT_ENVPOOL_PYTHON if DEFAULT_ENVPOOL_PYTHON.exists() else None


def run(
    tasks: list[str],
    envs: list[int],
    seconds: float = 2.0,
    async_max_envs: int = 16,
    sync_max_envs: int = 1024,
    progress=print,
    rounds: int = 3,
    envpool: Path | None = None,
    monitor: LoadMonitor | None = None,
) -> list[Row]:
    """Measure every (task, env count) in ``rounds`` interleaved rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rows = []
    for task in tasks:
        for n in envs:
            ours = _Ours(task, n, seconds)
            meters: dict = {"hw_limit": _Limit(task, seconds / 2), "ours": ours}
            if n == 1:
                meters["gym_single"] = _GymSingle(task, seconds)
            if n <= sync_max_envs:
                meters["gym_sync"] = _GymVector(task, n, "sync", seconds)
            if n <= async_max_envs:
                meters["gym_async"] = _GymVector(task, n, "async", seconds)
            if envpool is not None and task in GYMNASIUM_IDS:
                meters["envpool"] = _EnvPool(envpool, task, n, seconds)
            values: dict[str, list[float]] = {k: [] for k in meters} | {"engine": []}
            try:
                for _ in range(rounds):
                    for name, meter in meters.items():
                        values[name].append(meter())
                        if meter is ours:
                            values["engine"].append(ours.engine_rate)
                        if monitor is not None:
                            monitor.sample()
            finally:
                for name, meter in meters.items():
                    if name != "hw_limit":
                        meter.close()
            med = {k: statistics.median(v) for k, v in values.items()}
            row = Row(
                task,
                n,
                med["ours"],
                med.get("gym_sync"),
                med.get("gym_async"),
                med["hw_limit"],
                gym_single=med.get("gym_single"),
                envpool=med.get("envpool"),
                engine=med.get("engine"),
                rounds=values,
            )
            rows.append(row)
            progress(format_row(row))
    return rows


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.0f}%"


HEADER = (
    f"{'task':<12}{'envs':>6}{'ours':>10}{'gym 1':>9}{'gym sync':>10}{'gym async':>10}"
    f"{'envpool':>10}{'hw limit':>10}{'% limit':>9}{'engine %':>9}{'x gym':>8}{'x envpool':>10}"
)


def best_gym_ratio(r: Row) -> float | None:
    """Median over rounds of ours / the fastest Gymnasium figure of that round."""
    peers = [k for k in ("gym_single", "gym_sync", "gym_async") if getattr(r, k) is not None]
    if not peers:
        return None
    if all(k in r.rounds for k in peers) and "ours" in r.rounds:
        per_round = [o / max(r.rounds[k][i] for k in peers) for i, o in enumerate(r.rounds["ours"])]
        return statistics.median(per_round)
    return r.ours / max(getattr(r, k) for k in peers)


def format_row(r: Row) -> str:
    return (
        f"{r.task:<12}{r.num_envs:>6}{_fmt(r.ours):>10}{_fmt(r.gym_single):>9}"
        f"{_fmt(r.gym_sync):>10}{_fmt(r.gym_async):>10}{_fmt(r.envpool):>10}"
        f"{_fmt(r.hw_limit):>10}{100 * r.frac_of_limit:>8.0f}%{_pct(r.engine_frac_of_limit):>9}"
        f"{_x(best_gym_ratio(r)):>8}"
        f"{_x(r.ratio('envpool')):>10}"
    )


def markdown(rows: list[Row]) -> list[str]:
    """The table for docs/benchmarks.md."""
    out = [
        "| task | envs | ours | gym 1 env | gym sync | gym async | EnvPool | hw limit | "
        "% of limit | engine alone, % of limit | x best gym | x EnvPool |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        out.append(
            f"| {r.task} | {r.num_envs} | {_fmt(r.ours)} | {_fmt(r.gym_single)} | "
            f"{_fmt(r.gym_sync)} | {_fmt(r.gym_async)} | {_fmt(r.envpool)} | "
            f"{_fmt(r.hw_limit)} | {100 * r.frac_of_limit:.0f}% | {_pct(r.engine_frac_of_limit)} | "
            f"{_x(best_gym_ratio(r))} | "
            f"{_x(r.ratio('envpool'))} |"
        )
    return out


def report(
    tasks: list[str],
    envs: list[int],
    seconds: float = 2.0,
    async_max_envs: int = 16,
    json_out: str | None = None,
    rounds: int = 3,
    envpool: str | None = None,
    no_envpool: bool = False,
    doc: str | None = None,
    allow_busy: bool = False,
    wait_s: float = 120.0,
) -> int:
    """Measure and print the table (``sim2real bench sim``); optionally write the rows
    (``json_out``) and the markdown table (``doc``, idle machine only unless
    ``allow_busy``). Returns 3 when the table was not written because the machine was
    busy. With ``doc`` it first waits up to ``wait_s`` for the load average to settle."""
    if doc and wait_s > 0:
        wait_for_quiet(timeout_s=wait_s)
    monitor = LoadMonitor(own_threads=default_threads())
    pool = None if no_envpool else envpool_python(envpool)
    print(
        f"machine: {os.cpu_count()} CPUs visible, {default_threads()} usable; mujoco "
        f"{mujoco.__version__}; {rounds} interleaved rounds of {seconds:g} s; {monitor.before}"
    )
    if pool is None and not no_envpool:
        print("EnvPool: not measured (run scripts/setup_envpool.sh to add it)")
    print(HEADER)
    rows = run(
        tasks,
        envs,
        seconds,
        async_max_envs,
        progress=lambda s: print(s, flush=True),
        rounds=rounds,
        envpool=pool,
        monitor=monitor,
    )
    monitor.stop()
    verdict = monitor.describe()
    print(
        "medians over rounds; % limit, engine % (our batch's physics alone, no task Python: "
        "the floor under ours), x gym (ours over the fastest Gymnasium figure: one env, sync "
        "or async) and x envpool: medians of the per-round ratios"
    )
    print(verdict)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(
                {
                    "load": verdict,
                    "busy": monitor.busy,
                    "rows": [
                        asdict(r)
                        | {
                            "frac_of_limit": r.frac_of_limit,
                            "engine_frac_of_limit": r.engine_frac_of_limit,
                            "x_gym": best_gym_ratio(r),
                        }
                        for r in rows
                    ],
                },
                f,
                indent=1,
            )
    if doc:
        ok, why = monitor.may_write(allow_busy)
        if not ok:
            print(why)
            return 3
        cmd = "sim2real bench sim " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else ""
        Path(doc).write_text(
            "\n".join([f"`{cmd}`" if cmd else "", "", f"- {why}", "", *markdown(rows), ""])
        )
        print(f"wrote {doc}")
    return 0
