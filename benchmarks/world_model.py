"""The world-model learner (TD-MPC2 style) on hopper and halfcheetah, beside our PPO.

Per task and seed: train ``sim2real train world-model`` to each evaluation point (100k
and 300k env steps by default; the run is resumed from its checkpoint between points,
so one run serves all of them), and at each point evaluate, on the same 10 episodes,
(a) the actor that export writes (the policy prior, no planning) and (b) the MPPI
planner over the learned model. Wall time, env steps/s and gradient updates/s come from
the run itself. For the first seed of each task the actor is exported to ONNX and its
single-observation latency measured with the robot-side runtime (onnxruntime, one
thread; p50/p99).

Beside them: our PPO at the same env steps when ``--ppo-runs task=run_dir`` names PPO
runs (their ``eval/return`` rows, or else the training return, nearest step), otherwise
the PPO figures of docs/benchmarks_ppo.md, which are at 1M steps (the table says so).
Published figures beside them: MR.Q's (Fujimoto et al. 2025), whose released results
cover Gymnasium's v4 HalfCheetah and Hopper (the models and reward terms of v5, except
that v4's hopper is paid its healthy reward on the step it falls too: at most 1 per
episode; one env, one update per env step, 10 seeds, 10 evaluation episodes). TD-MPC2
and DreamerV3 publish the DeepMind Control Suite only (cheetah-run, hopper-hop /
hopper-stand: other models, rewards and episode rules than Gymnasium's tasks), so no
figure of theirs is printed.

``--probe STEPS`` measures instead: one seed of each task for STEPS env steps, then
extrapolates the time of a 300k-step run from the learning phase's own throughput
(labelled as an extrapolation, with the load average).

    OMP_NUM_THREADS=1 python benchmarks/world_model.py --tasks hopper halfcheetah \\
        --seeds 0 1 2 --at 100000 300000 --out runs/bench_wm
    OMP_NUM_THREADS=1 python benchmarks/world_model.py --probe 8000 --tasks hopper

Results are cached per (task, seed, step) in <out>/results.json: a rerun continues.
Extra arguments are config overrides (section.field=value) for every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.dppo import _latency_rounds  # noqa: E402
from benchmarks.inference_latency import _machine  # noqa: E402

PPO_1M = {"halfcheetah": 6010.0, "hopper": 3521.0}
"""Median over 3 seeds of our PPO preset at 1M env steps (docs/benchmarks_ppo.md)."""
QUIET = ["run.progress=false", "run.video=false"]
MRQ_PUBLISHED = {
    "halfcheetah": {100_000: 7977.0, 300_000: 11327.0, 1_000_000: 13616.0},
    "hopper": {100_000: 2519.0, 300_000: 2342.0, 1_000_000: 2485.0},
}
"""MR.Q's median evaluation return over its 10 seeds at these env steps on Gym-HalfCheetah-v4
and Gym-Hopper-v4: results/gym_results.txt of github.com/facebookresearch/MRQ at commit
8a44a7d (2025-02-05), read, not rerun."""


def _config(task: str, seed: int, steps: int, extra: list[str]):
    from training.train_configs import build_world_model_config

    return build_world_model_config(
        task, [*QUIET, f"run.seed={seed}", f"run.total_steps={steps}", *extra]
    )


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _throughput(rows: list[dict[str, Any]], after: int) -> dict[str, float]:
    """Mean env steps/s and updates/s over the rows logged after env step ``after``
    (the learning phase: the seed steps only step the simulator), leaving out the first
    (it holds the catch-up burst of utd_ratio x seed_steps updates)."""
    rows = [r for r in rows if r["step"] > after and "perf/steps_per_second" in r][1:]
    if not rows:
        return {"steps_per_second": float("nan"), "updates_per_second": float("nan")}
    return {
        "steps_per_second": statistics.mean(r["perf/steps_per_second"] for r in rows),
        "updates_per_second": statistics.mean(r["perf/updates_per_second"] for r in rows),
    }


def _store(path: Path, key: str, value: Any) -> dict[str, Any]:
    """Add one result to the cache file and return the whole cache. The file is read
    again first, so runs of other tasks writing to the same --out (one process per
    task, side by side) keep theirs; it is replaced whole, never left half written."""
    cache = json.loads(path.read_text()) if path.exists() else {}
    cache[key] = value
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=2))
    tmp.replace(path)
    return cache


def train_to(task: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """Train (or continue) the (task, seed) run to ``steps`` env steps; evaluate both ways."""
    from training.off_policy_runner import OffPolicyRunner

    run_dir = out / f"{task}_s{seed}"
    resume = run_dir if (run_dir / "checkpoints" / "latest.pt").exists() else None
    runner = OffPolicyRunner(_config(task, seed, steps, extra), run_dir, resume=resume)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        summary = runner.train()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if summary["stopped_early"]:
            # a run stopped by Ctrl-C / SIGTERM has saved its checkpoint; its figures
            # are not the ones at `steps` and must not be cached as such
            raise SystemExit(
                f"{task} seed {seed}: stopped at {summary['env_steps']:,} of {steps:,} env "
                f"steps; the checkpoint in {run_dir} is kept: rerun the same command to continue"
            )
        actor = runner.evaluate()
        planner = summary.get("eval_planner") or runner.evaluate_planner()
    finally:
        runner.close()
    cfg = runner.cfg
    return {
        "env_steps": summary["env_steps"],
        "updates": summary["updates"],
        "train_seconds": seconds,
        # CPU time of this process (all its threads): what the run costs without the
        # other jobs of a shared machine, which only stretch the wall time
        "cpu_seconds": cpu,
        "actor_return": actor["return_mean"],
        "actor_std": actor["return_std"],
        "planner_return": planner["return_mean"],
        "planner_std": planner["return_std"],
        **_throughput(_metrics(run_dir), cfg.tdmpc.seed_steps),
        "load_average": os.getloadavg()[0],
    }


def onnx_latency(run_dir: Path, calls: int) -> dict[str, Any]:
    from deploy.export import read_parity
    from deploy.runtime import OnnxPolicy
    from training.export import export_run

    path = export_run(run_dir)
    pol = OnnxPolicy(path)
    ms = _latency_rounds({"actor": pol}, pol.metadata.obs_frame_size, calls)["actor"]
    return {
        "parity_max_abs": read_parity(path),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "calls": int(ms.size),
    }


def ppo_at(run_dir: str, steps: int) -> float | None:
    """Our PPO run's return at the row nearest ``steps``: eval/return if it has one there."""
    rows = _metrics(Path(run_dir))
    for key in ("eval/return", "train/return"):
        have = [r for r in rows if key in r]
        if have:
            return float(min(have, key=lambda r: abs(r["step"] - steps))[key])
    return None


def probe(tasks: list[str], steps: int, out: Path, extra: list[str], target: int) -> None:
    """A short run per task; the 300k-step time extrapolated from its learning phase."""
    for task in tasks:
        r = train_to(task, 0, steps, out / "probe", extra)
        seed_steps = _config(task, 0, steps, extra).tdmpc.seed_steps
        hours = (target - seed_steps) / r["steps_per_second"] / 3600
        # the CPU share this run had, applied to the learning phase's extrapolation
        cpu_hours = hours * r["cpu_seconds"] / r["train_seconds"]
        print(
            f"{task}: {steps} env steps in {r['train_seconds']:.0f} s ({r['cpu_seconds']:.0f} "
            f"CPU s); learning phase {r['steps_per_second']:.1f} env steps/s, "
            f"{r['updates_per_second']:.1f} updates/s (load average {r['load_average']:.2f}); "
            f"EXTRAPOLATED to {target:,} steps: {hours:.1f} h at this load, {cpu_hours:.1f} h "
            f"of CPU time; returns at {steps}: actor {r['actor_return']:.1f}, planner "
            f"{r['planner_return']:.1f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", nargs="+", default=["hopper", "halfcheetah"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--at", nargs="+", type=int, default=[100_000, 300_000], help="eval points")
    p.add_argument("--out", default="runs/bench_world_model")
    p.add_argument("--ppo-runs", nargs="*", default=[], metavar="TASK=RUN_DIR")
    p.add_argument("--latency-calls", type=int, default=10_000)
    p.add_argument("--probe", type=int, default=0, metavar="STEPS", help="measure only")
    p.add_argument("--fresh", action="store_true", help="ignore cached results")
    a, extra = p.parse_known_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {_machine()}")
    if a.probe:
        probe(a.tasks, a.probe, out, extra, max(a.at))
        return
    cache_path = out / "results.json"
    cache: dict[str, Any] = {}
    if cache_path.exists() and not a.fresh:
        cache = json.loads(cache_path.read_text())
    ppo_runs = dict(item.split("=", 1) for item in a.ppo_runs)
    for task in a.tasks:
        for seed in a.seeds:
            for steps in sorted(a.at):
                key = f"{task}/{seed}/{steps}"
                if key not in cache:
                    cache[key] = train_to(task, seed, steps, out, extra)
                    cache = _store(cache_path, key, cache[key])
                r = cache[key]
                print(
                    f"{key}: actor {r['actor_return']:.1f} ± {r['actor_std']:.1f}, planner "
                    f"{r['planner_return']:.1f} ± {r['planner_std']:.1f}, {r['train_seconds']:.0f} s, "
                    f"{r['steps_per_second']:.1f} steps/s, {r['updates_per_second']:.1f} updates/s"
                )
        lat_key = f"{task}/onnx"
        if lat_key not in cache:
            cache[lat_key] = onnx_latency(out / f"{task}_s{a.seeds[0]}", a.latency_calls)
            cache = _store(cache_path, lat_key, cache[lat_key])
    print(
        "\n| task | env steps | actor (median) | planner (median) | PPO | MR.Q (published, v4) "
        "| updates/s | ONNX p99 ms |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for task in a.tasks:
        for steps in sorted(a.at):
            rows = [cache[f"{task}/{s}/{steps}"] for s in a.seeds]
            actor = statistics.median(r["actor_return"] for r in rows)
            planner = statistics.median(r["planner_return"] for r in rows)
            if task in ppo_runs:
                value = ppo_at(ppo_runs[task], steps)
                ppo = "n/a" if value is None else f"{value:.0f}"
            else:
                ppo = f"{PPO_1M.get(task, float('nan')):.0f} (at 1M steps)"
            mrq = MRQ_PUBLISHED.get(task, {}).get(steps)
            mrq_cell = "n/a" if mrq is None else f"{mrq:.0f}"
            ups = statistics.mean(r["updates_per_second"] for r in rows)
            p99 = cache[f"{task}/onnx"]["p99_ms"]
            print(
                f"| {task} | {steps:,} | {actor:.0f} | {planner:.0f} | {ppo} | {mrq_cell} | "
                f"{ups:.1f} | {p99:.3f} |"
            )
    print(
        "\nMR.Q: median of its 10 published seeds (Gym v4, one env, one update per step). "
        "TD-MPC2 / DreamerV3 publish DeepMind Control Suite tasks only (cheetah-run, "
        "hopper-hop/stand), not Gymnasium's hopper/halfcheetah: none printed."
    )


if __name__ == "__main__":
    main()
