"""Constraints as terminations (CaT) against plain training: how often each policy
violates its task's constraints, and at what velocity-tracking error.

Each policy (run directory, checkpoint or .onnx) runs deterministic episodes in one
world (the nominal model, or with --training-world its task's training randomization,
noise, latency and pushes), with its own command ranges; per policy the share of steps
that violate any declared constraint and each one (sim.evaluation), the tracking error
and the fall rate. The groups' means are compared: the issue's target is a violation
rate at least 5x lower with CaT, at a tracking error at most 10% higher. The peer (the
policies trained without CaT) is measured in the same run.

    python benchmarks/constraints.py --cat runs/cat-s0 runs/cat-s1 \
        --plain runs/plain-s0 runs/plain-s1 --episodes 32 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np

from deploy.files import atomic_write
from training.robustness import evaluate_world


def _summary(stats: dict) -> dict:
    per = {
        k.removeprefix("violation_rate_"): v
        for k, v in stats.items()
        if k.startswith("violation_rate_")
    }
    if not per:
        raise ValueError(f"{stats['source']}: task {stats['task']!r} declares no constraints")
    return {
        "violation_rate": stats["violation_rate"],
        "per_constraint": per,
        "tracking_error": stats.get("lin_vel_error_mean", math.nan),
        "yaw_tracking_error": stats.get("ang_vel_error_mean", math.nan),
        "fall_rate": stats["terminated"] / stats["episodes"],
        "return_mean": stats["return_mean"],
    }


def fewer_violations(cat_rate: float, plain_rate: float) -> float:
    """How many times less often CaT's policies violate: inf when they never do and the
    plain ones do (no bound), 1 when neither does."""
    if cat_rate > 0:
        return plain_rate / cat_rate
    return math.inf if plain_rate > 0 else 1.0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cat", nargs="+", required=True, help="policies trained with CaT")
    p.add_argument("--plain", nargs="+", required=True, help="policies trained without it")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--training-world", action="store_true", help="randomized, as in training")
    p.add_argument("--task-args", type=json.loads, default=None, help="JSON over the policies'")
    p.add_argument("--out", default="docs/figures/constraints_cat.json")
    a = p.parse_args()
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    results: dict[str, dict[str, dict]] = {"cat": {}, "plain": {}}
    for group in ("cat", "plain"):
        for source in getattr(a, group):
            t0 = time.perf_counter()
            stats = evaluate_world(
                source, a.episodes, a.seconds, a.seed, a.task_args, a.training_world
            )
            s = _summary(stats)
            results[group][source] = s
            per = ", ".join(f"{k} {v:.2%}" for k, v in s["per_constraint"].items())
            print(
                f"{group:>5} {source}: violations {s['violation_rate']:.2%} of steps ({per}); "
                f"tracking error {s['tracking_error']:.3f} m/s, yaw {s['yaw_tracking_error']:.3f}"
                f" rad/s; falls {s['fall_rate']:.0%}; return {s['return_mean']:.1f} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    means = {
        g: {
            k: float(np.mean([r[k] for r in results[g].values()]))
            for k in ("violation_rate", "tracking_error", "fall_rate")
        }
        for g in results
    }
    fewer = fewer_violations(means["cat"]["violation_rate"], means["plain"]["violation_rate"])
    fewer_text = f"{fewer:.1f}x" if math.isfinite(fewer) else "without bound (none with CaT)"
    worse = means["cat"]["tracking_error"] / means["plain"]["tracking_error"] - 1.0
    print(
        f"\nmeans: CaT violations {means['cat']['violation_rate']:.2%}, tracking "
        f"{means['cat']['tracking_error']:.3f}; plain {means['plain']['violation_rate']:.2%}, "
        f"{means['plain']['tracking_error']:.3f}\n"
        f"CaT violates {fewer_text} less often (target >= 5x: "
        f"{'met' if fewer >= 5 else 'missed'}), tracking error {worse:+.1%} "
        f"(target <= +10%: {'met' if worse <= 0.10 else 'missed'})"
    )
    out = {
        "episodes": a.episodes,
        "seconds": a.seconds,
        "seed": a.seed,
        "training_world": a.training_world,
        "task_args": a.task_args,
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()})",
        "results": results,
        "means": means,
        "fewer_violations_x": fewer if math.isfinite(fewer) else None,  # None: no bound
        "tracking_error_change": worse,
    }
    atomic_write(Path(a.out), json.dumps(out, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
