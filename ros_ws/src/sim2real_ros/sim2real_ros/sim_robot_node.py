"""A simulated robot on ROS 2: our MuJoCo model of the task's robot, stepped in real time.

It stands in for the robot, so that the very launch that will run on the robot can be
rehearsed against it: it subscribes to the joint position targets the policy node sends
(``std_msgs/Float64MultiArray``, the forward command controller's interface, joints in
``command_joint_names`` order) and publishes ``sensor_msgs/JointState`` and
``sensor_msgs/Imu`` at the sensor rate, as the robot's drivers would.

The model, its standing start pose and the PD gains are the training task's
(``sim.make(task)``; the MJCF's position actuators apply the PD law at every physics step,
to the latest target). With ``randomize: true`` the task's sim-to-real defaults apply, as
in training: masses, friction, motor strength and gains drawn at start, sensor noise and
per-run bias, an action latency of 0..k control steps, random pushes. ``extra_latency_s``
adds a fixed delay on top (a robot's bus).

Real time: a timer at the sensor rate steps as many physics steps as the wall clock asks
for (``real_time_factor`` scales it), catching up at most ``max_catchup_steps`` at once;
time it cannot catch up is dropped and counted (``overruns`` and ``dropped_s``, the
simulated seconds lost, in the diagnostics). A command is applied at the next physics
step after it arrives (within a sensor period).

Ground truth for tests and plots: ``ground_truth/twist`` (``geometry_msgs/TwistStamped``,
base velocity in the body frame) and ``ground_truth/pose`` (``geometry_msgs/PoseStamped``,
world frame) at ``ground_truth_rate_hz``.

This node imports ``sim`` (our simulator): it is the simulated robot, not robot code. It
reads the task through ``sim``'s public API only (``make``, ``robot``, ``joint_indices``,
``engine.get_model``/``get_data``), so that the task may change its internals.
"""

from __future__ import annotations

import array
import collections
import copy
import math
import sys
from typing import Any

import mujoco
import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped, TwistStamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from sim2real_ros.node_runtime import set_realtime, spin
from sim2real_ros.sim_clock import SimClock

NODE_NAME = "sim_robot"

SENSOR_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
)
COMMAND_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
)

PARAMETERS: dict[str, Any] = {
    "task": "quadruped",
    "model_path": "",
    "seed": 0,
    "randomize": False,
    "extra_latency_s": 0.0,
    "sensor_rate_hz": 250.0,
    "real_time_factor": 1.0,
    "max_catchup_steps": 25,
    "joint_states_topic": "joint_states",
    "imu_topic": "imu/data",
    "command_topic": "forward_position_controller/commands",
    "command_joint_names": Parameter.Type.STRING_ARRAY,  # unset: the robot's joint order
    "joint_state_order": Parameter.Type.STRING_ARRAY,
    "ground_truth_rate_hz": 50.0,
    "imu_frame_id": "base",
    "diagnostics_topic": "diagnostics",
    "rt_priority": 0,
}
"""Parameter names and defaults (``config/sim.yaml`` documents each)."""

GRAVITY = 9.81


def _quat_xyzw_rot(q_wxyz: np.ndarray) -> np.ndarray:
    rot = np.empty(9)
    mujoco.mju_quat2Mat(rot, q_wxyz)
    return rot.reshape(3, 3)


def _small_rotation(angles: np.ndarray) -> np.ndarray:
    """Quaternion (w, x, y, z) of a rotation by the vector ``angles`` (rad)."""
    q = np.empty(4)
    mujoco.mju_axisAngle2Quat(
        q, angles / max(np.linalg.norm(angles), 1e-12), np.linalg.norm(angles)
    )
    return q


class SimRobotNode(Node):
    """See the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        for name, default in PARAMETERS.items():
            self.declare_parameter(name, default)
        p = self._param
        self._build_sim(p("task"), p("model_path"), int(p("seed")), bool(p("randomize")))
        self.dt = float(self.model.opt.timestep)
        self.rtf = float(p("real_time_factor"))
        if not self.rtf > 0:
            raise ValueError(f"real_time_factor must be > 0, got {self.rtf}")
        self.max_catchup = max(1, int(p("max_catchup_steps")))
        sensor_rate = float(p("sensor_rate_hz"))
        self.sensor_every = max(1, round(1.0 / (sensor_rate * self.dt))) if sensor_rate > 0 else 1
        gt_rate = float(p("ground_truth_rate_hz"))
        self.gt_every = max(1, round(1.0 / (gt_rate * self.dt))) if gt_rate > 0 else 0
        self.extra_latency = max(0.0, float(p("extra_latency_s")))

        # joint orders: the commands' and the published JointState's
        cmd_names = list(p("command_joint_names")) or list(self.joint_names)
        order = list(p("joint_state_order")) or list(self.joint_names)
        for what, names in (("command_joint_names", cmd_names), ("joint_state_order", order)):
            if sorted(names) != sorted(self.joint_names):
                raise ValueError(
                    f"{what} must be a permutation of the robot's joints {self.joint_names}, "
                    f"got {names}"
                )
        where = {n: i for i, n in enumerate(self.joint_names)}
        self._cmd_to_model = np.array([where[n] for n in cmd_names])
        self._pub_from_model = np.array([where[n] for n in order])
        self._pub_names = list(order)

        self._js_msg = JointState(name=self._pub_names)
        self._js_msg.header.frame_id = ""
        self._imu_msg = Imu()
        self._imu_msg.header.frame_id = str(p("imu_frame_id"))
        self._imu_msg.orientation_covariance[0] = 0.0
        self._js_pub = self.create_publisher(JointState, p("joint_states_topic"), SENSOR_QOS)
        self._imu_pub = self.create_publisher(Imu, p("imu_topic"), SENSOR_QOS)
        self._twist_pub = self.create_publisher(TwistStamped, "ground_truth/twist", 10)
        self._pose_pub = self.create_publisher(PoseStamped, "ground_truth/pose", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, p("diagnostics_topic"), 10)
        self.create_subscription(
            Float64MultiArray, p("command_topic"), self._on_command, COMMAND_QOS
        )

        self.counters = {"commands": 0, "bad_commands": 0, "overruns": 0, "falls": 0}
        self._pending: collections.deque[tuple[float, np.ndarray]] = collections.deque()
        self.steps = 0
        self._fallen = False
        self.clock = SimClock(self.dt, self.rtf, self.max_catchup)
        # one wake-up per sensor period (not per physics step: an rclpy timer callback
        # costs more than a physics step); each runs the physics steps that are due
        self.create_timer(self.sensor_every * self.dt / self.rtf, self._on_timer)
        self.create_timer(1.0, self._publish_diagnostics)
        problem = set_realtime(int(p("rt_priority")))
        if problem:
            self.get_logger().warning(problem)
        self._publish_sensors()
        self.get_logger().info(
            f"simulating {self.task!r} at {1 / self.dt:g} Hz physics, sensors every "
            f"{self.sensor_every} steps, randomize={self.randomize}, action latency "
            f"{self.latency_steps} control steps + {self.extra_latency * 1e3:g} ms"
        )

    def _param(self, name: str) -> Any:
        default = PARAMETERS[name]
        if isinstance(default, Parameter.Type):  # declared without a value: empty list
            return self.get_parameter_or(name, Parameter(name, default, [])).value
        return self.get_parameter(name).value

    # ------------------------------------------------------------------ the model
    def _build_sim(self, task: str, model_path: str, seed: int, randomize: bool) -> None:
        from sim.randomization import SimToRealConfig
        from sim.registry import make

        kwargs: dict[str, Any] = {}
        if model_path:
            kwargs["model_path"] = model_path
        env = make(task, 1, seed=seed, s2r=None if randomize else SimToRealConfig(), **kwargs)
        try:
            env.reset(seed=seed)
            robot = env.robot
            if robot.control_mode != "position":
                raise ValueError(f"task {task!r} is torque-controlled; this node drives positions")
            try:
                joints = env.joint_indices
            except ValueError as exc:
                raise ValueError(
                    f"task {task!r} has no single actuator per action joint ({exc}); the "
                    "simulated robot drives one position actuator per joint"
                ) from exc
            self.task, self.randomize = task, randomize
            self.s2r = env.s2r
            self.control_dt = float(robot.control_dt)
            self.joint_names = list(robot.joint_names)
            # the randomized model of env 0 and its reset state, as standalone copies
            self.model = copy.copy(env.engine.get_model(0))
            src = env.engine.get_data(0)
            self.data = mujoco.MjData(self.model)
            for field in ("qpos", "qvel", "act", "ctrl"):
                getattr(self.data, field)[:] = getattr(src, field)
            mujoco.mj_forward(self.model, self.data)
            self._act = joints.actuator_ids
            self._jqpos = joints.qpos_adr
            self._jdof = joints.dof_adr
            self._jlow = np.asarray(robot.joint_pos_lower, dtype=np.float64)
            self._jhigh = np.asarray(robot.joint_pos_upper, dtype=np.float64)
            self.default_joint_pos = np.asarray(robot.default_joint_pos, dtype=np.float64)
            self.floor_height = float(getattr(env, "floor_height", 0.0))
            self.min_base_height = float(getattr(env, "min_base_height", 0.0))
            self.max_tilt = float(getattr(env, "max_tilt", math.pi))
        finally:
            env.close()
        self.data.ctrl[self._act] = self.default_joint_pos
        rng = np.random.default_rng(seed + 7919)
        self._rng = rng
        s2r = self.s2r
        lo, hi = s2r.action_latency
        self.latency_steps = int(rng.integers(lo, hi + 1))
        self._noise = {k: float(v) for k, v in s2r.obs_noise.items()}
        self._bias = {
            k: rng.standard_normal(
                3 if k in ("base_ang_vel", "projected_gravity") else len(self.joint_names)
            )
            * float(v)
            for k, v in s2r.obs_bias.items()
        }
        self._next_push = rng.exponential(s2r.push_interval_s) if s2r.push_interval_s else math.inf

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg: Float64MultiArray) -> None:
        target = (
            np.frombuffer(msg.data, dtype=np.float64)
            if isinstance(msg.data, array.array)
            else np.asarray(msg.data, dtype=np.float64)
        )
        if target.shape != (len(self.joint_names),) or not np.isfinite(target).all():
            self.counters["bad_commands"] += 1
            return
        self.counters["commands"] += 1
        model_order = np.empty_like(target)
        model_order[self._cmd_to_model] = target
        delay = self.latency_steps * self.control_dt + self.extra_latency
        if delay <= 0 and not self._pending:
            self._apply(model_order)
        else:
            self._pending.append((self.data.time + delay, model_order))

    def _apply(self, target: np.ndarray) -> None:
        self.data.ctrl[self._act] = np.clip(target, self._jlow, self._jhigh)

    # ------------------------------------------------------------------ real time
    def _on_timer(self) -> None:
        due, dropped = self.clock.due(self.steps)
        if dropped:  # the simulation fell behind the wall clock by more than it may catch up
            self.counters["overruns"] += 1
        if due <= 0:
            return
        m, d = self.model, self.data
        publish = gt = False
        for _ in range(due):
            while self._pending and self._pending[0][0] <= d.time:
                self._apply(self._pending.popleft()[1])
            if d.time >= self._next_push:
                d.qvel[0:2] += self._rng.uniform(
                    -self.s2r.push_velocity, self.s2r.push_velocity, size=2
                )
                self._next_push = d.time + self._rng.exponential(self.s2r.push_interval_s)
            mujoco.mj_step(m, d)
            self.steps += 1
            publish |= self.steps % self.sensor_every == 0
            gt |= bool(self.gt_every) and self.steps % self.gt_every == 0
        if publish:
            self._publish_sensors()
        if gt:
            self._publish_ground_truth()

    def _stamp(self) -> tuple[int, int]:
        return self.clock.stamp(self.steps)

    def _publish_sensors(self) -> None:
        d = self.data
        sec, nsec = self._stamp()
        pos = d.qpos[self._jqpos].copy()
        vel = d.qvel[self._jdof].copy()
        gyro = d.qvel[3:6].copy()  # a free joint's angular velocity is in the body frame
        quat = d.qpos[3:7].copy()  # (w, x, y, z), body to world
        rng = self._rng
        for term, std in self._noise.items():
            if std <= 0:
                continue
            if term == "joint_pos":
                pos += rng.standard_normal(pos.size) * std
            elif term == "joint_vel":
                vel += rng.standard_normal(vel.size) * std
            elif term == "base_ang_vel":
                gyro += rng.standard_normal(3) * std
            elif term == "projected_gravity":
                # a tilt of the reported orientation moves projected gravity by ~std
                tilt = np.zeros(3)
                tilt[:2] = rng.standard_normal(2) * std
                out = np.empty(4)
                mujoco.mju_mulQuat(out, quat, _small_rotation(tilt))
                quat = out
        for term, bias in self._bias.items():
            if term == "joint_pos":
                pos += bias
            elif term == "joint_vel":
                vel += bias
            elif term == "base_ang_vel":
                gyro += bias
        js = self._js_msg
        js.header.stamp.sec, js.header.stamp.nanosec = sec, nsec
        js.position = array.array("d", pos[self._pub_from_model].tobytes())
        js.velocity = array.array("d", vel[self._pub_from_model].tobytes())
        js.effort = array.array("d", d.actuator_force[self._act][self._pub_from_model].tobytes())
        self._js_pub.publish(js)
        imu = self._imu_msg
        imu.header.stamp.sec, imu.header.stamp.nanosec = sec, nsec
        o = imu.orientation
        o.w, o.x, o.y, o.z = (float(v) for v in quat)
        w = imu.angular_velocity
        w.x, w.y, w.z = (float(v) for v in gyro)
        rot = _quat_xyzw_rot(d.qpos[3:7])
        acc = rot.T @ (d.qacc[0:3] + np.array([0.0, 0.0, GRAVITY]))
        a = imu.linear_acceleration
        a.x, a.y, a.z = (float(v) for v in acc)
        self._imu_pub.publish(imu)

    def base_state(self) -> dict[str, Any]:
        """Ground truth: height, body-frame linear/angular velocity, tilt, fallen."""
        d = self.data
        rot = _quat_xyzw_rot(d.qpos[3:7])
        height = float(d.qpos[2]) - self.floor_height
        upright = rot[2, 2]
        fallen = height < self.min_base_height or upright < math.cos(self.max_tilt)
        return {
            "height": height,
            "lin_vel": rot.T @ d.qvel[0:3],
            "ang_vel": d.qvel[3:6].copy(),
            "fallen": fallen,
        }

    def _publish_ground_truth(self) -> None:
        d = self.data
        sec, nsec = self._stamp()
        state = self.base_state()
        if state["fallen"] and not self._fallen:
            self.counters["falls"] += 1
            self.get_logger().warning(f"the robot fell (base height {state['height']:.3f} m)")
        self._fallen = state["fallen"]
        tw = TwistStamped()
        tw.header.stamp.sec, tw.header.stamp.nanosec = sec, nsec
        tw.header.frame_id = "base"
        v, w = state["lin_vel"], state["ang_vel"]
        tw.twist.linear.x, tw.twist.linear.y, tw.twist.linear.z = (float(x) for x in v)
        tw.twist.angular.x, tw.twist.angular.y, tw.twist.angular.z = (float(x) for x in w)
        self._twist_pub.publish(tw)
        ps = PoseStamped()
        ps.header.stamp.sec, ps.header.stamp.nanosec = sec, nsec
        ps.header.frame_id = "world"
        q = d.qpos
        ps.pose.position.x, ps.pose.position.y, ps.pose.position.z = (float(x) for x in q[0:3])
        o = ps.pose.orientation
        o.w, o.x, o.y, o.z = (float(x) for x in q[3:7])
        self._pose_pub.publish(ps)

    def _publish_diagnostics(self) -> None:
        wall = self.clock.wall_elapsed()
        status = DiagnosticStatus()
        status.name = f"{self.get_name()}: simulated robot"
        status.hardware_id = self.task
        status.level = DiagnosticStatus.WARN if self._fallen else DiagnosticStatus.OK
        status.message = "fallen" if self._fallen else "ok"
        values = {
            "sim_time_s": f"{self.data.time:.3f}",
            "real_time_factor": f"{self.data.time / wall if wall > 0 else 0:.3f}",
            "fallen": str(self._fallen),
            "latency_steps": str(self.latency_steps),
            # simulated seconds lost to overruns (the wall time it could not catch up)
            "dropped_s": f"{self.clock.dropped_s:.3f}",
            **{k: str(v) for k, v in self.counters.items()},
        }
        status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status]
        self._diag_pub.publish(msg)


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=sys.argv if argv is None else argv)
    try:
        node = SimRobotNode()
    except ValueError as exc:
        print(f"sim_robot_node: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    spin(node)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
