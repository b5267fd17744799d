"""Our PPO against stable-baselines3's PPO on halfcheetah, in one run.

(a) identical settings for both (envs, rollout length, epochs, minibatch size,
    network, learning rate): env steps per second and return after the same steps.
(b) each with its recommended settings (SB3: the RL Zoo's HalfCheetah PPO
    hyperparameters; ours: the halfcheetah preset): wall time until each first
    reaches the return SB3 has at the end of its budget.

The SB3 side steps Gymnasium's own HalfCheetah-v5 in a DummyVecEnv (SB3's default
vectorization), which our halfcheetah reproduces exactly.

    python benchmarks/ppo_vs_sb3.py --steps-a 200000 --steps-b 1000000

SB3's side of (b) is cached in --out per (budget, seed): `--parts b --sb3-only` runs
just that side, a later `--parts b` reads it back and trains ours against it.

--compile trains ours in (a) and (b) with its minibatch step under torch.compile
(ppo.compile=true).
(m), not run by default, times that step alone on (a)'s settings, eager against
compiled, in interleaved rounds (median ms per step), the compiling first call apart:

    python benchmarks/ppo_vs_sb3.py --parts m
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sb3_peer import Curve, evaluate  # noqa: E402

SAME = dict(
    num_envs=16,
    n_steps=128,
    n_epochs=10,
    batch_size=256,
    lr=3e-4,
    hidden=(64, 64),
    gamma=0.99,
    lam=0.95,
)


def sb3_same(steps: int, seed: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.manual_seed(seed)
    venv = make_vec_env("HalfCheetah-v5", n_envs=SAME["num_envs"], seed=seed)
    model = PPO(
        "MlpPolicy", venv, n_steps=SAME["n_steps"], batch_size=SAME["batch_size"], n_epochs=SAME["n_epochs"],
        learning_rate=SAME["lr"], gamma=SAME["gamma"], gae_lambda=SAME["lam"], seed=seed, device="cpu",
        policy_kwargs=dict(net_arch=dict(pi=list(SAME["hidden"]), vf=list(SAME["hidden"]))),
    )  # fmt: skip
    curve = Curve()
    t0 = time.perf_counter()
    model.learn(steps, callback=curve.cb)
    wall = time.perf_counter() - t0
    return {"steps_per_s": steps / wall, "train_return": float(np.mean(curve.returns[-20:])),
            "eval_return": evaluate(model, "HalfCheetah-v5")["return_mean"], "wall_s": wall}  # fmt: skip


def same_config(steps: int, seed: int, compile_: bool) -> Any:
    """Our config for (a)'s identical settings."""
    from training.train_configs import build_ppo_config

    minibatches = SAME["num_envs"] * SAME["n_steps"] // SAME["batch_size"]
    h = ",".join(map(str, SAME["hidden"]))
    return build_ppo_config("halfcheetah", [
        f"env.num_envs={SAME['num_envs']}", f"ppo.num_steps={SAME['n_steps']}", f"ppo.num_epochs={SAME['n_epochs']}",
        f"ppo.num_minibatches={minibatches}", f"ppo.lr={SAME['lr']}", "ppo.schedule=fixed",
        f"ppo.gamma={SAME['gamma']}", f"ppo.lam={SAME['lam']}", f"policy.actor_hidden={h}", f"policy.critic_hidden={h}",
        "policy.activation=tanh", "ppo.value_clip=none", "ppo.value_coef=0.5", "ppo.max_grad_norm=0.5",
        f"run.total_steps={steps}", f"run.seed={seed}", "run.progress=false", "run.video=false",
        f"ppo.compile={str(compile_).lower()}",
    ])  # fmt: skip


def ours_same(steps: int, seed: int, out: Path, compile_: bool) -> dict:
    from training.artifacts import evaluate_source
    from training.runner import OnPolicyRunner

    run_dir = out / ("same_compiled" if compile_ else "same")
    if run_dir.exists():  # a timing run starts from scratch
        print(f"(a) removing the earlier run {run_dir}", flush=True)
        shutil.rmtree(run_dir)
    runner = OnPolicyRunner(same_config(steps, seed, compile_), run_dir)
    # timed like SB3's learn(): training only, not building the learner and its env
    t0 = time.perf_counter()
    summary = runner.train()
    wall = time.perf_counter() - t0
    ev = evaluate_source(run_dir, episodes=10, seed=100)
    return {"steps_per_s": runner.env_steps / wall, "train_return": summary["return"],
            "eval_return": ev["return_mean"], "wall_s": wall}  # fmt: skip


# RL Zoo hyperparameters for HalfCheetah PPO (hyperparams/ppo.yml; normalize: true, 1 env)
ZOO = dict(
    batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
    clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
)  # fmt: skip
ZOO_NET = dict(log_std_init=-2, ortho_init=False, activation="relu", pi=[256, 256], vf=[256, 256])


def sb3_zoo(steps: int, seed: int) -> dict:
    """SB3 PPO with the RL Zoo's HalfCheetah settings (ZOO, ZOO_NET)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed), gamma=ZOO["gamma"])
    net = ZOO_NET
    model = PPO(
        "MlpPolicy", venv, seed=seed, device="cpu", **ZOO,
        policy_kwargs=dict(log_std_init=net["log_std_init"], ortho_init=net["ortho_init"],
                           activation_fn={"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[net["activation"]],
                           net_arch=dict(pi=net["pi"], vf=net["vf"])),
    )  # fmt: skip
    curve = Curve()
    t0 = time.perf_counter()
    model.learn(steps, callback=curve.cb)
    wall = time.perf_counter() - t0
    venv.training = False
    return {"curve": curve.points, "final_train_return": curve.points[-1][2] if curve.points else float("nan"),
            "eval_return": evaluate(model, "HalfCheetah-v5", venv)["return_mean"], "wall_s": wall}  # fmt: skip


class _EpisodeLog(deque):
    """Stands in for our logger's recent_returns (the last 100 episodes, for its log)
    and records every finished episode, so that (b) reads our training return as it
    reads SB3's: the mean of the last 20 episodes, against the wall time since
    training began."""

    def __init__(self, runner, t0: float):
        super().__init__(maxlen=100)
        self.runner, self.t0 = runner, t0
        self.returns: list[float] = []
        self.points: list[tuple[float, int, float]] = []

    def extend(self, values) -> None:
        values = [float(v) for v in values]
        super().extend(values)
        if values:
            self.returns.extend(values)
            # the runner counts a rollout's steps once it ends: these episodes ended in it
            steps = self.runner.env_steps + self.runner.steps_per_iteration
            mean20 = float(np.mean(self.returns[-20:]))
            self.points.append((time.perf_counter() - self.t0, steps, mean20))


def ours_preset(steps: int, seed: int, out: Path, compile_: bool = False) -> dict:
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    cfg = build_ppo_config("halfcheetah", [f"run.total_steps={steps}", f"run.seed={seed}", "run.progress=false",
                                       "run.video=false", f"ppo.compile={str(compile_).lower()}"])  # fmt: skip
    run_dir = out / (f"preset_{steps}_compiled" if compile_ else f"preset_{steps}")
    if run_dir.exists():
        # a timing run starts from scratch: a resumed one's wall time would mean nothing
        print(f"(b) removing the earlier run {run_dir}", flush=True)
        shutil.rmtree(run_dir)
    runner = OnPolicyRunner(cfg, run_dir)
    t0 = time.perf_counter()
    runner.logger.recent_returns = log = _EpisodeLog(runner, t0)
    runner.train()
    wall = time.perf_counter() - t0
    return {"curve": log.points, "wall_s": wall}


def minibatch_step(seed: int, rounds: int) -> dict:
    """(m): ms per minibatch step of our PPO, eager and compiled, on (a)'s settings.

    Each learner takes one rollout of (a)'s env, then steps over its minibatches once
    per round; the two alternate which goes first, so that a change of the machine's
    load falls on both. The first compiled call (tracing and compiling, or reading
    Inductor's cache in TORCHINDUCTOR_CACHE_DIR) is timed apart.
    """
    import statistics
    import tempfile

    from training.runner import OnPolicyRunner

    learners, first_call = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, compile_ in (("eager", False), ("compiled", True)):
            runner = OnPolicyRunner(same_config(SAME["num_envs"] * SAME["n_steps"], seed, compile_),
                                    Path(tmp) / name)  # fmt: skip
            runner._rollout()
            alg = runner.alg
            c = alg.cfg
            alg.storage.compute_advantages(c.gamma, c.lam, c.normalize_advantages)
            batches = list(alg.storage.minibatches(c.num_minibatches, alg.generator))
            t0 = time.perf_counter()
            alg._minibatch_step(batches[0])
            first_call[name] = time.perf_counter() - t0
            learners[name] = (alg, batches)
            runner.close()
    per_step: dict[str, list[float]] = {name: [] for name in learners}
    for r in range(rounds + 1):
        for name in list(learners)[:: 1 if r % 2 == 0 else -1]:
            alg, batches = learners[name]
            t0 = time.perf_counter()
            for b in batches:
                alg._minibatch_step(b)
            if r > 0:  # round 0 warms both up
                per_step[name].append((time.perf_counter() - t0) / len(batches) * 1e3)
    skipped = {name: alg.guard.nonfinite_steps for name, (alg, _) in learners.items()}
    return {
        "ms_per_step_median": {n: statistics.median(v) for n, v in per_step.items()},
        "ms_per_step_range": {n: (min(v), max(v)) for n, v in per_step.items()},
        "first_call_s": first_call,
        "rounds": rounds,
        "steps_per_round": len(learners["eager"][1]),
        "skipped_steps": skipped,
    }


def first_reach(curve, target: float):
    for t, step, ret in curve:
        if ret >= target:
            return t, step
    return None, None


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps-a", type=int, default=200_000)
    p.add_argument("--steps-b", type=int, default=1_000_000, help="SB3's budget in (b)")
    p.add_argument(
        "--ours-steps-b", type=int, default=None, help="our budget in (b); default = steps-b"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench_ppo_vs_sb3")
    p.add_argument("--parts", default="ab")
    p.add_argument("--json", default=None)
    p.add_argument("--sb3-only", action="store_true", help="(b): run and cache SB3's side only")
    p.add_argument(
        "--compile", action="store_true", help="(a) and (b): ours with ppo.compile=true"
    )
    p.add_argument("--rounds", type=int, default=30, help="(m): rounds of minibatch steps")
    p.add_argument(
        "--rounds-a", type=int, default=1, help="(a): interleaved runs (ours, SB3, ours, ...)"
    )
    a = p.parse_args()
    from sim.machine_load import LoadMonitor, median_ratio

    # our simulator steps on both cores: two runnable threads of ours are expected
    monitor = LoadMonitor(own_threads=2)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # the machine is shared: the load beside the figures says how far to trust them
    res: dict = {"machine": f"{os.cpu_count()} CPUs", "torch_threads": torch.get_num_threads(),
                 "compile": a.compile, "loadavg_start": _loadavg()}  # fmt: skip
    if "m" in a.parts:
        m = res["m"] = minibatch_step(a.seed, a.rounds)
        med, first = m["ms_per_step_median"], m["first_call_s"]
        print(f"(m) minibatch step of {SAME['batch_size']} on (a)'s settings, median of {a.rounds} rounds "
              f"of {m['steps_per_round']} steps (load {_loadavg()})")  # fmt: skip
        for name in med:
            lo, hi = m["ms_per_step_range"][name]
            print(
                f"    {name}: {med[name]:.3f} ms per step ({lo:.3f}-{hi:.3f}); first call {first[name]:.2f} s"
            )
        print(f"    compiled / eager: {med['compiled'] / med['eager']:.2f}", flush=True)
    if "a" in a.parts:
        runs: dict[str, list[dict]] = {"ours": [], "sb3": []}
        for _ in range(max(1, a.rounds_a)):  # interleaved: a burst of load hits both
            runs["ours"].append(ours_same(a.steps_a, a.seed, out, a.compile))
            monitor.sample()
            runs["sb3"].append(sb3_same(a.steps_a, a.seed))
            monitor.sample()
        ours, sb3 = runs["ours"][-1], runs["sb3"][-1]
        rates = {k: [r["steps_per_s"] for r in v] for k, v in runs.items()}
        ratio = median_ratio(rates["ours"], rates["sb3"])
        res["a"] = {"ours": ours, "sb3": sb3, "settings": SAME, "steps": a.steps_a,
                    "rates": rates, "median_ratio": ratio}  # fmt: skip
        print(f"(a) identical settings {SAME}, {a.steps_a:,} steps")
        print(
            f"    ours: {ours['steps_per_s']:,.0f} steps/s, train return {ours['train_return']:.0f}, "
            f"eval {ours['eval_return']:.0f}"
        )
        print(
            f"    sb3:  {sb3['steps_per_s']:,.0f} steps/s, train return {sb3['train_return']:.0f}, "
            f"eval {sb3['eval_return']:.0f}"
        )
        print(
            f"    speed ratio ours/sb3: {ratio:.2f}x (median of {len(rates['ours'])} interleaved "
            f"rounds; ours {[round(x) for x in rates['ours']]}, SB3 "
            f"{[round(x) for x in rates['sb3']]})",
            flush=True,
        )
    if "b" in a.parts:
        # SB3 with the Zoo's settings takes 20 min or more for 1M steps on this machine:
        # its result is kept per (budget, seed), so our side can be rerun against it
        import stable_baselines3

        cache = out / f"sb3_zoo_s{a.seed}_{a.steps_b}.json"
        made_with = {"zoo": ZOO, "net": ZOO_NET, "sb3": stable_baselines3.__version__}
        sb3 = json.loads(cache.read_text()) if cache.exists() else None
        if sb3 is not None and sb3.get("made_with") == made_with:
            print(f"(b) SB3 side read from {cache} (delete it to rerun SB3)", flush=True)
        else:
            if sb3 is not None:
                print(f"(b) {cache} was made with other settings or SB3: rerunning SB3")
            sb3 = {**sb3_zoo(a.steps_b, a.seed), "made_with": made_with}
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(sb3))
            tmp.replace(cache)  # never a half-written cache after an interruption
        if a.sb3_only:
            print(
                f"(b) SB3 side done: training return {sb3['final_train_return']:.0f} at {a.steps_b:,} steps"
            )
            return
        target = sb3["final_train_return"]
        t_sb3, s_sb3 = first_reach(sb3["curve"], target)
        ours = ours_preset(a.ours_steps_b or a.steps_b, a.seed, out, a.compile)
        t_ours, s_ours = first_reach(ours["curve"], target)
        res["b"] = {"target": target, "sb3": {"t": t_sb3, "steps": s_sb3, "eval": sb3["eval_return"],
                                              "wall_s": sb3.get("wall_s")},
                    "ours": {"t": t_ours, "steps": s_ours, "budget": a.ours_steps_b or a.steps_b,
                             "wall_s": ours["wall_s"]}}  # fmt: skip
        print(
            f"(b) recommended settings; target = SB3's return at {a.steps_b:,} steps: {target:.0f}"
        )
        print(
            f"    sb3 (RL Zoo hyperparameters): first reached after {t_sb3:.0f} s ({s_sb3:,} steps)"
        )
        if t_ours is None:
            # the first iterations end no episode: their return is NaN
            best = max((r for _, _, r in ours["curve"] if math.isfinite(r)), default=float("nan"))
            print(f"    ours (preset): never reached it; best training return {best:.0f}")
        else:
            print(
                f"    ours (preset): first reached after {t_ours:.0f} s ({s_ours:,} steps); "
                f"speedup {t_sb3 / t_ours:.1f}x",
                flush=True,
            )
    res["loadavg_end"] = _loadavg()
    monitor.stop()
    res["machine_load"] = {"verdict": monitor.describe(), "busy": monitor.busy}
    print(
        f"load average (1, 5, 15 min): {res['loadavg_start']} at the start, {res['loadavg_end']} at the end"
    )
    print(monitor.describe())
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # not Linux
        return "n/a"


if __name__ == "__main__":
    main()
