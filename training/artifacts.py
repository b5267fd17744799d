"""What a finished run leaves behind, and evaluation of any saved policy.

After training, for every learner: a deterministic evaluation, the learning-curve PNG,
an MP4 of the final policy rendered offscreen, and ``summary.json``.
``evaluate_source`` evaluates a run directory, a checkpoint or an exported ONNX file
with the same statistics (optionally recording the first episode). :class:`VideoWriter`
is the one place an env becomes an MP4 (the run's video, ``sim2real eval --video``,
``sim2real play``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.files import atomic_write
from sim.evaluation import ActFn
from training.logger import log_final_evaluation
from training.plots import plot_learning_curve
from training.policy_kinds import PolicyFamily, load_policy, make_env

__all__ = [
    "EpisodeRecorder",
    "VideoWriter",
    "check_checkpoint_randomizable",
    "check_onnx_randomizable",
    "check_randomizable",
    "check_s2r",
    "control_steps",
    "draw_caption",
    "evaluate_source",
    "finish_run",
    "record_video",
]

MAX_VIDEO_FPS = 50


def control_steps(env: Any, seconds: float) -> int:
    """Control steps of ``env`` in ``seconds`` (at least one)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    return max(1, round(seconds * env.control_rate_hz))


def draw_caption(frame: np.ndarray, text: str) -> np.ndarray:
    """``frame`` (uint8 [H, W, 3]) with ``text`` written in white on a dark band along
    its top edge, one band line per line of text."""
    from PIL import Image, ImageDraw, ImageFont

    lines = text.splitlines() or [""]
    size = max(10, frame.shape[0] // 24)
    font = ImageFont.load_default(size=size)
    image = Image.fromarray(np.ascontiguousarray(frame))
    draw = ImageDraw.Draw(image)
    band = (size + 4) * len(lines) + 4
    draw.rectangle((0, 0, image.width, band), fill=(0, 0, 0))
    for k, line in enumerate(lines):
        draw.text((6, 4 + k * (size + 4)), line, fill=(255, 255, 255), font=font)
    return np.asarray(image)


class VideoWriter:
    """Env 0 of ``env`` rendered offscreen (MUJOCO_GL=egl without a display) into an MP4,
    frame by frame, so that a long video never sits in memory.

    Call :meth:`capture` once per control step: it renders every ``stride``-th call, for
    a video at the control rate up to ``fps`` (default 50), which plays in real time.
    ``caption``: called for each frame; its text is written on the frame (e.g. the
    instruction a language-conditioned policy was given).
    """

    def __init__(
        self,
        env: Any,
        out: str | os.PathLike,
        fps: int | None = None,
        caption: Callable[[], str] | None = None,
    ) -> None:
        import imageio

        self.env = env
        self.caption = caption
        self.path = Path(out)
        self.fps = int(fps or round(min(env.control_rate_hz, MAX_VIDEO_FPS)))
        self.stride = max(1, int(round(env.control_rate_hz / self.fps)))
        # gym models track with camera 0; envs of other frameworks (sim.external) have no
        # MuJoCo model of ours and render from their own camera
        model = getattr(env, "model", None)
        self.camera = 0 if model is not None and model.ncam > 0 else -1
        self.frames = 0
        self.steps = 0
        """Control steps seen by :meth:`capture`."""
        if self.path.parent != Path(""):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = imageio.get_writer(self.path, fps=self.fps, macro_block_size=1)

    def capture(self) -> None:
        if self._writer is None:
            raise ValueError(f"video {self.path} is already closed")
        if self.steps % self.stride == 0:
            frame = self.env.render(0, camera=self.camera)
            if self.caption is not None:
                frame = draw_caption(frame, self.caption())
            self._writer.append_data(frame)
            self.frames += 1
        self.steps += 1

    def close(self) -> Path:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EpisodeRecorder:
    """An act function around ``act`` that records env 0's first episode of an
    evaluation (sim.evaluation.evaluate) into an MP4: a frame of each state the policy
    acts on, until that episode ends. :meth:`close` when the evaluation is done."""

    def __init__(self, act: ActFn, env: Any, out: str | os.PathLike) -> None:
        self.act = act
        self.video = VideoWriter(env, out)
        self.done = False

    def __call__(self, obs: Any, reset_mask: Any) -> Any:
        if not self.done:
            if bool(reset_mask[0]) and self.video.steps > 0:  # env 0's episode ended
                self.done = True
                self.video.close()
            else:
                self.video.capture()
        return self.act(obs, reset_mask)

    def close(self) -> Path:
        self.done = True
        return self.video.close()


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
    env = make_env(cfg, num_envs=1, seed=seed, randomize=False, obs_history=family.obs_history(cfg))
    try:
        actor = family.actor(policy, 1, True, seed)
        obs = env.reset()
        reset = torch.ones(1, dtype=torch.bool)
        lo = torch.as_tensor(env.action_spec.low, dtype=torch.float32)
        hi = torch.as_tensor(env.action_spec.high, dtype=torch.float32)
        with VideoWriter(env, out, fps) as video:
            for _ in range(control_steps(env, seconds)):
                with torch.no_grad():
                    a = torch.clamp(actor(obs, reset), lo, hi)
                obs, _, term, trunc, _ = env.step(a)
                reset = term | trunc
                video.capture()
    finally:
        env.close()
    return Path(out)


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
    log_final_evaluation(run_dir, cfg, step, stats)
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


def check_s2r(s2r: Mapping[str, Any] | None, randomize: bool) -> None:
    """--s2r without --randomize is an error: its settings go over a randomization that
    is off (the nominal model), so they would change nothing."""
    if s2r and not randomize:
        raise ValueError(
            f"--s2r {json.dumps(dict(s2r))}: sim-to-real settings go over the randomization, "
            "which is off; add --randomize"
        )


def check_randomizable(task: str, settings: Any) -> None:
    """--randomize whose sim-to-real ``settings`` randomize nothing is an error, not a
    silent nominal evaluation."""
    from sim.randomization import SimToRealConfig

    if settings == SimToRealConfig(obs_history=settings.obs_history):
        raise ValueError(
            f"--randomize: task {task!r} has no default randomization, noise or latency to "
            f"turn on (its sim-to-real settings are the nominal model); name some with --s2r"
        )


def check_onnx_randomizable(
    meta: Any,
    task: str | None,
    task_args: Mapping[str, Any] | None,
    s2r: Mapping[str, Any] | None,
) -> None:
    """check_randomizable for an ONNX file's env: its metadata under the overrides."""
    from deploy.sim2sim import env_settings

    settings = env_settings(meta, task, True, task_args, s2r)
    check_randomizable(settings.task, settings.sim_to_real)


def check_checkpoint_randomizable(loaded: Any) -> None:
    """check_randomizable for a loaded checkpoint's env (its config, with the options)."""
    history = loaded.kind.family.obs_history(loaded.cfg)
    check_randomizable(loaded.cfg.env.task, loaded.cfg.env.sim_to_real(history))


def evaluate_source(
    source: str | os.PathLike,
    task: str | None = None,
    episodes: int = 10,
    seed: int = 0,
    randomize: bool = False,
    zero_noise: bool = False,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
    video: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Statistics of a run, checkpoint or policy.onnx (deterministic policy; a generative
    policy samples with noise seeded by ``seed`` unless ``zero_noise``).

    The env is the one the policy trained in: its task options (a checkpoint's
    env.task_args, a file's recorded ones) with ``task_args`` over them; the nominal
    model, or with ``randomize`` its training's sim-to-real settings with ``s2r`` over
    them (``s2r`` without ``randomize`` is an error). ``video``: an MP4 of the first
    episode (env 0), rendered offscreen; its path and frame count are in the result
    (``"video"``, ``"video_frames"``).

    A policy.onnx runs through the runtime and the safety layer, as on the robot; its
    statistics carry the safety layer's intervention counts, summed over envs and
    episodes, under ``"safety"`` (``{counter name: count}``, the names of
    :data:`deploy.safety.COUNTER_NAMES`), so that a policy the layer had to overrule
    (e.g. ``nonfinite_action`` > 0: the network output NaN or inf) cannot pass for a
    weak one.
    """
    check_s2r(s2r, randomize)
    recorders: list[EpisodeRecorder] = []

    def record(act: ActFn, env: Any) -> ActFn:
        assert video is not None
        recorders.append(EpisodeRecorder(act, env, video))
        return recorders[-1]

    wrap = record if video is not None else None
    try:
        if str(source).endswith(".onnx"):
            out = _evaluate_onnx(
                source, task, episodes, seed, randomize, zero_noise, task_args, s2r, wrap
            )
        else:
            out = _evaluate_checkpoint(
                source, task, episodes, seed, randomize, zero_noise, task_args, s2r, wrap
            )
    finally:
        for recorder in recorders:
            recorder.close()
    if recorders:
        out["video"] = str(recorders[0].video.path)
        out["video_frames"] = recorders[0].video.frames
    return out


def _evaluate_onnx(
    source: str | os.PathLike,
    task: str | None,
    episodes: int,
    seed: int,
    randomize: bool,
    zero_noise: bool,
    task_args: Mapping[str, Any] | None,
    s2r: Mapping[str, Any] | None,
    wrap: Any,
) -> dict[str, Any]:
    from deploy.metadata import PolicyLoadError, read_metadata
    from deploy.sim2sim import Sim2SimLoadError, evaluate_onnx

    if randomize:
        try:
            meta = read_metadata(source)
        except PolicyLoadError as exc:  # reported as evaluate_onnx reports it
            raise Sim2SimLoadError(str(exc)) from exc
        check_onnx_randomizable(meta, task, task_args, s2r)
    counters: dict[str, int] = {}
    stats = evaluate_onnx(
        source,
        task=task,
        episodes=episodes,
        seed=seed,
        randomize=randomize,
        zero_noise=zero_noise,
        counters=counters,
        task_args=task_args,
        s2r=s2r,
        wrap=wrap,
    )
    return {**stats, "safety": counters}


def _evaluate_checkpoint(
    source: str | os.PathLike,
    task: str | None,
    episodes: int,
    seed: int,
    randomize: bool,
    zero_noise: bool,
    task_args: Mapping[str, Any] | None,
    s2r: Mapping[str, Any] | None,
    wrap: Any,
) -> dict[str, Any]:
    loaded = load_policy(source, task=task).with_env_options(task_args, s2r)
    if randomize:
        check_checkpoint_randomizable(loaded)
    generative = loaded.kind.family.name != "gaussian"
    stats = loaded.evaluate(
        episodes, seed, randomize, deterministic=zero_noise if generative else True, wrap=wrap
    )
    out = {"task": loaded.cfg.env.task, "source": str(source), "randomize": randomize, **stats}
    if generative:
        out["zero_noise"] = zero_noise
    return out
