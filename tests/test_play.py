"""`sim2real play` and `sim2real eval --video`: the policy acting in one env, shown in
the viewer or rendered offscreen (MUJOCO_GL=egl) into an MP4 read back here; a fixed
command steers the walking quadruped (tests/data/quadruped_policy.onnx)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import imageio
import numpy as np
import pytest
import torch

from sim.tasks.quadruped import quat_to_mat, rotate_inverse
from training.cli import main
from training.export import export_run
from training.play import KEYS, STOP_KEY, default_video_path, open_player
from training.runner import OnPolicyRunner
from training.train_configs import build_ppo_config

WALKER = Path(__file__).parent / "data" / "quadruped_policy.onnx"
QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]
UP, LEFT = 265, 263


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    """A tiny cartpole run (25 Hz: its video has a frame per control step) and its file."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("play") / "run"
    cfg = build_ppo_config(
        "cartpole",
        QUIET
        + ["env.num_envs=4", "ppo.num_steps=8", "run.total_steps=64"]
        + ["env.max_episode_steps=12"],
    )
    OnPolicyRunner(cfg, run).train()
    yield run, export_run(run)
    torch.set_num_threads(before)


def _frames(path: Path) -> list[np.ndarray]:
    with imageio.get_reader(path) as reader:
        return [np.asarray(frame) for frame in reader]


@pytest.mark.parametrize("which", ["run", "onnx"])
def test_play_video_writes_every_control_step(cartpole, tmp_path, capsys, which):
    source = cartpole[0] if which == "run" else cartpole[1]
    out = tmp_path / "sub" / "play.mp4"
    assert main(["play", str(source), "--video", str(out), "--seconds", "0.4"]) == 0
    assert f"video: {out} (10 frames" in capsys.readouterr().out
    frames = _frames(out)
    assert len(frames) == 10  # 0.4 s at 25 Hz
    assert frames[0].shape == (360, 480, 3)
    assert not all(np.array_equal(frames[0], f) for f in frames[1:])  # the pole moves


def test_eval_video_records_the_first_episode(cartpole, tmp_path, capsys):
    run, onnx_path = cartpole
    for source in (run, onnx_path):
        out = tmp_path / f"{Path(source).stem}.mp4"
        assert main(["eval", str(source), "--episodes", "2", "--video", str(out), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["video"] == str(out)
        assert stats["video_frames"] == stats["lengths"][0] == len(_frames(out))


def test_without_a_display_play_renders_offscreen_and_says_where(
    cartpole, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    onnx_copy = tmp_path / "policy.onnx"
    shutil.copy(cartpole[1], onnx_copy)
    assert main(["play", str(onnx_copy), "--seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    where = tmp_path / "policy_play.mp4"
    assert (
        f"no display ($DISPLAY and $WAYLAND_DISPLAY are unset): rendering offscreen to {where}"
        in out
    )
    assert len(_frames(where)) == 5
    assert default_video_path(cartpole[0]) == cartpole[0] / "play.mp4"
    assert default_video_path(cartpole[0] / "checkpoints" / "latest.pt") == cartpole[0] / "play.mp4"


def test_command_on_a_task_without_commands_is_a_clear_error(cartpole, tmp_path, capsys):
    out = tmp_path / "x.mp4"
    for source in cartpole:
        argv = ["play", str(source), "--command", "0.5", "0", "0", "--video", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            "sim2real play: error: --command: task 'cartpole' takes no velocity command; the "
            "command-tracking tasks are ["
        )
        assert "'quadruped'" in err
        assert not out.exists()
    with pytest.raises(SystemExit):
        main(["play", str(cartpole[1]), "--command", "0.5", "0"])
    assert "--command: expected 3 arguments" in capsys.readouterr().err


def _body_velocity(command, steps: int = 100, settle: int = 25) -> np.ndarray:
    """Mean (vx, vy, yaw rate) of the walker's base in its own frame under a command."""
    player = open_player(WALKER, command=command, seed=0)
    try:
        seen = []
        for t in range(steps):
            player.step()
            if t >= settle:
                state = player.env.get_state()
                q, v = state["qpos"][:1], state["qvel"][:1]
                lin = rotate_inverse(quat_to_mat(q[:, 3:7]), v[:, 0:3])[0]
                seen.append([lin[0], lin[1], v[0, 5]])  # the free joint's angular velocity
        assert player.episodes == 0  # it walked without falling
        return np.mean(seen, axis=0)
    finally:
        player.close()


def test_a_commanded_quadruped_goes_where_it_is_told():
    torch.set_num_threads(1)
    still = _body_velocity((0.0, 0.0, 0.0))
    forward = _body_velocity((0.8, 0.0, 0.0))
    assert np.abs(still[:2]).max() < 0.1
    assert forward[0] > 0.6 and abs(forward[1]) < 0.1
    left, right = _body_velocity((0.0, 0.0, 0.5)), _body_velocity((0.0, 0.0, -0.5))
    assert left[2] > 0.05 and right[2] < -0.05


def test_viewer_keys_steer_the_command(cartpole):
    player = open_player(WALKER, command=(0.3, 0.0, 0.0))
    try:
        assert player.press(UP) and player.press(UP) and player.press(LEFT)
        np.testing.assert_allclose(player.command, [0.5, 0.0, 0.1])
        player.step()
        np.testing.assert_allclose(player.env.commands[0], [0.5, 0.0, 0.1])
        assert player.press(STOP_KEY) and not player.command.any()
        assert not player.press(ord("A"))  # the viewer's own keys are left alone
    finally:
        player.close()
    drawn = open_player(WALKER, seed=3)  # no command: the task's own draw, then the keys
    try:
        first = drawn.env.commands[0].copy()
        assert drawn.command is None and drawn.press(UP)
        np.testing.assert_allclose(drawn.command, first + [KEYS[UP][1], 0, 0], atol=1e-6)
    finally:
        drawn.close()
    pole = open_player(cartpole[1])
    try:
        assert not pole.takes_commands and not pole.press(UP)
    finally:
        pole.close()


def test_play_help_lists_the_keys(capsys):
    with pytest.raises(SystemExit):
        main(["play", "--help"])
    out = capsys.readouterr().out
    for text in ("--command VX VY YAW", "--video OUT.mp4", "--seconds", "Up / Down", "--s2r"):
        assert text in out


def test_with_a_display_play_opens_the_viewer_and_takes_keys(monkeypatch):
    """The viewer path without a window: launch_passive replaced by a stand-in that
    presses Up once and counts the frames it is handed."""
    import contextlib

    import mujoco.viewer

    monkeypatch.setenv("DISPLAY", ":0")
    shown: dict = {"syncs": 0}

    class FakeViewer:
        def __init__(self, model, data, key_callback):
            shown["data"] = data
            key_callback(UP)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def is_running(self):
            return True

        def lock(self):
            return contextlib.nullcontext()

        def sync(self):
            shown["syncs"] += 1

    monkeypatch.setattr(
        mujoco.viewer, "launch_passive", lambda m, d, key_callback: FakeViewer(m, d, key_callback)
    )
    from training.play import play

    lines: list[str] = []
    result = play(WALKER, seconds=0.1, command=(0.2, 0.0, 0.0), log=lines.append)
    assert result.mode == "viewer" and result.video is None
    assert result.steps == shown["syncs"] == 5  # 0.1 s at 50 Hz, each step shown
    assert "Up / Down" in lines[0]  # the keys are explained
    assert lines[1] == "command: vx +0.30 m/s, vy +0.00 m/s, yaw rate +0.00 rad/s"
    assert shown["data"].qpos[2] > 0.2  # the robot's state, standing, not the model's zeros
