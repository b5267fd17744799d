"""DPPO against Gaussian PPO, both fine-tuned from behaviour cloning on imperfect demos.

Per task: record demonstrations of a PPO expert with Gaussian action noise (imperfect
demonstrations), then for each seed:

1. diffusion BC: pretrain a diffusion policy on the demos (``train bc``); evaluate;
2. DPPO: fine-tune it for a fixed env-step budget (``train dppo``); evaluate along the way;
3. Gaussian BC: an MLP Gaussian actor (same hidden sizes) fitted to the same demos by
   mean-squared error; evaluate;
4. Gaussian PPO: fine-tune that policy with our PPO for the same budget, the same
   number of envs and rollout length; evaluate at the same points.

Evaluations: 10 episodes on the same seeds for every method; the Gaussian policies act
with their mean action, the diffusion policies sample their chunks as deployed (DDIM
5 steps, x_0 ~ N(0, I) from a seeded generator: the runtime's default mode) and, at
the end, also in the deterministic mode (the canonical x_0). A third evaluation from
the saved runs measures the stochastic policies that the fine-tuning optimizes
(diffusion with the std floor at every denoising step, Gaussian with its std). Then the DPPO policy of the first seed is exported to ONNX (DDIM, 5
steps), evaluated in sim2sim, and its single-observation latency is measured with the
robot-side runtime (onnxruntime, 1 thread).

Targets (the issue's): DPPO >= 1.5 x BC, DPPO >= Gaussian PPO, ONNX p99 < 1 ms.

    OMP_NUM_THREADS=1 python benchmarks/dppo.py --tasks hopper halfcheetah --seeds 0 1 2 \\
        --out runs/bench_dppo --figure docs/figures/dppo_benchmark.png

Results are cached per (task, seed, method) in <out>/results.json, so a rerun with the
same arguments continues where it stopped (--fresh starts over).
"""

from __future__ import annotations

import argparse
import json
import math
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

# The imperfect demonstrators: PPO experts stopped early (iteration 100, ~205k env steps,
# of `sim2real train ppo --task <task> --seed 0 --steps 400000 --run-dir
# runs/expert_<task> <EXPERT_RECIPE>`), whose actions the benchmark further perturbs with
# Gaussian noise. A missing one is trained first, so a fresh clone runs the benchmark
# with one command. The recipe is pinned (it is hopper's preset of 2026-12-02) rather
# than taken from the presets: halfcheetah's preset of 2026-12-03 makes a demonstrator
# that returns 4 266 at iteration 100 and whose noisy demonstrations return 40.
EXPERT_STEPS = 400_000
EXPERT_ITERATION = 100
EXPERT_RECIPE = [
    "env.num_envs=32",
    "ppo.num_steps=64",
    "ppo.schedule=adaptive",
    "ppo.lr=3e-4",
    "ppo.num_epochs=5",
    "ppo.num_minibatches=4",
    "ppo.gamma=0.99",
    "ppo.lam=0.95",
    "ppo.value_normalization=false",
    "policy.init_std=1.0",
    "policy.actor_hidden=256,256",
    "policy.critic_hidden=256,256",
]
EXPERTS = {
    task: f"runs/expert_{task}/checkpoints/iter_{EXPERT_ITERATION:06d}.pt"
    for task in ("hopper", "halfcheetah")
}
# Diffusion BC updates per task: halfcheetah's BC policy kept improving up to 20 000
# (returns of seeds 0/1/2: 1 500 updates -22/270/79, 8 000 570/339/354, 20 000
# 741/633/779); hopper's plateaus by 1 500.
BC_UPDATES = {"hopper": 1500, "halfcheetah": 20_000}
QUIET_DIFF = ["run.progress=false", "run.tensorboard=false"]
EVAL_EPISODES = 10


def _eval_seed(seed: int) -> int:
    return 10_000 + seed


class Cache:
    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.exists() and not fresh:
            self.data = json.loads(path.read_text())

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def put(self, key: str, value: Any) -> Any:
        self.data[key] = value
        self._write()
        return value

    def drop(self, *keys: str) -> None:
        for key in keys:
            self.data.pop(key, None)
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------- steps
def ensure_expert(task: str, checkpoint: str) -> str:
    """Train the default expert of `task` when its checkpoint is missing."""
    path = Path(checkpoint)
    if path.exists():
        return checkpoint
    if checkpoint != EXPERTS.get(task):
        raise SystemExit(f"expert checkpoint {checkpoint} for {task} does not exist")
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    run_dir = path.parent.parent
    print(f"[{task}] training the demonstrator: {EXPERT_STEPS} steps into {run_dir}", flush=True)
    cfg = build_ppo_config(
        task,
        [
            "run.seed=0",
            f"run.total_steps={EXPERT_STEPS}",
            "run.video=false",
            "run.progress=false",
            *EXPERT_RECIPE,
        ],
    )
    resume = run_dir if (run_dir / "checkpoints" / "latest.pt").exists() else None
    OnPolicyRunner(cfg, run_dir, resume=resume).train()
    if not path.exists():
        raise SystemExit(f"training {run_dir} did not leave {path}: check run.checkpoint_every")
    return checkpoint


def collect(task: str, expert: str, out: Path, episodes: int, noise: float) -> dict[str, Any]:
    from training.artifacts import evaluate_source
    from training.collect import collect_demos
    from training.demos import save_demos

    t0 = time.perf_counter()
    data = collect_demos(expert, task, episodes, noise, seed=777, num_envs=16)
    path = save_demos(out / task / "demos.hdf5", data)
    expert_eval = evaluate_source(expert, task=task, episodes=EVAL_EPISODES, seed=_eval_seed(0))
    return {
        "path": str(path),
        "wall_s": time.perf_counter() - t0,
        **data.summary(),
        "expert_return": expert_eval["return_mean"],
    }


def diffusion_bc(
    task: str, demos: str, seed: int, out: Path, updates: int, extra: list[str]
) -> dict[str, Any]:
    from training.bc_runner import BCRunner
    from training.train_configs import build_bc_config

    run_dir = out / task / f"bc-s{seed}"
    cfg = build_bc_config(
        task,
        demos,
        QUIET_DIFF + [f"run.seed={seed}", f"bc.seed={seed}", f"bc.num_updates={updates}", *extra],
    )
    t0 = time.perf_counter()
    runner = BCRunner(cfg, run_dir)
    runner.train()
    runner.close()
    wall = time.perf_counter() - t0
    ev = _eval_diffusion(runner.policy, cfg, seed)
    det = _eval_diffusion(runner.policy, cfg, seed, deterministic=True)
    return {
        "run_dir": str(run_dir),
        "wall_s": wall,
        "return": ev["return_mean"],
        "return_deterministic": det["return_mean"],
        "eval": ev,
    }


def _eval_diffusion(policy, cfg, seed: int, deterministic: bool = False) -> dict[str, Any]:
    """Sampling mode (x_0 ~ N(0, I), seeded) unless deterministic (canonical x_0)."""
    from training.policy_kinds import CHECKPOINT_KINDS, evaluate_policy

    family = CHECKPOINT_KINDS["dppo"].family
    return evaluate_policy(
        policy, cfg, family, EVAL_EPISODES, seed=_eval_seed(seed), deterministic=deterministic
    )


def dppo(
    task: str, bc_dir: str, seed: int, out: Path, budget: int, evals: int, extra: list[str]
) -> dict[str, Any]:
    from training.config import config_hash
    from training.runner import OnPolicyRunner

    run_dir = out / task / f"dppo-s{seed}"
    cfg = dppo_config(task, bc_dir, seed, budget, extra)
    settings = config_hash(cfg)  # before the loop below moves run.total_steps
    runner = OnPolicyRunner(cfg, run_dir)
    t0 = time.perf_counter()
    trained = _train_with_evals(runner, budget, evals, lambda p: _eval_diffusion(p, cfg, seed))
    det = _eval_diffusion(runner.policy, cfg, seed, deterministic=True)
    runner.close()
    return {
        "run_dir": str(run_dir),
        "wall_s": time.perf_counter() - t0,
        **trained,
        "return_deterministic": det["return_mean"],
        "config_hash": settings,
    }


def _train_with_evals(runner, budget: int, evals: int, evaluate) -> dict[str, Any]:
    """Train to ``budget`` env steps, pausing ``evals`` times for ``evaluate(policy)``
    (the learning curve); the training time excludes the evaluations."""
    per_iter = runner.steps_per_iteration
    iters = math.ceil(budget / per_iter)
    marks = sorted({max(1, round(iters * (i + 1) / evals)) for i in range(evals)})
    curve = [{"env_steps": 0, "return": None}]
    train_s = 0.0
    for m in marks:
        runner.cfg.run.total_steps = m * per_iter
        t1 = time.perf_counter()
        runner.train()
        train_s += time.perf_counter() - t1
        ev = evaluate(runner.policy)
        curve.append({"env_steps": runner.env_steps, "return": ev["return_mean"]})
    return {
        "train_s": train_s,
        "env_steps": runner.env_steps,
        "return": curve[-1]["return"],
        "curve": curve,
    }


def dppo_config(task: str, bc_dir: str, seed: int, budget: int, extra: list[str]):
    """The fine-tuning run's resolved config: DPPO defaults, the task's preset, `extra`."""
    from training.policy_kinds import finetune_config_from
    from training.train_configs import DPPOTrainConfig

    over = QUIET_DIFF + [f"run.seed={seed}", f"dppo.seed={seed}", f"run.total_steps={budget}"]
    return finetune_config_from(DPPOTrainConfig, bc_dir, task, over + extra)


def _gauss_cfg(task: str, seed: int, budget: int, extra: list[str]):
    from training.train_configs import build_ppo_config

    return build_ppo_config(
        task,
        [
            f"run.seed={seed}",
            f"ppo.seed={seed}",
            f"run.total_steps={budget}",
            "env.num_envs=16",
            "env.randomize=false",
            "ppo.num_steps=64",
            "ppo.lr=1e-4",
            # pinned, not the task preset's: the baseline the docs describe (adaptive-KL
            # rate over 5 x 4 minibatches), whatever the locomotion presets become
            "ppo.schedule=adaptive",
            "ppo.num_epochs=5",
            "ppo.num_minibatches=4",
            "ppo.value_normalization=true",
            # DPPO's discounting, so the two fine-tunings optimize the same returns
            "ppo.gamma=0.99",
            "ppo.lam=0.95",
            "policy.actor_hidden=256,256,256",
            "policy.critic_hidden=256,256",
            "policy.init_std=0.1",
            "run.video=false",
            "run.progress=false",
            "run.tensorboard=false",
            "run.checkpoint_every=1000",
            *extra,
        ],
    )


def _eval_gaussian(policy, cfg, seed: int) -> dict[str, Any]:
    from training.policy_kinds import CHECKPOINT_KINDS, evaluate_policy

    family = CHECKPOINT_KINDS["ppo"].family
    return evaluate_policy(policy, cfg, family, EVAL_EPISODES, seed=_eval_seed(seed))


def gaussian_bc(
    task: str, demos: str, seed: int, out: Path, updates: int, extra: list[str]
) -> dict[str, Any]:
    from training.algorithms.bc import BC, BCConfig
    from training.checkpoint import save_checkpoint
    from training.demos import load_demos
    from training.policy_kinds import CHECKPOINT_KINDS, make_env

    torch.manual_seed(seed)
    cfg = _gauss_cfg(task, seed, 1, extra)
    data = load_demos(demos, task=task)
    env = make_env(cfg, num_envs=1, randomize=False)
    policy = CHECKPOINT_KINDS["ppo"].family.build_policy(cfg, env)
    env.close()
    obs, act = data.windows(1, 1)
    t0 = time.perf_counter()
    bc = BC(policy, BCConfig(num_updates=updates, seed=seed), obs, act)
    for _ in range(updates):
        bc.update()
    bc.finalize()
    wall = time.perf_counter() - t0
    path = save_checkpoint(out / task / f"gbc-s{seed}.pt", {"policy": policy.state_dict()})
    ev = _eval_gaussian(policy, cfg, seed)
    return {"state": str(path), "wall_s": wall, "return": ev["return_mean"], "eval": ev}


def gaussian_ppo(
    task: str, state: str, seed: int, out: Path, budget: int, evals: int, extra: list[str]
) -> dict[str, Any]:
    from training.checkpoint import load_checkpoint
    from training.runner import OnPolicyRunner

    cfg = _gauss_cfg(task, seed, budget, extra)
    run_dir = out / task / f"gppo-s{seed}"
    runner = OnPolicyRunner(cfg, run_dir)
    runner.policy.load_state_dict(load_checkpoint(state)["policy"])
    t0 = time.perf_counter()
    trained = _train_with_evals(runner, budget, evals, lambda p: _eval_gaussian(p, cfg, seed))
    runner.close()
    return {"run_dir": str(run_dir), "wall_s": time.perf_counter() - t0, **trained}


def _latency_rounds(
    policies: dict[str, Any], frame: int, calls: int, block: int = 500
) -> dict[str, np.ndarray]:
    """Single-observation ``act`` latency, methods interleaved in blocks (so that a burst
    of load on this shared machine hits all of them alike), after a warm-up."""
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((block, frame)).astype(np.float32)
    times: dict[str, list[float]] = {k: [] for k in policies}
    for pol in policies.values():
        for i in range(300):
            pol.act(frames[i % block])
    for _ in range(max(1, calls // block)):
        for name, pol in policies.items():
            for i in range(block):
                t0 = time.perf_counter()
                pol.act(frames[i])
                times[name].append(time.perf_counter() - t0)
    return {k: np.asarray(v) * 1e3 for k, v in times.items()}


def onnx_check(
    run_dir: str, gauss_run: str | None, seed: int, calls: int = 10_000
) -> dict[str, Any]:
    """Export the DPPO policy, run it in sim2sim, time it beside the Gaussian MLP's ONNX."""
    from deploy.export import read_parity
    from deploy.runtime import OnnxPolicy
    from deploy.sim2sim import evaluate_onnx
    from training.export import export_run

    path = export_run(run_dir)
    policies = {"diffusion": OnnxPolicy(path, seed=0)}
    if gauss_run is not None:
        policies["gaussian"] = OnnxPolicy(export_run(gauss_run), seed=0)
    meta = policies["diffusion"].metadata
    ms = _latency_rounds(policies, meta.obs_frame_size, calls)
    sim = evaluate_onnx(path, episodes=EVAL_EPISODES, seed=_eval_seed(seed))
    d = ms["diffusion"]
    out = {
        "path": str(path),
        "parity_max_abs": read_parity(path),
        "latency_ms_p50": float(np.percentile(d, 50)),
        "latency_ms_p99": float(np.percentile(d, 99)),
        "latency_ms_max": float(d.max()),
        "sample_steps": int(meta.extra.get("diffusion_steps", "0")),
        "sim2sim_return": sim["return_mean"],
        "calls": int(d.size),
    }
    if "gaussian" in ms:
        g = ms["gaussian"]
        out["gaussian_ms_p50"] = float(np.percentile(g, 50))
        out["gaussian_ms_p99"] = float(np.percentile(g, 99))
    return out


class ExploringDiffusionActor:
    """The policy DPPO optimizes: chunks sampled with the std floor at every denoising
    step (``dppo.min_std``), executed ``act_steps`` at a time, new chunk on reset."""

    def __init__(self, policy, num_envs: int, min_std: float, seed: int) -> None:
        self.policy, self.min_std = policy, min_std
        self.pos = torch.zeros(num_envs, dtype=torch.long)
        self.chunk = torch.zeros(num_envs, policy.cfg.act_steps, policy.action_size)
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def __call__(self, obs, reset):
        self.pos[reset.to(torch.bool).cpu()] = 0
        need = self.pos == 0
        if bool(need.any()):
            idx = need.nonzero().squeeze(-1)
            s = self.policy.sample(
                obs["policy"][idx], min_std=self.min_std, generator=self.generator
            )
            self.chunk[idx] = s.actions[:, : self.policy.cfg.act_steps]
        a = self.chunk[torch.arange(len(self.pos)), self.pos]
        self.pos = (self.pos + 1) % self.policy.cfg.act_steps
        return a


def stochastic_eval(task: str, method: str, entry: dict[str, Any], seed: int) -> float:
    """Return of the stochastic policy (exploration noise on), 10 episodes, eval seeds."""
    from sim.evaluation import evaluate
    from training.checkpoint import find_checkpoint, load_checkpoint
    from training.policy_kinds import CHECKPOINT_KINDS, load_policy, make_env

    torch.manual_seed(_eval_seed(seed))
    if method in ("bc", "dppo"):
        loaded = load_policy(entry["run_dir"])
        policy = loaded.policy
        min_std = 0.1
        if method == "dppo":
            min_std = float(loaded.ck["config"]["dppo"]["min_std"])
        env = loaded.make_env(EVAL_EPISODES, _eval_seed(seed), randomize=False)
        act = ExploringDiffusionActor(policy, env.num_envs, min_std, _eval_seed(seed))
    else:
        cfg = _gauss_cfg(task, seed, 1, [])
        env = make_env(cfg, num_envs=EVAL_EPISODES, seed=_eval_seed(seed), randomize=False)
        policy = CHECKPOINT_KINDS["ppo"].family.build_policy(cfg, env)
        src = entry["state"] if method == "gbc" else find_checkpoint(entry["run_dir"])
        policy.load_state_dict(load_checkpoint(src)["policy"])
        policy.eval()

        def act(obs, reset):
            return policy.act(obs).actions

    try:
        return float(evaluate(act, env, EVAL_EPISODES)["return_mean"])
    finally:
        env.close()


# ---------------------------------------------------------------------- report
def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.0f}"
    return f"{statistics.mean(xs):.0f} ± {statistics.stdev(xs):.0f}"


def summarize(cache: Cache, tasks: list[str], seeds: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task in tasks:
        row: dict[str, Any] = {}
        for method in ("bc", "dppo", "gbc", "gppo"):
            row[method] = [
                cache.get(f"{task}/{method}/s{s}")["return"]
                for s in seeds
                if cache.get(f"{task}/{method}/s{s}") is not None
            ]
        demos = cache.get(f"{task}/demos") or {}
        bc, dp, gp = (
            statistics.mean(row[m]) if row[m] else math.nan for m in ("bc", "dppo", "gppo")
        )
        row["demos_return"] = demos.get("return_mean")
        row["expert_return"] = demos.get("expert_return")
        row["dppo_over_bc"] = dp / bc if bc else math.nan
        row["dppo_over_gppo"] = dp / gp if gp else math.nan
        row["target_bc_met"] = bool(dp >= 1.5 * bc)
        row["target_gauss_met"] = bool(dp >= gp)
        row["onnx"] = cache.get(f"{task}/onnx")
        for method in ("bc", "dppo"):
            row[f"{method}_deterministic"] = [
                cache.get(f"{task}/{method}/s{s}")["return_deterministic"]
                for s in seeds
                if cache.get(f"{task}/{method}/s{s}") is not None
            ]
        for method in ("bc", "dppo", "gbc", "gppo"):
            row[f"{method}_stochastic"] = [
                cache.get(f"{task}/{method}/s{s}/stochastic")
                for s in seeds
                if cache.get(f"{task}/{method}/s{s}/stochastic") is not None
            ]
        out[task] = row
    return out


def print_table(summary: dict[str, Any]) -> None:
    print(
        "\nDiffusion sampled as deployed, Gaussian mean action:\n"
        "\n| task | expert | demos | diffusion BC | DPPO | Gaussian BC | Gaussian PPO | "
        "DPPO / BC | DPPO / Gaussian PPO |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for task, r in summary.items():
        print(
            f"| {task} | {r['expert_return'] or float('nan'):.0f} | "
            f"{r['demos_return'] or float('nan'):.0f} | {_ms(r['bc'])} | {_ms(r['dppo'])} | "
            f"{_ms(r['gbc'])} | {_ms(r['gppo'])} | {r['dppo_over_bc']:.2f}"
            f"{' (met)' if r['target_bc_met'] else ' (missed)'} | {r['dppo_over_gppo']:.2f}"
            f"{' (met)' if r['target_gauss_met'] else ' (missed)'} |"
        )
    print("\nDiffusion policies in the deterministic mode (canonical x_0):\n")
    print("| task | diffusion BC | DPPO |")
    print("|---|---|---|")
    for task, r in summary.items():
        print(f"| {task} | {_ms(r['bc_deterministic'])} | {_ms(r['dppo_deterministic'])} |")
    print(
        "\nWith exploration noise on (the stochastic policy each method optimizes: "
        "diffusion with the std floor at every denoising step, Gaussian with its std):\n"
    )
    print("| task | diffusion BC | DPPO | Gaussian BC | Gaussian PPO | DPPO / BC |")
    print("|---|---|---|---|---|---|")
    for task, r in summary.items():
        b, d = r["bc_stochastic"], r["dppo_stochastic"]
        ratio = statistics.mean(d) / statistics.mean(b) if b and d else math.nan
        print(
            f"| {task} | {_ms(b)} | {_ms(d)} | {_ms(r['gbc_stochastic'])} | "
            f"{_ms(r['gppo_stochastic'])} | {ratio:.2f} |"
        )
    for task, r in summary.items():
        o = r.get("onnx")
        if o:
            peer = (
                f"; Gaussian MLP ONNX p50 {o['gaussian_ms_p50']:.3f} ms, p99 "
                f"{o['gaussian_ms_p99']:.3f} ms (diffusion / Gaussian at p50: "
                f"{o['latency_ms_p50'] / o['gaussian_ms_p50']:.1f}x)"
                if "gaussian_ms_p50" in o
                else ""
            )
            print(
                f"{task} ONNX ({o['sample_steps']} DDIM steps, {o.get('calls', '?')} calls): p50 "
                f"{o['latency_ms_p50']:.3f} ms, p99 {o['latency_ms_p99']:.3f} ms "
                f"(target < 1 ms: {'met' if o['latency_ms_p99'] < 1.0 else 'missed'}), "
                f"parity {o['parity_max_abs']:.2g}, sim2sim return {o['sim2sim_return']:.0f}{peer}"
            )


def plot(cache: Cache, tasks: list[str], seeds: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method, color, label, start in (
            ("dppo", "tab:blue", "DPPO (from diffusion BC)", "bc"),
            ("gppo", "tab:orange", "Gaussian PPO (from Gaussian BC)", "gbc"),
        ):
            runs = [cache.get(f"{task}/{method}/s{s}") for s in seeds]
            starts = [cache.get(f"{task}/{start}/s{s}") for s in seeds]
            runs = [(r, b) for r, b in zip(runs, starts) if r is not None and b is not None]
            if not runs:
                continue
            xs = [p["env_steps"] for p in runs[0][0]["curve"]]
            ys = np.array([[b["return"]] + [p["return"] for p in r["curve"][1:]] for r, b in runs])
            mean = ys.mean(0)
            ax.plot(xs, mean, color=color, label=label, marker="o", ms=3)
            if len(ys) > 1:
                ax.fill_between(xs, ys.min(0), ys.max(0), color=color, alpha=0.2)
        demos = cache.get(f"{task}/demos") or {}
        if demos.get("return_mean") is not None:
            ax.axhline(
                demos["return_mean"], color="gray", ls=":", label="demonstrations (noisy expert)"
            )
        if demos.get("expert_return") is not None:
            ax.axhline(
                demos["expert_return"], color="black", ls="--", lw=0.8, label="expert (no noise)"
            )
        ax.set_title(f"{task}: eval return (mean, min-max over seeds)", fontsize=10)
        ax.set_xlabel("fine-tuning env steps")
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- main
METHODS = ("bc", "dppo", "gbc", "gppo")


def drop_if_stale(cache: Cache, task: str, seed: int, a: argparse.Namespace, first: bool) -> None:
    """Forget a cached DPPO result whose settings differ from today's (a changed default
    or preset, other --dppo-extra), with what was measured on its policy."""
    from training.config import config_hash

    k = f"{task}/dppo/s{seed}"
    bc_dir = cache.get(f"{task}/bc/s{seed}")["run_dir"]
    want = config_hash(dppo_config(task, bc_dir, seed, a.budget, a.dppo_extra))
    if cache.get(k).get("config_hash") == want:
        return
    print(f"[{task} s{seed}] dppo: the cached result used other settings; running it again")
    cache.drop(k, k + "/stochastic", *([f"{task}/onnx"] if first else []))


def run_method(
    method: str, task: str, seed: int, demos: str, out: Path, a: argparse.Namespace, cache: Cache
) -> dict[str, Any]:
    bc_updates = a.bc_updates or BC_UPDATES.get(task, 2000)
    if method == "bc":
        return diffusion_bc(task, demos, seed, out, bc_updates, a.bc_extra)
    if method == "dppo":
        bc_dir = cache.get(f"{task}/bc/s{seed}")["run_dir"]
        return dppo(task, bc_dir, seed, out, a.budget, a.evals, a.dppo_extra)
    if method == "gbc":
        return gaussian_bc(task, demos, seed, out, bc_updates, a.ppo_extra)
    state = cache.get(f"{task}/gbc/s{seed}")["state"]
    return gaussian_ppo(task, state, seed, out, a.budget, a.evals, a.ppo_extra)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", nargs="+", default=["hopper", "halfcheetah"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=1_000_000, help="fine-tuning env steps")
    p.add_argument("--evals", type=int, default=5, help="evaluations along fine-tuning")
    p.add_argument("--episodes", type=int, default=20, help="demonstration episodes")
    p.add_argument("--noise", type=float, default=0.3, help="action noise of the demos")
    p.add_argument(
        "--bc-updates", type=int, default=None, help="diffusion BC updates (default: per task)"
    )
    p.add_argument("--expert", action="append", default=[], help="task=run_dir")
    p.add_argument("--out", default="runs/bench_dppo")
    p.add_argument("--figure", default="docs/figures/dppo_benchmark.png")
    p.add_argument("--bc-extra", nargs="*", default=[], help="overrides for train bc")
    p.add_argument(
        "--dppo-extra",
        nargs="*",
        default=[],
        help="overrides for train dppo",
    )
    p.add_argument("--ppo-extra", nargs="*", default=[], help="overrides for Gaussian PPO")
    p.add_argument("--no-onnx", action="store_true")
    p.add_argument("--fresh", action="store_true", help="ignore cached results")
    a = p.parse_args()

    torch.set_num_threads(1)
    experts = dict(EXPERTS)
    experts.update(dict(e.split("=", 1) for e in a.expert))
    out = Path(a.out)
    cache = Cache(out / "results.json", a.fresh)
    t_start = time.perf_counter()
    for task in a.tasks:
        key = f"{task}/demos"
        if cache.get(key) is None:
            print(f"[{task}] collecting {a.episodes} demos from {experts[task]} (noise {a.noise})")
            expert = ensure_expert(task, experts[task])
            cache.put(key, collect(task, expert, out, a.episodes, a.noise))
        demos = cache.get(key)
        print(
            f"[{task}] demos: return {demos['return_mean']:.0f} ± {demos['return_std']:.0f} "
            f"(expert without noise {demos['expert_return']:.0f}), {demos['transitions']} steps"
        )
        for seed in a.seeds:
            for method in METHODS:
                k = f"{task}/{method}/s{seed}"
                if method == "dppo" and cache.get(k) is not None:
                    drop_if_stale(cache, task, seed, a, first=seed == a.seeds[0])
                if cache.get(k) is None:
                    r = cache.put(k, run_method(method, task, seed, demos["path"], out, a, cache))
                    print(
                        f"[{task} s{seed}] {method}: return {r['return']:.0f} "
                        f"({r['wall_s']:.0f} s)",
                        flush=True,
                    )
        for seed in a.seeds:
            for method in METHODS:
                k = f"{task}/{method}/s{seed}"
                if cache.get(k + "/stochastic") is None and cache.get(k) is not None:
                    cache.put(k + "/stochastic", stochastic_eval(task, method, cache.get(k), seed))
        if not a.no_onnx and cache.get(f"{task}/onnx") is None:
            r = cache.get(f"{task}/dppo/s{a.seeds[0]}")
            g = cache.get(f"{task}/gppo/s{a.seeds[0]}")
            cache.put(f"{task}/onnx", onnx_check(r["run_dir"], g and g["run_dir"], a.seeds[0]))
    summary = summarize(cache, a.tasks, a.seeds)
    print_table(summary)
    fig = plot(cache, a.tasks, a.seeds, Path(a.figure))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"\nfigure: {fig}; results: {out / 'results.json'}; wall {time.perf_counter() - t_start:.0f} s"
    )


if __name__ == "__main__":
    main()
