"""The policy node: an exported ONNX policy driving a robot's joints over ROS 2.

A lifecycle node (``rclpy.lifecycle``):

- **configure**: load the policy file (``policy_path``) through ``deploy.runtime``, check
  it (metadata, a position-controlled policy, every observation term computable from
  ROS messages), build the safety layer, subscribe to the sensors and the command,
  create the publishers. Any problem -> the transition fails with the reason logged.
- **activate**: needs fresh sensor data (refused otherwise); resets the policy's
  history and recurrent state (a chunked policy's chunk too) and re-seeds a generative
  policy's noise (``seed``; ``deterministic``: zero noise), and starts sending its
  targets, ramped in from the measured joint positions.
- **deactivate**: the safe posture (the policy's default joint positions), sent from
  then on at the control rate until cleanup, so that a robot with a command timeout
  keeps standing.
- **cleanup**/**shutdown**: everything is released.

Before the first activation nothing is published: configuring must not move a robot.

Topics (names are parameters, relative to the node's namespace):

=================================  ==========================================  ===========
``joint_states``                   ``sensor_msgs/JointState`` (joints by name)  in
``imu/data``                       ``sensor_msgs/Imu``                          in
``cmd_vel``                        ``geometry_msgs/Twist`` (vx, vy, yaw rate)   in
``forward_position_controller/``   ``std_msgs/Float64MultiArray``: joint        out
``commands``                       position targets in the policy's joint
                                   order (ros2_control's forward command
                                   controller)
``joint_trajectory`` (optional)    ``trajectory_msgs/JointTrajectory``          out
``pd_gains``                       ``std_msgs/Float64MultiArray``, latched      out
                                   (transient local): the PD gains the
                                   joints' controllers must run, ``kp`` of
                                   every joint then ``kd`` (2 x joints), in
                                   the command's joint order; sent at
                                   activation, before the first command
``diagnostics``                    ``diagnostic_msgs/DiagnosticArray``: loop    out
                                   rate, jitter, latency, safety counters
=================================  ==========================================  ===========

PD gains: the policy was trained through PD controllers with the gains of its metadata,
and the robot's joint controllers (not this node) close that loop, so they must run those
gains. Configure logs them per joint; the ``kp``/``kd`` parameters (unset: the trained
gains) override what is published, with a warning that names every joint whose gain
differs from the trained one.

The loop runs on a timer at the policy's control rate (``control_rate_hz`` overrides
it), or, with ``trigger: joint_states``, on every fresh JointState (the robot's state
publisher sets the pace; a timer at the control rate still runs the watchdog). Latency
is measured from the JointState's ``header.stamp`` to the publication of the command.

Run: ``ros2 launch sim2real_ros policy.launch.py policy:=/path/policy.onnx``, or
``python -m sim2real_ros.policy_node --ros-args --params-file config/policy.yaml -p
policy_path:=/path/policy.onnx``.
"""

from __future__ import annotations

import array
import math
import sys
import time
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import Twist
from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from sim2real_ros.controller import ConfigureError, LoopStats, PolicyController
from sim2real_ros.gains import GainsError, PDGains, resolve_gains
from sim2real_ros.node_runtime import spin
from sim2real_ros.policy_lifecycle import COMMAND_QOS, SENSOR_QOS, PolicyLifecycleNode, stamp_s

NODE_NAME = "sim2real_policy"

# The gains: sent once per activation and latched, so that a driver started later (or
# restarted) still gets them; its subscription must be transient local too.
GAINS_QOS = QoSProfile(
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    history=HistoryPolicy.KEEP_LAST,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)

PARAMETERS: dict[str, Any] = {
    "policy_path": "",
    "joint_states_topic": "joint_states",
    "imu_topic": "imu/data",
    "cmd_vel_topic": "cmd_vel",
    "command_topic": "forward_position_controller/commands",
    "publish_trajectory": False,
    "trajectory_topic": "joint_trajectory",
    "gains_topic": "pd_gains",
    "kp": None,
    "kd": None,
    "diagnostics_topic": "diagnostics",
    "diagnostics_period_s": 1.0,
    "control_rate_hz": 0.0,
    "trigger": "timer",
    "watchdog_timeout_s": 0.0,
    "ramp_in_s": 1.0,
    "max_target_speed": 20.0,
    "hold_last_on_fault": True,
    "command_timeout_s": 0.5,
    "command_limits": [1.0, 0.5, 1.0],
    "intra_op_threads": 1,
    "seed": 0,
    "deterministic": False,
    "autostart": "configure",
    "rt_priority": 0,
    "timing_log": "",
}
"""Parameter names and defaults (``config/policy.yaml`` documents each). None: unset
unless the user sets it (``kp``/``kd``: then the policy's own values)."""

TRIGGERS = ("timer", "joint_states")


class PolicyNode(PolicyLifecycleNode):
    """See the module docstring."""

    SAFE_COMMAND = "the safe posture"

    def __init__(self, **kwargs: Any) -> None:
        self.controller: PolicyController | None = None
        self.stats: LoopStats | None = None
        self._js: JointState | None = None
        self._imu: Imu | None = None
        self._t_js: float | None = None
        self._t_imu: float | None = None
        self._last_tick = -math.inf
        self._log_errors_after = 0.0
        super().__init__(NODE_NAME, PARAMETERS, **kwargs)

    # ------------------------------------------------------------------ lifecycle
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        log = self.get_logger()
        trigger = self._param("trigger")
        if trigger not in TRIGGERS:
            log.error(f"configure failed: trigger must be one of {TRIGGERS}, got {trigger!r}")
            return TransitionCallbackReturn.FAILURE
        try:
            rate = float(self._param("control_rate_hz"))
            self.controller = PolicyController(
                self._param("policy_path"),
                control_period_s=1.0 / rate if rate > 0 else None,
                watchdog_timeout_s=float(self._param("watchdog_timeout_s")) or None,
                ramp_in_s=float(self._param("ramp_in_s")),
                max_target_speed=float(self._param("max_target_speed")),
                hold_last_on_fault=bool(self._param("hold_last_on_fault")),
                command_timeout_s=float(self._param("command_timeout_s")),
                command_limits=list(self._param("command_limits")),
                intra_op_threads=int(self._param("intra_op_threads")),
                seed=self._param("seed"),
                deterministic=bool(self._param("deterministic")),
            )
        except (ConfigureError, ValueError, TypeError) as exc:
            log.error(f"configure failed: {exc}")
            self.controller = None
            return TransitionCallbackReturn.FAILURE
        c = self.controller
        meta = c.metadata
        try:
            gains = resolve_gains(
                c.joint_names, meta.kp, meta.kd, self._param("kp"), self._param("kd")
            )
        except GainsError as exc:
            log.error(f"configure failed: {exc}")
            self.controller = None
            return TransitionCallbackReturn.FAILURE
        if rate > 0 and not math.isclose(1.0 / rate, meta.control_period_s, rel_tol=1e-6):
            log.warning(
                f"control_rate_hz={rate:g} overrides the policy's trained rate "
                f"{1.0 / meta.control_period_s:g} Hz"
            )
        timing_log = str(self._param("timing_log"))
        capacity = int(600.0 / c.control_period_s) if timing_log else 0  # up to 10 min
        self.stats = LoopStats(c.control_period_s, log_capacity=capacity)
        self._needs_imu = c.assembler.needs_imu
        self._js = self._imu = None
        self._t_js = self._t_imu = None
        self._started = False

        self._cmd_msg = Float64MultiArray()
        self._cmd_msg.layout.dim = [
            MultiArrayDimension(label="joints", size=c.num_joints, stride=c.num_joints)
        ]
        self._cmd_pub = self.create_publisher(
            Float64MultiArray, self._param("command_topic"), COMMAND_QOS
        )
        self._gains_msg = Float64MultiArray()
        self._gains_msg.layout.dim = [
            MultiArrayDimension(label="kp_kd", size=2, stride=2 * c.num_joints),
            MultiArrayDimension(label="joints", size=c.num_joints, stride=c.num_joints),
        ]
        self._gains_msg.data = array.array("d", gains.as_array().tobytes())
        self._gains_pub = self.create_publisher(
            Float64MultiArray, self._param("gains_topic"), GAINS_QOS
        )
        self._traj_pub = None
        if self._param("publish_trajectory"):
            self._traj_msg = JointTrajectory(joint_names=list(c.joint_names))
            self._traj_point = JointTrajectoryPoint()
            period_ns = int(round(c.control_period_s * 1e9))
            self._traj_point.time_from_start.sec = period_ns // 1_000_000_000
            self._traj_point.time_from_start.nanosec = period_ns % 1_000_000_000
            self._traj_pub = self.create_publisher(
                JointTrajectory, self._param("trajectory_topic"), COMMAND_QOS
            )
        self._diag_pub = self.create_publisher(
            DiagnosticArray, self._param("diagnostics_topic"), 10
        )
        on_js = self._on_joint_state_trigger if trigger == "joint_states" else self._on_joint_state
        self._io_entities = [
            self._cmd_pub,
            self._gains_pub,
            self._diag_pub,
            self.create_subscription(
                JointState, self._param("joint_states_topic"), on_js, SENSOR_QOS
            ),
            self.create_subscription(Twist, self._param("cmd_vel_topic"), self._on_twist, 10),
        ]
        if self._traj_pub is not None:
            self._io_entities.append(self._traj_pub)
        if self._needs_imu:
            self._io_entities.append(
                self.create_subscription(Imu, self._param("imu_topic"), self._on_imu, SENSOR_QOS)
            )
        self._trigger = trigger
        # On a timer: the loop. On JointStates: only a backstop that sends the safe
        # posture when they stop, at a quarter of the watchdog timeout (a timer at the
        # control rate would cost an executor wake-up per period for nothing).
        period = c.control_period_s
        if trigger == "joint_states":
            period = max(period, c.safety.config.watchdog_timeout_s / 4)
        self._start_loop(period, self._on_timer)
        log.info(
            f"configured: policy {c.metadata.run_id or '?'} ({c.policy.path}), task "
            f"{meta.task!r}, {c.num_joints} joints, obs terms {[n for n, _ in meta.obs_terms]}, "
            f"{1.0 / c.control_period_s:g} Hz ({trigger}), watchdog "
            f"{c.safety.config.watchdog_timeout_s * 1e3:.0f} ms{self._sampling(c)}"
        )
        self._log_gains(gains)
        return TransitionCallbackReturn.SUCCESS

    @staticmethod
    def _sampling(c: PolicyController) -> str:
        """How a generative policy (diffusion, flow) gets its noise; '' for the others."""
        if not c.policy.is_generative:
            return ""
        meta = c.metadata
        how = "zero noise (deterministic)" if c.policy.deterministic else f"noise seed {c.seed}"
        return f", {meta.policy_family} policy sampling with {how}"

    def _log_gains(self, gains: PDGains) -> None:
        log = self.get_logger()
        overrides = gains.overrides()
        source = "overridden by the kp/kd parameters" if any(overrides.values()) else "trained"
        log.info(
            f"joints in command order, with the PD gains their controllers must run ({source}; "
            f"sent latched on {self._gains_pub.topic_name} at activation):\n{gains.table()}"
        )
        for name, joints in overrides.items():
            if joints:
                log.warning(
                    f"{name} differs from the gains the policy was trained with: "
                    + ", ".join(f"{j} {v:g} (trained {t:g})" for j, v, t in joints)
                    + "; the policy's actions assume the trained gains"
                )

    def _stale_inputs(self) -> str:
        c = self.controller
        return (
            "no fresh sensor data (JointState"
            + (" and Imu" if self._needs_imu else "")
            + f" within {c.safety.config.watchdog_timeout_s:.3f} s)"
        )

    def _before_first_command(self) -> None:
        self._gains_pub.publish(self._gains_msg)

    def _before_release(self) -> None:
        self.save_timing_log()

    def on_exit(self) -> None:
        """Called by :func:`spin` when the process stops: keep the timing log."""
        self.save_timing_log()

    def save_timing_log(self) -> None:
        path = str(self._param("timing_log"))
        if path and self.stats is not None:
            self.stats.save(path)

    # ------------------------------------------------------------------ inputs
    def _on_joint_state(self, msg: JointState) -> None:
        self._js = msg
        self._t_js = time.monotonic()

    def _on_joint_state_trigger(self, msg: JointState) -> None:
        self._js = msg
        now = self._t_js = time.monotonic()
        if self._started:
            self._step(now)

    def _on_imu(self, msg: Imu) -> None:
        self._imu = msg
        self._t_imu = time.monotonic()

    def _on_twist(self, msg: Twist) -> None:
        c = self.controller
        if c is not None:
            c.set_command(msg.linear.x, msg.linear.y, msg.angular.z, time.monotonic())

    def _sensor_time(self) -> float | None:
        t = self._t_js
        if self._needs_imu:
            if t is None or self._t_imu is None:
                return None
            t = min(t, self._t_imu)
        return t

    def _fresh(self, now: float) -> bool:
        c = self.controller
        t = self._sensor_time()
        if c is None or t is None or self._js is None:
            return False
        if now - t > c.safety.config.watchdog_timeout_s:
            return False
        try:
            frame = c.assembler.assemble(self._js, self._imu, c.command, c.last_action)
        except ValueError:
            return False
        return bool(np.isfinite(frame).all())

    # ------------------------------------------------------------------ the loop
    def _on_timer(self) -> None:
        if not self._started:
            return
        now = time.monotonic()
        if self._trigger == "joint_states" and now - self._last_tick < 1.5 * (
            self.controller.control_period_s
        ):
            return  # the JointStates drive the loop; this timer covers their absence
        self._step(now)

    def _step(self, now: float) -> None:
        c = self.controller
        js = self._js
        wall_tick = time.time()
        out = c.step(js, self._imu, self._sensor_time(), now)
        msg = self._cmd_msg
        data = array.array("d")
        data.frombytes(out.tobytes())
        msg.data = data
        self._cmd_pub.publish(msg)
        wall = time.time()
        if self._traj_pub is not None:
            self._traj_point.positions = data
            self._traj_msg.points = [self._traj_point]
            self._traj_pub.publish(self._traj_msg)
        self._last_tick = now
        stamp = stamp_s(js) if js is not None else None
        self.stats.record(now, time.monotonic(), wall, stamp, wall_tick)
        if c.last_error and now > self._log_errors_after:
            self.get_logger().error(f"bad observation: {c.last_error}")
            self._log_errors_after = now + 1.0

    # ------------------------------------------------------------------ diagnostics
    def _diagnostics(self, status: DiagnosticStatus, state: str, now: float) -> dict[str, str]:
        c = self.controller
        summary = self.stats.summary()
        if self._started and not self._fresh(now):
            status.level = DiagnosticStatus.ERROR
            status.message = f"{state}: sensor data stale or invalid (safe posture)"
        elif self._started and c.active:
            rate = summary.get("rate_hz", math.nan)
            if not rate >= 0.9 / c.control_period_s:
                status.level = DiagnosticStatus.WARN
                status.message = f"{state}: loop at {rate:.1f} Hz < 90% of target"
        values = {
            "state": state,
            "policy": c.policy.path,
            "run_id": c.metadata.run_id,
            "policy_family": c.metadata.policy_family,
            "target_rate_hz": f"{1.0 / c.control_period_s:.3f}",
            "command": ",".join(f"{v:.3f}" for v in c.command),
        }
        values.update({k: f"{v:.4g}" for k, v in summary.items()})
        counters = {**c.safety.counters, **c.counters}
        values.update({f"safety.{k}": str(v) for k, v in counters.items()})
        return values


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=sys.argv if argv is None else argv)
    spin(PolicyNode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
