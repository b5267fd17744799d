"""The robustness matrix: end to end on a tiny grid, for an exported file and a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.tasks.quadruped import CONSTRAINT_LIMITS
from training.cli import main
from training.robustness import (
    SHIFTS,
    evaluate_world,
    plot_matrix,
    robustness_matrix,
    write_matrix,
)

DATA = Path(__file__).parent / "data"
QUADRUPED = DATA / "quadruped_policy.onnx"
CARTPOLE_CHECKPOINT = DATA / "checkpoints_v0" / "ppo"


def test_tiny_matrix_of_an_onnx_policy_end_to_end(tmp_path):
    levels = {"push": [0, 3.0], "latency": [0, 6], "obs_noise": [0, 2], "terrain": [0, 9]}
    result = robustness_matrix(QUADRUPED, levels, episodes=2, seconds=1.0, progress=False)
    assert result["task"] == "quadruped" and result["seconds"] == pytest.approx(1.0)
    rows = {r["shift"]: r for r in result["rows"]}
    assert list(rows) == ["push", "latency", "obs_noise", "terrain"]
    assert not result["skipped"]
    # the terrain row walks the quadruped on its heightfield (the terrain option)
    assert rows["terrain"]["task"] == "quadruped"
    assert [c["level"] for c in rows["terrain"]["cells"]] == [0, 9]
    nominal = [r["cells"][0] for s, r in rows.items() if s != "terrain"]
    # every row's nominal cell is the same nominal model
    assert all(c == nominal[0] | {"level": c["level"]} for c in nominal)
    assert not any(c["ood"] for c in nominal)
    for row in rows.values():
        for cell in row["cells"]:
            assert 0.0 <= cell["fall_rate"] <= 1.0
            assert cell["success_rate"] == pytest.approx(1.0 - cell["fall_rate"])
            assert np.isfinite(cell["tracking_error"])
    # six control steps of delay throw the walking policy over within a second
    assert rows["latency"]["cells"][1]["fall_rate"] > rows["latency"]["cells"][0]["fall_rate"]
    png = plot_matrix(result, tmp_path / "matrix.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(write_matrix(result, tmp_path / "matrix.json").read_text())
    assert saved["rows"][0]["shift"] == "push"


def test_matrix_of_a_checkpoint():
    result = robustness_matrix(
        CARTPOLE_CHECKPOINT,
        {"friction": [1, 0.2], "motor_strength": [1, 0.5], "obs_noise": [0, 1]},
        episodes=2,
        seconds=0.5,
        progress=False,
    )
    assert [r["shift"] for r in result["rows"]] == ["friction", "motor_strength"]
    assert "obs_noise" in result["skipped"]  # cartpole trains without observation noise
    cells = result["rows"][1]["cells"]
    assert cells[1]["ood"] and not np.isfinite(cells[1]["tracking_error"])


@pytest.mark.parametrize("task, args", [("go1_rough", {}), ("quadruped", {"terrain": True})])
def test_terrain_row_puts_every_env_on_the_level(task, args):
    from sim.registry import make

    env = make(task, 3, seed=0, level=7, curriculum=False, **args)
    assert (env.terrain_levels == 7).all()
    with pytest.raises(ValueError, match="level must be an integer"):
        make(task, 1, level=10, **args)


@pytest.mark.parametrize(
    "levels, message",
    [
        ({"gravity": [1]}, "unknown shifts"),
        ({"friction": []}, "non-empty list"),
        ({"friction": ["low"]}, "must be numbers"),
        ({"latency": [0, 1.5]}, "whole control steps"),
    ],
)
def test_bad_grid_is_a_clear_error(levels, message):
    with pytest.raises(ValueError, match=message):
        robustness_matrix(QUADRUPED, levels, episodes=1, seconds=0.1, progress=False)


def test_one_world_with_a_fixed_command_reports_constraint_violations():
    standing = {"command_vx": [0, 0], "command_vy": [0, 0], "command_yaw": [0, 0]}
    stand = evaluate_world(QUADRUPED, episodes=2, seconds=2.0, task_args=standing)
    walk = evaluate_world(
        QUADRUPED, episodes=2, seconds=2.0, task_args={**standing, "command_vx": [1, 1]}
    )
    assert stand["task"] == "quadruped" and stand["seconds"] == pytest.approx(2.0)
    per = {k: v for k, v in stand.items() if k.startswith("violation_rate_")}
    assert set(per) == {f"violation_rate_{n}" for n in CONSTRAINT_LIMITS}
    assert max(per.values()) <= stand["violation_rate"] <= min(1.0, sum(per.values()))
    # the override reached the env: asked to stand, the policy tracks zero better than
    # it tracks 1 m/s from a standstill
    assert stand["lin_vel_error_mean"] < walk["lin_vel_error_mean"]
    randomized = evaluate_world(
        QUADRUPED, episodes=2, seconds=2.0, task_args=standing, training_world=True
    )
    assert randomized["returns"] != stand["returns"]


@pytest.mark.parametrize(
    "task_args, message",
    [("vx=1", "task_args must map"), ({"no_such_option": 1}, "no_such_option")],
)
def test_bad_task_args_are_named(task_args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        evaluate_world(QUADRUPED, episodes=1, seconds=0.1, task_args=task_args)


def test_default_levels_start_at_the_nominal_world():
    for shift in SHIFTS.values():
        assert shift.levels[0] == shift.nominal


def test_eval_stress_command(tmp_path, capsys):
    out = tmp_path / "stress.png"
    args = ["eval", str(QUADRUPED), "--stress", "--episodes", "1", "--seconds", "0.2"]
    assert main([*args, "--shifts", '{"friction": [1, 0.3]}', "--plot", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"][0]["shift"] == "friction" and out.exists()
    fixed = '{"command_vx": [0.5, 0.5], "command_vy": [0, 0], "command_yaw": [0, 0]}'
    assert main([*args, "--shifts", '{"push": [0]}', "--task-args", fixed, "--json"]) == 0
    still = '{"command_vx": [0, 0], "command_vy": [0, 0], "command_yaw": [0, 0]}'
    assert main([*args, "--shifts", '{"push": [0]}', "--task-args", still, "--json"]) == 0
    walk, stand = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    # from a standstill, 0.5 m/s asked is tracked worse than standing, and walked faster
    walking, standing = walk["rows"][0]["cells"][0], stand["rows"][0]["cells"][0]
    assert walking["tracking_error"] > standing["tracking_error"]
    assert walking["forward_speed"] > standing["forward_speed"] + 0.02
    assert main([*args, "--randomize"]) == 2
    assert "--stress sets the world" in capsys.readouterr().err
    assert main(["eval", str(QUADRUPED), "--plot", str(out)]) == 2
    assert "only apply with --stress" in capsys.readouterr().err


def test_eval_prints_tracking_and_constraint_violations(capsys):
    assert main(["eval", str(QUADRUPED), "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "tracking error:" in out and "m/s linear" in out
    line = next(x for x in out.splitlines() if x.startswith("constraints violated in"))
    assert all(name in line for name in CONSTRAINT_LIMITS)


def test_the_constraints_benchmark_ratio_has_no_bound_when_cat_never_violates():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "constraints.py"
    spec = importlib.util.spec_from_file_location("bench_constraints", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.fewer_violations(0.01, 0.5) == pytest.approx(50.0)
    assert bench.fewer_violations(0.0, 0.5) == float("inf")
    assert bench.fewer_violations(0.0, 0.0) == 1.0
