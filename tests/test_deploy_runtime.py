"""Tests of deploy.runtime: loading checks, the act() hot path, history, state, noise.

The ONNX models are built in-process with onnx.helper so that the tests know the exact
weights and can compare against a numpy reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from deploy.metadata import MetadataError, PolicyMetadata, write_metadata
from deploy.runtime import OnnxPolicy, PolicyLoadError

OPSET = 17
TERMS = [("base_ang_vel", 3), ("joint_pos", 4)]
FRAME = 7
JOINTS = ["j0", "j1", "j2", "j3"]
NJ = len(JOINTS)


def _meta(**overrides) -> PolicyMetadata:
    values = dict(
        policy_family="gaussian_mlp",
        obs_terms=TERMS,
        action_joint_names=JOINTS,
        action_scale=[0.25, 0.5, 1.0, 2.0],
        action_offset=[0.1, -0.1, 0.0, 0.3],
        default_joint_pos=[0.1, -0.1, 0.0, 0.3],
        kp=[20.0] * NJ,
        kd=[0.5] * NJ,
        joint_pos_lower=[-1.0] * NJ,
        joint_pos_upper=[1.0] * NJ,
        control_period_s=0.02,
        opset=OPSET,
        task="unit-test",
        run_id="run-0",
        code_version="abc123",
        config_hash="deadbeef",
    )
    values.update(overrides)
    return PolicyMetadata(**values)


def _vi(name: str, *dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", *dims])


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "policy", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def mlp_model(w: np.ndarray, b: np.ndarray, noise_dim: int | None = None) -> onnx.ModelProto:
    """actions = tanh(obs @ w + b) (+ noise @ n_w if noise_dim)."""
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "B"], ["pre"]),
    ]
    inputs = [_vi("obs", w.shape[0])]
    inits = [_init("W", w), _init("B", b)]
    if noise_dim is None:
        nodes.append(helper.make_node("Tanh", ["pre"], ["actions"]))
    else:
        nodes += [
            helper.make_node("Tanh", ["pre"], ["t"]),
            helper.make_node("MatMul", ["noise", "NW"], ["nz"]),
            helper.make_node("Add", ["t", "nz"], ["actions"]),
        ]
        inputs.append(_vi("noise", noise_dim))
        inits.append(_init("NW", np.eye(noise_dim, w.shape[1])))
    return _model(nodes, inputs, [_vi("actions", w.shape[1])], inits)


def rnn_model(w: np.ndarray, u: np.ndarray, v: np.ndarray) -> onnx.ModelProto:
    """next_h = tanh(obs @ w + h @ u); actions = next_h @ v."""
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["a"]),
        helper.make_node("MatMul", ["h", "U"], ["c"]),
        helper.make_node("Add", ["a", "c"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["next_h"]),
        helper.make_node("MatMul", ["next_h", "V"], ["actions"]),
    ]
    hidden = u.shape[0]
    return _model(
        nodes,
        [_vi("obs", w.shape[0]), _vi("h", hidden)],
        [_vi("actions", v.shape[1]), _vi("next_h", hidden)],
        [_init("W", w), _init("U", u), _init("V", v)],
    )


def _weights(in_dim: int, out_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.normal(0, 0.3, (in_dim, out_dim)).astype(np.float32),
        rng.normal(0, 0.1, out_dim).astype(np.float32),
    )


def _save(tmp_path: Path, model: onnx.ModelProto, meta: PolicyMetadata, name="p.onnx") -> Path:
    path = tmp_path / name
    write_metadata(model, meta)
    onnx.save(model, path)
    return path


@pytest.fixture
def mlp(tmp_path):
    w, b = _weights(FRAME, NJ)
    return _save(tmp_path, mlp_model(w, b), _meta()), w, b


# ---------------------------------------------------------------------- loading
def test_missing_file_raises_file_not_found(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        OnnxPolicy(path)


def test_truncated_file_raises_policy_load_error_with_path(mlp, tmp_path):
    path, _, _ = mlp
    data = path.read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[:200])  # inside the graph
    with pytest.raises(PolicyLoadError, match="truncated.onnx.*truncated or corrupted"):
        OnnxPolicy(bad)


def test_file_cut_inside_its_metadata_is_a_load_error(mlp, tmp_path):
    """onnxruntime accepts the cut file; the runtime must not."""
    path, _, _ = mlp
    data = path.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[:-5])  # inside the last metadata entry
    with pytest.raises(PolicyLoadError, match="cut.onnx.*ends at byte"):
        OnnxPolicy(bad)


def test_file_cut_between_metadata_entries_names_the_missing_keys(mlp, tmp_path):
    """A cut exactly between two entries leaves a valid file with fewer keys: the error
    names them and suggests truncation."""
    path, _, _ = mlp
    model = onnx.load(str(path))
    kept = list(model.metadata_props)[:5]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(model.SerializeToString())
    with pytest.raises(MetadataError, match="truncated copy.*sim2real.format_version"):
        OnnxPolicy(bad)


def test_random_bytes_raise_policy_load_error_with_path(tmp_path):
    bad = tmp_path / "random.onnx"
    bad.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(PolicyLoadError, match="random.onnx"):
        OnnxPolicy(bad)


def test_invalid_metadata_raises_metadata_error(tmp_path):
    w, b = _weights(FRAME, NJ)
    model = mlp_model(w, b)
    write_metadata(model, _meta())
    for prop in model.metadata_props:
        if prop.key == "sim2real.kp":
            prop.value = "[1.0, 2.0]"
    onnx.save(model, tmp_path / "p.onnx")
    with pytest.raises(MetadataError, match="sim2real.kp"):
        OnnxPolicy(tmp_path / "p.onnx")


def test_obs_size_mismatch_between_graph_and_metadata(tmp_path):
    w, b = _weights(FRAME + 1, NJ)
    path = _save(tmp_path, mlp_model(w, b), _meta())
    with pytest.raises(PolicyLoadError, match=r"'obs'.*obs_size"):
        OnnxPolicy(path)


def test_history_length_counts_in_obs_size(tmp_path):
    w, b = _weights(FRAME, NJ)  # graph takes one frame, metadata says three
    path = _save(tmp_path, mlp_model(w, b), _meta(obs_history_length=3))
    with pytest.raises(PolicyLoadError, match="obs"):
        OnnxPolicy(path)


def test_action_size_mismatch(tmp_path):
    w, b = _weights(FRAME, NJ + 1)
    path = _save(tmp_path, mlp_model(w, b), _meta())
    with pytest.raises(PolicyLoadError, match=r"'actions'.*joints"):
        OnnxPolicy(path)


def test_noise_input_must_match_noise_shape(tmp_path):
    w, b = _weights(FRAME, NJ)
    with_noise = _save(tmp_path, mlp_model(w, b, noise_dim=NJ), _meta(), "n.onnx")
    with pytest.raises(PolicyLoadError, match="noise"):
        OnnxPolicy(with_noise)
    without = _save(tmp_path, mlp_model(w, b), _meta(noise_shape=[NJ]), "m.onnx")
    with pytest.raises(PolicyLoadError, match="noise"):
        OnnxPolicy(without)
    wrong = _save(tmp_path, mlp_model(w, b, noise_dim=NJ), _meta(noise_shape=[NJ + 1]), "w.onnx")
    with pytest.raises(PolicyLoadError, match="noise"):
        OnnxPolicy(wrong)


def test_recurrent_state_must_match_metadata(tmp_path):
    rng = np.random.default_rng(0)
    model = rnn_model(
        rng.normal(size=(FRAME, 5)), rng.normal(size=(5, 5)), rng.normal(size=(5, NJ))
    )
    no_state = _save(tmp_path, model, _meta(policy_family="recurrent"), "a.onnx")
    with pytest.raises(PolicyLoadError, match="h"):
        OnnxPolicy(no_state)
    wrong_shape = _save(
        tmp_path, model, _meta(policy_family="recurrent", recurrent_state=[("h", [6])]), "b.onnx"
    )
    with pytest.raises(PolicyLoadError, match="'h'"):
        OnnxPolicy(wrong_shape)
    w, b = _weights(FRAME, NJ)
    phantom = _save(tmp_path, mlp_model(w, b), _meta(recurrent_state=[("h", [5])]), "c.onnx")
    with pytest.raises(PolicyLoadError, match="missing"):
        OnnxPolicy(phantom)


def test_runtime_works_without_torch_and_onnx(mlp):
    """A robot computer has no torch (and maybe no onnx): block both and run a policy."""
    path, w, b = mlp
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['onnx'] = None\n"
        "import json\nimport numpy as np\n"
        "from deploy.metadata import read_metadata\n"
        "from deploy.runtime import OnnxPolicy\n"
        "from deploy.safety import SafetyConfig, SafetyLayer\n"
        "meta = read_metadata(sys.argv[1])\n"
        "policy = OnnxPolicy(sys.argv[1])\n"
        "safety = SafetyLayer(SafetyConfig.from_metadata(meta))\n"
        "print(json.dumps(policy.act(np.ones(policy.obs_frame_size)).tolist()))\n"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=root, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    expected = np.tanh(np.ones(FRAME, dtype=np.float32) @ w + b)
    np.testing.assert_allclose(json.loads(result.stdout), expected, atol=1e-6)


# ---------------------------------------------------------------------- act
def test_act_matches_numpy_reference(mlp):
    path, w, b = mlp
    policy = OnnxPolicy(path)
    rng = np.random.default_rng(3)
    for _ in range(5):
        frame = rng.normal(size=FRAME)
        expected = np.tanh(frame.astype(np.float32) @ w + b)
        np.testing.assert_allclose(policy.act(frame), expected, atol=1e-6)


def test_act_returns_independent_arrays_and_out(mlp):
    path, w, b = mlp
    policy = OnnxPolicy(path)
    first = policy.act(np.ones(FRAME))
    second = policy.act(np.zeros(FRAME))
    assert not np.array_equal(first, second)
    buf = np.empty(NJ)
    assert policy.act(np.ones(FRAME), out=buf) is buf
    np.testing.assert_allclose(buf, first, atol=1e-7)


def test_session_called_directly_and_public_method_as_fallback(mlp):
    """act() skips onnxruntime's per-call Python checks when the C++ session is reachable
    (CPU provider), and uses the public method otherwise; both give the same actions."""
    import types

    path, w, b = mlp
    policy = OnnxPolicy(path)
    assert policy._run.args[0] is policy._binding._iobinding  # the direct C++ call
    frame = np.linspace(-1, 1, FRAME)
    fast = policy.act(frame)
    public = policy.session.run_with_iobinding
    policy.session = types.SimpleNamespace(run_with_iobinding=public)  # no `_sess`
    policy._run = policy._fast_run()
    assert policy._run.func == public
    np.testing.assert_array_equal(policy.act(frame), fast)
    np.testing.assert_allclose(fast, np.tanh(frame.astype(np.float32) @ w + b), atol=1e-6)


def test_act_writes_joint_targets_in_the_same_call(tmp_path):
    """act(..., targets=) equals to_joint_targets of the action, bit for bit; a rejected
    frame gives NaN targets (as the NaN action would); a wrong buffer is refused before
    anything is committed."""
    w, b = _weights(FRAME, NJ)
    meta = _meta(action_scale=[0.5, 0.25, 2.0, 1.0], action_offset=[0.1, -0.2, 0.0, 0.3])
    policy = OnnxPolicy(_save(tmp_path, mlp_model(w, b), meta))
    raw, targets = np.empty(NJ, np.float32), np.empty(NJ)
    for frame in np.random.default_rng(0).normal(size=(5, FRAME)):
        policy.act(frame, out=raw, targets=targets)
        np.testing.assert_array_equal(targets, policy.to_joint_targets(raw))
    policy.act(np.full(FRAME, np.nan), out=raw, targets=targets)
    assert np.isnan(targets).all() and np.isnan(raw).all()
    steps = policy.counters["steps"]
    for bad in (np.empty(NJ, np.float32), np.empty(NJ + 1), [0.0] * NJ):
        with pytest.raises(ValueError, match="targets must be a float64 array"):
            policy.act(np.zeros(FRAME), targets=bad)
    assert policy.counters["steps"] == steps


def test_wrong_frame_size_raises_value_error(mlp):
    policy = OnnxPolicy(mlp[0])
    with pytest.raises(ValueError, match=r"\(7,\).*\(8,\)"):
        policy.act(np.zeros(FRAME + 1))
    with pytest.raises(ValueError, match="shape"):
        policy.act(np.zeros((1, FRAME)))
    with pytest.raises(ValueError, match="noise"):
        policy.act(np.zeros(FRAME), noise=np.zeros(NJ))


def test_history_is_oldest_first_and_reset_refills(tmp_path):
    history = 3
    w, b = _weights(FRAME * history, NJ)
    path = _save(tmp_path, mlp_model(w, b), _meta(obs_history_length=history))
    policy = OnnxPolicy(path)
    assert policy.obs_size == FRAME * history

    def ref(frames):
        return np.tanh(np.concatenate(frames).astype(np.float32) @ w + b)

    frames = [np.full(FRAME, float(i + 1)) for i in range(5)]
    # First call: the history is filled with copies of the first frame.
    np.testing.assert_allclose(policy.act(frames[0]), ref([frames[0]] * 3), atol=1e-6)
    np.testing.assert_allclose(policy.obs_history(), np.concatenate([frames[0]] * 3))
    np.testing.assert_allclose(
        policy.act(frames[1]), ref([frames[0], frames[0], frames[1]]), atol=1e-6
    )
    np.testing.assert_allclose(policy.act(frames[2]), ref(frames[0:3]), atol=1e-6)
    np.testing.assert_allclose(policy.act(frames[3]), ref(frames[1:4]), atol=1e-6)
    np.testing.assert_allclose(policy.act(frames[4]), ref(frames[2:5]), atol=1e-6)
    np.testing.assert_allclose(policy.obs_history(), np.concatenate(frames[2:5]))
    policy.reset()
    np.testing.assert_allclose(policy.act(frames[1]), ref([frames[1]] * 3), atol=1e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_nonfinite_frame_is_not_committed(tmp_path):
    w, b = _weights(FRAME * 2, NJ)
    policy = OnnxPolicy(_save(tmp_path, mlp_model(w, b), _meta(obs_history_length=2)))
    policy.act(np.ones(FRAME))
    bad = np.ones(FRAME)
    bad[2] = np.nan
    assert np.isnan(policy.act(bad)).all()
    np.testing.assert_allclose(policy.obs_history(), np.ones(2 * FRAME))
    bad[2] = -np.inf
    assert np.isnan(policy.act(bad)).all()
    bad[2] = 1e300  # finite in float64, inf in float32
    assert np.isnan(policy.act(bad)).all()
    with np.errstate(all="raise"):  # a node that makes numpy raise must not crash
        assert np.isnan(policy.act(bad)).all()
        bad[2] = np.inf
        assert np.isnan(policy.act(bad)).all()
    np.testing.assert_allclose(policy.obs_history(), np.ones(2 * FRAME))
    assert policy.counters["nonfinite_frames"] == 5
    frame = np.full(FRAME, 2.0)
    np.testing.assert_allclose(
        policy.act(frame), np.tanh(np.r_[np.ones(FRAME), frame] @ w + b), atol=1e-6
    )


def test_recurrent_state_carried_like_numpy_loop(tmp_path):
    rng = np.random.default_rng(4)
    hidden = 5
    w = rng.normal(0, 0.5, (FRAME, hidden)).astype(np.float32)
    u = rng.normal(0, 0.5, (hidden, hidden)).astype(np.float32)
    v = rng.normal(0, 0.5, (hidden, NJ)).astype(np.float32)
    meta = _meta(policy_family="recurrent", recurrent_state=[("h", [hidden])])
    policy = OnnxPolicy(_save(tmp_path, rnn_model(w, u, v), meta))
    assert policy.is_recurrent
    frames = rng.normal(size=(6, FRAME)).astype(np.float32)

    def run_reference(frames):
        h = np.zeros(hidden, dtype=np.float32)
        out = []
        for x in frames:
            h = np.tanh(x @ w + h @ u)
            out.append(h @ v)
        return np.array(out), h

    expected, h_last = run_reference(frames)
    got = np.array([policy.act(x) for x in frames])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(policy.state["h"][0], h_last, atol=1e-5)
    policy.reset()
    np.testing.assert_allclose(policy.state["h"], 0.0)
    np.testing.assert_allclose(policy.act(frames[0]), expected[0], atol=1e-5)

    # act_batch: explicit state, same numbers, internal state untouched.
    policy.reset()
    state = policy.initial_state(2)
    batch = np.stack([frames, frames[::-1]], axis=1)  # [T, 2, FRAME]
    outs = []
    for x in batch:
        actions, state = policy.act_batch(x, state)
        outs.append(actions)
    np.testing.assert_allclose(np.array(outs)[:, 0], expected, atol=1e-5)
    np.testing.assert_allclose(np.array(outs)[:, 1], run_reference(frames[::-1])[0], atol=1e-5)
    np.testing.assert_allclose(policy.state["h"], 0.0)


def test_generative_noise_modes(tmp_path):
    w, b = _weights(FRAME, NJ)
    path = _save(
        tmp_path, mlp_model(w, b, noise_dim=NJ), _meta(policy_family="flow", noise_shape=[NJ])
    )
    frame = np.linspace(-1, 1, FRAME)
    base = np.tanh(frame.astype(np.float32) @ w + b)

    det = OnnxPolicy(path, deterministic=True)
    assert det.is_generative
    np.testing.assert_allclose(det.act(frame), base, atol=1e-6)
    np.testing.assert_allclose(det.act(frame), base, atol=1e-6)
    given = np.array([0.5, -0.5, 1.0, 0.0])
    np.testing.assert_allclose(det.act(frame, noise=given), base + given, atol=1e-6)
    np.testing.assert_allclose(det.act(frame), base, atol=1e-6)  # zeros again afterwards

    a, b2 = OnnxPolicy(path, seed=7), OnnxPolicy(path, seed=7)
    noise_ref = np.random.default_rng(7).standard_normal((2, NJ), dtype=np.float32)
    first, second = a.act(frame), a.act(frame)
    np.testing.assert_allclose(first, base + noise_ref[0], atol=1e-6)
    np.testing.assert_allclose(second, base + noise_ref[1], atol=1e-6)
    np.testing.assert_allclose(b2.act(frame), first, atol=0)
    b2.reset(seed=7)
    np.testing.assert_allclose(b2.act(frame), first, atol=0)

    actions, state = det.act_batch(np.stack([frame, frame]))
    assert state == {}
    np.testing.assert_allclose(actions, np.stack([base, base]), atol=1e-6)


def test_nonfinite_next_state_is_not_committed(tmp_path):
    """next_h = obs @ W + h overflows float32 for a huge frame: keep the old state."""
    w = np.full((FRAME, 2), 1e30, dtype=np.float32)
    v = np.ones((2, NJ), dtype=np.float32)
    model = _model(
        [
            helper.make_node("MatMul", ["obs", "W"], ["a"]),
            helper.make_node("Add", ["a", "h"], ["next_h"]),
            helper.make_node("MatMul", ["next_h", "V"], ["actions"]),
        ],
        [_vi("obs", FRAME), _vi("h", 2)],
        [_vi("actions", NJ), _vi("next_h", 2)],
        [_init("W", w), _init("V", v)],
    )
    meta = _meta(policy_family="recurrent", recurrent_state=[("h", [2])])
    policy = OnnxPolicy(_save(tmp_path, model, meta))
    policy.act(np.full(FRAME, 1e-30))
    state = policy.state["h"]
    np.testing.assert_allclose(state, np.full((1, 2), FRAME * 1.0), rtol=1e-5)
    with np.errstate(over="ignore", invalid="ignore"):
        policy.act(np.full(FRAME, 1e30))  # finite frame, infinite state
    np.testing.assert_array_equal(policy.state["h"], state)
    assert policy.counters["nonfinite_state"] == 1


def test_extra_graph_outputs_are_allowed(tmp_path):
    w, b = _weights(FRAME, NJ)
    model = _model(
        [
            helper.make_node("MatMul", ["obs", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], ["actions"]),
            helper.make_node("ReduceSum", ["actions"], ["value"], keepdims=1),
        ],
        [_vi("obs", FRAME)],
        [_vi("actions", NJ), _vi("value", 1)],
        [_init("W", w), _init("B", b)],
    )
    policy = OnnxPolicy(_save(tmp_path, model, _meta()))
    frame = np.arange(FRAME, dtype=np.float32)
    np.testing.assert_allclose(policy.act(frame), frame @ w + b, atol=1e-5)


def test_act_batch_matches_reference_and_validates(mlp):
    path, w, b = mlp
    policy = OnnxPolicy(path)
    obs = np.random.default_rng(5).normal(size=(8, FRAME))
    actions, state = policy.act_batch(obs)
    assert state == {}
    np.testing.assert_allclose(actions, np.tanh(obs.astype(np.float32) @ w + b), atol=1e-6)
    with pytest.raises(ValueError, match="obs must have shape"):
        policy.act_batch(np.zeros(FRAME))


def test_to_joint_targets(mlp):
    policy = OnnxPolicy(mlp[0])
    raw = np.array([1.0, -1.0, 0.5, 0.0], dtype=np.float32)
    expected = np.array([0.1 + 0.25, -0.1 - 0.5, 0.5, 0.3])
    np.testing.assert_allclose(policy.to_joint_targets(raw), expected, atol=1e-12)
    out = np.empty(NJ)
    assert policy.to_joint_targets(raw, out=out) is out
    np.testing.assert_allclose(out, expected, atol=1e-12)
    np.testing.assert_allclose(policy.to_joint_targets(np.stack([raw, raw])), [expected] * 2)
