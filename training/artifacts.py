"""What a finished run leaves behind, and evaluation of any saved policy.

After training: a deterministic evaluation, the learning-curve PNG, an MP4 of the
final policy rendered offscreen, and `summary.json`. `evaluate_source` evaluates a
run directory, a checkpoint or an exported ONNX file with the same statistics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
from training.evaluate import evaluate


class TorchActor:
    """Deterministic actor from a policy's inference module, with recurrent state.

    The module's state tensors are [layers, envs, hidden]; envs that start a new
    episode get their slice zeroed.
    """

    def __init__(self, policy, num_envs: int, device: torch.device):
        self.module = policy.inference_module().to(device).eval()
        self.state = [s.to(device) for s in self.module.initial_state(num_envs)]

    def __call__(self, obs: dict[str, torch.Tensor], reset: torch.Tensor) -> torch.Tensor:
        x = obs["policy"].float()
        if not self.state:
            return self.module(x)
        keep = (~reset).to(x.dtype).view(1, -1, 1)
        out = self.module(x, *(s * keep for s in self.state))
        self.state = list(out[1:])
        return out[0]


def load_policy_from_checkpoint(path: str | os.PathLike, device: str = "cpu"):
    """(policy, config, checkpoint) for a PPO checkpoint or run directory."""
    from training.runner import config_from_checkpoint, make_env, make_policy

    ck_path = find_checkpoint(path)
    ck = load_checkpoint(ck_path)
    if ck.get("kind") != "ppo":
        raise CheckpointError(f"{ck_path} is a {ck.get('kind')!r} checkpoint; expected a PPO one")
    cfg = config_from_checkpoint(ck)
    env = make_env(cfg, num_envs=1)
    policy = make_policy(cfg, env)
    policy.load_state_dict(ck["policy"])
    policy.to(device).eval()
    env.close()
    return policy, cfg, ck


def evaluate_checkpoint(
    path: str | os.PathLike, task: str | None, episodes: int, seed: int = 0, randomize: bool = False
) -> dict[str, Any]:
    from training.runner import make_env

    policy, cfg, _ = load_policy_from_checkpoint(path)
    if task is not None and task != cfg.env.task:
        raise CheckpointError(f"{path} holds a policy for task {cfg.env.task!r}, not {task!r}")
    env = make_env(cfg, num_envs=episodes, seed=seed, randomize=randomize)
    actor = TorchActor(policy, env.num_envs, env.device)
    stats = evaluate(actor, env, episodes)
    env.close()
    return {"task": cfg.env.task, "source": str(path), "randomize": randomize, **stats}


def evaluate_source(
    source: str | os.PathLike,
    task: str | None = None,
    episodes: int = 10,
    seed: int = 0,
    randomize: bool = False,
    zero_noise: bool = False,
) -> dict[str, Any]:
    """Statistics of a run, checkpoint or policy.onnx; `zero_noise`: see `evaluate_onnx`."""
    if str(source).endswith(".onnx"):
        from deploy.sim2sim import evaluate_onnx

        return evaluate_onnx(
            source,
            task=task,
            episodes=episodes,
            seed=seed,
            randomize=randomize,
            zero_noise=zero_noise,
        )
    if checkpoint_kind(source) in DIFFUSION_KINDS:
        from training.dppo_runner import evaluate_diffusion, load_diffusion_checkpoint

        if randomize:
            raise ValueError(
                "--randomize is not supported for diffusion checkpoints; export and use sim2sim"
            )
        policy, cfg, _ = load_diffusion_checkpoint(source)
        if task is not None and task != cfg.env.task:
            raise CheckpointError(
                f"{source} holds a policy for task {cfg.env.task!r}, not {task!r}"
            )
        stats = evaluate_diffusion(policy, cfg, episodes, seed=seed, deterministic=zero_noise)
        return {
            "task": cfg.env.task,
            "source": str(source),
            "randomize": False,
            "zero_noise": zero_noise,
            **stats,
        }
    return evaluate_checkpoint(source, task, episodes, seed, randomize)


DIFFUSION_KINDS = ("diffusion_bc", "dppo")


def checkpoint_kind(source: str | os.PathLike) -> str | None:
    """The `kind` a run directory's or checkpoint file's checkpoint declares."""
    return load_checkpoint(find_checkpoint(source)).get("kind")


def record_video(
    policy, cfg, out: str | os.PathLike, seconds: float, seed: int = 0, fps: int | None = None
) -> Path:
    """Render env 0 offscreen while the deterministic policy acts (MUJOCO_GL=egl)."""
    import imageio

    from training.runner import make_env

    env = make_env(cfg, num_envs=1, seed=seed, randomize=False)
    actor = TorchActor(policy, 1, env.device)
    obs = env.reset()
    fps = fps or int(round(min(env.control_rate_hz, 50)))
    stride = max(1, int(round(env.control_rate_hz / fps)))
    frames = []
    reset = torch.ones(1, dtype=torch.bool)
    lo = torch.as_tensor(env.action_spec.low, dtype=torch.float32)
    hi = torch.as_tensor(env.action_spec.high, dtype=torch.float32)
    for t in range(int(seconds * env.control_rate_hz)):
        with torch.no_grad():
            a = torch.clamp(actor(obs, reset), lo, hi)
        obs, _, term, trunc, _ = env.step(a)
        reset = term | trunc
        if t % stride == 0:
            frames.append(env.render(0, camera=_camera(env)))
    env.close()
    out = Path(out)
    imageio.mimsave(out, frames, fps=fps, macro_block_size=1)
    return out


def _camera(env) -> int | str:
    # gym models have a tracking camera as camera 0; fall back to the free camera
    return 0 if env.model.ncam > 0 else -1


def finish_run(runner) -> dict[str, Any]:
    from training.plots import plot_learning_curve

    run_dir = runner.run_dir
    out: dict[str, Any] = {}
    stats = evaluate_checkpoint(
        run_dir, None, runner.cfg.run.eval_episodes, seed=runner.cfg.run.seed + 12345
    )
    out["eval"] = stats
    out["learning_curve"] = str(plot_learning_curve(run_dir))
    if runner.cfg.run.video:
        try:
            out["video"] = str(
                record_video(
                    runner.policy, runner.cfg, run_dir / "policy.mp4", runner.cfg.run.video_seconds
                )
            )
        except Exception as e:  # no GL on this machine: the run itself is still good
            out["video_error"] = f"{type(e).__name__}: {e}"
    (run_dir / "summary.json").write_text(json.dumps(out, indent=2))
    print(
        f"eval: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f} over {stats['episodes']} episodes\n"
        f"plot: {out['learning_curve']}\nvideo: {out.get('video', out.get('video_error'))}"
    )
    return out


def demo(argv: list[str]) -> int:
    """The README's main job: train PPO on the default task, export, evaluate."""
    import argparse

    p = argparse.ArgumentParser(prog="sim2real demo")
    p.add_argument("--task", default="halfcheetah")
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--run-dir", default=None, help="default: runs/demo-<task>-<time>")
    a = p.parse_args(argv)
    from training.cli import _default_run_dir, train_ppo

    a.run_dir = a.run_dir or str(_default_run_dir(a.task, "demo"))
    rc = train_ppo(["--task", a.task, "--steps", str(a.steps), "--run-dir", a.run_dir])
    if rc:
        return rc
    try:
        from deploy.export import export_checkpoint
    except ImportError:
        return 0
    onnx_path = export_checkpoint(a.run_dir, Path(a.run_dir) / "policy.onnx")
    stats = evaluate_source(onnx_path, episodes=10)
    print(
        f"onnx: {onnx_path}; sim2sim return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}"
    )
    return 0


__all__ = ["TorchActor", "evaluate_checkpoint", "evaluate_source", "finish_run"]
