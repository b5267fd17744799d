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

import numpy as np
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
    assert "Velocity-Flat-Sim2real-Quadruped" in msg  # ours, registered beside Isaac Lab's


# ---------------------------------------- our quadruped in Isaac Lab's velocity task

LEGS = ("FL", "FR", "RL", "RR")
LINKS = ["base"] + [f"{leg}_{part}" for leg in LEGS for part in ("hip", "thigh", "calf")]
JOINTS = [f"{leg}_{part}_joint" for leg in LEGS for part in ("hip", "thigh", "calf")]


def test_the_quadrupeds_usd_holds_the_mjcfs_robot(checks):
    a = checks["quadruped_asset"]
    assert a["articulation_root"] and a["root_name"] == "quadruped"
    assert a["model_links"] == LINKS and a["model_joints"] == JOINTS
    # bodies flat under the root (Isaac Lab's contact sensors read Robot/<body>)
    assert sorted(a["bodies"]) == sorted(LINKS)
    assert {b["parent"] for b in a["bodies"].values()} == {"quadruped"}
    assert sum(b["mass"] for b in a["bodies"].values()) == pytest.approx(12.6, abs=1e-5)
    assert a["bodies"]["base"]["inertia"] == pytest.approx([0.022, 0.072, 0.082])
    # twelve hinges and nothing else: no joint to the world, a floating base
    assert sorted(a["joints"]) == sorted(JOINTS)
    for leg in LEGS:
        chain = [("base", "hip", "X"), ("hip", "thigh", "Y"), ("thigh", "calf", "Y")]
        for parent, part, axis in chain:
            j = a["joints"][f"{leg}_{part}_joint"]
            assert j["body0"] == (parent if parent == "base" else f"{leg}_{parent}")
            assert j["body1"] == f"{leg}_{part}" and j["axis"] == axis
    # UsdPhysics's units: degrees, and drive gains per degree
    low, high = a["joints"]["FL_calf_joint"]["limits_deg"]
    assert (low, high) == pytest.approx((np.degrees(-2.7), np.degrees(-0.9)), rel=1e-6)
    for name, j in a["joints"].items():
        assert j["stiffness_per_deg"] == pytest.approx(30 * np.pi / 180, rel=1e-6)
        assert j["max_force"] == (35.0 if "calf" in name else 25.0)
    # the MJCF's colliders: trunk box, thigh and calf capsules, foot spheres on the calves
    shapes = a["shapes"]
    assert len(shapes) == 13 and shapes["trunk"] == {"body": "base", "type": "Cube"}
    for leg in LEGS:
        assert shapes[f"{leg}_foot"] == {"body": f"{leg}_calf", "type": "Sphere"}
        assert shapes[f"{leg}_thigh"] == {"body": f"{leg}_thigh", "type": "Capsule"}
        assert shapes[f"{leg}_calf"] == {"body": f"{leg}_calf", "type": "Capsule"}


def test_our_quadruped_stands_in_isaac_labs_velocity_task(checks):
    q = checks["quadruped"]
    # what Isaac Lab read from the USD, and the bodies its contact terms address
    assert q["body_names"] == LINKS and q["joint_names"] == JOINTS
    assert q["contact_sensors"] == LINKS
    assert q["feet_air_time_bodies"] == [f"{leg}_calf" for leg in LEGS]
    assert q["undesired_contact_bodies"] == [f"{leg}_thigh" for leg in LEGS]
    assert q["base_contact_bodies"] == ["base"]
    # limbs as the MJCF has them; the trunk scaled by Isaac Lab's +-25 % mass event
    mass = q["body_mass"]
    assert 5.0 / 1.25 <= mass["base"] <= 5.0 * 1.25
    for leg in LEGS:
        assert [mass[f"{leg}_{p}"] for p in ("hip", "thigh", "calf")] == pytest.approx(
            [0.65, 1.0, 0.25], rel=1e-6
        )
    assert q["armature"] == pytest.approx([0.01, 0.01, 0.02] * 4, rel=1e-6)
    assert q["friction"] == pytest.approx([0.1] * 12, rel=1e-6)
    assert q["viscous_friction"] == pytest.approx([0.05] * 12, rel=1e-6)
    assert q["obs_terms"] == [
        ["base_lin_vel", 3], ["base_ang_vel", 3], ["projected_gravity", 3],
        ["velocity_commands", 3], ["joint_pos", 12], ["joint_vel", 12], ["actions", 12],
    ]  # fmt: skip
    assert q["action_joints"] == JOINTS
    assert q["dt"] == pytest.approx(0.02) and q["max_episode_steps"] == 1000
    # zero actions hold the standing pose: no episode ends, the trunk stays up
    assert q["stand_ends"] == 0
    assert all(0.25 < h < 0.4 for h in q["stand_base_height"])
    assert q["stand_joint_err"] < 0.4
    # a second Isaac env in the process is refused by name, and the open one steps on
    assert "one simulation per process" in q["second_env_error"] and q["still_steps"]
    # same seed, same actions: the same trajectory, and one with content
    assert q["repeat_obs_max_diff"] == 0.0 and q["repeat_reward_max_diff"] == 0.0
    assert q["repeat_obs_std"] > 0.1


def test_our_quadruped_in_isaac_lab_is_described_as_in_our_mujoco_task(checks):
    import sim

    isaac = checks["quadruped"]["robot"]
    env = sim.make("quadruped", 1)
    try:
        ours = env.robot.to_dict()
    finally:
        env.close()
    assert isaac["control_mode"] == "position" and isaac["joint_names"] == list(ours["joint_names"])
    for key in ("default_joint_pos", "kp", "kd", "action_scale", "action_offset",
                "joint_pos_lower", "joint_pos_upper", "torque_limit", "control_dt"):  # fmt: skip
        assert isaac[key] == pytest.approx(ours[key], rel=1e-6), key
    # Isaac Lab's velocity task steps physics at 200 Hz (ours at 500 Hz), both act at 50 Hz
    assert isaac["physics_dt"] == pytest.approx(0.005)


def test_ppo_trains_our_quadruped_in_isaac_lab_resumes_and_exports(checks):
    t = checks["quadruped_training"]
    assert t["first_iterations"] == 2
    assert t["resume_loaded_equal"] and t["resume_start"] == 64
    assert t["env_steps"] == 128 and t["iterations"] == 4 and t["resumed_weights_moved"]
    meta = t["meta"]
    assert meta["task"] == "isaac:Isaac-Velocity-Flat-Sim2real-Quadruped"
    assert meta["control_dt"] == pytest.approx(0.02)
    assert meta["joint_names"] == JOINTS and meta["kp"] == [30.0] * 12
    assert meta["action_scale"] == [0.25] * 12
    assert [n for n, _ in meta["obs_terms"]][-1] == "actions"
    assert t["parity"] < 1e-5
    # the legged robot's contacts amplify float-level differences over 2 x 50 steps:
    # the checkpoint with its weights scaled by 1 + 1e-6 noise moved its return from
    # 0.69319 to 0.69191 (onnxruntime's: 0.69191), so the file and the checkpoint agree
    # to a contact event, not to the bit (the cart-pole above agrees to 1e-5)
    assert t["eval_onnx"] == pytest.approx(t["eval_checkpoint"], rel=1e-2)


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


def test_the_quadrupeds_isaac_model_is_read_from_its_mjcf():
    import sim
    from sim.isaac_assets import quadruped_model

    model = quadruped_model()
    assert [link.name for link in model.links] == LINKS
    assert model.links[0].parent is None and model.links[0].pos == (0.0, 0.0, 0.0)
    assert sum(link.mass for link in model.links) == pytest.approx(12.6)
    assert [j.name for j in model.joints] == JOINTS
    assert [j.axis for j in model.joints] == ["X", "Y", "Y"] * 4
    assert model.standing_height == pytest.approx(0.325)
    # the colliders only: the motor housings and the head are visual
    kinds = sorted((s.body, s.kind) for s in model.shapes)
    assert len(kinds) == 13 and ("base", "box") in kinds
    assert sum(k == "sphere" and b.endswith("_calf") for b, k in kinds) == 4
    # what the Isaac Lab task's actuators and init state take: our MuJoCo task's robot
    env = sim.make("quadruped", 1)
    try:
        robot = env.robot
    finally:
        env.close()
    assert [j.kp for j in model.joints] == pytest.approx(robot.kp)
    assert [j.kd for j in model.joints] == pytest.approx(robot.kd)
    assert [j.effort for j in model.joints] == pytest.approx(robot.torque_limit)
    assert [j.default for j in model.joints] == pytest.approx(robot.default_joint_pos)
    assert [j.lower for j in model.joints] == pytest.approx(robot.joint_pos_lower)
    assert [j.upper for j in model.joints] == pytest.approx(robot.joint_pos_upper)
    assert [j.armature for j in model.joints] == pytest.approx([0.01, 0.01, 0.02] * 4)


def test_an_edited_quadruped_mjcf_gets_a_new_usd_file(tmp_path):
    from sim.isaac_assets import QUADRUPED, QUADRUPED_MJCF, quadruped_file

    xml = tmp_path / "quadruped.xml"
    xml.write_bytes(QUADRUPED_MJCF.read_bytes())
    assert quadruped_file(xml) == QUADRUPED  # same robot, same cached file
    xml.write_text(xml.read_text().replace('mass="5.0"', 'mass="5.5"'))
    assert quadruped_file(xml) != QUADRUPED  # an edited robot is written anew


_ROBOT = """<mujoco><worldbody><body name="base" pos="0 0 0.3"><freejoint/>
  <geom type="box" size="0.1 0.1 0.05"/>
  <body name="leg" pos="0.1 0 0">{joint}<geom type="{geom}" size="0.02 0.1"/></body>
</body></worldbody><actuator>{actuator}</actuator>
<keyframe><key name="home" qpos="0 0 0.3 1 0 0 0 0"/></keyframe></mujoco>"""
_HINGE = '<joint name="knee" axis="{axis}" range="-1 1"/>'
_SERVO = '<position joint="knee" kp="10"/>'


@pytest.mark.parametrize(
    "joint, geom, actuator, error",
    [
        (_HINGE.format(axis="0 1 0"), "capsule", _SERVO, None),
        (_HINGE.format(axis="1 1 0"), "capsule", _SERVO, "about a body axis"),
        ('<joint name="knee" type="slide" axis="1 0 0"/>', "capsule", _SERVO, "hinge"),
        (_HINGE.format(axis="0 1 0"), "capsule", "", "has no actuator"),
        (_HINGE.format(axis="0 1 0"), "cylinder", _SERVO, "not a box, capsule or sphere"),
    ],
)
def test_the_quadruped_writer_refuses_what_its_usd_cannot_say(
    tmp_path, joint, geom, actuator, error
):
    from sim.isaac_assets import quadruped_model

    xml = tmp_path / "robot.xml"
    xml.write_text(_ROBOT.format(joint=joint, geom=geom, actuator=actuator))
    if error is None:  # the well-formed robot reads: the others fail only for their flaw
        model = quadruped_model(xml)
        assert [j.name for j in model.joints] == ["knee"] and model.joints[0].kp == 10.0
        return
    with pytest.raises(ValueError, match=error):
        quadruped_model(xml)


def test_the_isaac_factory_is_declared_as_an_entry_point():
    # `sim2real train ppo --task isaac:...` finds the factory through this entry point
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project.get("entry-points", {}).get("sim2real.external_envs", {})
    assert eps.get("isaac") == "sim.isaac_env:make_isaac_env"
