"""Tests of deploy.metadata: the metadata contract of a deployed ONNX policy."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from deploy.metadata import (
    FORMAT_VERSION,
    OPTIONAL_FIELDS,
    MetadataError,
    PolicyLoadError,
    PolicyMetadata,
    from_props,
    read_metadata,
    to_props,
    write_metadata,
)

OPSET = 17
FIELDS = [f.name for f in dataclasses.fields(PolicyMetadata)]
REQUIRED = [name for name in FIELDS if name not in OPTIONAL_FIELDS]


def sample(**overrides) -> PolicyMetadata:
    values = dict(
        policy_family="recurrent",
        obs_terms=[("base_ang_vel", 3), ("projected_gravity", 3), ("joint_pos", 2)],
        action_joint_names=["hip", "knee"],
        action_scale=[0.25, 0.1 + 0.2],  # 0.30000000000000004 must survive exactly
        action_offset=[0.1, -0.8],
        default_joint_pos=[0.1, -0.8],
        kp=[20.0, 25.0],
        kd=[0.5, 0.6],
        joint_pos_lower=[-1.0, -2.5],
        joint_pos_upper=[1.0, 0.0],
        control_period_s=0.02,
        obs_history_length=3,
        recurrent_state=[("h", [64]), ("c", [2, 32])],
        noise_shape=None,
        task="go2-flat",
        run_id="2024-01-01_run",
        code_version="v0.1.0-3-gabc",
        config_hash="0123abcd",
        opset=OPSET,
        extra={"note": "ünïcode ok"},
        task_args={"command_vx": [0.0, 1.0], "model_path": None},
        sim_to_real={"friction_scale": [0.5, 1.25], "obs_noise": {"joint_pos": 0.01}},
        trained_randomized=True,
    )
    values.update(overrides)
    return PolicyMetadata(**values)


def tiny_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["obs"], ["actions"])],
        "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_props_round_trip_is_exact():
    meta = sample()
    props = to_props(meta)
    assert set(props) == {"sim2real." + name for name in FIELDS}
    assert json.loads(props["sim2real.format_version"]) == FORMAT_VERSION
    assert from_props(props) == meta
    generative = sample(policy_family="diffusion", recurrent_state=[], noise_shape=[16, 2])
    assert from_props(to_props(generative)) == generative


def test_sizes():
    meta = sample()
    assert meta.obs_frame_size == 8
    assert meta.obs_size == 24
    assert meta.num_joints == 2


def test_numpy_values_are_normalized():
    meta = sample(
        action_scale=np.array([0.25, 0.5], dtype=np.float32),
        obs_terms=[("a", np.int64(3))],
        obs_history_length=np.int32(2),
    )
    assert meta.action_scale == [0.25, 0.5]
    assert all(type(x) is float for x in meta.action_scale)
    assert meta.obs_terms == [("a", 3)]
    assert type(meta.obs_history_length) is int
    from_props(to_props(meta))


def test_file_round_trip_with_onnxruntime(tmp_path):
    path = tmp_path / "p.onnx"
    model = tiny_model()
    model.metadata_props.add(key="producer_note", value="kept")
    onnx.save(model, path)
    meta = sample()
    write_metadata(path, meta)
    assert read_metadata(path) == meta
    # Rewriting replaces our keys and keeps foreign ones.
    write_metadata(path, sample(run_id="second"))
    assert read_metadata(path).run_id == "second"
    props = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert props["producer_note"] == "kept"
    assert len([k for k in props if k.startswith("sim2real.")]) == len(FIELDS)


def test_write_into_model_proto():
    model = tiny_model()
    assert write_metadata(model, sample()) is model
    props = {p.key: p.value for p in model.metadata_props}
    assert from_props(props) == sample()


def test_opset_must_match_model():
    with pytest.raises(MetadataError, match="opset"):
        write_metadata(tiny_model(), sample(opset=OPSET + 1))


@pytest.mark.parametrize("name", REQUIRED)
def test_every_missing_field_is_named(name):
    props = to_props(sample())
    del props["sim2real." + name]
    with pytest.raises(MetadataError, match="missing key.*sim2real." + name):
        from_props(props)


def test_a_file_from_before_the_training_env_fields_loads_with_them_unrecorded():
    props = to_props(sample())
    for name in OPTIONAL_FIELDS:
        del props["sim2real." + name]
    meta = from_props(props)
    assert meta.task_args == {} and meta.sim_to_real is None and meta.trained_randomized is None
    assert meta == sample(task_args={}, sim_to_real=None, trained_randomized=None)


def test_training_env_fields_are_plain_json():
    meta = sample(task_args={"command_vx": (0, 1)}, sim_to_real={"action_latency": (0, 2)})
    assert meta.task_args == {"command_vx": [0, 1]}  # tuples as JSON lists: round-trips exactly
    assert from_props(to_props(meta)) == meta
    for key, value, match in [
        ("task_args", [1], "sim2real.task_args.*mapping"),
        ("task_args", {"x": float("nan")}, "sim2real.task_args.*JSON"),
        ("sim_to_real", {"x": {1, 2}}, "sim2real.sim_to_real.*JSON"),
        ("trained_randomized", 1, "sim2real.trained_randomized"),
    ]:
        with pytest.raises(MetadataError, match=match):
            sample(**{key: value})


def test_all_missing_keys_are_listed():
    props = to_props(sample())
    del props["sim2real.kp"], props["sim2real.kd"]
    with pytest.raises(MetadataError, match="sim2real.kp, sim2real.kd"):
        from_props(props)


def test_newer_format_version_is_rejected_with_supported_version():
    props = to_props(sample())
    props["sim2real.format_version"] = str(FORMAT_VERSION + 1)
    del props["sim2real.kp"]  # the version is reported even if fields changed
    with pytest.raises(MetadataError, match=f"newer.*supports format version {FORMAT_VERSION}"):
        from_props(props)
    props["sim2real.format_version"] = "0"
    with pytest.raises(MetadataError, match="unknown format version 0"):
        from_props(props)
    props["sim2real.format_version"] = "true"
    with pytest.raises(MetadataError, match="format_version"):
        from_props(props)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("action_scale", [1.0], "sim2real.action_scale.*1 entries.*2 action joints"),
        ("action_offset", [1.0, 2.0, 3.0], "sim2real.action_offset"),
        ("kp", [1.0], "sim2real.kp"),
        ("joint_pos_upper", [1.0], "sim2real.joint_pos_upper"),
        ("joint_pos_lower", [2.0, -2.5], "sim2real.joint_pos_lower.*hip"),
        ("default_joint_pos", [0.0, float("nan")], "sim2real.default_joint_pos.*non-finite"),
        ("obs_history_length", 0, "sim2real.obs_history_length"),
        ("obs_history_length", 1.5, "sim2real.obs_history_length"),
        ("obs_terms", [["a", 0]], "sim2real.obs_terms.*non-positive"),
        ("obs_terms", [["a", -3]], "sim2real.obs_terms"),
        ("obs_terms", [["a", 1], ["a", 2]], "sim2real.obs_terms.*duplicate"),
        ("obs_terms", [], "sim2real.obs_terms"),
        ("obs_terms", [["a"]], "sim2real.obs_terms"),
        ("action_joint_names", ["a", "a"], "sim2real.action_joint_names"),
        ("policy_family", "transformer", "sim2real.policy_family"),
        ("control_period_s", 0.0, "sim2real.control_period_s"),
        ("recurrent_state", [["obs", [4]]], "sim2real.recurrent_state"),
        ("recurrent_state", [["h", [0]]], "sim2real.recurrent_state"),
        ("noise_shape", [], "sim2real.noise_shape"),
        ("opset", True, "sim2real.opset"),
        ("extra", {"a": 1}, "sim2real.extra"),
        ("task", 3, "sim2real.task"),
    ],
)
def test_inconsistent_fields_are_named(key, value, match):
    props = to_props(sample())
    props["sim2real." + key] = json.dumps(value)
    with pytest.raises(MetadataError, match=match):
        from_props(props)


def test_invalid_json_is_named():
    props = to_props(sample())
    props["sim2real.kd"] = "[0.5, "
    with pytest.raises(MetadataError, match="sim2real.kd.*JSON"):
        from_props(props)


def test_foreign_and_unknown_keys_are_ignored():
    props = to_props(sample())
    props["producer"] = "pytorch"
    props["sim2real.some_future_optional_field"] = "1"
    assert from_props(props) == sample()


def test_constructor_validates():
    with pytest.raises(MetadataError, match="sim2real.kd"):
        sample(kd=[1.0])


def test_read_metadata_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        read_metadata(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(PolicyLoadError, match="bad.onnx"):
        read_metadata(bad)
    plain = tmp_path / "plain.onnx"
    onnx.save(tiny_model(), plain)
    with pytest.raises(MetadataError, match="missing key"):
        read_metadata(plain)
