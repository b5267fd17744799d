"""deploy.export: ONNX/torch parity, the metadata of an export, the exporter registry."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from deploy import export as export_mod
from deploy.export import (
    PARITY_KEY,
    ExportError,
    export_policy,
    read_parity,
    register_exporter,
    registered_families,
)
from deploy.metadata import PolicyMetadata, read_metadata
from deploy.runtime import OnnxPolicy
from policies.gaussian import ActorCritic, ActorCriticConfig
from training.checkpoint import find_checkpoint, load_checkpoint
from training.export import export_run
from training.metadata import metadata_from_checkpoint
from training.runner import OnPolicyRunner
from training.train_configs import build_ppo_config

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]
TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # small nets: a thread pool only adds contention (and 10x slower tests on a busy box)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory, one_torch_thread):
    run = tmp_path_factory.mktemp("export") / "cartpole"
    cfg = build_ppo_config("cartpole", QUIET + ["run.total_steps=2048", "run.seed=3"])
    OnPolicyRunner(cfg, run).train()
    return run


def _randomized(module: nn.Module, seed: int = 0) -> nn.Module:
    """Weights of unit-scale outputs (a fresh policy's mean head is ~0) and real stats."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            if name.endswith("bias"):
                p.mul_(0.1)
        norm = module.normalizer
        norm.mean.copy_(torch.randn(norm.mean.shape, generator=gen))
        norm.var.copy_(torch.rand(norm.var.shape, generator=gen) * 4 + 0.1)
    return module


def _module(obs: int, act: int, rnn: str | None = None, layers: int = 1, seed: int = 0):
    cfg = ActorCriticConfig(
        actor_hidden=(64, 32), critic_hidden=(16,), rnn_type=rnn, rnn_hidden=24, rnn_layers=layers
    )
    return _randomized(ActorCritic(obs, None, act, cfg).inference_module(), seed)


def _meta(module, **overrides) -> PolicyMetadata:
    info = module.info
    n = info.action_size
    values = dict(
        policy_family=info.policy_family,
        obs_terms=[("a", 3), ("b", info.obs_size - 3)],
        action_joint_names=[f"j{i}" for i in range(n)],
        action_scale=[0.5] * n,
        action_offset=[0.1] * n,
        default_joint_pos=[0.1] * n,
        kp=[20.0] * n,
        kd=[0.5] * n,
        joint_pos_lower=[-2.0] * n,
        joint_pos_upper=[2.0] * n,
        control_period_s=0.02,
        recurrent_state=[(name, list(info.state_shape)) for name in info.state_names],
        task="unit-test",
    )
    values.update(overrides)
    return PolicyMetadata(**values)


# ---------------------------------------------------------------------- parity
@pytest.mark.parametrize("obs,act", [(4, 1), (45, 12)], ids=["cartpole-sized", "quadruped-sized"])
def test_mlp_parity_on_random_observations(tmp_path, obs, act):
    module = _module(obs, act)
    path = export_policy(module, _meta(module), tmp_path / "p.onnx")
    policy = OnnxPolicy(path)
    x = torch.randn(64, obs) * 3
    with torch.no_grad():
        want = module(x).numpy()
    assert np.abs(want).mean() > 0.1  # a meaningful comparison, not 0 against 0
    got, state = policy.act_batch(x.numpy())
    assert state == {}
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for row in x[:16]:  # the single-observation hot path
        a = policy.act(row.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(a, module(row[None])[0].numpy(), atol=TOL, rtol=0)
    assert read_parity(path) <= TOL


def test_mish_exports_as_one_sigmoid_within_float_rounding(tmp_path):
    """deploy.export writes mish with one Sigmoid (no Softplus, which onnxruntime
    evaluates slowly); over [-100, 100], saturation included, it stays within 3e-6 of
    torch's mish (onnxruntime's sigmoid is approximate in its far tail, near x = -17,
    where mish itself is ~1e-6), and within 1e-6 relative for x > 0."""
    path = tmp_path / "mish.onnx"
    x = torch.linspace(-100.0, 100.0, 400_001).view(1, -1)
    with torch.no_grad():
        torch.onnx.export(nn.Mish(), (x,), str(path), dynamo=False, opset_version=17)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "Softplus" not in ops and ops.count("Sigmoid") == 1, ops
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    want = torch.nn.functional.mish(x).numpy()
    np.testing.assert_allclose(got, want, atol=3e-6, rtol=0)
    pos = x.numpy() > 0
    assert (np.abs(got - want)[pos] / want[pos]).max() < 1e-6


@pytest.mark.parametrize("rnn,layers", [("gru", 1), ("lstm", 2)])
def test_recurrent_parity_over_a_sequence(tmp_path, rnn, layers):
    module = _module(10, 3, rnn, layers, seed=1)
    meta = _meta(module)
    assert [name for name, _ in meta.recurrent_state] == (["h", "c"] if rnn == "lstm" else ["h"])
    path = export_policy(module, meta, tmp_path / "p.onnx")
    policy = OnnxPolicy(path)
    gen = torch.Generator().manual_seed(5)
    seq = torch.randn(20, 1, 10, generator=gen) * 2
    state = module.initial_state(1)
    for t in range(20):  # act(): the runtime carries the state itself
        with torch.no_grad():
            out = module(seq[t], *state)
        want, state = out[0], out[1:]
        got = policy.act(seq[t, 0].numpy())
        np.testing.assert_allclose(got, want[0].numpy(), atol=TOL, rtol=0)
        for (name, _), s in zip(meta.recurrent_state, state):  # batch-first on the ONNX side
            np.testing.assert_allclose(policy.state[name], s.transpose(0, 1).numpy(), atol=TOL)
    assert np.abs(want.numpy()).mean() > 0.1

    # act_batch(): a batch of 5 with the state carried by the caller
    batch = torch.randn(20, 5, 10, generator=gen)
    state = module.initial_state(5)
    onnx_state = policy.initial_state(5)
    for t in range(20):
        with torch.no_grad():
            out = module(batch[t], *state)
        state = out[1:]
        got, onnx_state = policy.act_batch(batch[t].numpy(), onnx_state)
        np.testing.assert_allclose(got, out[0].numpy(), atol=TOL, rtol=0)
    for (name, _), s in zip(meta.recurrent_state, state):
        np.testing.assert_allclose(onnx_state[name], s.transpose(0, 1).numpy(), atol=TOL)


def test_exported_file_runs_without_torch(tmp_path):
    module = _module(45, 12)
    path = export_policy(module, _meta(module), tmp_path / "p.onnx")
    x = np.linspace(-1, 1, 45, dtype=np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)[None])[0].numpy()
    code = (
        "import sys, json, numpy as np\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "from deploy.runtime import OnnxPolicy\n"
        "from deploy.safety import SafetyConfig, SafetyLayer\n"
        f"p = OnnxPolicy({str(path)!r})\n"
        "a = p.act(np.linspace(-1, 1, 45, dtype=np.float32))\n"
        "s = SafetyLayer(SafetyConfig.from_metadata(p.metadata))\n"
        "print(json.dumps(a.tolist()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(json.loads(out.stdout), want, atol=TOL)


# ---------------------------------------------------------------------- metadata
def test_checkpoint_export_metadata_and_checker(cartpole_run):
    path = export_run(cartpole_run)
    assert path == cartpole_run / "policy.onnx"
    ck = load_checkpoint(find_checkpoint(cartpole_run))
    robot = ck["robot"]
    meta = read_metadata(path)
    assert meta.policy_family == "gaussian_mlp"
    assert meta.task == "cartpole"
    assert meta.obs_terms == [("qpos", 2), ("qvel", 2)]
    assert meta.obs_history_length == ck["obs_history"] == 1
    assert meta.action_joint_names == list(robot["joint_names"]) == ["slider"]
    assert meta.action_scale == robot["action_scale"]
    assert meta.action_offset == robot["action_offset"]
    assert meta.default_joint_pos == robot["default_joint_pos"]
    assert meta.kp == robot["kp"] and meta.kd == robot["kd"]
    assert meta.control_period_s == robot["control_dt"] == pytest.approx(0.04)
    # torque task: the limits are the actuator's control range (the action bounds)
    assert meta.joint_pos_lower == [-3.0] and meta.joint_pos_upper == [3.0]
    assert json.loads(meta.extra["joint_range_lower"]) == robot["joint_pos_lower"]
    assert meta.extra["control_mode"] == "torque"
    assert meta.run_id == ck["run_id"] == "cartpole"
    assert meta.code_version == ck["code_version"] and meta.code_version
    assert meta.config_hash == ck["config_hash"] and meta.config_hash
    assert meta.recurrent_state == [] and meta.noise_shape is None
    assert float(meta.extra[PARITY_KEY]) <= TOL

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    opset = next(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
    assert meta.opset == opset == 17
    assert [i.name for i in model.graph.input] == ["obs"]
    assert [o.name for o in model.graph.output] == ["actions"]
    # every metadata field is stored under its own key
    keys = {p.key for p in model.metadata_props}
    assert {f"sim2real.{name}" for name in PolicyMetadata.__dataclass_fields__} <= keys


def test_position_control_metadata_uses_joint_ranges():
    from sim.randomization import SimToRealConfig
    from sim.registry import make

    env = make("quadruped", 1, s2r=SimToRealConfig())
    robot = env.robot.to_dict()
    ck = {
        "robot": robot,
        "architecture": {
            "task": "quadruped",
            "policy": {"rnn_type": "lstm", "rnn_layers": 2, "rnn_hidden": 8},
        },
        "config": {"env": {"max_episode_steps": 50}},
        "obs_terms": {"policy": [(t.name, t.size) for t in env.observation_spec.policy.terms]},
        "obs_history": 1,
        "run_id": "r",
        "code_version": "c",
        "config_hash": "h",
    }
    meta = metadata_from_checkpoint(ck, (env.action_spec.low, env.action_spec.high))
    env.close()
    assert meta.obs_size == 45 and meta.num_joints == 12
    assert meta.joint_pos_lower == robot["joint_pos_lower"]
    assert meta.joint_pos_upper == robot["joint_pos_upper"]
    assert meta.action_offset == robot["default_joint_pos"] == meta.default_joint_pos
    assert meta.action_scale == [0.25] * 12
    assert meta.extra["control_mode"] == "position"
    assert meta.extra["max_episode_steps"] == "50"
    assert meta.policy_family == "recurrent"
    assert meta.recurrent_state == [("h", [2, 8]), ("c", [2, 8])]


def test_recurrent_checkpoint_export(tmp_path):
    run = tmp_path / "gru"
    cfg = build_ppo_config(
        "cartpole",
        QUIET
        + ["run.total_steps=256", "env.num_envs=4", "ppo.num_steps=16"]
        + ["policy.rnn_type=gru", "policy.rnn_hidden=16", "policy.rnn_layers=2"],
    )
    OnPolicyRunner(cfg, run).train()
    path = export_run(run / "checkpoints" / "latest.pt")
    assert path == run / "policy.onnx"
    meta = read_metadata(path)
    assert meta.policy_family == "recurrent"
    assert meta.recurrent_state == [("h", [2, 16])]
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["obs", "h"]
    assert [o.name for o in model.graph.output] == ["actions", "next_h"]


# ---------------------------------------------------------------------- mechanism
class _ToyFlow(nn.Module):
    """A stand-in generative policy: a fixed number of Euler steps from noise."""

    policy_family = "flow"

    def __init__(self, obs: int, act: int, steps: int = 4) -> None:
        super().__init__()
        self.steps = steps
        self.net = nn.Sequential(nn.Linear(obs + act + 1, 32), nn.Tanh(), nn.Linear(32, act))

    def forward(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        x = noise
        for k in range(self.steps):  # unrolled by the tracer
            t = torch.full_like(x[:, :1], k / self.steps)
            x = x + self.net(torch.cat([obs, x, t], dim=-1)) / self.steps
        return x


def test_a_new_family_only_registers_its_wrapper(tmp_path, monkeypatch):
    # a private copy of the registry without "flow", whatever other code registered
    registry = {k: v for k, v in export_mod._EXPORTERS.items() if k != "flow"}
    monkeypatch.setattr(export_mod, "_EXPORTERS", registry)
    assert "gaussian_mlp" in registered_families() and "flow" not in registered_families()
    module = _ToyFlow(6, 2)
    meta = PolicyMetadata(
        policy_family="flow",
        obs_terms=[("o", 6)],
        action_joint_names=["a", "b"],
        action_scale=[1.0, 1.0],
        action_offset=[0.0, 0.0],
        default_joint_pos=[0.0, 0.0],
        kp=[1.0, 1.0],
        kd=[0.1, 0.1],
        joint_pos_lower=[-5.0, -5.0],
        joint_pos_upper=[5.0, 5.0],
        control_period_s=0.02,
        noise_shape=[2],
    )
    with pytest.raises(ExportError, match="no exporter registered for policy family 'flow'"):
        export_policy(module, meta, tmp_path / "flow.onnx")
    register_exporter("flow", lambda m, _meta: m)  # its forward is already (obs, noise)
    path = export_policy(module, meta, tmp_path / "flow.onnx")
    policy = OnnxPolicy(path)
    assert policy.is_generative
    rng = np.random.default_rng(0)
    obs = rng.standard_normal(6).astype(np.float32)
    noise = rng.standard_normal(2).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(obs)[None], torch.from_numpy(noise)[None])[0].numpy()
    np.testing.assert_allclose(policy.act(obs, noise=noise), want, atol=TOL)
    with pytest.raises(ValueError, match="already registered"):
        register_exporter("flow", lambda m, _meta: m)
    with pytest.raises(ValueError, match="unknown policy family"):
        register_exporter("transformer", lambda m, _meta: m)


def test_failed_parity_leaves_no_file(tmp_path, monkeypatch):
    module = _module(4, 1)
    monkeypatch.setattr(export_mod, "PARITY_TOLERANCE", -1.0)
    out = tmp_path / "p.onnx"
    with pytest.raises(ExportError, match="differ by up to"):
        export_policy(module, _meta(module), out)
    assert list(tmp_path.iterdir()) == []


def test_metadata_that_does_not_fit_the_module(tmp_path):
    module = _module(10, 3)
    with pytest.raises(ExportError, match="observations of size 10"):
        export_policy(module, _meta(module, obs_terms=[("a", 3), ("b", 8)]), tmp_path / "p.onnx")
    with pytest.raises(ExportError, match="'recurrent'"):
        export_policy(module, _meta(module, policy_family="recurrent"), tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists()


# ---------------------------------------------------------------------- non-finite
def _first_weight(module: nn.Module) -> str:
    return next(name for name, p in module.named_parameters() if p.dim() > 1)


def test_export_refuses_nan_weights(tmp_path):
    module = _module(4, 1)
    name = _first_weight(module)
    with torch.no_grad():
        module.get_parameter(name)[0, 0] = math.nan
    out = tmp_path / "p.onnx"
    with pytest.raises(ExportError, match=rf"parameter '{re.escape(name)}'.*non-finite"):
        export_policy(module, _meta(module), out)
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_export_refuses_all_nan_network(tmp_path):
    """The issue's case: an all-NaN network used to export with 'parity 0'."""
    module = _module(4, 1)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(math.nan)
    with pytest.raises(ExportError, match="non-finite"):
        export_policy(module, _meta(module), tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists()


def test_export_refuses_infinite_buffers(tmp_path):
    module = _module(4, 1)
    with torch.no_grad():
        module.normalizer.var[1] = math.inf
    with pytest.raises(ExportError, match=r"buffer 'normalizer\.var'"):
        export_policy(module, _meta(module), tmp_path / "p.onnx")


class _BadOutput(nn.Module):
    """Finite weights, non-finite outputs (for all or for some inputs)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        y = self.lin(obs)
        if self.kind == "nan":
            return y * math.nan
        if self.kind == "inf":
            return y / torch.zeros_like(y)
        return torch.log(obs[:, :1])  # NaN for the negative observations only


def _toy_meta() -> PolicyMetadata:
    return PolicyMetadata(
        policy_family="gaussian_mlp",
        obs_terms=[("o", 4)],
        action_joint_names=["a"],
        action_scale=[1.0],
        action_offset=[0.0],
        default_joint_pos=[0.0],
        kp=[0.0],
        kd=[0.0],
        joint_pos_lower=[-1.0],
        joint_pos_upper=[1.0],
        control_period_s=0.02,
    )


@pytest.mark.parametrize("kind", ["nan", "inf", "sometimes"])
def test_export_refuses_nonfinite_outputs(tmp_path, kind):
    out = tmp_path / "p.onnx"
    with pytest.raises(ExportError, match=r"output 'actions' is not finite"):
        export_policy(_BadOutput(kind), _toy_meta(), out)
    assert list(tmp_path.iterdir()) == []


def test_export_of_a_finite_toy_module_still_works(tmp_path):
    path = export_policy(nn.Linear(4, 1), _toy_meta(), tmp_path / "p.onnx")
    assert read_parity(path) <= TOL
