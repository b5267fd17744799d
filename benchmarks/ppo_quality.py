"""Our PPO preset on the MuJoCo locomotion tasks, next to the RL Zoo's published PPO.

For each task and seed: train with the task's preset for a fixed env-step budget,
then evaluate the deterministic policy (10 episodes). Prints the median final return
and wall time per task beside stable-baselines3 RL Zoo's PPO figures (1M steps,
Gymnasium v3 tasks; DLR-RM/rl-baselines3-zoo, benchmark.md). The Zoo publishes no PPO
figure for Humanoid, so for the tasks in --sb3 (default: humanoid) stable-baselines3 PPO
is trained in the same run on Gymnasium's own v5 env, with SB3's defaults and
VecNormalize as its users run it, same budget and seeds, and evaluated the same way.
Quadruped: velocity tracking error of the trained policy.

    python benchmarks/ppo_quality.py --tasks halfcheetah hopper walker2d ant --seeds 0 1 2 --steps 1000000 \\
        --figure docs/figures/ppo_quality_curves.png
    python benchmarks/ppo_quality.py --tasks humanoid --seeds 0 1 2 --steps 1000000

Finished runs in --out are reused (a run resumes from its last checkpoint; an SB3 run is
cached as JSON), so a rerun only trains what is missing and can redraw the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rsl_rl_peer  # noqa: E402
from sb3_peer import GYM_IDS, cached_default  # noqa: E402

# RL Zoo PPO, 1M steps, mean ± std of the deterministic evaluation (benchmark.md)
RL_ZOO_PPO = {
    "halfcheetah": (5819.1, 663.5),
    "hopper": (2410.4, 10.0),
    "walker2d": (3478.8, 821.7),
    "ant": (1327.2, 451.6),
}


def run_one(task: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    from training.artifacts import evaluate_source
    from training.metrics import read_metrics
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    cfg = build_ppo_config(
        task,
        [
            f"run.seed={seed}",
            f"run.total_steps={steps}",
            "run.video=false",
            "run.progress=false",
            *extra,
        ],
    )
    run_dir = out / f"{task}-s{seed}"
    t0 = time.perf_counter()
    runner = OnPolicyRunner(
        cfg, run_dir, resume=run_dir if (run_dir / "checkpoints" / "latest.pt").exists() else None
    )
    runner.train()
    wall = time.perf_counter() - t0
    # the metrics' per-iteration timings add up to the training time of the whole run,
    # also when this call only resumed (or found finished) an earlier one
    rows = read_metrics(run_dir / "metrics.jsonl")
    # (rows without timings: the final evaluation's)
    train_s = sum(
        r["perf/rollout_seconds"] + r["perf/update_seconds"]
        for r in rows
        if "perf/rollout_seconds" in r
    )
    stats = evaluate_source(run_dir, episodes=10, seed=10_000 + seed)
    return {"task": task, "seed": seed, "steps": runner.env_steps, "wall_s": wall,
            "train_s": train_s, **stats}  # fmt: skip


def plot_curves(rows: list[dict], out: Path, figure: Path) -> None:
    """Training return (stochastic policy, last 100 episodes) against env steps, per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.metrics import read_metrics

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in (r for r in rows if r["task"] == task):
            metrics = read_metrics(out / f"{task}-s{r['seed']}" / "metrics.jsonl")
            pts = [(m["step"], m["train/return"]) for m in metrics if "train/return" in m]
            ax.plot(*zip(*pts), lw=1.2, label=f"seed {r['seed']}: eval {r['return_mean']:.0f}")
        if task in RL_ZOO_PPO:
            ax.axhline(RL_ZOO_PPO[task][0], color="k", ls="--", lw=1, label="RL Zoo PPO, 1M")
        ax.set_title(task)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("training return")
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=110)
    print(f"figure: {figure}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", nargs="+", default=["halfcheetah", "hopper", "walker2d", "ant"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument(
        "--sb3",
        nargs="*",
        default=["humanoid"],
        help="tasks on which SB3 PPO (defaults + VecNormalize) trains as the peer",
    )
    p.add_argument(
        "--rsl-rl",
        nargs="*",
        default=[],
        help="tasks on which rsl_rl's PPO (the preset's settings) trains as the peer",
    )
    p.add_argument(
        "--peers-only", "--sb3-only", dest="sb3_only", action="store_true",
        help="train only the peer runs",
    )  # fmt: skip
    p.add_argument("--out", default="runs/bench_ppo_quality")
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None, help="PNG of the learning curves")
    p.add_argument("overrides", nargs="*", help="section.field=value applied to every run")
    a = p.parse_args()
    out = Path(a.out)
    for task in a.sb3:
        if task not in GYM_IDS:
            p.error(f"--sb3 {task}: no Gymnasium env reproduces it ({', '.join(GYM_IDS)})")
    rows, peers = [], []
    for task in a.tasks:
        if task in a.sb3:
            for seed in a.seeds:
                r = cached_default(GYM_IDS[task], a.steps, seed, out)
                peers.append({"task": task, "peer": "SB3", **r})
                print(f"{task} seed {seed}: SB3 PPO on {r['env_id']}: return {r['return_mean']:.1f} "
                      f"± {r['return_std']:.1f}, length {r['length_mean']:.0f}, {r['wall_s']:.0f} s", flush=True)  # fmt: skip
        if task in a.rsl_rl:
            for seed in a.seeds:
                r = rsl_rl_peer.cached(task, a.steps, seed, out, a.overrides)
                peers.append({"peer": "rsl_rl", **r})
                print(f"{task} seed {seed}: rsl_rl PPO: return {r['return_mean']:.1f} "
                      f"± {r['return_std']:.1f}, length {r['length_mean']:.0f}, {r['wall_s']:.0f} s", flush=True)  # fmt: skip
        if a.sb3_only:
            continue
        for seed in a.seeds:
            r = run_one(task, seed, a.steps, out, a.overrides)
            rows.append(r)
            extra = (
                f", tracking error {r['lin_vel_error_mean']:.3f} m/s"
                if "lin_vel_error_mean" in r
                else ""
            )
            print(
                f"{task} seed {seed}: return {r['return_mean']:.1f} ± {r['return_std']:.1f}, "
                f"length {r['length_mean']:.0f}, training {r['train_s']:.0f} s "
                f"(this call {r['wall_s']:.0f} s){extra}",
                flush=True,
            )
    print(f"\nmachine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{a.steps:,} env steps per run, seeds {a.seeds}")  # fmt: skip
    print(f"{'task':<12}{'median return':>15}{'median length':>15}{'median train s':>15}"
          f"{'peer':>26}{'vs peer':>9}")  # fmt: skip
    for task in a.tasks:
        rs = [r for r in rows if r["task"] == task]
        ps = [r for r in peers if r["task"] == task]
        if ps:
            peer = statistics.median(r["return_mean"] for r in ps)
            peer_s = f"{ps[0]['peer']} {peer:.0f} (median)"
        elif task in RL_ZOO_PPO:
            peer = RL_ZOO_PPO[task][0]
            peer_s = f"RL Zoo {peer:.0f} ± {RL_ZOO_PPO[task][1]:.0f}"
        else:
            peer, peer_s = None, "-"
        if not rs:
            print(f"{task:<12}{'-':>15}{'-':>15}{'-':>15}{peer_s:>26}{'-':>9}")
            continue
        med = statistics.median(r["return_mean"] for r in rs)
        length = statistics.median(r["length_mean"] for r in rs)
        wall = statistics.median(r["train_s"] for r in rs)
        ratio = f"{med / peer:.2f}x" if peer else "-"
        print(f"{task:<12}{med:>15.1f}{length:>15.0f}{wall:>15.0f}{peer_s:>26}{ratio:>9}")
    if a.json:
        Path(a.json).write_text(json.dumps({"ours": rows, "sb3": peers}, indent=1))
    if a.figure and rows:
        plot_curves(rows, out, Path(a.figure))


if __name__ == "__main__":
    main()
