"""The VLA policy node: an exported vision-language-action policy driving a robot over ROS 2.

A lifecycle node like :mod:`sim2real_ros.policy_node` (configure loads and checks the
file, activate needs fresh inputs and ramps in, deactivate sends the safe command at the
control rate; nothing is published before the first activation). The step itself is
:class:`sim2real_ros.vla_controller.VLAController`; this module only converts messages.

Topics (names are parameters, relative to the node's namespace):

====================================  =======================================  =====
``<camera>/image_raw``                ``sensor_msgs/Image``, ``rgb8`` or          in
(``image_topic``; default from the    ``bgr8`` at the trained size; anything
metadata's camera name)               else is counted (``bad_image``), logged
                                      and dropped
``instruction``                       ``std_msgs/String``: the task in words;     in
                                      one the policy cannot take (an unknown
                                      word, not in ``instructions``) is counted
                                      (``bad_instruction``), logged, and the
                                      previous one is kept
``joint_states``                      ``sensor_msgs/JointState`` (by name)        in
``fingertip``                         ``geometry_msgs/PointStamped``, only if     in
                                      the policy observes ``fingertip``
``forward_effort_controller/          ``std_msgs/Float64MultiArray`` in the       out
commands`` (torque policies) or       policy's joint order: actuator commands
``forward_position_controller/        or joint position targets (see
commands`` (position policies)        :mod:`sim2real_ros.vla_controller`)
``diagnostics``                       loop rate, latency (JointState and image    out
                                      stamps to command), counters
====================================  =======================================  =====

The loop runs on a timer at the policy's control rate; the network runs only at the
steps that start a chunk (every ``act_steps`` steps), and only then is the latest image
converted. Image messages are checked on arrival (header only), so a bad one never
replaces the last good one.
"""

from __future__ import annotations

import array
import collections
import sys
import time
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PointStamped
from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String

from sim2real_ros.controller import ConfigureError, LoopStats
from sim2real_ros.node_runtime import spin
from sim2real_ros.policy_lifecycle import COMMAND_QOS, SENSOR_QOS, PolicyLifecycleNode, stamp_s
from sim2real_ros.vla_controller import VLAController

NODE_NAME = "sim2real_vla_policy"

# Instructions: reliable and volatile, which matches every publisher (`ros2 topic pub`
# included); a transient-local subscription would refuse volatile publishers.
INSTRUCTION_QOS = QoSProfile(
    depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
)
COMMAND_TOPICS = {
    "position": "forward_position_controller/commands",
    "torque": "forward_effort_controller/commands",
}

PARAMETERS: dict[str, Any] = {
    "policy_path": "",
    "image_topic": "",
    "instruction_topic": "instruction",
    "joint_states_topic": "joint_states",
    "fingertip_topic": "fingertip",
    "command_topic": "",
    "instructions": None,
    "instruction": "",
    "diagnostics_topic": "diagnostics",
    "diagnostics_period_s": 1.0,
    "control_rate_hz": 0.0,
    "watchdog_timeout_s": 0.0,
    "image_timeout_s": 0.5,
    "ramp_in_s": 0.5,
    "max_command_rate": 20.0,
    "hold_last_on_fault": False,
    "intra_op_threads": 1,
    "seed": 0,
    "deterministic": True,
    "autostart": "configure",
    "rt_priority": 0,
}
"""Parameter names and defaults (``config/vla_policy.yaml`` documents each)."""

LOG_EVERY_S = 1.0  # the same error is logged at most this often (a camera at 30 Hz)


class VLAPolicyNode(PolicyLifecycleNode):
    """See the module docstring."""

    LOOP_NAME = "VLA policy loop"

    def __init__(self, **kwargs: Any) -> None:
        self.controller: VLAController | None = None
        self.stats: LoopStats | None = None
        self._js: JointState | None = None
        self._tip: PointStamped | None = None
        self._t_js: float | None = None
        self._t_tip: float | None = None
        self._logged: dict[str, float] = {}
        self._image_latency: collections.deque[float] = collections.deque(maxlen=1024)
        self._image_arrivals: collections.deque[float] = collections.deque(maxlen=256)
        self._image_transport: collections.deque[float] = collections.deque(maxlen=256)
        self._commands_sent = 0
        super().__init__(NODE_NAME, PARAMETERS, **kwargs)

    def _log_limited(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now >= self._logged.get(key, 0.0):
            self.get_logger().error(message)
            self._logged[key] = now + LOG_EVERY_S

    # ------------------------------------------------------------------ lifecycle
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        log = self.get_logger()
        try:
            rate = float(self._param("control_rate_hz"))
            instructions = self._param("instructions") or []
            if isinstance(instructions, str):
                instructions = [instructions]
            self.controller = VLAController(
                self._param("policy_path"),
                control_period_s=1.0 / rate if rate > 0 else None,
                watchdog_timeout_s=float(self._param("watchdog_timeout_s")) or None,
                image_timeout_s=float(self._param("image_timeout_s")),
                ramp_in_s=float(self._param("ramp_in_s")),
                max_command_rate=float(self._param("max_command_rate")),
                hold_last_on_fault=bool(self._param("hold_last_on_fault")),
                instructions=[str(t) for t in instructions],
                instruction=str(self._param("instruction")),
                intra_op_threads=int(self._param("intra_op_threads")),
                seed=int(self._param("seed")),
                deterministic=bool(self._param("deterministic")),
            )
        except (ConfigureError, ValueError, TypeError) as exc:
            log.error(f"configure failed: {exc}")
            self.controller = None
            return TransitionCallbackReturn.FAILURE
        c = self.controller
        self.stats = LoopStats(c.control_period_s)
        self._js = self._tip = None
        self._t_js = self._t_tip = None
        self._started = False
        self._cmd_msg = Float64MultiArray()
        self._cmd_msg.layout.dim = [
            MultiArrayDimension(label="joints", size=c.num_joints, stride=c.num_joints)
        ]
        image_topic = self._param("image_topic") or f"{c.policy.camera}/image_raw"
        command_topic = self._param("command_topic") or COMMAND_TOPICS[c.control_mode]
        self._cmd_pub = self.create_publisher(Float64MultiArray, command_topic, COMMAND_QOS)
        self._diag_pub = self.create_publisher(
            DiagnosticArray, self._param("diagnostics_topic"), 10
        )
        p = self._param
        self._io_entities = [
            self._cmd_pub,
            self._diag_pub,
            self.create_subscription(Image, image_topic, self._on_image, SENSOR_QOS),
            self.create_subscription(
                String, p("instruction_topic"), self._on_instruction, INSTRUCTION_QOS
            ),
            self.create_subscription(
                JointState, p("joint_states_topic"), self._on_joint_state, SENSOR_QOS
            ),
        ]
        if c.proprio.needs_fingertip:
            self._io_entities.append(
                self.create_subscription(
                    PointStamped, p("fingertip_topic"), self._on_fingertip, SENSOR_QOS
                )
            )
        self._start_loop(c.control_period_s, self._on_timer)
        meta = c.metadata
        log.info(
            f"configured: VLA {meta.run_id or '?'} ({c.policy.path}), task {meta.task!r}, "
            f"{c.control_mode} control, {c.num_joints} joints {c.joint_names} -> "
            f"{self._cmd_pub.topic_name}; image {c.image_height}x{c.image_width} rgb8/bgr8 on "
            f"{image_topic}; proprio {[n for n, _ in meta.obs_terms]}; chunk "
            f"{c.policy.act_steps}/{c.policy.horizon} at {1.0 / c.control_period_s:g} Hz; "
            f"instruction {c.instruction!r}"
        )
        return TransitionCallbackReturn.SUCCESS

    def _stale_inputs(self) -> str:
        fingertip = ", fingertip" if self.controller.proprio.needs_fingertip else ""
        return f"no fresh JointState{fingertip} and image"

    # ------------------------------------------------------------------ inputs
    def _on_image(self, msg: Image) -> None:
        c = self.controller
        if c is None:
            return
        now = time.monotonic()
        problem = c.set_image(msg, now)
        if problem:
            self._log_limited(
                "image", f"image refused ({c.counters['bad_image']} so far): {problem}"
            )
        else:
            self._image_arrivals.append(now)
            self._image_transport.append(time.time() - stamp_s(msg))

    def _on_instruction(self, msg: String) -> None:
        c = self.controller
        if c is None:
            return
        before = c.instruction
        problem = c.set_instruction(msg.data)
        if problem:
            self.get_logger().error(f"instruction refused: {problem}; keeping {c.instruction!r}")
        elif c.instruction != before:
            self.get_logger().info(f"instruction: {c.instruction!r}")

    def _on_joint_state(self, msg: JointState) -> None:
        self._js = msg
        self._t_js = time.monotonic()

    def _on_fingertip(self, msg: PointStamped) -> None:
        self._tip = msg
        self._t_tip = time.monotonic()

    def _sensor_time(self) -> float | None:
        t = self._t_js
        if self.controller is not None and self.controller.proprio.needs_fingertip:
            if t is None or self._t_tip is None:
                return None
            t = min(t, self._t_tip)
        return t

    def _fresh(self, now: float) -> bool:
        c = self.controller
        t = self._sensor_time()
        if c is None or t is None or not c.image_fresh(now):
            return False
        if now - t > c.safety.config.watchdog_timeout_s:
            return False
        try:
            vec = c.proprio.assemble(self._js, self._tip, c.last_action)
        except ValueError:
            return False
        return bool(np.isfinite(vec).all())

    # ------------------------------------------------------------------ the loop
    def _on_timer(self) -> None:
        if self._started:
            self._step(time.monotonic())

    def _step(self, now: float) -> None:
        c = self.controller
        js = self._js
        out = c.step(js, self._tip, self._sensor_time(), now)
        data = array.array("d")
        data.frombytes(out.tobytes())
        self._cmd_msg.data = data
        self._cmd_pub.publish(self._cmd_msg)
        wall = time.time()
        self._commands_sent += 1
        if c.chunk_image_msg is not None:
            self._image_latency.append(wall - stamp_s(c.chunk_image_msg))
        stamp = stamp_s(js) if js is not None else None
        self.stats.record(now, time.monotonic(), wall, stamp)
        if c.last_error:
            self._log_limited("observation", f"bad observation: {c.last_error}")

    # ------------------------------------------------------------------ diagnostics
    def _diagnostics(self, status: DiagnosticStatus, state: str, now: float) -> dict[str, str]:
        c = self.controller
        if self._started and not self._fresh(now):
            status.level = DiagnosticStatus.ERROR
            status.message = f"{state}: inputs stale or invalid (safe command)"
        elif self._started and c.instruction is None:
            status.level = DiagnosticStatus.WARN
            status.message = f"{state}: no instruction yet (safe command)"
        values: dict[str, str] = {
            "state": state,
            "policy": c.policy.path,
            "control_mode": c.control_mode,
            "instruction": c.instruction or "",
            "target_rate_hz": f"{1.0 / c.control_period_s:.3f}",
            "commands_sent": str(self._commands_sent),
        }
        values.update({k: f"{v:.4g}" for k, v in self.stats.summary().items()})
        arrivals = [t for t in self._image_arrivals if now - t <= 2.0]
        if len(arrivals) > 1:
            values["image_rate_hz"] = f"{(len(arrivals) - 1) / (arrivals[-1] - arrivals[0]):.4g}"
        # image stamp -> received (camera and transport), and -> the first command of
        # the chunk computed from it (adds the wait for the next chunk start)
        for name, ring in (
            ("image_transport", self._image_transport),
            ("image_latency", self._image_latency),
        ):
            if ring:
                p50, p99 = np.percentile(np.asarray(ring) * 1e3, [50, 99])
                values[f"{name}_p50_ms"], values[f"{name}_p99_ms"] = f"{p50:.4g}", f"{p99:.4g}"
        values.update({f"vla.{k}": str(v) for k, v in c.counters.items()})
        values.update({f"vla.runtime.{k}": str(v) for k, v in c.policy.counters.items()})
        values.update({f"safety.{k}": str(v) for k, v in c.safety.counters.items()})
        return values


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=sys.argv if argv is None else argv)
    spin(VLAPolicyNode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
