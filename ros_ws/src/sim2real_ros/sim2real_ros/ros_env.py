"""Running the ROS 2 nodes from a Python virtual environment (the PyPI ROS wheels).

The ``ros-rclpy`` wheels from PyPI need no ``source /opt/ros/.../setup.bash`` and no
``AMENT_PREFIX_PATH``; they need one thing at process start: ``LD_LIBRARY_PATH`` must
list the wheels' shared-library folders (``site-packages/ros_*.libs``), because the
dynamic loader reads it only when a process starts. Their dependency
``ros-wheels-bootstrapper`` does that with a ``.pth`` file: the first time any Python of
the venv starts, it sets ``LD_LIBRARY_PATH`` and ``_ROS_WHEELS_BOOTSTRAP_COMPLETE=1`` and
re-executes the interpreter. A child process that inherits
``_ROS_WHEELS_BOOTSTRAP_COMPLETE`` but not ``LD_LIBRARY_PATH`` (an env scrubbed by hand)
fails with ``ImportError: librcl_action.so``: :func:`node_environment` builds child
environments that have both.

This module also holds what tests and the benchmark need to run nodes as processes:
distinct ``ROS_DOMAIN_ID``s, localhost-only discovery, the package and the repository on
``PYTHONPATH``, spawning and stopping node processes, and (with rclpy) calling lifecycle
transitions. Nothing here is needed on a robot with a sourced ROS installation, and
nothing here imports torch or ``sim``: the nodes' own run-time helpers are in
:mod:`sim2real_ros.node_runtime`, and the exporter of untrained test policies is
``tests/ros_support.py``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PACKAGE_ROOT",
    "REPO_ROOT",
    "LifecycleClient",
    "next_domain_id",
    "node_command",
    "node_environment",
    "ros_available",
    "ros_library_path",
    "spawn_node",
    "stop_process",
]

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""``ros_ws/src/sim2real_ros``: put it on ``sys.path`` to import ``sim2real_ros``."""

REPO_ROOT = PACKAGE_ROOT.parent.parent.parent
"""The sim2real repository (holds ``deploy`` and ``sim``), if the package lives in it."""

# ROS_DOMAIN_ID 0..101 is safe on Linux (the ports of higher ids may clash with the
# ephemeral range); 0 is everyone's default, so tests stay off it.
_DOMAIN_LOW, _DOMAIN_HIGH = 1, 101
_domain_counter = itertools.count()
_domain_offset = random.Random(os.getpid() ^ time.time_ns()).randrange(_DOMAIN_HIGH)


def ros_library_path(base: str | None = None) -> str:
    """``LD_LIBRARY_PATH`` with the ROS wheels' library folders of this interpreter first.

    Mirrors ``ros_wheels_bootstrapper``: ``<prefix>/lib`` and every
    ``site-packages/ros_*.libs`` folder, then the existing entries of ``base`` (default:
    this process's ``LD_LIBRARY_PATH``), without duplicates.
    """
    base = os.environ.get("LD_LIBRARY_PATH", "") if base is None else base
    parts: list[str] = []
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = site / "site-packages"
    candidates = [str(Path(sys.prefix) / "lib")]
    if site.is_dir():
        candidates += sorted(str(p.resolve()) for p in site.glob("ros_*.libs") if p.is_dir())
    for p in candidates + [p for p in base.split(os.pathsep) if p]:
        if p not in parts:
            parts.append(p)
    return os.pathsep.join(parts)


def ros_available() -> tuple[bool, str]:
    """Whether rclpy and the message packages import here; ``(False, reason)`` if not."""
    try:
        import rclpy  # noqa: F401
        from diagnostic_msgs.msg import DiagnosticArray  # noqa: F401
        from geometry_msgs.msg import Twist  # noqa: F401
        from lifecycle_msgs.srv import ChangeState  # noqa: F401
        from rclpy.lifecycle import LifecycleNode  # noqa: F401
        from sensor_msgs.msg import Imu, JointState  # noqa: F401
        from std_msgs.msg import Float64MultiArray  # noqa: F401
        from trajectory_msgs.msg import JointTrajectory  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from a missing shared library
        return False, (
            f"ROS 2 Python packages not importable ({type(exc).__name__}: {exc}); install "
            "the 'ros' extra (pip install -e '.[ros]') or source a ROS 2 Jazzy/Kilted setup"
        )
    return True, ""


def next_domain_id() -> int:
    """A ROS_DOMAIN_ID for one test: a counter from a random offset, in 1..101.

    The offset differs between processes (pytest workers, parallel runs), so two test
    runs on one machine seldom share a domain; tests also put their nodes in a namespace
    of their own, so even a shared domain does not mix their topics.
    """
    span = _DOMAIN_HIGH - _DOMAIN_LOW + 1
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw")
    shift = int(worker) * 17 if worker.isdigit() else 0
    return _DOMAIN_LOW + (_domain_offset + shift + next(_domain_counter)) % span


def node_environment(
    domain_id: int | None = None,
    extra: Mapping[str, str] | None = None,
    *,
    localhost_only: bool = True,
) -> dict[str, str]:
    """Environment for a node process: this one plus what the ROS wheels and tests need.

    Sets ``LD_LIBRARY_PATH`` (see the module docstring), ``ROS_DOMAIN_ID`` (if given),
    ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` (unless ``localhost_only`` is False: then
    the discovery reaches the subnet, as on a robot), the Fast DDS RMW unless
    ``RMW_IMPLEMENTATION`` is set, unbuffered output, and ``PYTHONPATH`` with the package
    and the repository first.
    """
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ros_library_path(env.get("LD_LIBRARY_PATH", ""))
    env["_ROS_WHEELS_BOOTSTRAP_COMPLETE"] = "1"
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(int(domain_id))
    if localhost_only:
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        env.pop("ROS_STATIC_PEERS", None)
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    env["PYTHONUNBUFFERED"] = "1"
    paths = [str(PACKAGE_ROOT), str(REPO_ROOT)]
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths + old)
    if extra:
        env.update(extra)
    return env


def node_command(
    module: str,
    *,
    params_files: Sequence[str | os.PathLike[str]] = (),
    params: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    name: str | None = None,
    remaps: Mapping[str, str] | None = None,
    python: str | None = None,
) -> list[str]:
    """``python -m <module> --ros-args ...``: the same arguments ``ros2 launch`` passes.

    ``params`` become ``-p name:=value`` (lists and bools in YAML syntax), applied after
    the parameter files, as a launch file's inline parameters are.
    """
    cmd = [python or sys.executable, "-m", module, "--ros-args"]
    if name:
        cmd += ["-r", f"__node:={name}"]
    if namespace:
        cmd += ["-r", f"__ns:={namespace}"]
    for src, dst in (remaps or {}).items():
        cmd += ["-r", f"{src}:={dst}"]
    for f in params_files:
        cmd += ["--params-file", os.fspath(f)]
    for key, value in (params or {}).items():
        cmd += ["-p", f"{key}:={_yaml_value(value)}"]
    return cmd


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value else "''"
    return repr(value)


def spawn_node(
    module: str,
    *,
    domain_id: int,
    log_path: str | os.PathLike[str] | None = None,
    env_extra: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.Popen:
    """Start a node module as a process (its own process group); output to ``log_path``."""
    cmd = node_command(module, **kwargs)
    out: Any = subprocess.DEVNULL
    if log_path is not None:
        out = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(
            cmd,
            env=node_environment(domain_id, env_extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if log_path is not None:
            out.close()


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> int | None:
    """SIGINT (as ``ros2 launch`` does on Ctrl-C), then SIGTERM, then SIGKILL; return code."""
    for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


class LifecycleClient:
    """Lifecycle transitions of a remote node, from a node of the caller's (needs rclpy).

    ``executor`` spins ``node``; calls block until the answer arrives or time runs out.
    """

    def __init__(self, node: Any, executor: Any, target: str) -> None:
        from lifecycle_msgs.srv import ChangeState, GetState

        self._node, self._executor = node, executor
        self.target = target.rstrip("/")
        self._change = node.create_client(ChangeState, f"{self.target}/change_state")
        self._get = node.create_client(GetState, f"{self.target}/get_state")

    def _call(self, client: Any, request: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not client.wait_for_service(timeout_sec=0.1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"service {client.srv_name} not available")
        future = client.call_async(request)
        self._executor.spin_until_future_complete(
            future, timeout_sec=max(0.0, deadline - time.monotonic())
        )
        if not future.done():
            raise TimeoutError(f"no answer from {client.srv_name}")
        return future.result()

    def state(self, timeout: float = 10.0) -> str:
        """The node's current state label (``unconfigured``, ``inactive``, ``active``...)."""
        from lifecycle_msgs.srv import GetState

        return self._call(self._get, GetState.Request(), timeout).current_state.label

    def transition(self, label: str, timeout: float = 10.0) -> bool:
        """Trigger ``configure``/``activate``/``deactivate``/``cleanup``/``shutdown``."""
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState

        ids = {
            "configure": Transition.TRANSITION_CONFIGURE,
            "activate": Transition.TRANSITION_ACTIVATE,
            "deactivate": Transition.TRANSITION_DEACTIVATE,
            "cleanup": Transition.TRANSITION_CLEANUP,
            "shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN,
        }
        request = ChangeState.Request()
        request.transition.id = ids[label]
        return bool(self._call(self._change, request, timeout).success)

    def wait_for_state(self, label: str, timeout: float = 15.0) -> bool:
        """Poll until the node reports ``label``; False on time-out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # a server can drop a response while its writer has not yet discovered this
            # client's reader ("failed to send response (timeout)"): each poll waits at
            # most 2 s, so a lost answer is asked again instead of eating the whole wait
            try:
                if self.state(timeout=min(2.0, max(0.5, deadline - time.monotonic()))) == label:
                    return True
            except TimeoutError:
                pass
            self._executor.spin_once(timeout_sec=0.05)
        return False
