"""Observation assembly and the control step of the ROS policy node, without ROS.

Messages are stand-ins with the attributes of sensor_msgs/JointState and Imu; the
assembler reads them duck-typed, exactly as it reads rclpy's messages.
"""

from __future__ import annotations

import array
import math
from types import SimpleNamespace as NS

import numpy as np
import pytest
from ros_support import export_test_flow_policy, export_test_policy
from sim2real_ros.controller import ConfigureError, LoopStats, PolicyController
from sim2real_ros.observation import (
    KNOWN_TERMS,
    ObservationAssembler,
    ObservationError,
    projected_gravity,
)

JOINTS = [
    f"{leg}_{part}_joint" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")
]
DEFAULT = np.array([0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5])
TERMS = [
    ("base_ang_vel", 3),
    ("projected_gravity", 3),
    ("command", 3),
    ("joint_pos", 12),
    ("joint_vel", 12),
    ("last_action", 12),
]


def joint_state(names, pos, vel):
    return NS(name=list(names), position=array.array("d", pos), velocity=array.array("d", vel))


def imu(q_xyzw=(0.0, 0.0, 0.0, 1.0), gyro=(0.0, 0.0, 0.0)):
    x, y, z, w = q_xyzw
    return NS(
        orientation=NS(x=x, y=y, z=z, w=w), angular_velocity=NS(x=gyro[0], y=gyro[1], z=gyro[2])
    )


@pytest.fixture
def assembler():
    return ObservationAssembler(TERMS, JOINTS, DEFAULT)


# ---------------------------------------------------------------------- assembly
def test_frame_layout_follows_the_metadata_terms(assembler):
    rng = np.random.default_rng(0)
    pos, vel, act = DEFAULT + rng.normal(size=12) * 0.1, rng.normal(size=12), rng.normal(size=12)
    f = assembler.assemble(
        joint_state(JOINTS, pos, vel), imu(gyro=(0.1, -0.2, 0.3)), (0.5, 0.1, -0.2), act
    ).copy()
    assert f.shape == (45,)
    np.testing.assert_allclose(f[0:3], [0.1, -0.2, 0.3])
    np.testing.assert_allclose(f[3:6], [0.0, 0.0, -1.0])  # upright: gravity straight down
    np.testing.assert_allclose(f[6:9], [0.5, 0.1, -0.2])
    np.testing.assert_allclose(f[9:21], pos - DEFAULT)  # relative to the default pose
    np.testing.assert_allclose(f[21:33], vel)
    np.testing.assert_allclose(f[33:45], act)


def test_terms_in_another_order_are_assembled_in_that_order():
    terms = [("joint_vel", 12), ("command", 3), ("projected_gravity", 3)]
    a = ObservationAssembler(terms, JOINTS, DEFAULT)
    vel = np.arange(12.0)
    f = a.assemble(joint_state(JOINTS, DEFAULT, vel), imu(), (1.0, 2.0, 3.0), np.zeros(12))
    np.testing.assert_allclose(f, np.concatenate([vel, [1, 2, 3], [0, 0, -1]]))
    assert a.needs_imu and a.needs_velocity and a.needs_command


def test_joints_are_mapped_by_name_not_by_position(assembler):
    rng = np.random.default_rng(1)
    pos, vel = DEFAULT + rng.normal(size=12) * 0.2, rng.normal(size=12)
    ref = assembler.assemble(joint_state(JOINTS, pos, vel), imu(), (0, 0, 0), np.zeros(12)).copy()
    for seed in range(5):
        perm = np.random.default_rng(seed).permutation(12)
        shuffled = joint_state([JOINTS[i] for i in perm], pos[perm], vel[perm])
        f = assembler.assemble(shuffled, imu(), (0, 0, 0), np.zeros(12))
        np.testing.assert_array_equal(f, ref)
    # extra joints (a gripper, a head) are ignored
    names = ["head_pan", *JOINTS[::-1], "gripper"]
    extra = joint_state(names, [9.0, *pos[::-1], 9.0], [9.0, *vel[::-1], 9.0])
    np.testing.assert_array_equal(assembler.assemble(extra, imu(), (0, 0, 0), np.zeros(12)), ref)


def test_missing_joint_is_an_error_naming_it(assembler):
    names = JOINTS[:5] + JOINTS[6:]
    with pytest.raises(ObservationError, match="FR_hip_joint"):
        assembler.assemble(
            joint_state(names, DEFAULT[:11], np.zeros(11)), imu(), (0, 0, 0), np.zeros(12)
        )
    with pytest.raises(ObservationError, match="lacks action joint"):
        assembler.joint_positions(joint_state(names, DEFAULT[:11], np.zeros(11)))


def test_inconsistent_arrays_and_missing_messages_are_errors(assembler):
    with pytest.raises(ObservationError, match="positions"):
        assembler.assemble(
            joint_state(JOINTS, DEFAULT[:10], np.zeros(12)), imu(), (0, 0, 0), np.zeros(12)
        )
    with pytest.raises(ObservationError, match="velocities"):
        assembler.assemble(joint_state(JOINTS, DEFAULT, []), imu(), (0, 0, 0), np.zeros(12))
    with pytest.raises(ObservationError, match="no JointState"):
        assembler.assemble(None, imu(), (0, 0, 0), np.zeros(12))
    with pytest.raises(ObservationError, match="no Imu"):
        assembler.assemble(
            joint_state(JOINTS, DEFAULT, np.zeros(12)), None, (0, 0, 0), np.zeros(12)
        )


def test_unknown_term_or_wrong_size_is_refused_at_construction():
    with pytest.raises(ObservationError, match="base_lin_vel"):
        ObservationAssembler([*TERMS, ("base_lin_vel", 3)], JOINTS, DEFAULT)
    with pytest.raises(ObservationError, match="size 13"):
        ObservationAssembler([("joint_pos", 13)], JOINTS, DEFAULT)
    with pytest.raises(ObservationError, match="size 4"):
        ObservationAssembler([("command", 4)], JOINTS, DEFAULT)
    assert set(KNOWN_TERMS) == {t for t, _ in TERMS}


def test_nan_sensor_values_pass_through_for_the_safety_layer(assembler):
    pos = DEFAULT.copy()
    pos[3] = math.nan
    f = assembler.assemble(joint_state(JOINTS, pos, np.zeros(12)), imu(), (0, 0, 0), np.zeros(12))
    assert np.isnan(f[9 + 3]) and np.isfinite(np.delete(f, 12)).all()
    g = projected_gravity(0.0, 0.0, 0.0, 0.0, np.zeros(3))  # a zero quaternion
    assert np.isnan(g).all()


def test_projected_gravity_matches_the_simulator():
    from sim.tasks.quadruped import quat_to_mat

    rng = np.random.default_rng(3)
    for _ in range(50):
        q = rng.normal(size=4)  # (w, x, y, z), not normalized on purpose
        rot = quat_to_mat(q[None])[0]
        want = rot.T @ np.array([0.0, 0.0, -1.0])  # the task's R^T (0, 0, -1)
        got = projected_gravity(q[1], q[2], q[3], q[0], np.zeros(3))
        np.testing.assert_allclose(got, want, atol=1e-12)


# ---------------------------------------------------------------------- the control step
@pytest.fixture(scope="module")
def policy_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ros_policies")
    return {
        "stand": export_test_policy(root / "stand.onnx", gain=0.0),
        "random": export_test_policy(root / "random.onnx", gain=1.0, seed=1),
        "unknown_term": export_test_policy(
            root / "lin_vel.onnx", obs_terms=[*TERMS, ("base_lin_vel", 3)]
        ),
        # chunks of 4 actions, 2 of them run, 4 Euler steps: noise input and chunk state
        "flow": export_test_flow_policy(root / "flow.onnx", horizon=4, act_steps=2, steps=4),
    }


def test_configure_errors_are_clear(policy_files, tmp_path):
    with pytest.raises(ConfigureError, match="not found"):
        PolicyController(tmp_path / "missing.onnx")
    with pytest.raises(ConfigureError, match="empty"):
        PolicyController("")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(policy_files["stand"].read_bytes()[:300])
    with pytest.raises(ConfigureError, match="cannot use"):
        PolicyController(broken)
    with pytest.raises(ConfigureError, match="base_lin_vel"):
        PolicyController(policy_files["unknown_term"])


def _inputs(pos=DEFAULT, names=JOINTS):
    return joint_state(names, pos, np.zeros(len(names))), imu()


def test_step_is_the_runtime_and_safety_layer_on_the_assembled_frame(policy_files):
    from deploy.runtime import OnnxPolicy

    c = PolicyController(policy_files["random"], ramp_in_s=0.0, max_target_speed=math.inf)
    ref = OnnxPolicy(policy_files["random"], deterministic=True)
    js, im = _inputs(DEFAULT + 0.05)
    c.set_command(0.5, 0.0, 0.0, 0.0)
    c.activate(0.0, js)
    last = np.zeros(12)
    for k in range(5):
        t = 0.02 * k
        out = c.step(js, im, t, t)
        frame = np.concatenate(
            [[0, 0, 0], [0, 0, -1], [0.5, 0, 0], np.full(12, 0.05), np.zeros(12), last]
        )
        target = ref.to_joint_targets(ref.act(frame))
        want = np.clip(target, c.metadata.joint_pos_lower, c.metadata.joint_pos_upper)
        np.testing.assert_allclose(out, want, atol=1e-6)
        last = (out - DEFAULT) / 0.25  # the last action is what was sent
        np.testing.assert_allclose(c.last_action, last)


def _flow_run(c, t0=0.0, steps=6):
    """The controller's outputs over ``steps`` ticks from ``t0``, activated afresh, on
    fixed sensors and a forward command; with the frames it assembled."""
    js, im = _inputs(DEFAULT + 0.05)
    c.set_command(0.5, 0.0, 0.0, t0)
    c.deactivate()
    c.activate(t0, js)
    outs, frames = [], []
    for k in range(steps):
        t = t0 + 0.02 * k
        frames.append(np.concatenate([[0, 0, 0], [0, 0, -1], [0.5, 0, 0], np.full(12, 0.05),
                                      np.zeros(12), c.last_action]))  # fmt: skip
        outs.append(c.step(js, im, t, t).copy())
    return np.array(outs), frames


def test_a_flow_policy_samples_on_the_robot_as_the_runtime_and_eval_do(policy_files):
    """A generative policy (a flow policy here: chunks, noise input) runs on the node as
    ``deploy.runtime`` samples it with the node's seed, which is how ``sim2real eval``
    and sim2sim measure it; deterministic: zero noise; each activation re-seeds."""
    from deploy.runtime import OnnxPolicy

    path = policy_files["flow"]
    kw = {"ramp_in_s": 0.0, "max_target_speed": math.inf}
    c = PolicyController(path, seed=7, **kw)
    outs, frames = _flow_run(c)
    ref = OnnxPolicy(path, seed=7)
    lo, hi = c.metadata.joint_pos_lower, c.metadata.joint_pos_upper
    want = [np.clip(ref.to_joint_targets(ref.act(f)), lo, hi) for f in frames]
    np.testing.assert_allclose(outs, want, atol=1e-6)
    # each chunk's two actions differ, and so do the chunks: the samples are used
    assert np.abs(np.diff(outs, axis=0)).max(axis=1).min() > 1e-3
    again, _ = _flow_run(c, t0=1.0)  # a new activation draws the same noise again
    np.testing.assert_array_equal(again, outs)
    other, _ = _flow_run(PolicyController(path, seed=8, **kw))
    assert np.abs(other - outs).max() > 1e-2
    det, det_frames = _flow_run(PolicyController(path, deterministic=True, **kw))
    zero = OnnxPolicy(path, deterministic=True)
    want = [np.clip(zero.to_joint_targets(zero.act(f)), lo, hi) for f in det_frames]
    np.testing.assert_allclose(det, want, atol=1e-6)
    assert np.abs(det - outs).max() > 1e-2
    for bad in (-1, 1.5, "0", True):
        with pytest.raises(ConfigureError, match="seed must be an integer >= 0"):
            PolicyController(path, seed=bad)


def test_shuffled_joint_state_gives_the_same_commands(policy_files):
    a = PolicyController(policy_files["random"])
    b = PolicyController(policy_files["random"])
    perm = np.random.default_rng(0).permutation(12)
    pos = DEFAULT + np.random.default_rng(1).normal(size=12) * 0.1
    js_a = joint_state(JOINTS, pos, np.zeros(12))
    js_b = joint_state([JOINTS[i] for i in perm], pos[perm], np.zeros(12))
    a.activate(0.0, js_a)
    b.activate(0.0, js_b)
    for k in range(60):
        t = 0.02 * k
        np.testing.assert_array_equal(a.step(js_a, imu(), t, t), b.step(js_b, imu(), t, t))


def test_nan_or_missing_joint_never_reaches_the_output(policy_files):
    c = PolicyController(policy_files["random"], watchdog_timeout_s=0.1)
    js, im = _inputs()
    c.activate(0.0, js)
    for k in range(10):
        c.step(js, im, 0.02 * k, 0.02 * k)
    held = c.step(js, im, 0.2, 0.2)
    bad = DEFAULT.copy()
    bad[[0, 7]] = math.nan
    nan_js = joint_state(JOINTS, bad, np.zeros(12))
    outs = []
    for k in range(11, 30):  # NaN readings arrive fresh every step
        t = 0.02 * k
        outs.append(c.step(nan_js, im, t, t))
    outs = np.array(outs)
    assert np.isfinite(outs).all()
    np.testing.assert_allclose(outs[0], held)  # first: hold the last output
    # a NaN reading does not feed the watchdog: after its timeout, the safe posture
    np.testing.assert_allclose(outs[-1], c.safe_posture)
    assert c.safety.counters["watchdog"] > 0 and c.counters["bad_observation"] >= 19
    # a JointState without one of the joints: also never a NaN out
    short = joint_state(JOINTS[1:], DEFAULT[1:], np.zeros(11))
    assert np.isfinite(c.step(short, im, 0.62, 0.62)).all()
    assert "FL_hip_joint" in c.last_error


def test_stale_sensors_trip_the_watchdog_and_recovery_ramps_in(policy_files):
    c = PolicyController(policy_files["random"], watchdog_timeout_s=0.1, ramp_in_s=0.5)
    js, im = _inputs()
    c.activate(0.0, js)
    for k in range(30):
        c.step(js, im, 0.02 * k, 0.02 * k)
    # the sensors stop at t = 0.58: 0.1 s later the output is the safe posture
    out = None
    for k in range(30, 40):
        out = c.step(js, im, 0.58, 0.02 * k)
    np.testing.assert_allclose(out, c.safe_posture)
    assert c.safety.counters["watchdog"] >= 1


def test_deactivate_sends_the_safe_posture(policy_files):
    c = PolicyController(policy_files["random"], ramp_in_s=0.0)
    js, im = _inputs(DEFAULT + 0.1)
    c.activate(0.0, js)
    out = c.step(js, im, 0.0, 0.0)
    assert not np.allclose(out, c.safe_posture)
    c.deactivate()
    np.testing.assert_allclose(c.step(js, im, 0.02, 0.02), c.safe_posture)
    np.testing.assert_allclose(c.last_action, 0.0)  # the safe posture is the default pose


def test_ramp_in_starts_from_the_measured_posture(policy_files):
    c = PolicyController(policy_files["stand"], ramp_in_s=1.0, max_target_speed=math.inf)
    crouched = DEFAULT + np.array([0, 0.3, -0.3] * 4)
    js, im = _inputs(crouched)
    c.activate(0.0, js)
    np.testing.assert_allclose(c.step(js, im, 0.0, 0.0), crouched)
    np.testing.assert_allclose(c.step(js, im, 0.5, 0.5), 0.5 * crouched + 0.5 * DEFAULT)
    np.testing.assert_allclose(c.step(js, im, 1.0, 1.0), DEFAULT)


def test_command_is_clipped_and_times_out(policy_files):
    c = PolicyController(
        policy_files["stand"], command_timeout_s=0.5, command_limits=(1.0, 0.5, 1.0)
    )
    js, im = _inputs()
    c.activate(0.0, js)
    c.set_command(3.0, -2.0, 0.2, 0.0)
    c.step(js, im, 0.0, 0.0)
    np.testing.assert_allclose(c.command, [1.0, -0.5, 0.2])
    c.step(js, im, 0.6, 0.6)  # no command for 0.6 s: stand still
    np.testing.assert_allclose(c.command, 0.0)
    assert c.counters["command_timeout"] == 1
    assert not c.set_command(math.nan, 0.0, 0.0, 0.7)
    c.step(js, im, 0.7, 0.7)
    np.testing.assert_allclose(c.command, 0.0)
    assert c.counters["bad_command"] == 1


def test_loop_stats():
    s = LoopStats(0.01, window=100, log_capacity=1000)
    for k in range(200):
        tick = k * 0.01 + (0.001 if k % 10 == 0 else 0.0)
        s.record(tick, tick + 0.0002, 1000.0 + tick + 0.0003, 1000.0 + tick - 0.002)
    out = s.summary()
    assert out["steps"] == 200
    assert out["rate_hz"] == pytest.approx(100.0, rel=0.02)
    assert out["jitter_max_ms"] == pytest.approx(1.0, abs=1e-6)
    assert out["latency_p50_ms"] == pytest.approx(2.3, abs=1e-3)
    assert out["compute_p50_ms"] == pytest.approx(0.2, abs=1e-6)
