"""The part of the checks of another framework's task (tests/mjlab_checks.py,
tests/isaac_checks.py) that is the same for every framework: PPO through our runner,
save, resume, export, ONNX parity and sim2sim against the checkpoint. Runs in that
framework's venv; imported from the check scripts' directory."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch


def train_export_sim2sim(
    task: str, out: Path, num_steps: int, critic_size: int | None = None
) -> dict:
    """Two PPO iterations of 4 envs x ``num_steps``, saved; resumed to four; exported;
    the file against the torch policy and, in sim2sim, against the checkpoint.
    ``critic_size``: the critic group's size, where the task has one (the torch policy
    asks for every group it was built with; the actor reads only "policy")."""
    from deploy.runtime import OnnxPolicy
    from deploy.sim2sim import evaluate_onnx
    from training.export import export_run
    from training.policy_kinds import evaluate_policy, load_policy
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    quiet = ["run.progress=false", "run.tensorboard=false", "run.video=false", "run.seed=0"]
    half = 2 * 4 * num_steps
    over = quiet + ["env.num_envs=4", f"ppo.num_steps={num_steps}"]
    cfg = build_ppo_config(task, over + [f"run.total_steps={half}"])
    t0 = time.perf_counter()
    runner = OnPolicyRunner(cfg, out / "run")
    first = runner.train()
    runner.save()
    weights = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    runner.close()
    resumed = OnPolicyRunner(
        build_ppo_config(task, over + [f"run.total_steps={2 * half}"]),
        out / "run",
        resume=out / "run",
    )
    loaded_equal = all(torch.equal(v, weights[k]) for k, v in resumed.policy.state_dict().items())
    start = resumed.env_steps
    summary = resumed.train()
    resumed.save()
    resumed.close()
    train_s = time.perf_counter() - t0
    trained = load_policy(out / "run")
    moved = any(not torch.equal(v, weights[k]) for k, v in trained.policy.state_dict().items())
    eval_ckpt = evaluate_policy(
        trained.policy, trained.cfg, trained.kind.family, 2, seed=0, max_steps=50
    )

    onnx = export_run(out / "run", out / "policy.onnx")
    policy = OnnxPolicy(str(onnx))
    meta = policy.metadata
    x = torch.randn(5, meta.obs_frame_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        obs = {"policy": x}
        if critic_size is not None:
            obs["critic"] = torch.zeros(5, critic_size)
        want = trained.policy.act_inference(obs).numpy()
    got, _ = policy.act_batch(x.numpy())
    eval_onnx = evaluate_onnx(onnx, episodes=2, seed=0, max_steps=50)
    return {
        "hidden": list(cfg.policy.actor_hidden),
        "first_iterations": first["iterations"],
        "resume_loaded_equal": loaded_equal,
        "resume_start": start,
        "resumed_weights_moved": moved,
        "env_steps": summary["env_steps"],
        "iterations": summary["iterations"],
        "train_s": train_s,
        "parity": float(np.abs(got - want).max()),
        "meta": {
            "task": meta.task,
            "control_dt": meta.control_period_s,
            "joint_names": list(meta.action_joint_names),
            "kp": list(map(float, meta.kp)),
            "action_scale": list(map(float, meta.action_scale)),
            "obs_terms": [list(t) for t in meta.obs_terms],
        },
        "eval_checkpoint": eval_ckpt["return_mean"],
        "eval_onnx": eval_onnx["return_mean"],
    }
