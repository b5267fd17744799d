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

from deploy.files import atomic_write

SAVE_EVERY = 50
"""rsl_rl checkpoints every this many iterations; train() resumes from the last one."""


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
        "save_interval": SAVE_EVERY,
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


def train(
    task: str,
    steps: int,
    seed: int,
    out: Path,
    overrides: list[str] = (),
    save_every: int = SAVE_EVERY,
) -> dict:
    """Train rsl_rl's PPO with `task`'s preset for `steps` env steps, export its final
    checkpoint, evaluate it as ours are evaluated.

    An interrupted run resumes: rsl_rl checkpoints every `save_every` iterations and a
    second call continues from the last one (weights, optimizer, rate and iteration;
    the envs restart, so it is not bit-identical to an uninterrupted run). The run folder
    records what it trains; a call with another budget or overrides is refused instead
    of continuing or overwriting that run. wall_s sums the training time of every
    segment, "segments" says how many there were.
    """
    import torch
    from rsl_rl.runners import OnPolicyRunner

    from sim.rsl_rl_env import RslRlVecEnv
    from training.artifacts import evaluate_source
    from training.rsl_rl_import import export_rsl_rl
    from training.train_configs import build_ppo_config

    if save_every < 1:
        raise ValueError(f"save_every must be >= 1 iteration, got {save_every}")
    cfg = build_ppo_config(task, [f"run.seed={seed}", *overrides])
    iters = max(1, math.ceil(steps / (cfg.env.num_envs * cfg.ppo.num_steps)))
    log_dir = Path(out) / f"rsl_rl-{task}-s{seed}"
    progress = _claim_run_dir(log_dir, {"task": task, "steps": steps, "seed": seed,
                                        "overrides": list(overrides)})  # fmt: skip
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = RslRlVecEnv(task, cfg.env.num_envs, seed=seed, num_threads=cfg.env.threads)
    tc = {**train_cfg(cfg), "save_interval": save_every}
    runner = OnPolicyRunner(env, tc, log_dir=str(log_dir), device="cpu")
    runner.logger.git_status_repos = []  # no `git status` of this checkout
    ckpts = _checkpoints(log_dir)
    done = 0
    if ckpts:
        runner.load(str(ckpts[-1]))
        # a checkpoint carries the index of the iteration it ends; rsl_rl's learn() would
        # start at that index again and train that iteration twice
        done = runner.current_learning_iteration + 1
        runner.current_learning_iteration = done
    if done < iters:
        t0 = time.perf_counter()
        runner.learn(iters - done)
        progress["wall_s"] += time.perf_counter() - t0
        progress["segments"] += 1
        _write_json(log_dir / _PROGRESS, progress)
    onnx = export_rsl_rl(
        _checkpoints(log_dir)[-1], task, log_dir / "policy.onnx", activation=cfg.policy.activation
    )
    stats = evaluate_source(onnx, episodes=10, seed=10_000 + seed)
    env.env.close()
    return {"task": task, "seed": seed, "steps": iters * cfg.env.num_envs * cfg.ppo.num_steps,
            "wall_s": progress["wall_s"], "segments": progress["segments"], "onnx": str(onnx),
            **stats}  # fmt: skip


_PROGRESS = "peer_run.json"


def _checkpoints(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("model_*.pt"), key=lambda p: int(p.stem.split("_")[1]))


def _write_json(path: Path, obj: dict) -> None:
    atomic_write(path, json.dumps(obj))


def _claim_run_dir(log_dir: Path, run: dict) -> dict:
    """The progress record of `log_dir` for `run`, creating both; refuses a folder that
    holds another run (or files no peer run wrote)."""
    path = log_dir / _PROGRESS
    if path.exists():
        progress = json.loads(path.read_text())
        if progress["run"] != run:
            raise FileExistsError(
                f"{log_dir} holds another rsl_rl run ({progress['run']}), not {run}; "
                "choose another --out or remove that folder"
            )
        return progress
    if log_dir.exists() and any(log_dir.iterdir()):
        raise FileExistsError(
            f"{log_dir} exists and was not written by this benchmark's rsl_rl peer "
            f"(no {_PROGRESS}); choose another --out or remove that folder"
        )
    log_dir.mkdir(parents=True, exist_ok=True)
    progress = {"run": run, "wall_s": 0.0, "segments": 0}
    _write_json(path, progress)
    return progress


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
    _write_json(path, res)
    return res
