"""What the node processes need at run time: real-time scheduling and the spin loop.

The policy node runs on the robot, so this module imports only the standard library
(and rclpy, when a node spins); the process helpers of tests and benchmarks are in
:mod:`sim2real_ros.ros_env`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["make_executor", "set_realtime", "spin"]


def set_realtime(priority: int) -> str:
    """SCHED_FIFO at ``priority`` for every thread of this process; "" or the reason not.

    Every thread: the DDS middleware's receive and event threads exist by the time a
    node reads its parameters, and a control loop at real-time priority whose messages
    wait in a normal-priority receive thread gains nothing (measured: with only the main
    thread at SCHED_FIFO, JointStates reached the loop up to 14 ms late on a loaded
    machine). Threads started later inherit the policy. Needs root or CAP_SYS_NICE (or an
    rtprio limit, as on a robot's real-time kernel setup).
    """
    if priority <= 0:
        return ""
    try:
        param = os.sched_param(int(priority))
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        for tid in tids:
            os.sched_setscheduler(tid, os.SCHED_FIFO, param)
    except (OSError, AttributeError, ValueError) as exc:
        return f"SCHED_FIFO priority {priority} not granted: {exc}"
    return ""


def make_executor() -> Any:
    """rclpy's SingleThreadedExecutor.

    rclpy's experimental EventsExecutor (rclpy 9.1.2 wheel) was tried: its timers never
    fired under ``spin()`` here while it busy-looped a core, and it ignored SIGINT; so
    the nodes use the standard executor.
    """
    from rclpy.executors import SingleThreadedExecutor

    return SingleThreadedExecutor()


def spin(node: Any, executor: Any = None) -> None:
    """Spin ``node`` until Ctrl-C / SIGTERM, then destroy it and shut rclpy down."""
    import rclpy
    from rclpy.executors import ExternalShutdownException

    executor = executor or make_executor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if hasattr(node, "on_exit"):
            node.on_exit()
        executor.shutdown()
        node.destroy_node()
        if rclpy.ok():
            rclpy.try_shutdown()
