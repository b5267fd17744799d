"""The VLA policy node and the simulated arm with its camera (issue #19, the ROS part).

Without ROS: camera messages convert (rgb8, bgr8, padded rows) or are refused by name;
the controller keeps the previous instruction when a new one is refused, sends the safe
command (zero torque) without an image or instruction, and never anything non-finite or
out of the actuator range.

Over DDS (Fast DDS, localhost only; the nodes as processes, started as the launch files
start them, one ROS_DOMAIN_ID and namespace per test): images reach the policy node,
commands flow back and the arm moves; the instruction topic changes the instruction;
a bad image or instruction is counted, logged and survives; and with 128 x 128 images
the loop rate and latencies are measured and printed (behaviour asserted, not times).

The policy is an untrained tiny VLA shaped like instructed_reach's (proprio terms,
two torque-controlled joints, the top camera), exported with its tokenizer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sim2real_ros import ros_env

PKG = Path(__file__).resolve().parent.parent
POLICY_YAML = PKG / "config" / "vla_policy.yaml"
SIM_YAML = PKG / "config" / "vla_sim.yaml"
POLICY_NODE = "sim2real_vla_policy"
SIM_NODE = "sim_vla_robot"
INSTRUCTIONS = [f"reach the {c} ball" for c in ("red", "green", "blue", "yellow")]

OK, WHY = ros_env.ros_available()
needs_ros = pytest.mark.skipif(not OK, reason=WHY)


def export_reach_vla(out_dir: Path, image_size: int) -> Path:
    """An untrained VLA with instructed_reach's interface, exported as training does."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import torch

    from deploy.export import export_policy
    from deploy.tokenizer import file_sha256
    from policies.vla import VLAConfig, VLAPolicy
    from policies.vla_tokenizer import build_word_tokenizer, instruction_vocabulary
    from sim.registry import make
    from sim.tasks.instructed_reach import all_instructions
    from training.metadata import metadata_from_checkpoint

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = out_dir / "tokenizer.json"
    build_word_tokenizer(instruction_vocabulary(all_instructions()), tokenizer)
    env = make("instructed_reach", 1, image_size=image_size, images=False)
    try:
        terms = [(t.name, t.size) for t in env.observation_spec.policy.terms]
        low, high = env.action_spec.low, env.action_spec.high
        frame = {
            "robot": env.robot.to_dict(),
            "architecture": {"task": "instructed_reach", "policy": {}},
            "config": {"env": {}},
            "obs_terms": {"policy": terms},
            "obs_history": 1,
            "run_id": f"untrained-vla-{image_size}",
        }
        base = metadata_from_checkpoint(frame, (low, high))
    finally:
        env.close()
    torch.manual_seed(0)
    cfg = VLAConfig(image_size=image_size)
    size = sum(s for _, s in terms)
    module = VLAPolicy(size, len(base.action_joint_names), cfg, low, high).inference_module(2)
    meta = dataclasses.replace(
        base,
        policy_family="vla_flow",
        noise_shape=list(module.noise_shape),
        image_input={
            "name": "image",
            "height": image_size,
            "width": image_size,
            "channels": 3,
            "dtype": "uint8",
            "channel_order": "RGB",
            "layout": "HWC",
            "camera": "top",
            "mean": list(cfg.image_mean),
            "std": list(cfg.image_std),
        },
        instruction_input={
            "name": "instruction_ids",
            "max_tokens": cfg.max_instruction_tokens,
            "pad_id": cfg.pad_token_id,
            "vocab_size": module.backbone.vocab_size,
            "tokenizer_file": "tokenizer.json",
            "tokenizer_sha256": file_sha256(tokenizer),
            "instructions": all_instructions(),
        },
        action_chunk={"horizon": module.horizon, "act_steps": module.act_steps},
        flow_steps=module.steps,
    )
    return export_policy(module, meta, out_dir / "policy.onnx", tokenizer=tokenizer)


@pytest.fixture(scope="module")
def vla_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ros_vla")
    cache: dict[int, Path] = {}

    def get(size: int) -> Path:
        if size not in cache:
            cache[size] = export_reach_vla(root / str(size), size)
        return cache[size]

    return get


# ---------------------------------------------------------------------- no ROS
def _image_msg(pixels: np.ndarray, encoding: str = "rgb8", pad: int = 0) -> SimpleNamespace:
    h, w = pixels.shape[:2]
    rows = pixels.reshape(h, -1)
    rows = np.concatenate([rows, np.zeros((h, pad), np.uint8)], axis=1)
    return SimpleNamespace(
        height=h, width=w, encoding=encoding, step=rows.shape[1], data=rows.tobytes()
    )


def test_camera_messages_convert_or_are_refused_by_name():
    from sim2real_ros.vla_observation import ImageError, check_image, image_into

    rgb = np.random.default_rng(0).integers(0, 256, (8, 6, 3), dtype=np.uint8)
    out = np.zeros_like(rgb)
    for msg, want in (
        (_image_msg(rgb), rgb),
        (_image_msg(rgb, pad=5), rgb),  # rows padded to an aligned step
        (_image_msg(rgb[..., ::-1].copy(), "bgr8"), rgb),
    ):
        check_image(msg, 8, 6)
        np.testing.assert_array_equal(image_into(msg, out), want)
    bad = {
        "encoding 'mono8'": _image_msg(rgb[..., :1].copy(), "mono8"),
        "image is 8 x 6, the policy was trained at 16 x 16": _image_msg(rgb),
        "need step * height": SimpleNamespace(**{**vars(_image_msg(rgb)), "data": b"\0" * 10}),
    }
    for reason, msg in bad.items():
        size = (16, 16) if "trained at 16" in reason else (8, 6)
        with pytest.raises(ImageError, match=re.escape(reason)):
            check_image(msg, *size)


def _joint_state(q=(0.3, -0.2), dq=(0.0, 0.0)):
    return SimpleNamespace(name=["joint1", "joint0"], position=list(q)[::-1], velocity=list(dq))


def _tip(x=0.1, y=0.05):
    return SimpleNamespace(point=SimpleNamespace(x=x, y=y, z=0.0))


def test_controller_instruction_image_and_torque_safety(vla_files):
    from sim2real_ros.vla_controller import VLAController

    c = VLAController(vla_files(64), instructions=INSTRUCTIONS, ramp_in_s=0.0)
    assert c.control_mode == "torque" and c.joint_names == ["joint0", "joint1"]
    np.testing.assert_array_equal(c.safe_command, [0.0, 0.0])  # no torque, not a pose
    # no instruction yet: nothing but the safe command, however fresh the inputs
    image = _image_msg(np.full((64, 64, 3), 90, np.uint8))
    assert c.set_image(image, 0.0) == ""
    c.activate(0.0)
    np.testing.assert_array_equal(c.step(_joint_state(), _tip(), 0.0, 0.0), [0.0, 0.0])
    assert c.counters["no_instruction"] == 1
    # an instruction; a refused one keeps it (unknown word; a sentence not of the task)
    assert c.set_instruction("reach the blue ball") == ""
    assert "instruction_id" not in c.proprio.slices  # the words alone carry it
    assert "purple" in c.set_instruction("reach the purple ball")
    assert "not one of" in c.set_instruction("reach the ball")
    assert c.instruction == "reach the blue ball" and c.counters["bad_instruction"] == 2
    # no list given: the export's (the task's sentences) is the allow-list
    d = VLAController(vla_files(64), ramp_in_s=0.0)
    assert d.instructions == INSTRUCTIONS
    assert "not one of" in d.set_instruction("reach the ball")
    assert d.set_instruction("reach the yellow ball") == ""
    # a refused image leaves the last good one
    assert "encoding" in c.set_image(_image_msg(np.zeros((64, 64, 4), np.uint8), "rgba8"), 0.01)
    assert c.counters == {**c.counters, "images": 1, "bad_image": 1}
    outs = []
    for k in range(1, 13):
        t = k * 0.02
        c.set_image(image, t)
        outs.append(c.step(_joint_state(), _tip(), t, t))
    outs = np.array(outs)
    assert c.counters["chunks"] == 3  # 12 steps, a chunk every act_steps (4)
    assert np.isfinite(outs).all() and np.abs(outs).max() <= 1.0  # the actuator range
    assert np.abs(outs).max() > 0  # the policy pushes
    # NaN joint states: finite, and with hold_last_on_fault false, no torque at once
    bad = c.step(_joint_state(q=(math.nan, 0.0)), _tip(), 0.26, 0.26)
    np.testing.assert_array_equal(bad, [0.0, 0.0])
    # the camera stops: after image_timeout_s + the watchdog, zero torque
    t = 0.28
    while t < 0.26 + c.image_timeout_s + c.safety.config.watchdog_timeout_s + 0.05:
        out = c.step(_joint_state(), _tip(), t, t)
        t += 0.02
    np.testing.assert_array_equal(out, [0.0, 0.0])
    assert c.safety.counters["watchdog"] > 0


@needs_ros
def test_vla_policy_node_process_loads_nothing_of_training():
    """Importing the VLA node, as the robot does, loads no torch, sim, training or export."""
    forbidden = ("torch", "sim", "training", "policies", "mujoco", "transformers")
    code = (
        "import sys, sim2real_ros.vla_policy_node\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r} "
        "or m == 'deploy.export'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=ros_env.node_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# ---------------------------------------------------------------------- over DDS
class Harness:
    """The test's side of the wire: an rclpy node in its own context and domain."""

    def __init__(self, domain_id: int, namespace: str) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.node = rclpy.create_node("test_harness", namespace=namespace, context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.Image, self.String = Image, String
        n = self.node
        self.commands: list[tuple[float, np.ndarray]] = []
        self.joints: list[tuple[float, np.ndarray]] = []
        self.diagnostics: dict[str, dict[str, str]] = {}
        n.create_subscription(
            Float64MultiArray,
            "forward_effort_controller/commands",
            lambda m: self.commands.append((time.monotonic(), np.array(m.data))),
            100,
        )
        n.create_subscription(
            JointState,
            "joint_states",
            lambda m: self.joints.append((time.monotonic(), np.array(m.position))),
            100,
        )
        n.create_subscription(DiagnosticArray, "diagnostics", self._on_diag, 10)
        self.instruction_pub = n.create_publisher(String, "instruction", 10)
        self.image_pub = n.create_publisher(Image, "top/image_raw", 10)

    def _on_diag(self, msg) -> None:
        for s in msg.status:
            self.diagnostics[s.name.split(":")[0]] = {kv.key: kv.value for kv in s.values}

    def diag(self, node: str, key: str, default: str = "0") -> str:
        return self.diagnostics.get(node, {}).get(key, default)

    def count(self, key: str) -> int:
        return int(self.diag(POLICY_NODE, key))

    def spin_for(self, seconds: float, until=None, every=None) -> bool:
        """Spin for ``seconds`` or until ``until()``; ``every()`` runs at 5 Hz meanwhile."""
        end = time.monotonic() + seconds
        next_call = time.monotonic()
        while time.monotonic() < end:
            if every is not None and time.monotonic() >= next_call:
                every()
                next_call = time.monotonic() + 0.2
            self.executor.spin_once(timeout_sec=0.01)
            if until is not None and until():
                return True
        return until is None

    def instruct(self, text: str) -> None:
        self.instruction_pub.publish(self.String(data=text))

    def publish_image(self, size: int, encoding: str) -> None:
        channels = 1 if encoding == "mono8" else 3
        self.image_pub.publish(
            self.Image(
                height=size,
                width=size,
                encoding=encoding,
                step=size * channels,
                data=bytes(size * size * channels),
            )
        )

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.ctx.try_shutdown()


@pytest.fixture
def ros_setup(tmp_path, request, monkeypatch):
    """(harness, spawn(...)): every node process is stopped at the end, its log shown."""
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    domain = ros_env.next_domain_id()
    ns = f"/t{os.getpid()}_{domain}_{request.node.name[:20]}"
    ns = "".join(ch if ch.isalnum() or ch in "/_" else "_" for ch in ns)
    procs = []

    def spawn(module, **kwargs):
        log = tmp_path / f"{module.split('.')[-1]}_{len(procs)}.log"
        proc = ros_env.spawn_node(module, domain_id=domain, namespace=ns, log_path=log, **kwargs)
        proc.log_path = log
        procs.append(proc)
        return proc

    harness = Harness(domain, ns)
    try:
        yield harness, spawn
    finally:
        codes = [ros_env.stop_process(p) for p in procs]
        harness.close()
        for p in procs:  # shown by pytest only when the test fails
            print(
                f"----- {p.log_path.name} -----\n{p.log_path.read_text(errors='replace')[-4000:]}"
            )
        print("exit codes:", codes)


def _start_loop(h, spawn, policy: Path, size: int, **sim_params):
    sim = spawn(
        "sim2real_ros.vla_sim_robot_node",
        params_files=[SIM_YAML],
        params={"image_size": size, "instruction": INSTRUCTIONS[0], **sim_params},
    )
    pol = spawn(
        "sim2real_ros.vla_policy_node",
        params_files=[POLICY_YAML],
        params={
            "policy_path": str(policy),
            "autostart": "activate",
            "instruction": INSTRUCTIONS[0],
            "diagnostics_period_s": 0.5,
            # instructed_reach's robot description records the physics step (0.01 s) as
            # its control period, not env.dt (0.02 s; sim.tasks.gym_base.torque_robot
            # ignores its control_dt): run at the env's 50 Hz until the export says so
            "control_rate_hz": 50.0,
        },
    )
    assert h.spin_for(120.0, until=lambda: len(h.commands) >= 20), "the loop did not start"
    return sim, pol


@needs_ros
def test_vla_closed_loop_over_dds(ros_setup, vla_files):
    h, spawn = ros_setup
    sim, pol = _start_loop(h, spawn, vla_files(64), 64)

    # images reach the policy node, chunks are computed from them, commands flow back
    t0 = time.monotonic()
    h.spin_for(3.0)
    assert h.count("vla.images") > 10 and h.count("vla.chunks") > 10
    cmds = np.array([c for t, c in h.commands if t > t0])
    assert len(cmds) > 30 and cmds.shape[1] == 2
    assert np.isfinite(cmds).all() and np.abs(cmds).max() <= 1.0  # the actuator range
    assert np.abs(cmds).max() > 0.0
    # ...and the arm moves under them
    q = np.array([p for t, p in h.joints if t > t0])
    assert len(q) > 30 and np.ptp(q, axis=0).max() > 0.05, np.ptp(q, axis=0)
    assert h.diag(POLICY_NODE, "state", "") == "active"
    assert h.diag(POLICY_NODE, "instruction", "") == INSTRUCTIONS[0]

    # the instruction topic changes the instruction (and the scene's named ball)
    changes = h.count("vla.instruction_changes")
    assert h.spin_for(
        10.0,
        until=lambda: h.diag(POLICY_NODE, "instruction", "") == INSTRUCTIONS[2],
        every=lambda: h.instruct(INSTRUCTIONS[2]),
    ), "the instruction did not change"
    assert h.count("vla.instruction_changes") == changes + 1  # re-sent: no change again

    # refused instructions: counted, logged, the previous one kept
    for text in ("reach the purple ball", "reach the ball"):
        before = h.count("vla.bad_instruction")
        assert h.spin_for(
            10.0,
            until=lambda b=before: h.count("vla.bad_instruction") > b,
            every=lambda t=text: h.instruct(t),
        ), text
        assert h.diag(POLICY_NODE, "instruction", "") == INSTRUCTIONS[2]
    log = pol.log_path.read_text()
    assert "instruction refused" in log and "purple" in log

    # bad images (another size, another encoding): counted, logged, and the loop goes on
    assert h.spin_for(
        10.0,
        until=lambda: h.count("vla.bad_image") >= 4,
        every=lambda: (h.publish_image(32, "rgb8"), h.publish_image(64, "mono8")),
    ), "bad images not counted"
    n0, images = len(h.commands), h.count("vla.images")
    h.spin_for(1.5)
    assert len(h.commands) > n0 + 20 and h.count("vla.images") > images
    assert pol.poll() is None and sim.poll() is None
    assert "image refused" in pol.log_path.read_text()
    assert h.count("safety.nonfinite_action") == 0  # no chunk ever went without an image


@needs_ros
def test_vla_loop_rate_with_128px_images(ros_setup, vla_files):
    h, spawn = ros_setup
    _start_loop(h, spawn, vla_files(128), 128)
    h.spin_for(2.0)  # past the ramp-in and start-up
    counts0 = {k: h.count(k) for k in ("vla.images", "vla.chunks", "commands_sent")}
    t0 = time.monotonic()
    n0 = len(h.commands)
    h.spin_for(6.0)
    h.diagnostics.clear()
    assert h.spin_for(2.0, until=lambda: POLICY_NODE in h.diagnostics and SIM_NODE in h.diagnostics)
    dt = time.monotonic() - t0
    d, s = h.diagnostics[POLICY_NODE], h.diagnostics[SIM_NODE]
    images = (int(d["vla.images"]) - counts0["vla.images"]) / dt
    chunks = (int(d["vla.chunks"]) - counts0["vla.chunks"]) / dt
    received = [t for t, _ in h.commands[n0:] if t <= t0 + 6.0]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(
        f"\nROS VLA loop, 128x128 rgb8 images at {s.get('real_time_factor')} real time "
        f"(loadavg {' '.join(load)}): images received {images:.1f}/s (node's window "
        f"{d.get('image_rate_hz', '?')} Hz), chunks {chunks:.1f}/s, commands "
        f"{len(received) / 6.0:.1f}/s (target {float(d['target_rate_hz']):.0f}); "
        f"image stamp -> received p50 {d.get('image_transport_p50_ms', '?')} ms, p99 "
        f"{d.get('image_transport_p99_ms', '?')} ms; image stamp -> command p50 {d.get('image_latency_p50_ms', '?')} ms, p99 "
        f"{d.get('image_latency_p99_ms', '?')} ms; JointState stamp -> command p50 "
        f"{d.get('latency_p50_ms', '?')} ms, p99 {d.get('latency_p99_ms', '?')} ms"
    )
    # behaviour only: images arrive and feed chunks, commands flow, nothing refused
    assert images > 0 and chunks > 0 and len(received) > 0
    assert int(d["vla.bad_image"]) == 0 and int(d["safety.nonfinite_action"]) == 0
