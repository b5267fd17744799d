"""rsl_rl's own PPO as the peer on tasks that only our simulator has (the quadruped and
the Go1s): rsl_rl 5.x's OnPolicyRunner trains on the same batched env through
sim.rsl_rl_env.RslRlVecEnv, with our task preset's settings translated to its train cfg
(envs, rollout, epochs, minibatches, rate schedule, discounting, clipping, entropy,
networks, initial std, observation normalization, asymmetric critic). Its last
checkpoint leaves through `sim2real export --rsl-rl` and is evaluated exactly as our
runs are (training.artifacts.evaluate_source on the ONNX file), so both sides are scored
by the same code on the same episodes.

benchmarks/ is a folder of scripts: a script imports this module after putting its own
folder on sys.path.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any


def train_cfg(cfg: Any) -> dict:
    """rsl_rl 5.x train cfg equivalent to our PPO config `cfg` (a TrainConfig)."""
    ppo, pol = cfg.ppo, cfg.policy
    if pol.rnn_type is not None:
        raise ValueError("the rsl_rl peer takes MLP presets only")
    if ppo.schedule not in ("adaptive", "fixed"):
        # rsl_rl knows a fixed and an adaptive-KL rate; a decaying one has no equivalent
        raise ValueError(f"rsl_rl has no {ppo.schedule!r} rate schedule (adaptive or fixed)")

    if ppo.value_normalization or pol.obs_clip is not None or ppo.clip_high is not None:
        raise ValueError(
            "rsl_rl has no value normalization, observation clipping or asymmetric ratio clip; "
            "the peer would not run the preset's settings"
        )

    def mlp(hidden) -> dict:
        return {"class_name": "MLPModel", "hidden_dims": list(hidden),
                "activation": pol.activation, "obs_normalization": pol.normalize_obs}  # fmt: skip

    return {
        "num_steps_per_env": ppo.num_steps,
        "save_interval": 10**9,  # only the final checkpoint (learn() always writes it)
        "obs_groups": {"actor": ["policy"], "critic": ["critic" if _has_critic(cfg) else "policy"]},
        "actor": {
            **mlp(pol.actor_hidden),
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": pol.init_std},
        },  # fmt: skip
        "critic": mlp(pol.critic_hidden),
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": ppo.num_epochs,
            "num_mini_batches": ppo.num_minibatches,
            "learning_rate": ppo.lr,
            "schedule": ppo.schedule,
            "desired_kl": ppo.desired_kl,
            "gamma": ppo.gamma,
            "lam": ppo.lam,
            "clip_param": ppo.clip,
            "entropy_coef": ppo.entropy_coef,
            "value_loss_coef": ppo.value_coef,
            "use_clipped_value_loss": ppo.value_clip is not None,
            "max_grad_norm": ppo.max_grad_norm if ppo.max_grad_norm is not None else 1e9,
        },
        "logger": "tensorboard",
    }


def _has_critic(cfg: Any) -> bool:
    from sim.registry import make

    env = make(cfg.env.task, 1)
    try:
        return "critic" in env.observation_spec.groups
    finally:
        env.close()


def train(task: str, steps: int, seed: int, out: Path, overrides: list[str] = ()) -> dict:
    """Train rsl_rl's PPO with `task`'s preset for `steps` env steps, export its final
    checkpoint, evaluate it as ours are evaluated."""
    import torch
    from rsl_rl.runners import OnPolicyRunner

    from sim.rsl_rl_env import RslRlVecEnv
    from training.artifacts import evaluate_source
    from training.rsl_rl_import import export_rsl_rl
    from training.train_configs import build_ppo_config

    cfg = build_ppo_config(task, [f"run.seed={seed}", *overrides])
    iters = max(1, math.ceil(steps / (cfg.env.num_envs * cfg.ppo.num_steps)))
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    log_dir = Path(out) / f"rsl_rl-{task}-s{seed}"
    env = RslRlVecEnv(task, cfg.env.num_envs, seed=seed, num_threads=cfg.env.threads)
    tc = train_cfg(cfg)
    runner = OnPolicyRunner(env, tc, log_dir=str(log_dir), device="cpu")
    runner.logger.git_status_repos = []  # no `git status` of this checkout
    t0 = time.perf_counter()
    runner.learn(iters)
    wall = time.perf_counter() - t0
    ckpts = sorted(log_dir.glob("model_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    onnx = export_rsl_rl(ckpts[-1], task, log_dir / "policy.onnx", activation=cfg.policy.activation)
    stats = evaluate_source(onnx, episodes=10, seed=10_000 + seed)
    env.env.close()
    return {"task": task, "seed": seed, "steps": iters * cfg.env.num_envs * cfg.ppo.num_steps,
            "wall_s": wall, "onnx": str(onnx), **stats}  # fmt: skip


def cached(task: str, steps: int, seed: int, out: Path, overrides: list[str] = ()) -> dict:
    """train(), read back from `out` when this (task, budget, seed, overrides) already ran."""
    tag = f"{task}_{steps}_s{seed}"
    if overrides:
        tag += "_" + hashlib.sha256(" ".join(overrides).encode()).hexdigest()[:8]
    path = Path(out) / f"rsl_rl_{tag}.json"
    if path.exists():
        return json.loads(path.read_text())
    res = train(task, steps, seed, out, list(overrides))
    res = {k: v for k, v in res.items() if isinstance(v, int | float | str)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(path)
    return res
