"""Deploying a VLA policy: ONNX equals torch with fixed noise, the runtime runs without
torch, both sides tokenize alike, chunks execute as in training, bad inputs and bad files
are named, an older reader refuses a VLA file, and the older files still load."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import deploy.metadata as metadata_module  # noqa: E402
from deploy.export import PARITY_TOLERANCE, ExportError, export_policy, read_parity  # noqa: E402
from deploy.metadata import (  # noqa: E402
    VLA_FIELDS,
    MetadataError,
    PolicyLoadError,
    PolicyMetadata,
    from_props,
    read_metadata,
    to_props,
)
from deploy.runtime import OnnxPolicy  # noqa: E402
from deploy.tokenizer import InstructionTokenizer, TokenizerFileError, file_sha256  # noqa: E402
from deploy.vla_runtime import OnnxVLAPolicy  # noqa: E402
from policies.vla import VLAConfig, VLAPolicy  # noqa: E402
from policies.vla_tokenizer import (  # noqa: E402
    build_word_tokenizer,
    encode_instructions,
    instruction_vocabulary,
)

PROPRIO, ACT, HORIZON, ACT_STEPS = 5, 2, 4, 3
LOW, HIGH = [-1.0, -2.0], [1.0, 0.5]
INSTRUCTIONS = ["push the block left", "go right", "Pick up the red cube."]
OLD_FAMILIES = ("gaussian_mlp", "recurrent", "diffusion", "flow", "world_model")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny towers on a shared box: a thread pool only contends
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_word_tokenizer(instruction_vocabulary(INSTRUCTIONS), path)
    return path


def _policy(seed: int = 0) -> VLAPolicy:
    torch.manual_seed(seed)
    cfg = VLAConfig()
    cfg.head.act_steps = ACT_STEPS  # the chunk executes 3 of its 4 actions
    p = VLAPolicy(PROPRIO, ACT, cfg, action_low=LOW, action_high=HIGH)
    p.update_proprio_normalizer(torch.randn(64, PROPRIO) * 2 + 1)
    return p


def vla_meta(module, tokenizer: Path, **overrides) -> PolicyMetadata:
    """What the training side builds from a VLA checkpoint and its task."""
    n, s = module.action_size, module.image_size
    values = dict(
        policy_family="vla_flow",
        obs_terms=[("joint_pos", 3), ("joint_vel", PROPRIO - 3)],
        action_joint_names=[f"j{i}" for i in range(n)],
        action_scale=[0.5] * n,
        action_offset=[0.1] * n,
        default_joint_pos=[0.1] * n,
        kp=[20.0] * n,
        kd=[0.5] * n,
        joint_pos_lower=[-2.0] * n,
        joint_pos_upper=[2.0] * n,
        control_period_s=0.05,
        noise_shape=list(module.noise_shape),
        task="unit-test-vla",
        image_input=dict(
            name="image",
            height=s,
            width=s,
            channels=3,
            dtype="uint8",
            channel_order="RGB",
            layout="HWC",
            camera="wrist",
            mean=[0.5] * 3,
            std=[0.5] * 3,
        ),
        instruction_input=dict(
            name="instruction_ids",
            max_tokens=module.max_instruction_tokens,
            pad_id=module.pad_token_id,
            vocab_size=module.backbone.vocab_size,
            tokenizer_file="tokenizer.json",
            tokenizer_sha256=file_sha256(tokenizer),
        ),
        action_chunk=dict(horizon=module.horizon, act_steps=module.act_steps),
        flow_steps=module.steps,
    )
    values.update(overrides)
    return PolicyMetadata(**values)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer_file):
    """A tiny VLA (4 flow steps) exported with its tokenizer: (path, torch module)."""
    module = _policy(seed=1).inference_module(steps=4)
    out = tmp_path_factory.mktemp("vla") / "policy.onnx"
    return export_policy(
        module, vla_meta(module, tokenizer_file), out, tokenizer=tokenizer_file
    ), module


def _obs(seed: int, size: int = 64):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    proprio = (rng.normal(size=PROPRIO) * 2 + 1).astype(np.float32)
    noise = rng.normal(size=(HORIZON, ACT)).astype(np.float32)
    return image, proprio, noise


def _torch_chunk(module, tokenizer_file, image, proprio, noise, text) -> np.ndarray:
    ids = encode_instructions(_training_tokenizer(tokenizer_file), [text], 16)
    with torch.no_grad():
        out = module(
            torch.from_numpy(image[None]),
            torch.from_numpy(ids),
            torch.from_numpy(proprio[None]),
            torch.from_numpy(noise[None]),
        )
    return out[0].numpy()


def _training_tokenizer(path: Path):
    from policies.vla_tokenizer import load_tokenizer

    return load_tokenizer(path)


# ---------------------------------------------------------------------- ONNX equals torch
@pytest.mark.parametrize("steps", [1, 4])
def test_onnx_equals_torch_with_fixed_noise(tmp_path, tokenizer_file, steps):
    module = _policy(seed=2).inference_module(steps=steps)
    path = export_policy(
        module, vla_meta(module, tokenizer_file), tmp_path / "p.onnx", tokenizer=tokenizer_file
    )
    assert read_parity(path) <= PARITY_TOLERANCE
    policy = OnnxVLAPolicy(path)
    for i, text in enumerate(INSTRUCTIONS):
        image, proprio, noise = _obs(10 + i)
        policy.set_instruction(text)
        got = policy.act(image, proprio, noise)
        want = _torch_chunk(module, tokenizer_file, image, proprio, noise, text)
        assert got.shape == (HORIZON, ACT)
        assert np.abs(want).mean() > 0.05  # a meaningful comparison, not 0 against 0
        np.testing.assert_allclose(got, want, atol=PARITY_TOLERANCE, rtol=0)
    # the batch path, several instructions at once
    obs = [_obs(20 + i) for i in range(3)]
    images, proprio, noise = (np.stack(x) for x in zip(*obs))
    got = policy.act_batch(images, proprio, INSTRUCTIONS, noise)
    want = np.stack(
        [
            _torch_chunk(module, tokenizer_file, *o, text)
            for o, text in zip(obs, INSTRUCTIONS, strict=True)
        ]
    )
    np.testing.assert_allclose(got, want, atol=PARITY_TOLERANCE, rtol=0)


def test_export_writes_metadata_and_the_tokenizer_next_to_the_policy(exported, tokenizer_file):
    path, module = exported
    meta = read_metadata(path)
    assert meta.policy_family == "vla_flow" and meta.flow_steps == 4
    assert meta.image_input["height"] == meta.image_input["width"] == 64
    assert meta.image_input["mean"] == [0.5] * 3 and meta.image_input["layout"] == "HWC"
    assert meta.action_chunk == {"horizon": HORIZON, "act_steps": ACT_STEPS}
    copied = path.parent / meta.instruction_input["tokenizer_file"]
    assert copied.read_bytes() == tokenizer_file.read_bytes()
    assert meta.instruction_input["tokenizer_sha256"] == file_sha256(copied)
    model = onnx.load(str(path))
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert types == {
        "image": onnx.TensorProto.UINT8,
        "instruction_ids": onnx.TensorProto.INT64,
        "proprio": onnx.TensorProto.FLOAT,
        "noise": onnx.TensorProto.FLOAT,
    }
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.onnx", "tokenizer.json"]


def test_tokenizer_ids_are_the_same_on_both_sides(exported, tokenizer_file):
    path, _ = exported
    robot = InstructionTokenizer.for_policy(path, read_metadata(path))
    training = _training_tokenizer(tokenizer_file)
    texts = [*INSTRUCTIONS, "GO   right", "the red block. left"]
    want = encode_instructions(training, texts, 16)
    np.testing.assert_array_equal(robot.encode_batch(texts), want)
    for bad, culprit in [("the red block, left", "','"), ("go " * 17, "17 tokens")]:
        for encode in (robot.encode, lambda t: encode_instructions(training, [t], 16)):
            with pytest.raises(ValueError, match=culprit):
                encode(bad)
    assert robot.encode("go right").dtype == np.int64


def test_runtime_works_without_torch(exported, tokenizer_file):
    """A robot computer has no torch (nor transformers, nor onnx): block them and run."""
    path, module = exported
    image, proprio, noise = _obs(5)
    np.savez(path.parent / "obs.npz", image=image, proprio=proprio, noise=noise)
    code = (
        "import sys\n"
        "for name in ('torch', 'onnx', 'transformers', 'policies'): sys.modules[name] = None\n"
        "import json\nimport numpy as np\n"
        "from deploy.vla_runtime import OnnxVLAPolicy\n"
        "policy = OnnxVLAPolicy(sys.argv[1])\n"
        "policy.set_instruction('go right')\n"
        "d = np.load(sys.argv[2])\n"
        "print(json.dumps(policy.act(d['image'], d['proprio'], d['noise']).tolist()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path), str(path.parent / "obs.npz")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    want = _torch_chunk(module, tokenizer_file, image, proprio, noise, "go right")
    np.testing.assert_allclose(json.loads(result.stdout), want, atol=PARITY_TOLERANCE, rtol=0)


# ---------------------------------------------------------------------- chunk execution
def test_next_action_executes_act_steps_of_each_chunk_in_order(exported):
    path, _ = exported
    policy = OnnxVLAPolicy(path)
    policy.set_instruction("go right")
    image, proprio, noise = _obs(7)
    first = policy.act(image, proprio, noise)
    image2, proprio2, noise2 = _obs(8)
    second = policy.act(image2, proprio2, noise2)
    assert not np.allclose(first, second)

    assert policy.needs_observation
    got = [policy.next_action(image, proprio, noise)]
    for _ in range(ACT_STEPS - 1):  # inside a chunk no observation is needed
        assert not policy.needs_observation
        got.append(policy.next_action())
    assert policy.needs_observation
    got.append(policy.next_action(image2, proprio2, noise2))
    np.testing.assert_allclose(np.stack(got[:ACT_STEPS]), first[:ACT_STEPS], atol=1e-6)
    np.testing.assert_allclose(got[ACT_STEPS], second[0], atol=1e-6)
    assert policy.counters["chunks"] == 4 and policy.counters["steps"] == ACT_STEPS + 1

    # a new instruction, or a reset, drops the chunk being executed
    policy.set_instruction("push the block left")
    assert policy.needs_observation
    policy.next_action(image, proprio)
    policy.set_instruction("push the block left")  # the same text again: nothing changes
    assert not policy.needs_observation
    policy.reset()
    assert policy.needs_observation

    targets = policy.to_joint_targets(first)  # a whole chunk at once
    np.testing.assert_allclose(targets, 0.1 + 0.5 * first.astype(np.float64))


def test_seeded_and_deterministic_noise(exported):
    path, _ = exported
    image, proprio, _ = _obs(9)
    a, b = OnnxVLAPolicy(path, seed=3), OnnxVLAPolicy(path, seed=3)
    for p in (a, b):
        p.set_instruction("go right")
    np.testing.assert_array_equal(a.act(image, proprio), b.act(image, proprio))
    det = OnnxVLAPolicy(path, deterministic=True)
    det.set_instruction("go right")
    zeros = np.zeros((HORIZON, ACT), np.float32)
    np.testing.assert_array_equal(det.act(image, proprio), det.act(image, proprio, zeros))


def test_nonfinite_proprio_gives_nan_and_commits_no_chunk(exported):
    path, _ = exported
    policy = OnnxVLAPolicy(path)
    policy.set_instruction("go right")
    image, proprio, _ = _obs(1)
    proprio[2] = np.nan
    assert np.isnan(policy.next_action(image, proprio)).all()
    assert policy.needs_observation and policy.counters["nonfinite_inputs"] == 1


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.zeros((32, 32, 3), np.uint8), r"\[64, 64, 3\].*got shape \(32, 32, 3\).*resize"),
        (np.zeros((64, 64, 4), np.uint8), r"got shape \(64, 64, 4\) \(4 channels.*RGB"),
        (np.zeros((64, 64), np.uint8), r"got shape \(64, 64\)"),
        (np.zeros((3, 64, 64), np.uint8), r"channels go last"),
        (np.zeros((1, 64, 64, 3), np.uint8), r"not a batch"),
        (np.zeros((64, 64, 3), np.float32), r"uint8.*got dtype float32"),
    ],
)
def test_bad_images_are_named(exported, image, match):
    policy = OnnxVLAPolicy(exported[0])
    policy.set_instruction("go right")
    with pytest.raises(ValueError, match=match):
        policy.act(image, np.zeros(PROPRIO))


def test_bad_proprio_noise_and_missing_instruction_are_named(exported):
    policy = OnnxVLAPolicy(exported[0])
    image, proprio, _ = _obs(0)
    with pytest.raises(RuntimeError, match="no instruction set.*set_instruction"):
        policy.act(image, proprio)
    policy.set_instruction("go right")
    with pytest.raises(ValueError, match=r"proprio must have shape \(5,\).*joint_pos:3.*got"):
        policy.act(image, np.zeros(4))
    with pytest.raises(ValueError, match=r"noise must have 8 values"):
        policy.act(image, proprio, np.zeros(3))
    with pytest.raises(ValueError, match="new chunk and needs the image"):
        policy.next_action()


def test_bad_instructions_are_named(exported):
    policy = OnnxVLAPolicy(exported[0])
    policy.set_instruction("go right")
    with pytest.raises(ValueError, match="does not know: 'blue'"):
        policy.set_instruction("push the blue block left")
    long = " ".join(["go right"] * 9)
    with pytest.raises(ValueError, match="18 tokens, more than.*max_tokens=16"):
        policy.set_instruction(long)
    with pytest.raises(ValueError, match="empty"):
        policy.set_instruction("   ")
    assert policy.instruction == "go right"  # a refused instruction changes nothing


def test_missing_or_tampered_tokenizer_is_named(exported, tmp_path):
    path, _ = exported
    copy = tmp_path / "policy.onnx"
    copy.write_bytes(path.read_bytes())
    with pytest.raises(TokenizerFileError, match=r"tokenizer\.json.*does not exist"):
        OnnxVLAPolicy(copy)
    tok = tmp_path / "tokenizer.json"
    data = json.loads((path.parent / "tokenizer.json").read_text())
    data["model"]["vocab"]["right"], data["model"]["vocab"]["left"] = (
        data["model"]["vocab"]["left"],
        data["model"]["vocab"]["right"],
    )
    tok.write_text(json.dumps(data))
    with pytest.raises(TokenizerFileError, match="has sha256 .* exported with .*another tokenizer"):
        OnnxVLAPolicy(copy)
    assert issubclass(TokenizerFileError, PolicyLoadError)


def test_export_refuses_a_missing_or_foreign_tokenizer_and_a_wrong_metadata(
    tmp_path, tokenizer_file
):
    module = _policy().inference_module(steps=1)
    meta = vla_meta(module, tokenizer_file)
    with pytest.raises(ExportError, match="needs its instruction tokenizer"):
        export_policy(module, meta, tmp_path / "a.onnx")
    other = tmp_path / "other.json"
    build_word_tokenizer(["go", "left"], other)
    with pytest.raises(ExportError, match="has sha256"):
        export_policy(module, meta, tmp_path / "a.onnx", tokenizer=other)
    image = dict(meta.image_input, height=128, width=128)
    with pytest.raises(ExportError, match="image_size is 64 but.*image_input.height/width is 128"):
        export_policy(
            module,
            dataclasses.replace(meta, image_input=image),
            tmp_path / "a.onnx",
            tokenizer=tokenizer_file,
        )
    chunk = dict(meta.action_chunk, act_steps=ACT_STEPS - 1)
    with pytest.raises(ExportError, match="act_steps is 3 but.*action_chunk.act_steps is 2"):
        export_policy(
            module,
            dataclasses.replace(meta, action_chunk=chunk),
            tmp_path / "a.onnx",
            tokenizer=tokenizer_file,
        )
    wrong = dict(meta.image_input, mean=[0.485, 0.456, 0.406])
    with pytest.raises(ExportError, match="normalizes images with mean"):
        export_policy(
            module,
            dataclasses.replace(meta, image_input=wrong),
            tmp_path / "a.onnx",
            tokenizer=tokenizer_file,
        )
    assert not list(tmp_path.glob("*.onnx")) and not (tmp_path / "tokenizer.json").exists()


# ---------------------------------------------------------------------- metadata, old readers
def _mlp() -> tuple[torch.nn.Module, PolicyMetadata]:
    torch.manual_seed(0)
    meta = vla_meta(_policy().inference_module(steps=1), Path(__file__))
    fields = {name: None for name in VLA_FIELDS}
    meta = dataclasses.replace(
        meta, policy_family="gaussian_mlp", noise_shape=None, obs_terms=[("x", 4)], **fields
    )
    return torch.nn.Sequential(torch.nn.Linear(4, ACT), torch.nn.Tanh()), meta


def test_vla_metadata_validation_names_the_field(tokenizer_file):
    module = _policy().inference_module(steps=1)
    meta = vla_meta(module, tokenizer_file)
    assert from_props(to_props(meta)) == meta
    # the optional list of trained sentences round-trips; files without it load
    listed = dataclasses.replace(
        meta, instruction_input={**meta.instruction_input, "instructions": ["reach it"]}
    )
    assert from_props(to_props(listed)) == listed
    assert "instructions" not in meta.instruction_input
    for overrides, match in [
        (dict(flow_steps=None), "sim2real.flow_steps.*required for policy family 'vla_flow'"),
        (dict(image_input=dict(meta.image_input, channels=4)), "image_input.*channels must be 3"),
        (dict(image_input=dict(meta.image_input, layout="CHW")), "image_input.*layout must be"),
        (dict(image_input={"name": "image"}), "image_input.*missing \\['height'"),
        (
            dict(instruction_input=dict(meta.instruction_input, tokenizer_file="../t.json")),
            "tokenizer_file must be a file name next to the policy file",
        ),
        (
            dict(instruction_input=dict(meta.instruction_input, tokenizer_sha256="abc")),
            "tokenizer_sha256 must be 64 lowercase hex digits",
        ),
        (
            dict(instruction_input=dict(meta.instruction_input, instructions="reach it")),
            "instruction_input.*key 'instructions'.*expected a list",
        ),
        (
            dict(instruction_input=dict(meta.instruction_input, sentences=["reach it"])),
            "instruction_input.*unknown \\['sentences'\\]",
        ),
        (dict(action_chunk={"horizon": 4, "act_steps": 5}), "act_steps must be in \\[1, horizon"),
        (dict(noise_shape=[3, 2]), "sim2real.noise_shape.*\\[horizon, joints\\] = \\[4, 2\\]"),
        (dict(obs_history_length=2), "obs_history_length.*must be 1"),
    ]:
        with pytest.raises(MetadataError, match=match):
            dataclasses.replace(meta, **overrides)
    flow = dict(policy_family="flow", noise_shape=[4, 2])
    with pytest.raises(MetadataError, match="image_input.*is set but policy family 'flow'"):
        dataclasses.replace(meta, **flow)


def test_an_older_reader_refuses_a_vla_file_by_its_family(exported, monkeypatch):
    """A reader of before the VLA family ignores the new keys but not the family."""
    path, _ = exported
    props = to_props(read_metadata(path))
    monkeypatch.setattr(metadata_module, "POLICY_FAMILIES", OLD_FAMILIES)
    with pytest.raises(MetadataError, match="sim2real.policy_family.*'vla_flow' is not one of"):
        from_props({k: v for k, v in props.items() if k[len("sim2real.") :] not in VLA_FIELDS})


def test_the_obs_runtime_refuses_a_vla_file_and_the_vla_runtime_an_obs_file(exported, tmp_path):
    with pytest.raises(PolicyLoadError, match="vision-language-action.*OnnxVLAPolicy"):
        OnnxPolicy(exported[0])
    module, meta = _mlp()
    path = export_policy(module, meta, tmp_path / "mlp.onnx")
    with pytest.raises(PolicyLoadError, match="'gaussian_mlp' has no image.*deploy.runtime"):
        OnnxVLAPolicy(path)


def test_files_without_the_vla_keys_still_load():
    _, meta = _mlp()
    props = to_props(meta)
    assert all(json.loads(props["sim2real." + name]) is None for name in VLA_FIELDS)
    old = {k: v for k, v in props.items() if k[len("sim2real.") :] not in VLA_FIELDS}
    assert from_props(old) == meta
