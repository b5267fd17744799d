"""The ROS 2 control loop over real DDS: rate, jitter and observation-to-command latency.

Two processes per run, as on a robot: the policy node (``sim2real_ros.policy_node``, the
quadruped policy through deploy's runtime and safety layer) and a minimal fake robot
(this script with ``--fake-robot``): it publishes ``JointState`` + ``Imu`` at
max(loop rate, 500 Hz) (a robot's state publisher; ``--min-sensor-rate``), stamped with
the wall clock when sent, and records when each joint command (``Float64MultiArray``)
arrives. No MuJoCo: the robot side costs next to nothing, so the figures are the loop's.

Measured per run, after a warm-up, over ``--duration`` seconds:

- achieved rate: policy steps per second;
- period jitter: |tick-to-tick period - nominal| at the policy node, p50/p99/max;
- latency from message stamps: the JointState's ``header.stamp`` (when the robot sent
  it) to the arrival back at the robot of the command computed from it, p50/p99/max
  ("obs->cmd"); and to the node's publish call ("stamp->publish").

Runs: the policy node on its timer at 50, 200 and 1000 Hz (``trigger: timer``, the
default: the latency includes the age of the newest reading at the tick, up to one
sensor period), the policy node stepping on each JointState at 1000 Hz (``trigger:
joint_states``), and the named peer, a bare rclpy relay that answers each JointState
with a zero command (no policy, no safety layer), at 1000 Hz: the floor that rclpy +
Fast DDS set on this machine. The ratio printed is the policy node's obs->cmd p50 over
the relay's (both stepping on JointStates).

    python benchmarks/ros_loop.py                          # 5 runs x 30 s, ~3 min
    python benchmarks/ros_loop.py --rt-priority 0 50       # also with SCHED_FIFO, ~6 min
    python benchmarks/ros_loop.py --duration 10 --rates 1000 --out ''

Figures and the command go to docs/benchmarks_ros.md (``--out``).
"""

from __future__ import annotations

import argparse
import array
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "ros_ws" / "src" / "sim2real_ros"
TESTS = ROOT / "tests"  # ros_support: the untrained-policy exporter the ROS tests use
for p in (str(ROOT), str(PKG), str(TESTS)):
    if p not in sys.path:
        sys.path.insert(0, p)

from ros_support import export_test_policy  # noqa: E402
from sim2real_ros import node_runtime, ros_env  # noqa: E402

TARGET_RATE_HZ = 1000.0
TARGET_P99_MS = 1.0
WARMUP_S = 3.0
JOINTS = [
    f"{leg}_{part}_joint" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")
]
DEFAULT = [0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5]


# ---------------------------------------------------------------------- the fake robot
def _set_rt(priority: int) -> None:
    problem = node_runtime.set_realtime(priority)
    if problem:
        print(problem, file=sys.stderr)


def fake_robot(args: argparse.Namespace) -> int:
    """Publish sensors at ``--sensor-rate`` for ``--duration`` s after the first command;
    log when each was sent and when each command arrived."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Imu, JointState
    from std_msgs.msg import Float64MultiArray

    _set_rt(args.rt_priority)
    rclpy.init()
    node = rclpy.create_node("fake_robot")
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    reliable = QoSProfile(
        depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
    )
    best_effort = QoSProfile(
        depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
    )
    js_pub = node.create_publisher(JointState, "joint_states", reliable)
    imu_pub = node.create_publisher(Imu, "imu/data", reliable)
    sensor_rate = args.sensor_rate or args.rate
    capacity = int(max(args.rate, sensor_rate) * (args.duration + WARMUP_S + 60)) + 1000
    arrivals = np.full(capacity, np.nan)
    sent = np.full(capacity, np.nan)
    n_arr = n_sent = 0

    def on_command(msg: Float64MultiArray) -> None:
        nonlocal n_arr
        t = time.time()
        if n_arr < capacity:
            arrivals[n_arr] = t
            n_arr += 1

    node.create_subscription(
        Float64MultiArray, "forward_position_controller/commands", on_command, best_effort
    )
    js = JointState(name=list(JOINTS))
    imu = Imu()
    imu.orientation.w = 1.0
    period = 1.0 / sensor_rate
    deadline = time.monotonic()
    started = None  # wall time of the first command
    hard_stop = time.monotonic() + args.duration + WARMUP_S + 60.0  # never runs away
    k = 0
    while time.monotonic() < hard_stop:
        now = time.monotonic()
        if now >= deadline:
            k += 1
            phase = 0.05 * math.sin(2 * math.pi * 0.5 * k * period)
            js.position = array.array("d", [q + phase for q in DEFAULT])
            js.velocity = array.array("d", [0.1 * phase] * 12)
            t = time.time()
            sec = int(t)
            js.header.stamp.sec, js.header.stamp.nanosec = sec, int((t - sec) * 1e9)
            imu.header.stamp = js.header.stamp
            imu_pub.publish(imu)
            js_pub.publish(js)
            if n_sent < capacity:
                sent[n_sent] = t
                n_sent += 1
            deadline += period
            if deadline < now - 10 * period:  # far behind: skip, do not burst
                deadline = now + period
        ex.spin_once(timeout_sec=max(0.0, deadline - time.monotonic()))
        if started is None and n_arr:
            started = time.monotonic()
        if started is not None and time.monotonic() - started > args.duration + WARMUP_S:
            break
    np.save(args.log, arrivals[:n_arr])
    np.save(str(args.log).replace(".npy", "_sent.npy"), sent[:n_sent])
    ex.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0 if started is not None else 3


def relay(args: argparse.Namespace) -> int:
    """The peer: JointState in -> a zero Float64MultiArray out, in the callback."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from sim2real_ros.controller import LoopStats
    from std_msgs.msg import Float64MultiArray

    _set_rt(args.rt_priority)
    rclpy.init()
    node = rclpy.create_node("relay")
    reliable = QoSProfile(
        depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST
    )
    best_effort = QoSProfile(
        depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST
    )
    pub = node.create_publisher(Float64MultiArray, "forward_position_controller/commands", reliable)
    stats = LoopStats(1.0 / args.rate, log_capacity=int(args.rate * 700))
    out = Float64MultiArray()
    zeros = bytes(8 * 12)

    def on_js(msg: JointState) -> None:
        tick, wall_tick = time.monotonic(), time.time()
        data = array.array("d")
        data.frombytes(zeros)
        out.data = data
        pub.publish(out)
        wall = time.time()
        s = msg.header.stamp
        stats.record(tick, time.monotonic(), wall, s.sec + s.nanosec * 1e-9, wall_tick)

    node.create_subscription(JointState, "joint_states", on_js, best_effort)
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    try:
        ex.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        stats.save(args.log)
        rclpy.try_shutdown()
    return 0


# ---------------------------------------------------------------------- one run
def _pct(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"p50": math.nan, "p99": math.nan, "max": math.nan}
    p50, p99 = np.percentile(x, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(x.max())}


def analyze(
    node_log: np.ndarray, arrivals: np.ndarray, sent: np.ndarray, rate: float, duration: float
) -> dict:
    """Figures of one run from the node's step log and the robot's send/arrival times."""
    tick, done, wall_tick, wall_pub, stamp = node_log.T
    # the measurement window: WARMUP_S after the first command reached the robot
    start = arrivals[0] + WARMUP_S
    end = min(start + duration, sent[-1] - 0.1)  # not the robot's last, stopping moments
    sel = (wall_tick >= start) & (wall_tick < end)
    n = int(sel.sum())
    ticks = tick[sel]
    periods = np.diff(ticks)
    span = ticks[-1] - ticks[0] if n > 1 else math.nan
    arr = arrivals[(arrivals >= start) & (arrivals < end + 0.5)]
    # each arrival belongs to the last step that started before it
    j = np.searchsorted(wall_tick, arr, side="right") - 1
    ok = j >= 0
    e2e = (arr[ok] - stamp[j[ok]]) * 1e3
    return {
        "rate_hz": rate,
        "steps": n,
        "achieved_hz": (n - 1) / span if n > 1 else math.nan,
        "jitter_ms": _pct(np.abs(periods - 1.0 / rate) * 1e3),
        "obs_to_cmd_ms": _pct(e2e[np.isfinite(e2e)]),
        "stamp_to_publish_ms": _pct(((wall_pub - stamp)[sel] * 1e3)[np.isfinite(stamp[sel])]),
        "compute_ms": _pct((done - tick)[sel] * 1e3),
        "commands_received": int(arr.size),
        "lost": max(0, n - int(arr.size)),
    }


def run_one(
    kind: str, rate: float, args: argparse.Namespace, policy: Path, workdir: Path, prio: int
) -> dict:
    domain = ros_env.next_domain_id()
    ns = f"/bench_{os.getpid()}_{domain}"
    tag = f"{kind}_{int(rate)}_rt{prio}"
    node_log = workdir / f"{tag}_node.npy"
    robot_log = workdir / f"{tag}_robot.npy"
    env = ros_env.node_environment(domain)
    procs: list[subprocess.Popen] = []
    try:
        if kind == "relay":
            cmd = [
                sys.executable,
                __file__,
                "--relay",
                "--rate",
                str(rate),
                "--log",
                str(node_log),
                "--rt-priority",
                str(prio),
                "--ros-args",
                "-r",
                f"__ns:={ns}",
            ]
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        else:
            params = {
                "policy_path": str(policy),
                "control_rate_hz": float(rate),
                "trigger": "joint_states" if kind == "event" else "timer",
                "autostart": "activate",
                "timing_log": str(node_log),
                "rt_priority": prio,
                "ramp_in_s": 0.5,
            }
            procs.append(
                ros_env.spawn_node(
                    "sim2real_ros.policy_node",
                    domain_id=domain,
                    namespace=ns,
                    params_files=[PKG / "config" / "policy.yaml"],
                    params=params,
                    log_path=workdir / f"{tag}_node.log",
                )
            )
        robot = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--fake-robot",
                "--rate",
                str(rate),
                "--sensor-rate",
                str(max(rate, args.min_sensor_rate)),
                "--duration",
                str(args.duration),
                "--log",
                str(robot_log),
                "--rt-priority",
                str(prio),
                "--ros-args",
                "-r",
                f"__ns:={ns}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(robot)
        try:
            robot.wait(timeout=args.duration + WARMUP_S + 90)
        except subprocess.TimeoutExpired:
            pass
    finally:
        for p in procs:
            ros_env.stop_process(p)
    if not robot_log.exists() or not node_log.exists():
        raise RuntimeError(f"run {tag}: no logs (see {workdir}/{tag}_node.log)")
    arrivals = np.load(robot_log)
    if arrivals.size == 0:
        raise RuntimeError(f"run {tag}: no command reached the fake robot")
    sent = np.load(str(robot_log).replace(".npy", "_sent.npy"))
    out = analyze(np.load(node_log), arrivals, sent, rate, args.duration)
    out["kind"] = kind
    out["rt_priority"] = prio
    return out


# ---------------------------------------------------------------------- report
LABELS = {
    "timer": "policy node, timer",
    "event": "policy node, on JointState",
    "relay": "peer: bare rclpy relay",
}


def table(results: list[dict]) -> str:
    head = (
        "| run | scheduling | target Hz | achieved Hz | jitter p50 / p99 / max (ms) | obs->cmd p50 / p99 / max (ms) "
        "| stamp->publish p50 / p99 (ms) | step p50 / p99 (ms) | lost |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    rows = []
    for r in results:
        j, e, s, c = r["jitter_ms"], r["obs_to_cmd_ms"], r["stamp_to_publish_ms"], r["compute_ms"]
        rows.append(
            f"| {LABELS[r['kind']]} | {_sched(r)} | {r['rate_hz']:g} | {r['achieved_hz']:.1f} | "
            f"{j['p50']:.3f} / {j['p99']:.3f} / {j['max']:.2f} | "
            f"{e['p50']:.3f} / {e['p99']:.3f} / {e['max']:.2f} | "
            f"{s['p50']:.3f} / {s['p99']:.3f} | {c['p50']:.3f} / {c['p99']:.3f} | {r['lost']} |"
        )
    return head + "\n".join(rows) + "\n"


def _sched(r: dict) -> str:
    return f"SCHED_FIFO {r['rt_priority']}" if r.get("rt_priority", 0) > 0 else "normal"


def verdicts(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        if r["kind"] == "relay" or r["rate_hz"] != TARGET_RATE_HZ:
            continue
        sustained = r["achieved_hz"] >= 0.99 * TARGET_RATE_HZ
        p99 = r["obs_to_cmd_ms"]["p99"]
        met = sustained and p99 < TARGET_P99_MS
        lines.append(
            f"{LABELS[r['kind']]} at {TARGET_RATE_HZ:g} Hz ({_sched(r)}): {r['achieved_hz']:.1f} Hz, "
            f"obs->cmd p99 {p99:.3f} ms -> target (>= {0.99 * TARGET_RATE_HZ:g} Hz and p99 < "
            f"{TARGET_P99_MS:g} ms) {'MET' if met else 'MISSED'}"
        )
    for prio in sorted({r.get("rt_priority", 0) for r in results}):
        same = [r for r in results if r.get("rt_priority", 0) == prio]
        peer = next((r for r in same if r["kind"] == "relay"), None)
        ours = next((r for r in same if r["kind"] == "event"), None)
        if peer and ours:
            ratio = ours["obs_to_cmd_ms"]["p50"] / peer["obs_to_cmd_ms"]["p50"]
            lines.append(
                f"policy node (on JointState) / bare rclpy relay, obs->cmd p50 at 1000 Hz "
                f"({_sched(ours)}): {ratio:.2f}x ({ours['obs_to_cmd_ms']['p50']:.3f} vs "
                f"{peer['obs_to_cmd_ms']['p50']:.3f} ms)"
            )
    return lines


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python "
        f"{platform.python_version()}, load average at start {load[0]:.2f}"
    )


def _shown_args(argv: list[str]) -> list[str]:
    """The command line minus where the output went (--out, --json, --keep)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--out", "--json", "--keep", "--from-json"):
            skip = True
            continue
        out.append(a)
    return out


READING = """Reading the figures:

- On a timer, a reading is on average half a sensor period old when the tick uses it and
  up to a whole one, so with the sensors at 1000 Hz the timer loop's obs->cmd p99 cannot
  be below 1 ms whatever the node does: the 1 ms target is for the node stepping on each
  JointState (`trigger: joint_states`), which is what a robot that wants that latency
  runs.
- The bare relay is the floor on this machine: a Python rclpy node that does nothing
  but answer. Where the relay itself misses 1 ms at p99, so does the policy node; the
  difference between the two is the node's own cost (observation by joint name, the
  ONNX policy, the safety layer, the diagnostics), the `step` column.
- The machine is a shared 2-core VM on which other jobs run; normal-priority rows
  compete with them (hence 'lost' commands and rates below target), SCHED_FIFO rows
  do not, or much less.
"""


def write_doc(path: Path, results: list[dict], argv: list[str], info: dict) -> None:
    argv = _shown_args(argv)
    cmd = "python benchmarks/ros_loop.py" + ("" if not argv else " " + " ".join(argv))
    lines = [
        "# ROS 2 control loop: rate, jitter, latency",
        "",
        "The policy node and a fake robot as two processes over Fast DDS (localhost, shared",
        "memory), rclpy's SingleThreadedExecutor in both. Per run, after a "
        f"{WARMUP_S:g} s warm-up, {info['duration']:g} s measured.",
        "",
        "- **jitter**: |tick-to-tick period - nominal| at the policy node;",
        "- **obs->cmd**: JointState `header.stamp` (set by the robot when it sends) to the",
        "  arrival of the command computed from it back at the robot;",
        "- **stamp->publish**: the same stamp to the node's `publish()` returning;",
        "- **step**: the node's work per tick (observation, policy, safety, publish);",
        "- **lost**: steps whose command did not reach the robot (best-effort subscription).",
        "",
        "The fake robot publishes JointState + Imu at max(loop rate, "
        f"{info['min_sensor_rate']:g} Hz). On a timer (the",
        "default, `trigger: timer`) the loop runs at its own phase, so obs->cmd includes the",
        "age of the newest reading at the tick (up to one sensor period); with",
        "`trigger: joint_states` the node steps on each JointState. The peer, a bare rclpy",
        "relay (JointState in, zero command out, nothing else), is the floor of rclpy + Fast",
        "DDS on this machine. `SCHED_FIFO` rows: both processes, every thread, real-time",
        "priority (`rt_priority` parameter), as a robot's control computer would run them.",
        "",
        "Command:",
        "",
        "```bash",
        cmd,
        "```",
        "",
        f"Machine: {info['machine']}, at the end {info.get('load_end', math.nan):.2f}. "
        f"Policy: {info['policy']}.",
        "",
        table(results),
        *[f"- {v}" for v in verdicts(results)],
        "",
        READING,
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")


def _policy(args: argparse.Namespace, workdir: Path) -> tuple[Path, str]:
    if args.policy:
        return Path(args.policy), f"`{args.policy}`"
    trained = ROOT / "tests" / "data" / "quadruped_policy.onnx"
    if trained.exists():
        return trained, "the trained quadruped policy (tests/data/quadruped_policy.onnx)"
    path = export_test_policy(workdir / "quadruped_untrained.onnx", gain=0.05)
    return path, (
        "an untrained quadruped-shaped policy (45 -> 256-128-64 ELU -> 12, the trained "
        "network's size; tests/data/quadruped_policy.onnx was absent)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ros_args: list[str] = []
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        argv, ros_args = argv[:i], argv[i:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", type=float, nargs="*", default=[50.0, 200.0, 1000.0])
    p.add_argument("--duration", type=float, default=30.0, help="seconds measured per run")
    p.add_argument(
        "--policy", default="", help="ONNX policy (default: tests/data/... or untrained)"
    )
    p.add_argument(
        "--rt-priority",
        type=int,
        nargs="+",
        default=[0],
        help="SCHED_FIFO priority of both processes (0: off); several: one set of runs each",
    )
    p.add_argument(
        "--min-sensor-rate",
        type=float,
        default=500.0,
        help="the fake robot publishes sensors at max(loop rate, this) Hz",
    )
    p.add_argument("--no-event", action="store_true", help="skip the on-JointState run")
    p.add_argument("--no-peer", action="store_true", help="skip the bare relay peer")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks_ros.md"))
    p.add_argument("--json", default="", help="also write the figures as JSON here")
    p.add_argument("--keep", default="", help="keep the raw logs in this folder")
    p.add_argument("--from-json", default="", help="only rewrite --out from a --json file")
    p.add_argument(
        "--allow-busy", action="store_true", help="write --out even if the machine was busy"
    )
    p.add_argument("--fake-robot", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=1000.0, help=argparse.SUPPRESS)
    p.add_argument("--sensor-rate", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--log", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fake_robot or args.relay:
        args.rt_priority = args.rt_priority[0]
        sys.argv = [sys.argv[0], *ros_args]
        return fake_robot(args) if args.fake_robot else relay(args)

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        write_doc(Path(args.out), data["results"], data.get("argv", []), data["info"])
        print(f"wrote {args.out}")
        return 0
    ok, why = ros_env.ros_available()
    if not ok:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    from sim.machine_load import LoadMonitor, wait_for_quiet

    if args.out:
        wait_for_quiet()  # an earlier run's load takes tens of seconds to decay
    # sampled between runs, when no node of ours is running: only this driver counts
    monitor = LoadMonitor(own_threads=1)
    info = {
        "machine": machine(),
        "duration": args.duration,
        "min_sensor_rate": args.min_sensor_rate,
    }
    print(info["machine"], flush=True)
    with tempfile.TemporaryDirectory(prefix="ros_loop_") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        policy, info["policy"] = _policy(args, workdir)
        runs = [("timer", r) for r in args.rates]
        if not args.no_event:
            runs.append(("event", TARGET_RATE_HZ))
        if not args.no_peer:
            runs.append(("relay", TARGET_RATE_HZ))
        results = []
        for prio in args.rt_priority:
            for kind, rate in runs:
                sched = f"SCHED_FIFO {prio}" if prio > 0 else "normal priority"
                print(
                    f"{LABELS[kind]} at {rate:g} Hz, {sched}, {args.duration:g} s ...", flush=True
                )
                r = run_one(kind, rate, args, policy, workdir, prio)
                monitor.sample()
                results.append(r)
                e, j = r["obs_to_cmd_ms"], r["jitter_ms"]
                print(
                    f"  achieved {r['achieved_hz']:.1f} Hz, jitter p50/p99/max {j['p50']:.3f}/"
                    f"{j['p99']:.3f}/{j['max']:.2f} ms, obs->cmd p50/p99/max {e['p50']:.3f}/"
                    f"{e['p99']:.3f}/{e['max']:.2f} ms, lost {r['lost']}",
                    flush=True,
                )
    info["load_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    monitor.stop()
    may_write, why = monitor.may_write(args.allow_busy)
    info["machine"] += f"; {why}"
    print()
    print(table(results))
    for v in verdicts(results):
        print(v)
    print(why)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"info": info, "results": results, "argv": argv}, indent=1)
        )
    if args.out and not may_write:
        return 3
    if args.out:
        write_doc(Path(args.out), results, argv, info)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
