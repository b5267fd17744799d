"""Robustness matrix of policies against a reference, on shifts beyond the training ranges.

For each policy (run directory, checkpoint or .onnx; the files run through the runtime
and the safety layer, as on the robot) the matrix of training.robustness: added base
mass, friction, motor strength, PD gain error, action latency, observation noise,
pushes and (for tasks with a heightfield variant) terrain, one shift at a time, at
levels beyond the quadruped's training ranges. Per cell: fall rate and tracking error.
Writes <out-dir>/robustness_<name>.png (heatmap) and .json, and prints each policy's
fall rate over the out-of-distribution cells with its ratio to the reference's, measured
in the same run (the reference is the peer; it is measured when its task matches).

    python benchmarks/robustness.py tests/data/quadruped_policy.onnx
    python benchmarks/robustness.py runs/quadruped_rarl tests/data/quadruped_policy.onnx \
        --reference tests/data/quadruped_policy.onnx --episodes 16 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from training.robustness import format_matrix, plot_matrix, robustness_matrix, write_matrix

REFERENCE = "tests/data/quadruped_policy.onnx"


def _name(source: str) -> str:
    path = Path(source)
    return (path.stem if path.suffix else path.name).removesuffix("_policy")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("policies", nargs="+", help="run directories, checkpoints or .onnx files")
    p.add_argument("--reference", default=REFERENCE, help=f"the peer (default {REFERENCE})")
    p.add_argument("--episodes", type=int, default=16, help="episodes per cell")
    p.add_argument("--seconds", type=float, default=10.0, help="horizon of each episode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shifts", type=json.loads, default=None, help="JSON: shift -> levels")
    p.add_argument(
        "--task-args",
        type=json.loads,
        default=None,
        help="JSON task options over the policies' own, e.g. '{\"command_vx\": [0.5, 0.5]}'",
    )
    p.add_argument("--out-dir", default="docs/figures")
    a = p.parse_args()
    sources = list(dict.fromkeys([*a.policies, a.reference]))
    results = {}
    for source in sources:
        t0 = time.perf_counter()
        result = robustness_matrix(
            source, a.shifts, a.episodes, a.seconds, a.seed, task_args=a.task_args
        )
        result["wall_seconds"] = time.perf_counter() - t0
        result["machine"] = f"{platform.node()} ({platform.processor() or platform.machine()})"
        name = _name(source)
        result["plot"] = str(plot_matrix(result, Path(a.out_dir) / f"robustness_{name}.png"))
        write_matrix(result, Path(a.out_dir) / f"robustness_{name}.json")
        results[source] = result
        print(format_matrix(result))
        print(f"{result['wall_seconds']:.0f} s; heatmap {result['plot']}\n", flush=True)
    ref = results[a.reference]
    print(f"out-of-distribution fall rate against the reference {a.reference}:")
    for source, result in results.items():
        if result["task"] != ref["task"]:
            print(f"  {source}: {result['ood_fall_rate']:.1%} (task {result['task']}, no peer)")
            continue
        ratio = result["ood_fall_rate"] / max(ref["ood_fall_rate"], 1e-9)
        print(f"  {source}: {result['ood_fall_rate']:.1%} ({ratio:.2f}x the reference)")


if __name__ == "__main__":
    main()
