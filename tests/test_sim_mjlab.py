"""mjlab's tasks behind our contract (sim/mjlab_env.py).

mjlab pins MuJoCo 3.11, so it lives in .venv-mjlab (scripts/setup_mjlab.sh, run by
scripts/test.sh): the checks run there as a subprocess (tests/mjlab_checks.py) and are
asserted here. Set SIM2REAL_MJLAB=0 to leave that venv out (the test is then skipped).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv-mjlab" / "bin" / "python"


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    if not VENV_PYTHON.exists():
        if os.environ.get("SIM2REAL_MJLAB") == "0":
            pytest.skip("SIM2REAL_MJLAB=0: .venv-mjlab is not set up")
        pytest.fail(f"{VENV_PYTHON} is missing: run `bash scripts/setup_mjlab.sh`")
    out = tmp_path_factory.mktemp("mjlab")
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    # a cold Warp kernel cache compiles mjlab's physics first (~2 min on 2 cores)
    proc = subprocess.run(
        [str(VENV_PYTHON), str(ROOT / "tests" / "mjlab_checks.py"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "checks.json").read_text())


def test_the_adapter_gives_what_mjlabs_own_wrapper_gives(checks):
    a = checks["adapter"]
    # same seed, same actions: bit-identical observations, rewards and episode ends
    assert a["obs_max_diff"] == 0.0 and a["reward_max_diff"] == 0.0 and a["ends_equal"]
    assert a["reward_std"] > 1e-3  # the actions moved the robot: the comparison has content
    h, w, c = a["frame_shape"]
    assert c == 3 and h >= 64 and w >= 64 and a["frame_std"] > 5  # a picture, not a blank


def test_the_exported_go1_policy_carries_mjlabs_robot_and_runs_in_sim2sim(checks):
    t, actuators = checks["training"], checks["adapter"]["actuators"]
    meta = t["meta"]
    assert meta["task"] == "mjlab:Velocity-Flat-Unitree-Go1" and meta["control_dt"] == 0.02
    assert len(meta["joint_names"]) == 12
    # per joint, the PD gain of the actuator group mjlab's config assigns it, and mjlab's
    # action scale for the Go1 (0.25 x effort limit / stiffness)
    for name, kp, scale in zip(meta["joint_names"], meta["kp"], meta["action_scale"], strict=True):
        (group,) = [g for g in actuators if any(re.fullmatch(e, name) for e in g["expr"])]
        assert kp == pytest.approx(group["kp"], rel=1e-9)
        assert scale == pytest.approx(0.25 * group["effort"] / group["kp"], rel=1e-6)
    terms = dict(meta["obs_terms"])
    assert list(terms)[:3] == ["base_lin_vel", "base_ang_vel", "projected_gravity"]
    assert sum(terms.values()) == 48 and terms["joint_pos"] == 12
    assert t["parity"] < 1e-5
    # the file through onnxruntime and the safety layer scores what the checkpoint scores
    assert t["eval_onnx"] == pytest.approx(t["eval_checkpoint"], rel=1e-5, abs=1e-6)


def test_ppo_trains_mjlabs_task_with_mjlabs_settings_and_resumes(checks):
    t = checks["training"]
    assert t["hidden"] == [512, 256, 128]  # the preset mirrors mjlab's rsl_rl config
    assert t["resume_loaded_equal"] and t["resume_start"] == 192
    assert t["env_steps"] == 384 and t["iterations"] == 4
    assert checks["cli"] == {"rc": 0, "printed_actor_hidden": True}


def test_mjlab_tasks_outside_their_venv_are_a_clear_error():
    import sim

    if "mjlab" in sys.modules or _importable("mjlab"):
        pytest.skip("mjlab is importable in this venv")
    with pytest.raises(ImportError, match=r"setup_mjlab\.sh"):
        sim.make("mjlab:Velocity-Flat-Unitree-Go1", 2)


def test_unknown_mjlab_task_names_list_the_known_ones():
    from sim.mjlab_env import mjlab_task_id

    known = ["Mjlab-Cartpole-Balance", "Mjlab-Velocity-Flat-Unitree-Go1"]
    assert mjlab_task_id("Velocity-Flat-Unitree-Go1", known) == known[1]
    assert mjlab_task_id("Mjlab-Cartpole-Balance", known) == known[0]
    with pytest.raises(ValueError, match="no task 'Go2'.*Cartpole-Balance, Velocity-Flat"):
        mjlab_task_id("Go2", known)


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(name) is not None


def test_the_default_run_directory_of_an_external_task_has_no_colon():
    from training.cli import default_run_dir

    name = default_run_dir("mjlab:Velocity-Flat-Unitree-Go1", "ppo").name
    assert name.startswith("ppo-mjlab-Velocity-Flat-Unitree-Go1-") and ":" not in name
