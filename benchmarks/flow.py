"""Flow policies (flow BC, ReinFlow, FPO) beside DPPO and Gaussian PPO, from the same
imperfect demonstrations, budgets, seeds and evaluations as benchmarks/dppo.py.

Per task it uses benchmarks/dppo.py's results file (demonstrations, experts, and its
cached DPPO and Gaussian PPO results, run first if missing), then for each seed:

1. flow BC: a flow policy (shortcut-trained, 4 Euler steps) pretrained on the same demos;
   evaluated at 4 steps and at 1 step (the one-step policy);
2. ReinFlow: that policy fine-tuned for the budget, 4 noisy Euler steps;
3. FPO from flow BC, and FPO from scratch (no demonstrations), same budget;
4. its peer: our Gaussian PPO from scratch with the task's preset (the policy the PPO
   benchmark measures), same budget, evaluated with its mean action.

Evaluations: 10 episodes on the DPPO benchmark's seeds, the generative policies sampling
as deployed (x_0 ~ N(0, I) from a seeded generator). Then the ONNX latency per action of
the first seed's policies on the robot-side runtime (onnxruntime, 1 thread): flow at 1
and 4 steps and DPPO's 5-step DDIM, interleaved in the same run.

Targets (the issue's): ReinFlow (4 steps) >= DPPO in at most half its fine-tuning wall
time; one-step flow ONNX p99 <= DPPO's / 4 with a return within 10% of the 4-step policy;
FPO from BC >= 1.5 x BC; FPO from scratch >= 0.8 x our Gaussian PPO at 1M steps.

    OMP_NUM_THREADS=1 python benchmarks/flow.py --tasks hopper halfcheetah --seeds 0 1 2 \\
        --out runs/bench_dppo

Results are cached per (task, seed, method) in <out>/results.json beside DPPO's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import dppo as dppo_bench  # noqa: E402  (the DPPO benchmark: cache, demos, evaluations)

FLOW_METHODS = ("fbc", "reinflow", "fpo", "fpo_scratch", "ppo_scratch")
QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]


def _eval_flow(policy, cfg, seed: int, steps: int | None = None) -> dict[str, Any]:
    """Sampling mode (x_0 ~ N(0, I), seeded), ``steps`` Euler steps (None: the policy's)."""
    from sim.evaluation import evaluate
    from training.actors import ChunkActor
    from training.policy_kinds import CHECKPOINT_KINDS, make_env

    family = CHECKPOINT_KINDS["flow_bc"].family
    seed = dppo_bench._eval_seed(seed)
    env = make_env(cfg, dppo_bench.EVAL_EPISODES, seed, False, family.obs_history(cfg))
    try:
        was = policy.training
        policy.eval()
        act = ChunkActor(policy, env.num_envs, deterministic=False, seed=seed, steps=steps)
        stats = evaluate(act, env, dppo_bench.EVAL_EPISODES)
        policy.train(was)
    finally:
        env.close()
    return stats


def flow_bc(task: str, demos: str, seed: int, out: Path, updates: int, extra: list[str]) -> dict:
    from training.bc_runner import BCRunner
    from training.train_configs import build_bc_config

    over = QUIET + [f"run.seed={seed}", f"bc.seed={seed}", f"bc.num_updates={updates}", *extra]
    cfg = build_bc_config(task, demos, over, policy="flow")
    t0 = time.perf_counter()
    runner = BCRunner(cfg, out / task / f"fbc-s{seed}")
    runner.train()
    runner.close()
    wall = time.perf_counter() - t0
    four = _eval_flow(runner.policy, cfg, seed)
    one = _eval_flow(runner.policy, cfg, seed, steps=1)
    return {
        "run_dir": str(runner.run_dir),
        "wall_s": wall,
        "return": four["return_mean"],
        "return_1step": one["return_mean"],
    }


def fine_tune(
    task: str, method: str, init: str | None, seed: int, out: Path, budget: int, evals: int,
    extra: list[str], name: str | None = None,
) -> dict:  # fmt: skip
    """`method`: the learner (reinflow | fpo); `name`: the run's directory and cache key
    (fpo_scratch is FPO without `init`), default `method`."""
    from training.policy_kinds import finetune_config_from
    from training.run_control import TrainingDiverged
    from training.runner import OnPolicyRunner
    from training.train_configs import FPOTrainConfig, ReinFlowTrainConfig, build_fpo_config

    section = "reinflow" if method == "reinflow" else "fpo"
    over = QUIET + [f"run.seed={seed}", f"{section}.seed={seed}", f"run.total_steps={budget}"]
    over += extra
    if init is None:
        cfg = build_fpo_config(task, over)
    else:
        cls = ReinFlowTrainConfig if method == "reinflow" else FPOTrainConfig
        cfg = finetune_config_from(cls, init, task, over)
    runner = OnPolicyRunner(cfg, out / task / f"{name or method}-s{seed}")
    t0 = time.perf_counter()
    try:
        trained = dppo_bench._train_with_evals(
            runner, budget, evals, lambda p: _eval_flow(p, cfg, seed)
        )
    except TrainingDiverged as e:
        # a result, not a crash: the run's last good weights, and where it stopped
        print(f"[{task} s{seed}] {name or method}: {e}", flush=True)
        ev = _eval_flow(runner.policy, cfg, seed)
        trained = {"env_steps": runner.env_steps, "return": ev["return_mean"], "diverged": str(e)}
    runner.close()
    return {"run_dir": str(runner.run_dir), "wall_s": time.perf_counter() - t0, **trained}


def ppo_scratch(task: str, seed: int, out: Path, budget: int, evals: int) -> dict:
    """Our PPO from scratch, the task's preset (docs/benchmarks_ppo.md), ``budget`` steps."""
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = QUIET + [f"run.seed={seed}", f"ppo.seed={seed}", f"run.total_steps={budget}"]
    cfg = build_ppo_config(task, over)
    runner = OnPolicyRunner(cfg, out / task / f"ppo_scratch-s{seed}")
    t0 = time.perf_counter()
    trained = dppo_bench._train_with_evals(
        runner, budget, evals, lambda p: dppo_bench._eval_gaussian(p, cfg, seed)
    )
    runner.close()
    return {"run_dir": str(runner.run_dir), "wall_s": time.perf_counter() - t0, **trained}


def latency(task: str, cache: Any, seed: int, calls: int = 5000) -> dict[str, Any]:
    """ONNX per-action latency of the one-step and four-step flow policies and DPPO's
    5-step DDIM, measured interleaved on the robot-side runtime."""
    from deploy.export import export_policy
    from deploy.runtime import OnnxPolicy
    from training.export import export_run
    from training.policy_kinds import load_policy

    fbc = load_policy(cache.get(f"{task}/fbc/s{seed}")["run_dir"])
    out = Path(cache.get(f"{task}/fbc/s{seed}")["run_dir"])
    meta = fbc.metadata()
    files = {}
    for steps in (1, 4):
        module = fbc.policy.inference_module(steps)
        m = type(meta)(**{**meta.__dict__, "extra": {**meta.extra, "flow_steps": str(steps)}})
        files[f"flow_{steps}step"] = export_policy(module, m, out / f"policy_{steps}step.onnx")
    files["dppo_ddim5"] = export_run(cache.get(f"{task}/dppo/s{seed}")["run_dir"])
    policies = {k: OnnxPolicy(v, seed=0) for k, v in files.items()}
    ms = dppo_bench._latency_rounds(policies, meta.obs_frame_size, calls)
    return {
        k: {"p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99))}
        for k, v in ms.items()
    }


def _mean(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.0f}" + (f" ± {statistics.stdev(xs):.0f}" if len(xs) > 1 else "")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", nargs="+", default=["hopper", "halfcheetah"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=1_000_000, help="fine-tuning env steps")
    p.add_argument("--evals", type=int, default=5)
    p.add_argument("--bc-updates", type=int, default=None, help="BC updates (default: per task)")
    p.add_argument("--out", default="runs/bench_dppo", help="the DPPO benchmark's directory")
    p.add_argument("--flow-extra", nargs="*", default=[], help="overrides of every flow run")
    p.add_argument("--methods", nargs="+", default=list(FLOW_METHODS), choices=FLOW_METHODS)
    p.add_argument("--no-onnx", action="store_true")
    a = p.parse_args()

    torch.set_num_threads(1)
    out = Path(a.out)
    cache = dppo_bench.Cache(out / "results.json", fresh=False)
    t_start = time.perf_counter()
    for task in a.tasks:
        demos = cache.get(f"{task}/demos")
        # FPO and PPO from scratch learn without them: a directory of their own will do
        if demos is None and set(a.methods) - {"fpo_scratch", "ppo_scratch"}:
            raise SystemExit(f"no demonstrations of {task} in {out}: run benchmarks/dppo.py first")
        updates = a.bc_updates or dppo_bench.BC_UPDATES.get(task, 2000)
        for seed in a.seeds:
            for method in a.methods:
                k = f"{task}/{method}/s{seed}"
                if cache.get(k) is not None:
                    continue
                if method == "fbc":
                    r = flow_bc(task, demos["path"], seed, out, updates, a.flow_extra)
                elif method == "ppo_scratch":
                    r = ppo_scratch(task, seed, out, a.budget, a.evals)
                else:
                    fbc = cache.get(f"{task}/fbc/s{seed}")
                    init = None if method == "fpo_scratch" else fbc["run_dir"]
                    kind = "fpo" if method.startswith("fpo") else "reinflow"
                    r = fine_tune(
                        task, kind, init, seed, out, a.budget, a.evals, a.flow_extra, method
                    )
                cache.put(k, r)
                print(
                    f"[{task} s{seed}] {method}: return {r['return']:.0f} ({r['wall_s']:.0f} s)",
                    flush=True,
                )
        if (
            not a.no_onnx
            and cache.get(f"{task}/flow_onnx") is None
            and cache.get(f"{task}/dppo/s{a.seeds[0]}")
        ):
            cache.put(f"{task}/flow_onnx", latency(task, cache, a.seeds[0]))
    print(
        "\n| task | BC (diffusion) | DPPO | flow BC 4 steps | flow BC 1 step | ReinFlow | FPO from BC | FPO from scratch | Gaussian PPO | PPO from scratch |"
    )
    print("| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
    for task in a.tasks:

        def col(method: str, key: str = "return", task: str = task) -> str:
            vals = [cache.get(f"{task}/{method}/s{s}") for s in a.seeds]
            return _mean([v[key] for v in vals if v is not None and v.get(key) is not None])

        print(f"| {task} | {col('bc')} | {col('dppo')} | {col('fbc')} | {col('fbc', 'return_1step')} | "
              f"{col('reinflow')} | {col('fpo')} | {col('fpo_scratch')} | {col('gppo')} | "
              f"{col('ppo_scratch')} |")  # fmt: skip
        walls = {
            m: col(m, "train_s") for m in ("dppo", "reinflow", "fpo", "fpo_scratch", "ppo_scratch")
        }
        print(f"  fine-tuning wall time, s: {walls}")
        if cache.get(f"{task}/flow_onnx"):
            print(f"  ONNX per action: {json.dumps(cache.get(f'{task}/flow_onnx'))}")
    print(f"\nresults: {out / 'results.json'}; wall {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
