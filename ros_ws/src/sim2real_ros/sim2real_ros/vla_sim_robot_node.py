"""A simulated robot with a camera on ROS 2: a VLA task's env stepped in real time.

It stands in for the arm, its camera and its kinematics, so that the VLA policy node's
launch can be rehearsed against it. It publishes:

- ``<camera>/image_raw``: ``sensor_msgs/Image`` (``rgb8``; ``bgr8`` with ``image_encoding``)
  rendered from the task's camera at ``image_rate_hz`` (stamped with the wall-clock
  instant of the simulated state it shows);
- ``joint_states``: ``sensor_msgs/JointState`` of the action joints at the control rate;
- ``fingertip``: ``geometry_msgs/PointStamped``, the end effector (tasks that have one);
- ``diagnostics``: simulated time, real-time factor, distance to the named target, counters.

It takes ``forward_effort_controller/commands`` (``std_msgs/Float64MultiArray``, the
policy's joint order): for a torque-controlled task the actuator commands, for a
position-controlled one the joint targets (turned back into the task's raw action). A
command holds until the next (zero-order hold over the control period, as in training);
none for ``command_timeout_s`` -> zero raw action (a motor driver's own timeout). And
``instruction`` (``std_msgs/String``): names another target in the scene
(``env.instruct``), so that the distance in the diagnostics follows the instruction.

The env is ``sim.make(task, 1, images=False, ...)`` with the nominal model, no auto-reset
in practice (``max_episode_steps`` huge, no termination on success): one long episode,
like a robot's day. Images come from ``env.render`` of the task's camera, rendered only
at the image rate, not at every step. This node imports ``sim`` (it *is* the simulator)
and uses its public API only.
"""

from __future__ import annotations

import array
import math
import sys
import time
from typing import Any

import numpy as np
import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PointStamped
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String

from sim2real_ros.node_runtime import set_realtime, spin
from sim2real_ros.sim_clock import SimClock

NODE_NAME = "sim_vla_robot"

# Camera drivers publish best effort (a late frame is worth nothing); joint states as
# sim_robot_node does; commands as ros2_control's forward command controllers take them.
IMAGE_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
)
SENSOR_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
)
COMMAND_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
)

PARAMETERS: dict[str, Any] = {
    "task": "instructed_reach",
    "seed": 0,
    "image_size": 64,
    "image_rate_hz": 15.0,
    "camera": "top",
    "image_topic": "",
    "image_encoding": "rgb8",
    "joint_states_topic": "joint_states",
    "fingertip_topic": "fingertip",
    "command_topic": "forward_effort_controller/commands",
    "instruction_topic": "instruction",
    "instruction": "",
    "command_timeout_s": 0.5,
    "real_time_factor": 1.0,
    "max_catchup_steps": 10,
    "diagnostics_topic": "diagnostics",
    "rt_priority": 0,
}
"""Parameter names and defaults (``config/vla_sim.yaml`` documents each)."""

EPISODE_STEPS = 10**9  # one episode for the node's lifetime


class VLASimRobotNode(Node):
    """See the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        for name, default in PARAMETERS.items():
            self.declare_parameter(name, default)
        p = self._param
        self.encoding = str(p("image_encoding"))
        if self.encoding not in ("rgb8", "bgr8"):
            raise ValueError(f"image_encoding must be rgb8 or bgr8, got {self.encoding!r}")
        self.size = int(p("image_size"))
        self.camera = str(p("camera"))
        self._build_sim(str(p("task")), int(p("seed")))
        self.rtf = float(p("real_time_factor"))
        if not self.rtf > 0:
            raise ValueError(f"real_time_factor must be > 0, got {self.rtf}")
        self.max_catchup = max(1, int(p("max_catchup_steps")))
        rate = float(p("image_rate_hz"))
        self.image_period = 1.0 / rate if rate > 0 else math.inf
        self.command_timeout = float(p("command_timeout_s"))

        self._js_msg = JointState(name=list(self.joint_names))
        self._tip_msg = PointStamped()
        self._tip_msg.header.frame_id = "base"
        self._img_msg = Image(
            height=self.size, width=self.size, encoding=self.encoding, step=3 * self.size
        )
        self._img_msg.header.frame_id = self.camera
        image_topic = p("image_topic") or f"{self.camera}/image_raw"
        self._img_pub = self.create_publisher(Image, image_topic, IMAGE_QOS)
        self._js_pub = self.create_publisher(JointState, p("joint_states_topic"), SENSOR_QOS)
        self._tip_pub = (
            self.create_publisher(PointStamped, p("fingertip_topic"), SENSOR_QOS)
            if self._has_fingertip
            else None
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, p("diagnostics_topic"), 10)
        self.create_subscription(
            Float64MultiArray, p("command_topic"), self._on_command, COMMAND_QOS
        )
        self.create_subscription(String, p("instruction_topic"), self._on_instruction, 10)

        self.counters = {
            "commands": 0,
            "bad_commands": 0,
            "command_timeout": 0,
            "images": 0,
            "instructions": 0,
            "bad_instructions": 0,
            "overruns": 0,
        }
        self._raw = torch.zeros(1, len(self.joint_names))
        self._t_cmd = -math.inf
        if p("instruction"):
            self._instruct(str(p("instruction")))
        self.steps = 0
        self._next_image = 0.0
        self.clock = SimClock(self.control_dt, self.rtf, self.max_catchup)
        self.create_timer(self.control_dt / self.rtf, self._on_timer)
        self.create_timer(1.0, self._publish_diagnostics)
        problem = set_realtime(int(p("rt_priority")))
        if problem:
            self.get_logger().warning(problem)
        self._publish_state()
        self._publish_image()
        self.get_logger().info(
            f"simulating {self.task!r} ({self.control_mode} control) at "
            f"{1 / self.control_dt:g} Hz, camera {self.camera!r} {self.size}x{self.size} "
            f"{self.encoding} at {1 / self.image_period:g} Hz on {image_topic}; "
            f"instruction {self.instruction!r}"
        )

    def _param(self, name: str) -> Any:
        return self.get_parameter(name).value

    # ------------------------------------------------------------------ the model
    def _build_sim(self, task: str, seed: int) -> None:
        from sim.randomization import SimToRealConfig
        from sim.registry import make

        kwargs: dict[str, Any] = {"images": False, "image_size": self.size}
        if task == "instructed_reach":
            kwargs["terminate_on_success"] = False
        env = make(
            task, 1, seed=seed, s2r=SimToRealConfig(), max_episode_steps=EPISODE_STEPS, **kwargs
        )
        self.env = env
        self.task = task
        env.reset(seed=seed)
        robot = env.robot
        self.control_mode = robot.control_mode
        self.control_dt = float(env.dt)
        self.joint_names = list(robot.joint_names)
        self._offset = np.asarray(robot.action_offset, dtype=np.float64)
        self._scale = np.asarray(robot.action_scale, dtype=np.float64)
        joints = env.joint_indices
        self._jqpos, self._jdof = joints.qpos_adr, joints.dof_adr
        self._has_fingertip = callable(getattr(env, "fingertip", None))
        self.instruction = env.instructions[0] if hasattr(env, "instructions") else ""
        self.distance = math.nan

    # ------------------------------------------------------------------ inputs
    def _on_command(self, msg: Float64MultiArray) -> None:
        cmd = (
            np.frombuffer(msg.data, dtype=np.float64)
            if isinstance(msg.data, array.array)
            else np.asarray(msg.data, dtype=np.float64)
        )
        if cmd.shape != (len(self.joint_names),) or not np.isfinite(cmd).all():
            self.counters["bad_commands"] += 1
            return
        self.counters["commands"] += 1
        # torque tasks: scale 1, offset 0, the command is the raw action
        self._raw[0] = torch.from_numpy((cmd - self._offset) / self._scale)
        self._t_cmd = time.monotonic()

    def _on_instruction(self, msg: String) -> None:
        self._instruct(msg.data)

    def _instruct(self, text: str) -> None:
        if text == self.instruction:
            return
        try:
            self.env.instruct([text])
        except (ValueError, AttributeError) as exc:
            self.counters["bad_instructions"] += 1
            self.get_logger().warning(f"instruction {text!r} not applied to the scene: {exc}")
            return
        self.instruction = text
        self.counters["instructions"] += 1

    # ------------------------------------------------------------------ real time
    def _on_timer(self) -> None:
        now = time.monotonic()
        due, dropped = self.clock.due(self.steps)
        if dropped:
            self.counters["overruns"] += 1
        if due <= 0:
            return
        if now - self._t_cmd > self.command_timeout and self._raw.any():
            self.counters["command_timeout"] += 1
            self._raw.zero_()
        for _ in range(due):
            _, _, _, _, info = self.env.step(self._raw)
            self.steps += 1
        if "distance" in info:
            self.distance = float(info["distance"][0])
        self._publish_state()
        if self.steps * self.control_dt >= self._next_image:
            self._publish_image()
            self._next_image = max(
                self._next_image + self.image_period, self.steps * self.control_dt
            )

    def _stamp(self) -> tuple[int, int]:
        return self.clock.stamp(self.steps)

    def _publish_state(self) -> None:
        sec, nsec = self._stamp()
        qpos = self.env.engine.get("qpos")[0]
        qvel = self.env.engine.get("qvel")[0]
        js = self._js_msg
        js.header.stamp.sec, js.header.stamp.nanosec = sec, nsec
        js.position = array.array("d", np.asarray(qpos[self._jqpos], np.float64).tobytes())
        js.velocity = array.array("d", np.asarray(qvel[self._jdof], np.float64).tobytes())
        self._js_pub.publish(js)
        if self._tip_pub is not None:
            tip = self.env.fingertip()[0]
            m = self._tip_msg
            m.header.stamp.sec, m.header.stamp.nanosec = sec, nsec
            m.point.x, m.point.y = float(tip[0]), float(tip[1])
            self._tip_pub.publish(m)

    def _publish_image(self) -> None:
        frame = self.env.render(0, width=self.size, height=self.size, camera=self.camera)
        if self.encoding == "bgr8":
            frame = frame[..., ::-1]
        m = self._img_msg
        m.header.stamp.sec, m.header.stamp.nanosec = self._stamp()
        m.data = np.ascontiguousarray(frame).tobytes()
        self._img_pub.publish(m)
        self.counters["images"] += 1

    def _publish_diagnostics(self) -> None:
        wall = self.clock.wall_elapsed()
        sim_time = self.steps * self.control_dt
        status = DiagnosticStatus()
        status.name = f"{self.get_name()}: simulated robot"
        status.hardware_id = self.task
        status.level = DiagnosticStatus.OK
        status.message = "ok"
        values = {
            "sim_time_s": f"{sim_time:.3f}",
            "real_time_factor": f"{sim_time / wall if wall > 0 else 0:.3f}",
            "instruction": self.instruction,
            "distance": f"{self.distance:.4f}",
            # simulated seconds lost to overruns (the wall time it could not catch up)
            "dropped_s": f"{self.clock.dropped_s:.3f}",
            **{k: str(v) for k, v in self.counters.items()},
        }
        status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status]
        self._diag_pub.publish(msg)

    def close(self) -> None:
        self.env.close()


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=sys.argv if argv is None else argv)
    try:
        node = VLASimRobotNode()
    except ValueError as exc:
        print(f"vla_sim_robot_node: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    try:
        spin(node)
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
