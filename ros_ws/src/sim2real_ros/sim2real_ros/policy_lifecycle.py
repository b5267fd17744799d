"""What every policy node shares: the lifecycle around a controller that turns sensor
messages into commands through an ONNX policy and a safety layer.

:class:`PolicyLifecycleNode` holds the parts that do not depend on the policy's
inputs: parameter declaration, autostart, activation (fresh inputs required, the
controller's ramp-in), deactivation (the safe command at once and then at the control
rate), release of every timer, publisher and subscription, garbage collection kept off
the control path, real-time priority, and the skeleton of the diagnostics message.
A node (:mod:`sim2real_ros.policy_node`, :mod:`sim2real_ros.vla_policy_node`) adds its
topics, its controller and its step; this module imports rclpy and the standard library
only (it runs on the robot).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from sim2real_ros.node_runtime import set_realtime

__all__ = ["AUTOSTART", "COMMAND_QOS", "SENSOR_QOS", "PolicyLifecycleNode", "stamp_s"]

# Sensor input: best effort, keep the latest (a best-effort subscription also matches a
# reliable publisher). Commands out: reliable, what ros2_control's controllers expect.
SENSOR_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
)
COMMAND_QOS = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
)
AUTOSTART = ("none", "configure", "activate")


def stamp_s(msg: Any) -> float:
    """A stamped message's ``header.stamp`` in seconds."""
    s = msg.header.stamp
    return s.sec + s.nanosec * 1e-9


class PolicyLifecycleNode(LifecycleNode):
    """A lifecycle node driving a controller (``self.controller``: ``activate(now, js)``,
    ``active``, ``deactivate()``, ``safety``, ``metadata``, ``policy``,
    ``control_period_s``). A subclass implements ``on_configure`` (ending with
    :meth:`_start_loop`), ``_fresh(now)``, ``_step(now)``, ``_stale_inputs()`` and
    ``_diagnostics(status, state, now)``."""

    SAFE_COMMAND = "the safe command"
    """What deactivation sends, in the log ("the safe posture" for a standing robot)."""
    LOOP_NAME = "policy loop"
    """The diagnostics status's name after the node's."""

    def __init__(self, node_name: str, parameters: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        for name, default in parameters.items():
            if default is None:
                # no default value to take a type from; any list is accepted (a YAML
                # [20, 20, ...] is an integer array) and checked at configure
                self.declare_parameter(name, None, ParameterDescriptor(dynamic_typing=True))
            else:
                self.declare_parameter(name, default)
        self.controller: Any = None
        self.stats: Any = None
        self._started = False  # published anything since configure
        self._io_entities: list[Any] = []
        self._loop_timers: list[Any] = []
        self._diag_pub: Any = None
        mode = self._param("autostart")
        if mode not in AUTOSTART:
            self.get_logger().error(f"autostart must be one of {AUTOSTART}, got {mode!r}")
            mode = "none"
        self._autostart = mode
        # after the executor starts spinning (transitions need the node registered)
        self._autostart_timer = (
            self.create_timer(0.05, self._autostart_step) if mode != "none" else None
        )

    def _param(self, name: str) -> Any:
        return self.get_parameter(name).value

    # ------------------------------------------------------------------ autostart
    def _autostart_step(self) -> None:
        state = self._state_machine.current_state[1]
        if state == "unconfigured":
            if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                self.get_logger().error("autostart: configure failed; not retrying")
                self._stop_autostart()
            elif self._autostart == "configure":
                self._stop_autostart()
        elif state == "inactive" and self._autostart == "activate":
            if self._fresh(time.monotonic()):
                self.trigger_activate()
                self._stop_autostart()
        else:
            self._stop_autostart()

    def _stop_autostart(self) -> None:
        if self._autostart_timer is not None:
            self.destroy_timer(self._autostart_timer)
            self._autostart_timer = None

    # ------------------------------------------------------------------ the node's part
    def _fresh(self, now: float) -> bool:
        """Whether every input is recent and makes a finite observation."""
        raise NotImplementedError

    def _step(self, now: float) -> None:
        """One control step: the controller's command, published."""
        raise NotImplementedError

    def _stale_inputs(self) -> str:
        """The inputs activation waits for, for its refusal message."""
        raise NotImplementedError

    def _before_first_command(self) -> None:
        """At activation, before the first command (e.g. latched PD gains)."""

    def _diagnostics(self, status: DiagnosticStatus, state: str, now: float) -> dict[str, str]:
        """The node's diagnostic values (it may raise ``status``'s level)."""
        raise NotImplementedError

    def _before_release(self) -> None:
        """At cleanup, shutdown or error, before anything is released (e.g. a log)."""

    # ------------------------------------------------------------------ lifecycle
    def _start_loop(self, period_s: float, on_timer: Any) -> None:
        """The end of a successful configure: the loop and diagnostics timers, real-time
        priority, and the garbage collector taken off the control path."""
        p = self._param
        self._loop_timers = [
            self.create_timer(period_s, on_timer),
            self.create_timer(float(p("diagnostics_period_s")), self._publish_diagnostics),
        ]
        priority = int(p("rt_priority"))
        if priority > 0:
            problem = set_realtime(priority)
            if problem:
                self.get_logger().warning(problem)
            else:
                self.get_logger().info(f"SCHED_FIFO priority {priority} (all threads)")
        # what exists now is frozen (never scanned again), the automatic collector is
        # off, and the diagnostics timer collects once per period (cycles live at most
        # that long; ~0.05 ms measured)
        gc.collect()
        gc.freeze()
        gc.disable()

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        c = self.controller
        now = time.monotonic()
        if c is None:
            return TransitionCallbackReturn.FAILURE
        if not self._fresh(now):
            self.get_logger().error(f"activate refused: {self._stale_inputs()}")
            return TransitionCallbackReturn.FAILURE
        c.activate(now, self._js)
        if not c.active:  # the safety layer refused the time (the clock went back)
            self.get_logger().error("activate refused: the clock went back since the last step")
            return TransitionCallbackReturn.FAILURE
        self._before_first_command()
        self._started = True
        self.get_logger().info(f"activated: ramp-in {c.safety.config.ramp_in_s:g} s")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.controller is not None:
            self.controller.deactivate()
            self._step(time.monotonic())  # the safe command now, not at the next tick
        self.get_logger().info(f"deactivated: sending {self.SAFE_COMMAND}")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def _release(self) -> None:
        gc.enable()
        self._before_release()
        for t in self._loop_timers:
            self.destroy_timer(t)
        for e in self._io_entities:
            if hasattr(e, "publish"):
                self.destroy_publisher(e)
            else:
                self.destroy_subscription(e)
        self._loop_timers, self._io_entities = [], []
        self.controller = None
        self._started = False

    # ------------------------------------------------------------------ diagnostics
    def _publish_diagnostics(self) -> None:
        gc.collect()  # the collector's one place (see _start_loop)
        c, stats = self.controller, self.stats
        if c is None or stats is None:
            return
        now = time.monotonic()
        state = self._state_machine.current_state[1]
        status = DiagnosticStatus()
        status.name = f"{self.get_name()}: {self.LOOP_NAME}"
        status.hardware_id = c.metadata.task or "robot"
        status.level = DiagnosticStatus.OK
        status.message = state
        values = self._diagnostics(status, state, now)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in values.items()]
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status]
        self._diag_pub.publish(msg)
