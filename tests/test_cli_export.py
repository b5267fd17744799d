"""`sim2real export` and `sim2real eval policy.onnx`: results, and bad input -> clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from training.cli import main
from training.runner import OnPolicyRunner
from training.train_configs import build_ppo_config

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, one_torch_thread):
    """(run dir, policy.onnx) of a tiny cartpole run exported through the CLI."""
    root = tmp_path_factory.mktemp("cli-export")
    run = root / "run"
    OnPolicyRunner(build_ppo_config("cartpole", QUIET + ["run.total_steps=1024"]), run).train()
    assert main(["export", str(run), "--out", str(root / "policy.onnx")]) == 0
    return run, root / "policy.onnx"


def _edit_props(src: Path, dst: Path, edit) -> Path:
    model = onnx.load(str(src))
    props = {p.key: p.value for p in model.metadata_props}
    props = edit(props)
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(dst))
    return dst


def test_export_prints_path_and_parity(exported, capsys, tmp_path):
    run, _ = exported
    assert main(["export", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(run / "policy.onnx")
    assert out[1].startswith("parity: max |onnx - torch| = ")
    assert float(out[1].split("=")[1].split()[0]) <= 1e-5
    assert (run / "policy.onnx").is_file()
    # a checkpoint file works as well; --out into a directory names the file
    ck = run / "checkpoints" / "latest.pt"
    assert main(["export", str(ck), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "policy.onnx").is_file()


def test_eval_of_the_exported_file(exported, capsys):
    run, onnx_path = exported
    assert main(["eval", str(onnx_path), "--episodes", "3", "--seed", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--episodes", "3", "--seed", "1", "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got.pop("source") == str(onnx_path) and want.pop("source") == str(run)
    safety = got.pop("safety")  # an ONNX file runs through the safety layer: its counts
    assert "safety" not in want
    assert safety["steps"] >= sum(got["lengths"]) and safety["nonfinite_action"] == 0
    assert got.pop("task") == want.pop("task") == "cartpole"
    # each episode is reported, and the summary is made of them
    for stats in (got, want):
        assert len(stats["returns"]) == len(stats["lengths"]) == 3
        assert stats["return_mean"] == pytest.approx(sum(stats["returns"]) / 3)
    assert got.pop("returns") == pytest.approx(want.pop("returns"), rel=1e-3)
    assert got.pop("lengths") == want.pop("lengths")
    assert got == pytest.approx(want, rel=1e-3)
    # cartpole has nothing to randomize: said, not silently evaluated nominally
    assert main(["eval", str(onnx_path), "--episodes", "2", "--randomize"]) == 2
    assert "task 'cartpole' has no default randomization" in capsys.readouterr().err


def _bad_files(onnx_path: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    data = onnx_path.read_bytes()
    truncated = tmp / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 3])
    garbage = tmp / "garbage.onnx"
    garbage.write_bytes(os.urandom(4096))

    def drop_all(props):
        return {k: v for k, v in props.items() if not k.startswith("sim2real.")}

    def version_2(props):
        return {**props, "sim2real.format_version": "2"}

    def drop_joints(props):
        return {k: v for k, v in props.items() if k != "sim2real.action_joint_names"}

    def bad_scale(props):
        return {**props, "sim2real.action_scale": "[1.0, 2.0]"}  # one joint, two scales

    return {
        "truncated": (truncated, "truncated or corrupted"),
        "random bytes": (garbage, "truncated or corrupted"),
        "no metadata": (_edit_props(onnx_path, tmp / "nometa.onnx", drop_all), "missing key"),
        "format version": (
            _edit_props(onnx_path, tmp / "v2.onnx", version_2),
            "newer format version 2",
        ),
        "missing field": (
            _edit_props(onnx_path, tmp / "nojoints.onnx", drop_joints),
            "sim2real.action_joint_names",
        ),
        "wrong field": (
            _edit_props(onnx_path, tmp / "scale.onnx", bad_scale),
            "sim2real.action_scale",
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["truncated", "random bytes", "no metadata", "format version", "missing field", "wrong field"],
)
def test_bad_policy_file_is_a_clear_error(exported, tmp_path, capsys, case):
    _, onnx_path = exported
    path, message = _bad_files(onnx_path, tmp_path)[case]
    assert main(["eval", str(path), "--episodes", "1"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("sim2real eval: error:")
    assert message in err
    assert "Traceback" not in err


def test_wrong_observation_size_for_the_task(exported, capsys):
    _, onnx_path = exported
    assert main(["eval", str(onnx_path), "--task", "hopper", "--episodes", "1"]) != 0
    err = capsys.readouterr().err
    assert "observation size mismatch" in err and "'hopper' gives 11" in err


def test_export_of_a_missing_run_fails(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope")]) != 0
    assert "no checkpoint or run directory" in capsys.readouterr().err
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert main(["export", str(empty)]) != 0
    assert "has no checkpoints/latest.pt" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert main(["export", str(corrupt)]) != 0
    assert "cannot read checkpoint" in capsys.readouterr().err


def test_exit_status_of_a_real_process(exported, tmp_path):
    """A real process: exit status 2 and a one-line message, no traceback."""
    _, onnx_path = exported
    truncated = tmp_path / "t.onnx"
    truncated.write_bytes(onnx_path.read_bytes()[:100])
    code = "import sys; from training.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "eval", str(truncated)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "truncated or corrupted" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------- a NaN policy
def _nan_policy(src: Path, dst: Path) -> Path:
    """The exported file with one weight matrix rewritten to NaN, metadata untouched (so
    the export's own refusal of non-finite weights is not in the way)."""
    model = onnx.load(str(src))
    init = next(t for t in model.graph.initializer if len(t.dims) == 2)
    values = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(np.full_like(values, np.nan), init.name))
    onnx.save(model, str(dst))
    return dst


def test_eval_reports_the_safety_counters(exported, capsys):
    _, onnx_path = exported
    assert main(["eval", str(onnx_path), "--episodes", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cartpole: return")
    assert lines[1].startswith("safety: steps ")
    assert "nonfinite_action 0" in lines[1] and "watchdog 0" in lines[1]
    assert "clamped" in lines[1] and "bad_time 0" in lines[1]


def test_eval_of_a_nan_policy_fails_with_status_3(exported, tmp_path, capsys):
    """It used to report rc 0 and a finite return: the safety layer held every action."""
    _, onnx_path = exported
    nan_path = _nan_policy(onnx_path, tmp_path / "nan.onnx")
    assert main(["eval", str(nan_path), "--episodes", "2"]) == 3
    captured = capsys.readouterr()
    safety_line = captured.out.splitlines()[1]
    assert safety_line.startswith("safety: steps ")
    steps = int(safety_line.split("steps ")[1].split(",")[0])
    assert steps > 0 and f"nonfinite_action {steps}" in safety_line  # every single step
    assert captured.err.startswith("sim2real eval: error: the policy output non-finite actions")
    assert f"in {steps} of {steps} " in captured.err

    assert main(["eval", str(nan_path), "--episodes", "2", "--json"]) == 3
    captured = capsys.readouterr()
    stats = json.loads(captured.out)
    assert stats["safety"]["nonfinite_action"] == stats["safety"]["steps"] == steps
    assert "non-finite actions" in captured.err


def test_evaluate_source_always_reports_the_safety_layer(exported, tmp_path):
    from training.artifacts import evaluate_source

    _, onnx_path = exported
    stats = evaluate_source(_nan_policy(onnx_path, tmp_path / "nan.onnx"), episodes=1)
    assert set(stats["safety"]) >= {"steps", "nonfinite_action", "watchdog", "clamped"}
    assert stats["safety"]["nonfinite_action"] == stats["safety"]["steps"] > 0


def test_nan_policy_exit_status_of_a_real_process(exported, tmp_path):
    _, onnx_path = exported
    nan_path = _nan_policy(onnx_path, tmp_path / "nan.onnx")
    code = "import sys; from training.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "eval", str(nan_path), "--episodes", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    assert "non-finite actions" in proc.stderr and "Traceback" not in proc.stderr


def test_eval_of_a_file_edited_for_another_robot_is_an_error(exported, tmp_path, capsys):
    _, onnx_path = exported

    def scale_zero(props):
        return {**props, "sim2real.action_scale": "[0.0]"}

    path = _edit_props(onnx_path, tmp_path / "scale0.onnx", scale_zero)
    assert main(["eval", str(path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim2real eval: error: action_scale mismatch")
    assert "'cartpole' has 1" in err
