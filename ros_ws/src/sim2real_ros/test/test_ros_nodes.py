"""The ROS 2 nodes as separate processes, over real DDS (Fast DDS, localhost only).

Each test gets its own ROS_DOMAIN_ID and namespace, starts the nodes exactly as the
launch files do (``python -m sim2real_ros.<node> --ros-args --params-file config/...``),
talks to them from an rclpy node in the test process, and stops them in ``finally``.

- safety over the wire, against a fake robot publishing from the test: NaN joint
  positions never produce a NaN command; sensors that stop -> the safe posture within
  the watchdog timeout; ``deactivate`` -> the safe posture; a policy the node cannot
  run -> configure fails;
- the simulated robot with a standing policy: it stands, and the loop runs at rate;
- closed loop with the trained policy (tests/data/quadruped_policy.onnx): the simulated
  quadruped follows a forward command for 20 s without falling, with a tracking error
  close to sim2sim's on the same command.
"""

from __future__ import annotations

import array
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ros_support import export_test_flow_policy, export_test_policy
from sim2real_ros import ros_env

from deploy.metadata import read_metadata

PKG = Path(__file__).resolve().parent.parent  # ros_ws/src/sim2real_ros (conftest: on sys.path)
ROOT = PKG.parents[2]  # the repository

OK, WHY = ros_env.ros_available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)

# SIM2REAL_ROS_TEST_POLICY points the closed-loop test at another export (a run in progress)
TRAINED_POLICY = Path(
    os.environ.get("SIM2REAL_ROS_TEST_POLICY", ROOT / "tests" / "data" / "quadruped_policy.onnx")
)
GO1_POLICY = ROOT / "tests" / "data" / "go1_policy.onnx"
POLICY_YAML = PKG / "config" / "policy.yaml"
SIM_YAML = PKG / "config" / "sim.yaml"
JOINTS = [
    f"{leg}_{part}_joint" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")
]
DEFAULT = np.array([0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5])
POLICY_NODE = "sim2real_policy"


class Harness:
    """The test's side of the wire: an rclpy node in its own context and domain."""

    def __init__(self, domain_id: int, namespace: str) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseStamped, Twist, TwistStamped
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import Imu, JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.node = rclpy.create_node("test_harness", namespace=namespace, context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.JointState, self.Imu, self.Twist = JointState, Imu, Twist
        n = self.node
        self.js_pub = n.create_publisher(JointState, "joint_states", 10)
        self.imu_pub = n.create_publisher(Imu, "imu/data", 10)
        self.twist_pub = n.create_publisher(Twist, "cmd_vel", 10)
        self.commands: list[tuple[float, np.ndarray]] = []
        self.diagnostics: dict[str, dict[str, str]] = {}
        self.twists: list[tuple[float, np.ndarray]] = []
        self.poses: list[tuple[float, np.ndarray]] = []
        n.create_subscription(
            Float64MultiArray, "forward_position_controller/commands", self._on_command, 100
        )
        n.create_subscription(DiagnosticArray, "diagnostics", self._on_diag, 10)
        self.trajectories: list = []
        n.create_subscription(
            JointTrajectory, "joint_trajectory", lambda m: self.trajectories.append(m), 100
        )
        n.create_subscription(TwistStamped, "ground_truth/twist", self._on_twist, 100)
        # the PD gains: latched, so a subscriber must ask for transient local to get them
        self.gains_qos = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.gains: list = []
        n.create_subscription(Float64MultiArray, "pd_gains", self.gains.append, self.gains_qos)
        self.Float64MultiArray = Float64MultiArray
        n.create_subscription(PoseStamped, "ground_truth/pose", self._on_pose, 100)
        self.lifecycle = ros_env.LifecycleClient(n, self.executor, f"{namespace}/{POLICY_NODE}")
        self._sensor_qos = qos_profile_sensor_data

    def _on_command(self, msg):
        self.commands.append((time.monotonic(), np.array(msg.data)))

    def _on_diag(self, msg):
        for s in msg.status:
            self.diagnostics[s.name.split(":")[0]] = {kv.key: kv.value for kv in s.values}

    def _on_twist(self, msg):
        t, a = msg.twist.linear, msg.twist.angular
        self.twists.append((time.monotonic(), np.array([t.x, t.y, t.z, a.x, a.y, a.z])))

    def _on_pose(self, msg):
        p = msg.pose.position
        o = msg.pose.orientation
        self.poses.append((time.monotonic(), np.array([p.x, p.y, p.z, o.w, o.x, o.y, o.z])))

    def publish_sensors(self, pos=DEFAULT, names=JOINTS):
        js = self.JointState()
        now = time.time()
        js.header.stamp.sec = int(now)
        js.header.stamp.nanosec = int((now - int(now)) * 1e9)
        js.name = list(names)
        js.position = array.array("d", np.asarray(pos, dtype=np.float64).tobytes())
        js.velocity = array.array("d", bytes(8 * len(names)))
        self.js_pub.publish(js)
        imu = self.Imu()
        imu.header.stamp = js.header.stamp
        imu.orientation.w = 1.0
        self.imu_pub.publish(imu)

    def send_command(self, vx, vy=0.0, wz=0.0):
        msg = self.Twist()
        msg.linear.x, msg.linear.y, msg.angular.z = float(vx), float(vy), float(wz)
        self.twist_pub.publish(msg)

    def spin_for(self, seconds, sensors_hz=0.0, pos=DEFAULT, names=JOINTS, until=None, cmd=None):
        """Spin (and publish sensors at ``sensors_hz``) for ``seconds`` or until ``until()``."""
        end = time.monotonic() + seconds
        period = 1.0 / sensors_hz if sensors_hz else math.inf
        next_pub = time.monotonic()
        next_cmd = time.monotonic()
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_pub:
                self.publish_sensors(pos, names)
                next_pub = max(next_pub + period, now)
            if cmd is not None and now >= next_cmd:
                self.send_command(*cmd)
                next_cmd = now + 0.1
            self.executor.spin_once(timeout_sec=min(0.01, max(0.0, min(next_pub, end) - now)))
            if until is not None and until():
                return True
        return until is None

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self.ctx.try_shutdown()


@pytest.fixture(scope="module")
def test_policies(tmp_path_factory):
    root = tmp_path_factory.mktemp("ros_node_policies")
    return {
        "stand": export_test_policy(root / "stand.onnx", gain=0.0),
        "random": export_test_policy(root / "random.onnx", gain=1.0, seed=2),
        "unknown_term": export_test_policy(
            root / "lin_vel.onnx",
            obs_terms=[("base_lin_vel", 3), ("joint_pos", 12), ("last_action", 12)],
        ),
        "flow": export_test_flow_policy(root / "flow.onnx", horizon=4, act_steps=2, steps=4),
    }


@pytest.fixture
def ros_setup(tmp_path, request, monkeypatch):
    """(domain id, namespace, harness, spawn(...)); every process is stopped at the end."""
    # the test's own rclpy context discovers on localhost only, like the nodes
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    domain = ros_env.next_domain_id()
    ns = f"/t{os.getpid()}_{domain}_{request.node.name[:20].replace('[', '_').replace(']', '')}"
    ns = "".join(ch if ch.isalnum() or ch in "/_" else "_" for ch in ns)
    procs = []
    logs = []

    def spawn(module, **kwargs):
        log = tmp_path / f"{module.split('.')[-1]}_{len(procs)}.log"
        logs.append(log)
        proc = ros_env.spawn_node(module, domain_id=domain, namespace=ns, log_path=log, **kwargs)
        proc.log_path = log  # what the node logged, for tests that check it
        procs.append(proc)
        return proc

    harness = Harness(domain, ns)
    try:
        yield domain, ns, harness, spawn
    finally:
        codes = [ros_env.stop_process(p) for p in procs]
        harness.close()
        for log in logs:  # shown by pytest only when the test fails
            print(f"----- {log.name} -----\n{log.read_text(errors='replace')[-4000:]}")
        print("exit codes:", codes)


def _policy_params(path, **extra):
    params = {"policy_path": str(path), "diagnostics_period_s": 0.5}
    params.update(extra)
    return params


def _wait_commands(h, count, seconds, **spin):
    start = len(h.commands)
    return h.spin_for(seconds, until=lambda: len(h.commands) >= start + count, **spin)


# ---------------------------------------------------------------------- what the robot loads
def test_policy_node_process_loads_nothing_of_training():
    """Importing the policy node, as the robot does, loads no torch, sim, training or export."""
    forbidden = ("torch", "sim", "training", "policies", "mujoco")
    code = (
        "import sys, sim2real_ros.policy_node\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r} "
        "or m == 'deploy.export'))"
    )
    # the repository is on PYTHONPATH, so sim and torch could be imported: they must not be
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=ros_env.node_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# ---------------------------------------------------------------------- safety over the wire
def test_safety_over_the_wire(ros_setup, test_policies):
    _, _, h, spawn = ros_setup
    watchdog = 0.1
    spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(
            test_policies["random"],
            autostart="activate",
            watchdog_timeout_s=watchdog,
            ramp_in_s=0.2,
        ),
    )
    # the node activates once fresh sensor data arrives; joints sent in reverse order
    assert _wait_commands(h, 25, 30.0, sensors_hz=100, pos=DEFAULT[::-1], names=JOINTS[::-1]), (
        "no commands from the policy node"
    )
    assert h.lifecycle.state() == "active"
    cmds = np.array([c for _, c in h.commands])
    assert cmds.shape[1] == 12 and np.isfinite(cmds).all()
    assert not np.allclose(cmds[-1], DEFAULT)  # the untrained policy moves the joints

    # 1. NaN joint positions: no NaN leaves the node (hold, then the safe posture)
    nan_pos = DEFAULT.copy()
    nan_pos[[2, 9]] = math.nan
    n0 = len(h.commands)
    h.spin_for(0.6, sensors_hz=100, pos=nan_pos)
    during = np.array([c for _, c in h.commands[n0:]])
    assert len(during) >= 15 and np.isfinite(during).all()
    np.testing.assert_allclose(during[-1], DEFAULT)  # NaN readings do not feed the watchdog

    # 2. recovery, then the sensors stop: the safe posture within the watchdog timeout
    assert _wait_commands(h, 30, 10.0, sensors_hz=100)
    assert not np.allclose(h.commands[-1][1], DEFAULT)
    h.spin_for(0.05, sensors_hz=100)
    t_stop = time.monotonic()
    h.spin_for(0.5)  # no sensors
    after = [(t - t_stop, c) for t, c in h.commands if t > t_stop]
    posture_at = next(t for t, c in after if np.allclose(c, DEFAULT))
    # watchdog timeout + one control period + transport (generous for a loaded CI machine)
    assert posture_at <= watchdog + 0.02 + 0.1, posture_at
    assert all(np.allclose(c, DEFAULT) for t, c in after if t > posture_at)

    # 3. deactivate: the safe posture, sent on while inactive
    assert _wait_commands(h, 30, 10.0, sensors_hz=100)
    assert not np.allclose(h.commands[-1][1], DEFAULT)
    assert h.lifecycle.transition("deactivate")
    assert h.lifecycle.state() == "inactive"
    n0 = len(h.commands)
    h.spin_for(0.3, sensors_hz=100)
    tail = [c for _, c in h.commands[n0:]]
    assert len(tail) >= 5 and all(np.allclose(c, DEFAULT) for c in tail)

    # the diagnostics count what happened (a report made after the deactivation)
    h.diagnostics.clear()
    h.spin_for(2.0, sensors_hz=100, until=lambda: POLICY_NODE in h.diagnostics)
    d = h.diagnostics[POLICY_NODE]
    assert d["state"] == "inactive"
    assert int(d["safety.watchdog"]) > 0 and int(d["safety.nonfinite_obs"]) > 0
    assert int(d["safety.bad_observation"]) > 0 and int(d["safety.inactive"]) > 0
    assert float(d["rate_hz"]) > 40.0

    # reactivating ramps back in
    assert h.lifecycle.transition("activate")
    assert _wait_commands(h, 10, 5.0, sensors_hz=100)


def test_activation_refused_without_sensors_and_configure_fails_on_unusable_policy(
    ros_setup, test_policies
):
    _, ns, h, spawn = ros_setup
    spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(test_policies["unknown_term"], autostart="none"),
        name="bad_policy",
    )
    spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(
            test_policies["stand"], autostart="configure", publish_trajectory=True
        ),
    )
    bad = ros_env.LifecycleClient(h.node, h.executor, f"{ns}/bad_policy")
    assert bad.wait_for_state("unconfigured", timeout=30.0)
    assert not bad.transition("configure")  # base_lin_vel has no ROS source
    assert bad.state() == "unconfigured"
    assert h.lifecycle.wait_for_state("inactive", timeout=30.0)
    assert not h.lifecycle.transition("activate")  # no sensor data: refused
    h.spin_for(0.3)
    assert h.commands == [] and h.gains == []  # configured, never activated: nothing sent
    h.spin_for(0.3, sensors_hz=100)
    assert h.lifecycle.transition("activate")
    assert _wait_commands(h, 10, 5.0, sensors_hz=100)
    np.testing.assert_allclose(h.commands[-1][1], DEFAULT)  # a standing policy
    # the trained gains (nothing overrides them), kp then kd, in the command's joint order
    meta = read_metadata(test_policies["stand"])
    assert h.gains, "no PD gains from the policy node"
    np.testing.assert_array_equal(h.gains[-1].data, meta.kp + meta.kd)
    # the optional JointTrajectory carries the same targets, with the joint names
    h.spin_for(0.2, sensors_hz=100)
    assert h.trajectories
    traj = h.trajectories[-1]
    assert list(traj.joint_names) == JOINTS and len(traj.points) == 1
    np.testing.assert_allclose(traj.points[0].positions, DEFAULT)
    assert traj.points[0].time_from_start.nanosec == 20_000_000  # one control period
    h.diagnostics.clear()
    h.spin_for(2.0, sensors_hz=100, until=lambda: POLICY_NODE in h.diagnostics)
    d = h.diagnostics[POLICY_NODE]
    assert {"rate_hz", "latency_p50_ms", "latency_p99_ms", "jitter_p99_ms"} <= set(d)
    assert 0.0 < float(d["latency_p50_ms"]) < 100.0  # JointState stamp -> command sent


def test_gains_logged_at_configure_overrides_warned_and_sent_latched_at_activation(
    ros_setup, test_policies
):
    _, _, h, spawn = ros_setup
    meta = read_metadata(test_policies["stand"])
    kp = list(meta.kp)
    kp[1], kp[11] = kp[1] + 5.0, kp[11] - 5.0  # FL_thigh_joint, RR_calf_joint
    node = spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(test_policies["stand"], autostart="configure", kp=kp),
    )
    assert h.lifecycle.wait_for_state("inactive", timeout=30.0)
    log = node.log_path.read_text()
    # the joint names in the commands' order, each with the gains to set on the robot
    table = log[log.index("joints in command order") :].splitlines()[1:13]
    assert [line.split()[1] for line in table] == JOINTS, table
    for line, joint_kp, joint_kd in zip(table, kp, meta.kd):
        assert f"kp {joint_kp:g}" in line and f"kd {joint_kd:g}" in line, line
    assert "overridden by the kp/kd parameters" in log
    # the override, joint by joint with both values; kd is the trained one: no warning
    warning = next(line for line in log.splitlines() if "differs from the gains" in line)
    assert warning.startswith("[WARN]"), warning
    assert (
        f"kp differs from the gains the policy was trained with: FL_thigh_joint {kp[1]:g} "
        f"(trained {meta.kp[1]:g}), RR_calf_joint {kp[11]:g} (trained {meta.kp[11]:g})"
    ) in warning, warning
    assert "kd differs" not in log

    h.spin_for(0.3, sensors_hz=100)
    assert h.gains == []  # configured: nothing sent yet
    assert h.lifecycle.transition("activate")
    assert h.spin_for(5.0, sensors_hz=100, until=lambda: bool(h.gains))
    msg = h.gains[-1]
    np.testing.assert_array_equal(msg.data, kp + meta.kd)  # what the parameters say
    assert [(d.label, d.size, d.stride) for d in msg.layout.dim] == [
        ("kp_kd", 2, 24),
        ("joints", 12, 12),
    ]
    # latched: a driver that subscribes later still gets them
    late: list = []
    h.node.create_subscription(h.Float64MultiArray, "pd_gains", late.append, h.gains_qos)
    assert h.spin_for(5.0, until=lambda: bool(late)), "the gains are not latched"
    np.testing.assert_array_equal(late[0].data, kp + meta.kd)


# ---------------------------------------------------------------------- with the simulated robot
def _tracking(h, t_from, cmd):
    v = np.array([x for t, x in h.twists if t >= t_from])
    err = np.linalg.norm(v[:, :2] - np.asarray(cmd)[None, :2], axis=1)
    return float(err.mean()), v


def test_simulated_robot_stands_with_a_standing_policy(ros_setup, test_policies):
    _, _, h, spawn = ros_setup
    spawn("sim2real_ros.sim_robot_node", params_files=[SIM_YAML])
    spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(test_policies["stand"], autostart="activate"),
    )
    assert h.spin_for(60.0, until=lambda: len(h.commands) >= 10), "loop did not start"
    t0 = time.monotonic()
    h.spin_for(3.0)
    poses = np.array([p for t, p in h.poses if t > t0])
    assert len(poses) > 50  # ground truth at 50 Hz (of simulated time)
    assert poses[:, 2].min() > 0.2  # standing: the base stays up
    assert np.abs(poses[:, :2] - poses[0, :2]).max() < 0.05  # and in place
    h.diagnostics.clear()
    h.spin_for(2.5, until=lambda: "sim_robot" in h.diagnostics and POLICY_NODE in h.diagnostics)
    sim, pol = h.diagnostics["sim_robot"], h.diagnostics[POLICY_NODE]
    assert sim["fallen"] == "False" and int(sim["commands"]) > 100
    assert float(pol["rate_hz"]) > 40.0 and pol["state"] == "active"
    cmds = np.array([c for _, c in h.commands])
    assert np.isfinite(cmds).all() and np.allclose(cmds[-1], DEFAULT)


@pytest.fixture(scope="module")
def world_model_policy(tmp_path_factory):
    """The world-model learner's exported actor for the quadruped, from a tiny run of
    the real learner (untrained, but through the same export as any trained run)."""
    import torch

    from training.export import export_run
    from training.off_policy_runner import OffPolicyRunner
    from training.train_configs import build_world_model_config

    root = tmp_path_factory.mktemp("ros_world_model")
    overrides = [
        "run.progress=false", "run.tensorboard=false", "run.video=false",
        "run.eval_planner=false", "run.total_steps=24", "env.num_envs=2",
        "policy.hidden=32", "policy.latent_dim=16", "policy.encoder_hidden=32",
        "policy.num_bins=21", "tdmpc.batch_size=8", "tdmpc.seed_steps=8",
        "planner.iterations=1", "planner.num_samples=8", "planner.num_elites=2",
        "planner.num_pi_trajs=2",
    ]  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runner = OffPolicyRunner(build_world_model_config("quadruped", overrides), root / "run")
    try:
        runner.train()
    finally:
        runner.close()
        torch.set_num_threads(threads)
    return export_run(root / "run", root / "world_model.onnx")


def _drive_simulated_robot(ros_setup, path, family: str, **params):
    """Run the policy node with `path` against the simulated robot for 2 s once its loop
    has started; check the node is active at rate with `family`, and every command
    finite and within the joint limits. Returns (commands of those 2 s, node process)."""
    _, _, h, spawn = ros_setup
    meta = read_metadata(path)
    spawn("sim2real_ros.sim_robot_node", params_files=[SIM_YAML])
    node = spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(path, autostart="activate", ramp_in_s=0.0, **params),
    )
    assert h.spin_for(60.0, until=lambda: len(h.commands) >= 10), "loop did not start"
    t0 = time.monotonic()
    h.spin_for(2.0)
    h.diagnostics.clear()
    h.spin_for(2.5, until=lambda: POLICY_NODE in h.diagnostics)
    pol = h.diagnostics[POLICY_NODE]
    assert pol["policy_family"] == family and pol["state"] == "active"
    assert float(pol["rate_hz"]) > 40.0
    cmds = np.array([c for t, c in h.commands if t > t0])
    assert len(cmds) > 50 and np.isfinite(cmds).all()
    lo, hi = np.asarray(meta.joint_pos_lower), np.asarray(meta.joint_pos_upper)
    assert (cmds >= lo - 1e-9).all() and (cmds <= hi + 1e-9).all()
    return cmds, node


def test_the_world_model_learners_actor_drives_the_simulated_robot(ros_setup, world_model_policy):
    """The world-model learner's export is a plain feed-forward actor with the robot's
    metadata: the unchanged policy node runs it against the simulated robot."""
    meta = read_metadata(world_model_policy)
    assert meta.extra["checkpoint_kind"] == "world_model" and meta.task == "quadruped"
    cmds, _ = _drive_simulated_robot(ros_setup, world_model_policy, "gaussian_mlp")
    # the actor's targets, not the safe posture (the default pose) held by a node
    # that does not run its policy
    assert np.abs(cmds - DEFAULT).max() > 1e-3


def test_a_flow_policy_drives_the_simulated_robot(ros_setup, test_policies):
    """A generative policy over the wire: a flow policy (noise input, chunks of 4 of
    which 2 run) on the policy node against the simulated robot, sampling with its seed."""
    cmds, node = _drive_simulated_robot(ros_setup, test_policies["flow"], "flow", seed=3)
    # sampled chunks: the targets move around the default pose, every joint
    assert (cmds.std(axis=0) > 1e-3).all()
    assert np.abs(cmds.mean(axis=0) - DEFAULT).max() < 0.2
    assert "flow policy sampling with noise seed 3" in node.log_path.read_text()


# the trained walking policies the closed loop runs: (task, file, lowest base height
# of a robot still on its feet; the Go1 stands 0.25 m high, the quadruped 0.3 m)
WALKERS = {
    "quadruped": (TRAINED_POLICY, 0.2),
    "go1": (GO1_POLICY, 0.15),
}
# A fall keeps the trunk down; a stride's dip does not. The Go1 policy walks with its
# trunk at 0.15-0.18 m, on its training's termination height, and over ROS (timing
# jitter on a shared machine) one 50 Hz sample now and then reads 0.145 m: the robot
# is on its feet. So a fall is the trunk below the height for longer than this, or tipped.
FALL_SECONDS = 0.2
POSE_HZ = 50.0  # ground truth is published at 50 Hz of simulated time


def _fell(poses: np.ndarray, min_height: float) -> str:
    """Why the trunk trajectory (x, y, z, qw, qx, qy, qz rows) is a fall, or ''."""
    low = poses[:, 2] < min_height
    longest = run = 0
    for is_low in low:
        run = run + 1 if is_low else 0
        longest = max(longest, run)
    if longest / POSE_HZ > FALL_SECONDS:
        return f"trunk below {min_height} m for {longest / POSE_HZ:.2f} s (min {poses[:, 2].min():.3f})"
    # the body z axis's vertical component: 1 upright, 0 on its side
    up = 1.0 - 2.0 * (poses[:, 4] ** 2 + poses[:, 5] ** 2)
    if up.min() < 0.5:
        return f"trunk tipped past 60 degrees (up component {up.min():.2f})"
    return ""


def test_fall_is_a_sustained_low_trunk_or_a_tip_not_a_strides_dip():
    upright = np.array([0.0, 0.0, 0.17, 1.0, 0.0, 0.0, 0.0])
    poses = np.tile(upright, (500, 1))
    assert _fell(poses, 0.15) == ""
    poses[100, 2] = poses[300:305, 2] = 0.145  # one sample, then 0.1 s: dips
    assert _fell(poses, 0.15) == ""
    poses[400:420, 2] = 0.08  # 0.4 s down: fallen
    assert "for 0.40 s" in _fell(poses, 0.15)
    tipped = np.tile(upright, (10, 1))
    tipped[5, 3:] = [np.cos(0.6), np.sin(0.6), 0.0, 0.0]  # rolled 69 degrees
    assert "tipped" in _fell(tipped, 0.15)


@pytest.mark.parametrize("task", sorted(WALKERS))
def test_closed_loop_walk_follows_forward_command(ros_setup, task):
    path, min_height = WALKERS[task]
    if not path.exists():
        pytest.skip(f"needs the trained {task} policy {path} (made as tests/data/README.md says)")
    _, _, h, spawn = ros_setup
    cmd = (0.5, 0.0, 0.0)
    spawn(
        "sim2real_ros.sim_robot_node",
        params_files=[SIM_YAML],
        # joints by name over the wire too
        params={"task": task, "joint_state_order": JOINTS[::-1]},
    )
    spawn(
        "sim2real_ros.policy_node",
        params_files=[POLICY_YAML],
        params=_policy_params(path, autostart="activate"),
    )
    assert h.spin_for(60.0, until=lambda: len(h.commands) >= 10, cmd=cmd), "loop did not start"
    t0 = time.monotonic()
    h.spin_for(20.0, cmd=cmd)
    poses = np.array([p for t, p in h.poses if t > t0])
    fell = _fell(poses, min_height)
    assert not fell, f"the robot fell: {fell}"
    sim = h.diagnostics["sim_robot"]
    # the comparison with sim2sim holds only if the simulated robot kept real time: a
    # loaded machine may make it drop a few short stretches (overruns), which matter
    # only if they add up to a noticeable part of the run
    assert float(sim["real_time_factor"]) > 0.9, sim
    assert float(sim["dropped_s"]) < 0.02 * float(sim["sim_time_s"]), sim
    ros_err, v = _tracking(h, t0 + 5.0, cmd)  # steady state: after ramp-in and speed-up
    sim_err = _sim2sim_tracking(path, cmd, skip_s=5.0, seconds=20.0, task=task)
    print(
        f"{task}: tracking error over ROS {ros_err:.3f} m/s, sim2sim {sim_err:.3f} m/s, "
        f"mean vx {v[:, 0].mean():.3f}, lowest trunk {poses[:, 2].min():.3f} m"
    )
    assert v[:, 0].mean() > 0.5 * cmd[0]
    assert ros_err <= sim_err + 0.1, (ros_err, sim_err)
    sim = h.diagnostics["sim_robot"]
    assert sim["fallen"] == "False"


def test_simulated_robot_randomization_and_latency(monkeypatch):
    """randomize: the training's draws; extra latency: a command acts only after it."""
    import rclpy
    from sim2real_ros.sim_robot_node import SimRobotNode
    from std_msgs.msg import Float64MultiArray

    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    ctx = rclpy.Context()
    args = ["--ros-args", "-p", "randomize:=true", "-p", "extra_latency_s:=0.05", "-p", "seed:=3"]
    rclpy.init(context=ctx, domain_id=ros_env.next_domain_id(), args=args)
    try:
        node = SimRobotNode(context=ctx, namespace=f"/t{os.getpid()}_rand")
        try:
            from sim.tasks.quadruped import Quadruped

            nominal = Quadruped(1, s2r=None).model
            assert node.randomize and node.latency_steps in (0, 1)
            assert not np.allclose(node.model.body_mass, nominal.body_mass)  # drawn masses
            assert node._noise and node.s2r.push_interval_s  # sensor noise, pushes
            delay = node.latency_steps * node.control_dt + 0.05
            target = DEFAULT + 0.2
            msg = Float64MultiArray()
            msg.data = array.array("d", target.tobytes())
            act = node._act
            ctrl_before = node.data.ctrl[act].copy()

            clock = [node.clock.t0 + node.steps * node.dt]  # the node's wall clock, faked
            monkeypatch.setattr(node.clock, "_monotonic", lambda: clock[0])

            def advance(seconds):  # run the real-time loop as if that much time passed
                for _ in range(round(seconds / 0.004)):
                    clock[0] += 0.004
                    node._on_timer()

            t_cmd = node.data.time
            node._on_command(msg)
            advance(delay - 0.012)
            np.testing.assert_allclose(node.data.ctrl[act], ctrl_before)  # not yet
            advance(0.02)
            assert node.data.time >= t_cmd + delay
            np.testing.assert_allclose(node.data.ctrl[act], target)  # now applied
        finally:
            node.destroy_node()
    finally:
        ctx.try_shutdown()


def _sim2sim_tracking(path, cmd, skip_s, seconds, num_envs=4, task="quadruped"):
    """Mean |cmd - v_xy| of the policy in the simulator, through deploy's sim2sim actor."""
    import torch

    from deploy.runtime import OnnxPolicy
    from deploy.sim2sim import Sim2SimActor
    from sim.randomization import SimToRealConfig
    from sim.registry import make

    policy = OnnxPolicy(path, deterministic=True)
    env = make(task, num_envs, seed=0, s2r=SimToRealConfig(), fixed_command=cmd)
    try:
        # the robot's safety settings (ramp-in, rate limit), as the node runs them
        actor = Sim2SimActor(policy, num_envs, env.dt, strict_safety=True)
        obs = env.reset()
        reset = torch.ones(num_envs, dtype=torch.bool)
        errs = []
        for k in range(int(seconds / env.dt)):
            obs, _, term, trunc, info = env.step(torch.as_tensor(actor(obs, reset)))
            reset = term | trunc
            if k * env.dt >= skip_s:
                errs.append(info["lin_vel_error"].numpy())
        return float(np.mean(errs))
    finally:
        env.close()
