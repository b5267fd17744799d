"""Isaac Lab 3.0's tasks behind our contract (sim/isaac_env.py, sim/isaac_assets.py).

Isaac Lab needs Python 3.12 and pins torch 2.11, so it lives in .venv-isaac
(scripts/setup_isaac.sh, ~8 GB): the checks run there as a subprocess
(tests/isaac_checks.py) and are asserted here, only with SIM2REAL_ISAAC=1
(scripts/test_isaac.sh sets the venv up and runs them); CI leaves them out. The tests at
the end run in every venv: what a user without Isaac Lab sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv-isaac" / "bin" / "python"


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    if os.environ.get("SIM2REAL_ISAAC") != "1":
        pytest.skip("SIM2REAL_ISAAC=1 runs the Isaac Lab checks (scripts/test_isaac.sh)")
    if not VENV_PYTHON.exists():
        pytest.fail(f"{VENV_PYTHON} is missing: run `bash scripts/setup_isaac.sh`")
    out = tmp_path_factory.mktemp("isaac")
    # a cold Warp kernel cache compiles Newton's and MuJoCo Warp's kernels first (~1 min)
    proc = subprocess.run(
        [str(VENV_PYTHON), str(ROOT / "tests" / "isaac_checks.py"), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "checks.json").read_text())


def test_the_stand_in_assets_have_what_isaac_labs_cartpole_addresses(checks):
    a = checks["assets"]
    assert a["joints"] == {
        "root_joint": "PhysicsFixedJoint",
        "slider_to_cart": "PhysicsPrismaticJoint",
        "cart_to_pole": "PhysicsRevoluteJoint",
    }
    assert a["bodies"] == ["cart", "pole", "rail"] and a["articulation_root"]
    assert a["collision_planes"] == ["CollisionPlane"]
    assert a["rewritten"] == []  # written once, then found
    # the env was built from them: Isaac Lab read its assets from our cache, not a server
    assert checks["adapter"]["asset_root"].endswith("sim2real/isaac_assets/v1")


def test_the_adapter_gives_what_isaac_labs_own_wrapper_gives(checks):
    a = checks["adapter"]
    # same seed, same actions: bit-identical observations, rewards and episode ends
    assert a["obs_max_diff"] == 0.0 and a["reward_max_diff"] == 0.0 and a["ends_equal"]
    # and the same again from a second env in the same process (same seed, same trajectory)
    assert a["repeat_obs_max_diff"] == 0.0 and a["repeat_reward_max_diff"] == 0.0
    assert a["repeat_ends_equal"]
    # the comparison has content: the cart moved, and episodes ended both ways
    assert a["reward_std"] > 1e-3 and a["obs_std"] > 0.1
    kinds = a["ends_by_kind"]
    assert kinds["terminated"] >= 1 and kinds["truncated"] >= 1
    assert a["ends"] == kinds["terminated"] + kinds["truncated"]


def test_the_env_carries_isaac_labs_spaces_and_robot(checks):
    a = checks["adapter"]
    spec, robot = a["spec"], a["robot"]
    assert spec["groups"] == ["policy"]
    assert spec["obs_terms"] == [["joint_pos_rel", 2], ["joint_vel_rel", 2]]
    assert spec["action_joints"] == ["slider_to_cart"] and spec["action_high"] == 100.0
    # decimation 2 of a 1/120 s physics step; a 5 s episode
    assert spec["dt"] == pytest.approx(1 / 60) and spec["max_episode_steps"] == 300
    assert robot["physics_dt"] == pytest.approx(1 / 120)
    assert robot["control_dt"] == pytest.approx(1 / 60)
    # an effort action: a torque robot, the action the actuator command (scale 1), the
    # force limit the actuator's effort limit from Isaac Lab's config
    assert robot["control_mode"] == "torque"
    assert robot["joint_names"] == ["slider_to_cart"]
    assert robot["action_scale"] == [1.0] and robot["action_offset"] == [0.0]
    assert robot["torque_limit"] == [a["actuators"]["cart_actuator"]["effort"]]
    assert robot["kp"] == [0.0] and robot["kd"] == [0.0]
    assert robot["joint_pos_lower"] == [-4.0] and robot["joint_pos_upper"] == [4.0]


def test_ppo_trains_isaac_labs_task_resumes_and_exports(checks):
    t = checks["training"]
    assert t["hidden"] == [32, 32]  # the preset mirrors Isaac Lab's rsl_rl config
    assert t["first_iterations"] == 2
    assert t["resume_loaded_equal"] and t["resume_start"] == 128
    assert t["env_steps"] == 256 and t["iterations"] == 4 and t["resumed_weights_moved"]
    meta = t["meta"]
    assert meta["task"] == "isaac:Isaac-Cartpole"
    assert meta["control_dt"] == pytest.approx(1 / 60)
    assert meta["joint_names"] == ["slider_to_cart"] and meta["action_scale"] == [1.0]
    assert meta["obs_terms"] == [["joint_pos_rel", 2], ["joint_vel_rel", 2]]
    assert t["parity"] < 1e-5
    # the file through onnxruntime and the safety layer scores what the checkpoint scores
    assert t["eval_onnx"] == pytest.approx(t["eval_checkpoint"], rel=1e-5, abs=1e-6)


def test_unknown_isaac_tasks_are_named_with_the_known_ones(checks):
    msg = checks["unknown_task"]
    assert "No-Such-Task" in msg and "Cartpole" in msg


# ------------------------------------------------------------- in every venv


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("user_assets", [False, True])
def test_isaac_tasks_outside_their_venv_are_a_clear_error(monkeypatch, tmp_path, user_assets):
    import sim
    from sim import external
    from sim.isaac_env import make_isaac_env

    if "isaaclab" in sys.modules or _importable("isaaclab"):
        pytest.skip("isaaclab is importable in this venv")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if user_assets:
        # assets of the user's own: no stand-ins written, Isaac Lab itself is missing
        monkeypatch.setenv("ISAACSIM_ASSET_ROOT", str(tmp_path / "mine"))
    else:
        monkeypatch.delenv("ISAACSIM_ASSET_ROOT", raising=False)
    with pytest.raises(ImportError, match=r"setup_isaac\.sh"):
        make_isaac_env("Isaac-Cartpole", 1)
    monkeypatch.setitem(external._EXTERNAL, "isaac", make_isaac_env)
    with pytest.raises(ImportError, match=r"isaaclab.*setup_isaac\.sh"):
        sim.make("isaac:Isaac-Cartpole", 1)
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_the_stand_in_writer_without_pxr_is_a_clear_error(tmp_path):
    from sim.isaac_assets import write_standin_assets

    if _importable("pxr"):
        pytest.skip("pxr is importable in this venv (the Isaac checks write the assets)")
    with pytest.raises(ImportError, match=r"pxr.*setup_isaac\.sh"):
        write_standin_assets(tmp_path / "assets")
    assert not (tmp_path / "assets").exists()


def test_unknown_isaac_task_names_list_the_known_ones():
    from sim.isaac_env import isaac_task_id

    known = ["Isaac-Cartpole", "Isaac-Ant", "Isaac-Cartpole-Direct"]
    assert isaac_task_id("Isaac-Cartpole", known) == "Isaac-Cartpole"
    assert isaac_task_id("Cartpole", known) == "Isaac-Cartpole"  # the prefix may be left out
    with pytest.raises(ValueError, match=r"no task 'Cartpol'.*Ant, Cartpole, Cartpole-Direct"):
        isaac_task_id("Cartpol", known)


def test_unknown_isaac_options_are_refused_before_anything_is_imported():
    from sim.isaac_env import make_isaac_env

    with pytest.raises(ValueError, match=r"unknown option\(s\) \['max_speed'\]"):
        make_isaac_env("Isaac-Cartpole", 1, max_speed=3)
    with pytest.raises(TypeError, match=r"overrides must be a list"):
        make_isaac_env("Isaac-Cartpole", 1, overrides="physics=newton_mjwarp")


def test_the_isaac_factory_is_declared_as_an_entry_point():
    # `sim2real train ppo --task isaac:...` finds the factory through this entry point
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project.get("entry-points", {}).get("sim2real.external_envs", {})
    assert eps.get("isaac") == "sim.isaac_env:make_isaac_env"
