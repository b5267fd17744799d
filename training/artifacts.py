"""What a finished run leaves behind, and evaluation of any saved policy.

After training, for every learner: a deterministic evaluation, the learning-curve PNG,
an MP4 of the final policy rendered offscreen, and ``summary.json``.
``evaluate_source`` evaluates a run directory, a checkpoint or an exported ONNX file
with the same statistics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from deploy.files import atomic_write
from training.metrics import MetricsLogger
from training.plots import plot_learning_curve
from training.policy_kinds import PolicyFamily, load_policy, make_env

__all__ = ["evaluate_source", "finish_run", "record_video"]


def record_video(
    policy: torch.nn.Module,
    cfg: Any,
    family: PolicyFamily,
    out: str | os.PathLike,
    seconds: float,
    seed: int = 0,
    fps: int | None = None,
) -> Path:
    """Render env 0 offscreen while the deterministic policy acts (MUJOCO_GL=egl)."""
    import imageio

    env = make_env(cfg, num_envs=1, seed=seed, randomize=False, obs_history=family.obs_history(cfg))
    try:
        actor = family.actor(policy, 1, True, seed)
        obs = env.reset()
        fps = fps or int(round(min(env.control_rate_hz, 50)))
        stride = max(1, int(round(env.control_rate_hz / fps)))
        frames = []
        reset = torch.ones(1, dtype=torch.bool)
        lo = torch.as_tensor(env.action_spec.low, dtype=torch.float32)
        hi = torch.as_tensor(env.action_spec.high, dtype=torch.float32)
        camera = 0 if env.model.ncam > 0 else -1  # gym models track with camera 0
        for t in range(int(seconds * env.control_rate_hz)):
            with torch.no_grad():
                a = torch.clamp(actor(obs, reset), lo, hi)
            obs, _, term, trunc, _ = env.step(a)
            reset = term | trunc
            if t % stride == 0:
                frames.append(env.render(0, camera=camera))
    finally:
        env.close()
    out = Path(out)
    imageio.mimsave(out, frames, fps=fps, macro_block_size=1)
    return out


def finish_run(runner: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """Evaluation, learning curve, video and summary.json of a finished run (any runner
    with ``evaluate()``, ``policy``, ``family``, ``cfg`` and ``run_dir``); ``summary``:
    what its ``train()`` returned."""
    run_dir = Path(runner.run_dir)
    cfg = runner.cfg
    family = runner.family
    out: dict[str, Any] = dict(summary)
    was_training = runner.policy.training
    stats = runner.evaluate()
    out["eval"] = stats
    # the final evaluation on the learning curve, at the run's last step
    step = summary.get("env_steps", summary.get("updates", 0))
    final = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard)
    final.log(step, {"eval/return": stats["return_mean"]})
    final.close()
    x_label = "updates" if cfg.algo == "bc" else "env steps"
    out["learning_curve"] = str(plot_learning_curve(run_dir, x_label=x_label))
    if cfg.run.video:
        try:
            runner.policy.eval()
            out["video"] = str(
                record_video(
                    runner.policy, cfg, family, run_dir / "policy.mp4", cfg.run.video_seconds
                )
            )
        except Exception as e:  # no GL on this machine: the run itself is still good
            out["video_error"] = f"{type(e).__name__}: {e}"
        finally:
            runner.policy.train(was_training)
    atomic_write(run_dir / "summary.json", json.dumps(out, indent=2))
    print(
        f"eval (deterministic policy, {stats['episodes']} episodes): return "
        f"{stats['return_mean']:.2f} ± {stats['return_std']:.2f}\n"
        f"plot: {out['learning_curve']}\nvideo: {out.get('video', out.get('video_error', 'off'))}"
    )
    return out


def _check_randomizable(task: str) -> None:
    """--randomize on a task whose sim-to-real defaults randomize nothing is an error, not
    a silent nominal evaluation."""
    from sim.randomization import SimToRealConfig
    from sim.registry import task_class

    if task_class(task).default_s2r() == SimToRealConfig():
        raise ValueError(
            f"--randomize: task {task!r} has no default randomization, noise or latency to "
            f"turn on (its sim-to-real defaults are the nominal model)"
        )


def evaluate_source(
    source: str | os.PathLike,
    task: str | None = None,
    episodes: int = 10,
    seed: int = 0,
    randomize: bool = False,
    zero_noise: bool = False,
) -> dict[str, Any]:
    """Statistics of a run, checkpoint or policy.onnx (deterministic policy; a generative
    policy samples with noise seeded by ``seed`` unless ``zero_noise``).

    A policy.onnx runs through the runtime and the safety layer, as on the robot; its
    statistics carry the safety layer's intervention counts, summed over envs and
    episodes, under ``"safety"`` (``{counter name: count}``, the names of
    :data:`deploy.safety.COUNTER_NAMES`), so that a policy the layer had to overrule
    (e.g. ``nonfinite_action`` > 0: the network output NaN or inf) cannot pass for a
    weak one.
    """
    if str(source).endswith(".onnx"):
        from deploy.sim2sim import evaluate_onnx

        if randomize:
            from deploy.metadata import read_metadata

            _check_randomizable(task or read_metadata(source).task)

        counters: dict[str, int] = {}
        stats = evaluate_onnx(
            source,
            task=task,
            episodes=episodes,
            seed=seed,
            randomize=randomize,
            zero_noise=zero_noise,
            counters=counters,
        )
        return {**stats, "safety": counters}
    loaded = load_policy(source, task=task)
    if randomize:
        _check_randomizable(loaded.cfg.env.task)
    generative = loaded.kind.family.name != "gaussian"
    stats = loaded.evaluate(
        episodes, seed, randomize, deterministic=zero_noise if generative else True
    )
    out = {"task": loaded.cfg.env.task, "source": str(source), "randomize": randomize, **stats}
    if generative:
        out["zero_noise"] = zero_noise
    return out
