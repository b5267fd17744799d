"""`sim2real play`: watch a policy act in one env, live or as an MP4.

A run directory, checkpoint or policy.onnx acts in one env of its task, built as
``sim2real eval`` builds it: the task options it trained with (``--task-args`` over
them), the nominal model or (``--randomize``) its sim-to-real settings (``--s2r`` over
them). A policy.onnx runs through the runtime and the safety layer, as on the robot.

Where there is a display ($DISPLAY or $WAYLAND_DISPLAY) the env is shown in MuJoCo's
viewer in real time; otherwise, or with ``video=``, env 0 is rendered offscreen into an
MP4 (training.artifacts.VideoWriter, the writer of the run's own video).

The command-tracking tasks (those with a ``fixed_command`` option, e.g. quadruped) take
a fixed (vx, vy, yaw rate) command, and in the viewer the keys of :data:`KEYS` steer
the robot; without a command the task draws its own, from the ranges it trained with.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# torch, the simulator and the policies load when a policy does: `sim2real --help` reads
# this module's key help

__all__ = [
    "KEYS",
    "KEYS_HELP",
    "PlayError",
    "PlayResult",
    "Player",
    "command_tasks",
    "default_video_path",
    "has_display",
    "open_player",
    "play",
]

VIDEO_SECONDS = 10.0
"""Length of a video when --seconds is not given (the viewer runs until closed)."""

KEY_STEP = 0.1
"""Change of a command component per key press (m/s, rad/s)."""

KEYS: dict[int, tuple[int, float]] = {
    265: (0, +KEY_STEP),  # Up: faster forward
    264: (0, -KEY_STEP),  # Down: slower / backward
    44: (1, +KEY_STEP),  # ',': to the left
    46: (1, -KEY_STEP),  # '.': to the right
    263: (2, +KEY_STEP),  # Left: turn left (counter-clockwise)
    262: (2, -KEY_STEP),  # Right: turn right
}
"""GLFW key code -> (command component: 0 vx, 1 vy, 2 yaw rate, change per press).
Arrow keys and , . / because the viewer binds most letters and digits itself."""

STOP_KEY = 47
"""'/': command zero (stand still)."""

KEYS_HELP = (
    "viewer keys (command-tracking tasks, e.g. quadruped):\n"
    f"  Up / Down      forward velocity vx +/- {KEY_STEP:g} m/s\n"
    f"  , / .          lateral velocity vy +/- {KEY_STEP:g} m/s (left / right)\n"
    f"  Left / Right   yaw rate +/- {KEY_STEP:g} rad/s (turn left / right)\n"
    "  /              stand still (command 0, 0, 0)\n"
    "A key press replaces the task's own command draws until the window closes."
)


class PlayError(ValueError):
    """A play request that cannot be met (e.g. --command for a task without commands)."""


def has_display() -> bool:
    """Whether a window can open: $DISPLAY (X11) or $WAYLAND_DISPLAY is set."""
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def command_tasks() -> list[str]:
    """The tasks that track a (vx, vy, yaw rate) command: those with ``fixed_command``."""
    from sim.registry import task_names, task_options

    return [name for name in task_names() if "fixed_command" in task_options(name)]


def default_video_path(source: str | os.PathLike) -> Path:
    """Where a video goes when none is named: ``play.mp4`` in the run directory (of a run
    or of a checkpoint in its checkpoints/), else ``<name>_play.mp4`` beside the file."""
    from training.run_dir import checkpoint_run_dir

    path = Path(source)
    if path.is_dir():
        return path / "play.mp4"
    run_dir = checkpoint_run_dir(path)
    if run_dir is not None and path.suffix == ".pt":
        return run_dir / "play.mp4"
    return path.with_name(f"{path.stem}_play.mp4")


class Player:
    """One env and the policy acting in it, a control step at a time.

    ``command``: the (vx, vy, yaw rate) held in the env, None while the task draws its
    own; ``takes_commands``: whether the task tracks commands at all.
    """

    def __init__(self, env: Any, act: Callable[[Any, Any], Any], task: str, source: str) -> None:
        import torch

        self.env = env
        self.act = act
        self.task = task
        self.source = source
        self.command: np.ndarray | None = None
        self.takes_commands = hasattr(env, "set_command")
        self._low = torch.as_tensor(self.env.action_spec.low, dtype=torch.float32)
        self._high = torch.as_tensor(self.env.action_spec.high, dtype=torch.float32)
        self._obs = self.env.reset()
        self._reset = torch.ones(self.env.num_envs, dtype=torch.bool)
        self.steps = 0
        self.episodes = 0

    def step(self) -> bool:
        """One control step; True when env 0's episode ended (the env restarted it)."""
        import torch

        with torch.no_grad():
            actions = torch.as_tensor(self.act(self._obs, self._reset), dtype=torch.float32)
        actions = torch.clamp(actions, self._low, self._high)
        self._obs, _, terminated, truncated, _ = self.env.step(actions)
        self._reset = (terminated | truncated).cpu()
        if self.command is not None:
            # held over the task's own draws and over resets (which restore the fixed one)
            self.env.set_command(self.command)
        self.steps += 1
        ended = bool(self._reset[0])
        self.episodes += ended
        return ended

    def set_command(self, command: Sequence[float]) -> None:
        """Hold (vx, vy, yaw rate) from the next step on."""
        if not self.takes_commands:
            raise PlayError(_no_command(self.task))
        value = np.asarray(command, dtype=np.float64)
        if value.shape != (3,) or not np.isfinite(value).all():
            raise PlayError(f"a command is 3 finite numbers (vx, vy, yaw rate), got {command!r}")
        self.command = value
        self.env.set_command(value)

    def press(self, key: int) -> bool:
        """Apply a viewer key (:data:`KEYS`, :data:`STOP_KEY`); True if it changed the
        command."""
        if not self.takes_commands or (key not in KEYS and key != STOP_KEY):
            return False
        if self.command is not None:
            command = self.command.copy()
        else:  # start from what the task drew
            command = np.array(getattr(self.env, "commands", np.zeros((1, 3)))[0], dtype=float)
        if key == STOP_KEY:
            command[:] = 0.0
        else:
            axis, delta = KEYS[key]
            command[axis] = round(command[axis] + delta, 6)
        self.set_command(command)
        return True

    def close(self) -> None:
        self.env.close()


def _no_command(task: str) -> str:
    return (
        f"--command: task {task!r} takes no velocity command; the command-tracking tasks are "
        f"{command_tasks()}"
    )


def open_player(
    source: str | os.PathLike,
    *,
    seed: int = 0,
    randomize: bool = False,
    command: Sequence[float] | None = None,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
) -> Player:
    """A :class:`Player` of a run directory, checkpoint or policy.onnx in one env.

    ``command``: a fixed (vx, vy, yaw rate) for a command-tracking task (PlayError for
    another task). A Gaussian policy acts deterministically; a generative one samples
    with noise seeded by ``seed``, as ``sim2real eval`` does.
    """
    from training.artifacts import check_s2r

    check_s2r(s2r, randomize)
    options = dict(task_args or {})
    if command is not None:
        value = np.asarray(command, dtype=np.float64)
        if value.shape != (3,) or not np.isfinite(value).all():
            raise PlayError(f"--command takes 3 finite numbers: VX VY YAW, got {command!r}")
        options["fixed_command"] = value.tolist()
    if str(source).endswith(".onnx"):
        player = _onnx_player(source, seed, randomize, options, s2r)
    else:
        player = _checkpoint_player(source, seed, randomize, options, s2r)
    if command is not None:
        player.command = np.asarray(command, dtype=np.float64)
    return player


def _check_command(task: str, options: Mapping[str, Any]) -> None:
    from sim.registry import task_options

    if "fixed_command" in options and "fixed_command" not in (task_options(task) or ()):
        raise PlayError(_no_command(task))


def _onnx_player(
    source: str | os.PathLike,
    seed: int,
    randomize: bool,
    options: dict[str, Any],
    s2r: Mapping[str, Any] | None,
) -> Player:
    from deploy.metadata import PolicyLoadError
    from deploy.runtime import OnnxPolicy
    from deploy.sim2sim import Sim2SimActor, Sim2SimLoadError, make_env_for
    from training.artifacts import check_onnx_randomizable

    try:
        policy = OnnxPolicy(source, seed=seed)
    except PolicyLoadError as exc:  # a ValueError as well, which the CLI reports cleanly
        raise Sim2SimLoadError(str(exc)) from exc
    meta = policy.metadata
    _check_command(meta.task, options)
    if randomize:
        check_onnx_randomizable(meta, None, options, s2r)
    env = make_env_for(meta, None, 1, seed, randomize, options, s2r)
    return Player(env, Sim2SimActor(policy, 1, env.dt), meta.task, str(source))


def _checkpoint_player(
    source: str | os.PathLike,
    seed: int,
    randomize: bool,
    options: dict[str, Any],
    s2r: Mapping[str, Any] | None,
) -> Player:
    from training.artifacts import check_checkpoint_randomizable
    from training.policy_kinds import load_policy

    loaded = load_policy(source)
    _check_command(loaded.cfg.env.task, options)
    loaded = loaded.with_env_options(options, s2r)
    if randomize:
        check_checkpoint_randomizable(loaded)
    env = loaded.make_env(1, seed, randomize)
    deterministic = loaded.kind.family.name == "gaussian"
    return Player(env, loaded.actor(1, deterministic, seed), loaded.cfg.env.task, str(source))


@dataclass(frozen=True)
class PlayResult:
    """What a play did."""

    mode: str
    """"viewer" or "video"."""
    steps: int
    """Control steps run."""
    seconds: float
    """Simulated time."""
    episodes: int
    """Episodes of env 0 that ended (and restarted)."""
    video: Path | None = None
    frames: int = 0


def play(
    source: str | os.PathLike,
    *,
    seconds: float | None = None,
    seed: int = 0,
    randomize: bool = False,
    command: Sequence[float] | None = None,
    video: str | os.PathLike | None = None,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> PlayResult:
    """Run a policy in one env: in MuJoCo's viewer where a display exists and no
    ``video`` is asked for, else offscreen into an MP4 (``video``, or
    :func:`default_video_path`), saying where it went through ``log``.

    ``seconds``: simulated time (the viewer: until its window closes; a video:
    :data:`VIDEO_SECONDS`).
    """
    if seconds is not None:
        if not (np.isfinite(seconds) and seconds > 0):
            raise PlayError(f"--seconds must be a finite number > 0, got {seconds!r}")
    viewer = video is None and has_display()
    player = open_player(
        source, seed=seed, randomize=randomize, command=command, task_args=task_args, s2r=s2r
    )
    try:
        if viewer:
            return _show(player, seconds, log)
        if video is None:
            video = default_video_path(source)
            log(
                "no display ($DISPLAY and $WAYLAND_DISPLAY are unset): rendering offscreen "
                f"to {video}"
            )
        return _record(player, seconds or VIDEO_SECONDS, video)
    finally:
        player.close()


def _record(player: Player, seconds: float, out: str | os.PathLike) -> PlayResult:
    from training.artifacts import VideoWriter, control_steps

    env = player.env
    with VideoWriter(env, out) as writer:
        for _ in range(control_steps(env, seconds)):
            player.step()
            writer.capture()
    return PlayResult(
        "video", player.steps, player.steps * env.dt, player.episodes, writer.path, writer.frames
    )


def _show(player: Player, seconds: float | None, log: Callable[[str], None]) -> PlayResult:
    """The passive viewer on a copy of env 0's state, stepped in real time; key presses
    arrive on the viewer's thread and are applied between steps."""
    import mujoco
    import mujoco.viewer

    from training.artifacts import control_steps

    env = player.env
    model = env.model
    data = mujoco.MjData(model)
    pressed: list[int] = []
    lock = threading.Lock()

    def on_key(key: int) -> None:
        with lock:
            pressed.append(key)

    if player.takes_commands:
        log(KEYS_HELP)
    limit = None if seconds is None else control_steps(env, seconds)
    with mujoco.viewer.launch_passive(model, data, key_callback=on_key) as viewer:
        due = time.perf_counter()
        while viewer.is_running() and (limit is None or player.steps < limit):
            with lock:
                keys, pressed[:] = list(pressed), []
            for key in keys:
                if player.press(key):
                    vx, vy, yaw = player.command  # type: ignore[misc]
                    log(f"command: vx {vx:+.2f} m/s, vy {vy:+.2f} m/s, yaw rate {yaw:+.2f} rad/s")
            player.step()
            state = env.get_state()
            with viewer.lock():
                data.qpos[:] = state["qpos"][0]
                data.qvel[:] = state["qvel"][0]
                mujoco.mj_forward(model, data)
            viewer.sync()
            due += env.dt
            time.sleep(max(0.0, due - time.perf_counter()))
    return PlayResult("viewer", player.steps, player.steps * env.dt, player.episodes)
