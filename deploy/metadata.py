"""The metadata contract of a deployed ONNX policy.

An exported policy is a single ONNX file; everything the robot side needs to run it
(observation layout, joint order, action scale and offset, PD gains, limits, control
period, history length, recurrent state and noise inputs) travels inside that file as
``metadata_props``, so that nothing has to be guessed or copied by hand on the robot.

Each field of :class:`PolicyMetadata` is stored under its own key ``"sim2real.<field>"``
with a JSON-encoded value. Keeping one key per field (instead of one JSON blob) lets
tools such as Netron show the fields individually and lets a reader name exactly which
key is missing or wrong.

Graph contract that goes with the metadata (checked by :mod:`deploy.runtime`):

- input ``obs``: float32 ``[batch, obs_size]``. It is the observation history, oldest
  frame first, frames concatenated; a frame is the observation terms of ``obs_terms``
  concatenated in order. ``obs_history_length == 1`` means just the current frame.
- input ``noise`` (only if ``noise_shape`` is not None): float32 ``[batch, *noise_shape]``,
  standard-normal noise for generative policies (diffusion, flow).
- for each ``(name, shape)`` in ``recurrent_state``: input ``name`` float32
  ``[batch, *shape]`` (batch first) and output ``"next_" + name`` of the same shape.
  The initial state is zeros.
- output ``actions``: float32 ``[batch, num_joints]``, the raw network action; the joint
  target is ``action_offset + action_scale * actions``.

Training-side fields (optional: files written before them load with "not recorded"):
``task_args``, the task constructor's options the policy trained with (e.g. narrowed
command ranges), ``sim_to_real``, the task's sim-to-real settings as the training run
configured them (``sim.randomization.SimToRealConfig`` as JSON: the task's defaults with
the run's ``env.s2r`` over them), and ``trained_randomized``, whether training used those
settings (``env.randomize``). The robot side needs none of them; sim2sim evaluation
builds its env from them. They were added without a version bump because they are
optional and a reader of version 1 ignores keys it does not know, so new files still
load on robots with an older reader.

Vision-language-action policies (family ``"vla_flow"``) add four optional fields, all
set for that family and null for every other one:

- ``image_input``: the camera image input, ``{"name", "height", "width", "channels": 3,
  "dtype": "uint8", "channel_order": "RGB", "layout": "HWC", "camera", "mean", "std"}``;
  ``mean`` and ``std`` are the per-channel normalization on the [0, 1] scale that the
  graph applies *inside* (recorded so that a reader knows what the network expects, not
  for the robot to apply).
- ``instruction_input``: the token-id input, ``{"name", "max_tokens", "pad_id",
  "vocab_size", "tokenizer_file", "tokenizer_sha256"}``; the tokenizer is a
  ``tokenizers`` JSON file next to the ``.onnx`` (a bare file name), checked by its
  sha256 on load (:mod:`deploy.tokenizer`); ``vocab_size`` is the rows of the model's
  token embedding, which every id must be below. Optional ``instructions``: the
  sentences the task trained with (a robot may refuse any other; files without the key
  load as before).
- ``action_chunk``: ``{"horizon", "act_steps"}``: the graph returns ``horizon`` actions;
  the robot executes the first ``act_steps`` of each, as training did.
- ``flow_steps``: the Euler steps unrolled inside the graph.

For that family ``obs_terms`` are the proprioceptive terms, in order, and the VLA graph
contract replaces the one above (checked by :mod:`deploy.vla_runtime`): inputs
``image_input.name`` uint8 ``[batch, H, W, C]``, ``instruction_input.name`` int64
``[batch, max_tokens]`` (right-padded with ``pad_id``), ``proprio`` float32
``[batch, obs_size]``, ``noise`` float32 ``[batch, *noise_shape]`` (``[horizon, A]``, or
``[flow_steps + 1, horizon, A]`` for a stochastic sampler); output ``actions`` float32
``[batch, horizon, num_joints]``, the raw actions of the chunk (scale and offset apply
per action as above).

An older reader must not run such a file as an observation-only policy, and it does
not: its ``policy_family`` check refuses a family it does not know (``field
'sim2real.policy_family': 'vla_flow' is not one of (...)``) before any graph is run,
and its graph check would refuse the missing ``obs`` input anyway. So the format
version stays 1: files of the older families are unchanged and every reader either
runs a file correctly or names why it cannot.

Reading needs only the standard library and onnxruntime (a robot computer has neither
torch nor necessarily onnx); :func:`write_metadata` uses the ``onnx`` package, which is
imported lazily because only the export side calls it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from deploy.files import atomic_write

FORMAT_VERSION = 1
"""Version of this metadata format; readers reject any other version."""

KEY_PREFIX = "sim2real."
"""Prefix of every metadata key written by :func:`to_props`."""

POLICY_FAMILIES = ("gaussian_mlp", "recurrent", "diffusion", "flow", "world_model", "vla_flow")
"""Allowed values of :attr:`PolicyMetadata.policy_family`."""

VLA_FAMILIES = ("vla_flow",)
"""Families with image and instruction inputs and a chunk output (:mod:`deploy.vla_runtime`
runs them; :class:`deploy.runtime.OnnxPolicy` cannot)."""

VLA_FIELDS = ("image_input", "instruction_input", "action_chunk", "flow_steps")
"""Fields every file of a :data:`VLA_FAMILIES` family sets and no other file does."""

OPTIONAL_FIELDS = ("task_args", "sim_to_real", "trained_randomized", *VLA_FIELDS)
"""Fields a file may lack (written before they existed): they read as their defaults."""

RESERVED_IO_NAMES = ("obs", "noise", "actions")
"""Graph input/output names with a fixed meaning; recurrent states may not use them."""

VLA_PROPRIO_INPUT = "proprio"
"""Graph input of a VLA policy's proprioceptive terms (``obs_terms``), float32."""

IMAGE_INPUT_KEYS = (
    "name",
    "height",
    "width",
    "channels",
    "dtype",
    "channel_order",
    "layout",
    "camera",
    "mean",
    "std",
)
"""Keys of :attr:`PolicyMetadata.image_input`."""

INSTRUCTION_INPUT_KEYS = (
    "name",
    "max_tokens",
    "pad_id",
    "vocab_size",
    "tokenizer_file",
    "tokenizer_sha256",
)
"""Keys of :attr:`PolicyMetadata.instruction_input`."""

INSTRUCTION_INPUT_OPTIONAL = ("instructions",)
"""Keys :attr:`PolicyMetadata.instruction_input` may have besides the required ones."""

ACTION_CHUNK_KEYS = ("horizon", "act_steps")
"""Keys of :attr:`PolicyMetadata.action_chunk`."""

__all__ = [
    "ACTION_CHUNK_KEYS",
    "FORMAT_VERSION",
    "IMAGE_INPUT_KEYS",
    "INSTRUCTION_INPUT_KEYS",
    "KEY_PREFIX",
    "OPTIONAL_FIELDS",
    "POLICY_FAMILIES",
    "VLA_FAMILIES",
    "VLA_FIELDS",
    "VLA_PROPRIO_INPUT",
    "MetadataError",
    "PolicyLoadError",
    "PolicyMetadata",
    "check_file_complete",
    "from_props",
    "read_metadata",
    "to_props",
    "write_metadata",
]


class MetadataError(ValueError):
    """The metadata of a policy file is missing, malformed, inconsistent or too new."""


class PolicyLoadError(RuntimeError):
    """A policy file exists but cannot be loaded (corrupted, truncated, wrong graph).

    Defined here (and re-exported by :mod:`deploy.runtime`) so that
    :func:`read_metadata` can raise the same error as the runtime without a circular
    import.
    """


_PER_JOINT_FIELDS = (
    "action_scale",
    "action_offset",
    "default_joint_pos",
    "kp",
    "kd",
    "joint_pos_lower",
    "joint_pos_upper",
)


@dataclass(kw_only=True)
class PolicyMetadata:
    """Everything the robot side needs to run an exported policy.

    Construction normalizes values (numpy arrays and tuples become plain lists of Python
    scalars, so the object is JSON-serializable) and validates them, raising
    :class:`MetadataError` naming the offending field. Per-joint lists follow the order
    of ``action_joint_names``.
    """

    policy_family: str
    obs_terms: list[tuple[str, int]]
    action_joint_names: list[str]
    action_scale: list[float]
    action_offset: list[float]
    default_joint_pos: list[float]
    kp: list[float]
    kd: list[float]
    joint_pos_lower: list[float]
    joint_pos_upper: list[float]
    control_period_s: float
    obs_history_length: int = 1
    recurrent_state: list[tuple[str, list[int]]] = field(default_factory=list)
    noise_shape: list[int] | None = None
    task: str = ""
    run_id: str = ""
    code_version: str = ""
    config_hash: str = ""
    opset: int = 17
    extra: dict[str, str] = field(default_factory=dict)
    # the training run's env, for sim2sim evaluation (see the module doc); optional
    task_args: dict[str, Any] = field(default_factory=dict)
    sim_to_real: dict[str, Any] | None = None
    trained_randomized: bool | None = None
    # vision-language-action policies only (see the module doc); optional
    image_input: dict[str, Any] | None = None
    instruction_input: dict[str, Any] | None = None
    action_chunk: dict[str, int] | None = None
    flow_steps: int | None = None
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        self._normalize()
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def obs_frame_size(self) -> int:
        """Size of one observation frame: the sum of the observation term sizes."""
        return sum(size for _, size in self.obs_terms)

    @property
    def obs_size(self) -> int:
        """Size of the policy input ``obs``: one frame times the history length.

        The input is the history of observation frames, oldest first, concatenated;
        a history length of 1 means just the current frame.
        """
        return self.obs_frame_size * self.obs_history_length

    @property
    def num_joints(self) -> int:
        """Number of action joints (the last dimension of the ``actions`` output)."""
        return len(self.action_joint_names)

    @property
    def is_vla(self) -> bool:
        """Whether the policy has image and instruction inputs (:data:`VLA_FAMILIES`)."""
        return self.policy_family in VLA_FAMILIES

    # ------------------------------------------------------------------ normalization
    def _normalize(self) -> None:
        """Coerce field values to plain Python types, naming the field on failure."""
        converters = {
            "format_version": _as_int,
            "policy_family": _as_str,
            "obs_terms": _as_obs_terms,
            "action_joint_names": lambda v: [_as_str(x) for x in _as_list(v)],
            "control_period_s": _as_float,
            "obs_history_length": _as_int,
            "recurrent_state": _as_recurrent_state,
            "noise_shape": lambda v: None if v is None else [_as_int(x) for x in _as_list(v)],
            "task": _as_str,
            "run_id": _as_str,
            "code_version": _as_str,
            "config_hash": _as_str,
            "opset": _as_int,
            "extra": _as_str_dict,
            "task_args": _as_json_object,
            "sim_to_real": lambda v: None if v is None else _as_json_object(v),
            "trained_randomized": lambda v: None if v is None else _as_bool(v),
            "image_input": lambda v: None if v is None else _as_image_input(v),
            "instruction_input": lambda v: None if v is None else _as_instruction_input(v),
            "action_chunk": lambda v: None if v is None else _as_action_chunk(v),
            "flow_steps": lambda v: None if v is None else _as_int(v),
        }
        for name in _PER_JOINT_FIELDS:
            converters[name] = lambda v: [_as_float(x) for x in _as_list(v)]
        for f in fields(self):
            try:
                setattr(self, f.name, converters[f.name](getattr(self, f.name)))
            except (TypeError, ValueError) as exc:
                raise MetadataError(f"field {_key(f.name)!r}: {exc}") from None

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check internal consistency; raise :class:`MetadataError` naming the field."""
        if self.format_version != FORMAT_VERSION:
            raise MetadataError(
                f"field {_key('format_version')!r}: format version {self.format_version} is "
                f"not supported; this reader supports version {FORMAT_VERSION}"
            )
        if self.policy_family not in POLICY_FAMILIES:
            _fail("policy_family", f"{self.policy_family!r} is not one of {POLICY_FAMILIES}")
        if not self.obs_terms:
            _fail("obs_terms", "must list at least one observation term")
        names = [name for name, _ in self.obs_terms]
        if len(set(names)) != len(names):
            _fail("obs_terms", f"duplicate term names in {names}")
        for name, size in self.obs_terms:
            if size <= 0:
                _fail("obs_terms", f"term {name!r} has non-positive size {size}")
        if self.obs_history_length < 1:
            _fail("obs_history_length", f"must be >= 1, got {self.obs_history_length}")
        n = len(self.action_joint_names)
        if n == 0:
            _fail("action_joint_names", "must name at least one joint")
        if len(set(self.action_joint_names)) != n:
            _fail("action_joint_names", f"duplicate joint names in {self.action_joint_names}")
        for name in _PER_JOINT_FIELDS:
            values = getattr(self, name)
            if len(values) != n:
                _fail(name, f"has {len(values)} entries but there are {n} action joints")
            if not all(math.isfinite(v) for v in values):
                _fail(name, "contains a non-finite value")
        for i, (lo, hi) in enumerate(zip(self.joint_pos_lower, self.joint_pos_upper)):
            if lo > hi:
                _fail(
                    "joint_pos_lower",
                    f"lower limit {lo} > upper limit {hi} for joint {self.action_joint_names[i]!r}",
                )
        if not (math.isfinite(self.control_period_s) and self.control_period_s > 0):
            _fail("control_period_s", f"must be finite and > 0, got {self.control_period_s}")
        state_names = [name for name, _ in self.recurrent_state]
        if len(set(state_names)) != len(state_names):
            _fail("recurrent_state", f"duplicate state names in {state_names}")
        for name, shape in self.recurrent_state:
            if not name or name in RESERVED_IO_NAMES or name.startswith("next_"):
                _fail("recurrent_state", f"invalid state name {name!r}")
            if not shape or any(d <= 0 for d in shape):
                _fail("recurrent_state", f"state {name!r} has invalid shape {shape}")
        if self.noise_shape is not None and (
            not self.noise_shape or any(d <= 0 for d in self.noise_shape)
        ):
            _fail(
                "noise_shape", f"must be None or a list of positive sizes, got {self.noise_shape}"
            )
        if self.opset <= 0:
            _fail("opset", f"must be positive, got {self.opset}")
        self._validate_vla()

    def _validate_vla(self) -> None:
        present = [name for name in VLA_FIELDS if getattr(self, name) is not None]
        if not self.is_vla:
            if present:
                _fail(
                    present[0],
                    f"is set but policy family {self.policy_family!r} has no image or "
                    f"instruction input (only {VLA_FAMILIES} do)",
                )
            return
        for name in VLA_FIELDS:
            if getattr(self, name) is None:
                _fail(name, f"is required for policy family {self.policy_family!r}")
        if self.obs_history_length != 1:
            _fail("obs_history_length", "must be 1 for a VLA policy (it sees one frame)")
        if self.recurrent_state:
            _fail("recurrent_state", "must be empty for a VLA policy (the robot executes chunks)")
        image, instr, chunk = self.image_input, self.instruction_input, self.action_chunk
        steps = self.flow_steps
        assert image is not None and instr is not None and chunk is not None and steps is not None
        if steps < 1:
            _fail("flow_steps", f"must be >= 1, got {steps}")
        for key in ("height", "width", "channels"):
            if image[key] < 1:
                _fail("image_input", f"{key} must be >= 1, got {image[key]}")
        for key, want in (("dtype", "uint8"), ("channel_order", "RGB"), ("layout", "HWC")):
            if image[key] != want:
                _fail("image_input", f"{key} must be {want!r}, got {image[key]!r}")
        if image["channels"] != 3:
            _fail("image_input", f"channels must be 3 (RGB), got {image['channels']}")
        for key in ("mean", "std"):
            values = image[key]
            if len(values) != image["channels"] or not all(math.isfinite(v) for v in values):
                _fail("image_input", f"{key} must be {image['channels']} finite numbers")
        if not all(v > 0 for v in image["std"]):
            _fail("image_input", f"std must be > 0, got {image['std']}")
        if instr["max_tokens"] < 1:
            _fail("instruction_input", f"max_tokens must be >= 1, got {instr['max_tokens']}")
        if not 0 <= instr["pad_id"] < instr["vocab_size"]:
            _fail(
                "instruction_input",
                f"pad_id must be in [0, vocab_size={instr['vocab_size']}), got {instr['pad_id']}",
            )
        name = instr["tokenizer_file"]
        # a bare name: the file sits next to the .onnx, never elsewhere on the robot
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            _fail(
                "instruction_input",
                f"tokenizer_file must be a file name next to the policy file, got {name!r}",
            )
        digest = instr["tokenizer_sha256"]
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            _fail(
                "instruction_input",
                f"tokenizer_sha256 must be 64 lowercase hex digits, got {digest!r}",
            )
        names = [image["name"], instr["name"], VLA_PROPRIO_INPUT, "noise"]
        if len(set(names)) != len(names) or not all(names) or "actions" in names:
            _fail("image_input", f"graph input names {names} must be distinct and not 'actions'")
        if not 1 <= chunk["act_steps"] <= chunk["horizon"]:
            _fail(
                "action_chunk",
                f"act_steps must be in [1, horizon={chunk['horizon']}], got {chunk['act_steps']}",
            )
        x0 = [chunk["horizon"], self.num_joints]
        if self.noise_shape not in (x0, [steps + 1, *x0]):
            _fail(
                "noise_shape",
                f"must be [horizon, joints] = {x0} or, for a stochastic sampler, [flow_steps "
                f"+ 1, horizon, joints] = {[steps + 1, *x0]}; got {self.noise_shape}",
            )

    @property
    def chunk_shape(self) -> tuple[int, int]:
        """``(horizon, num_joints)``: the ``actions`` output of a VLA policy, per row."""
        if self.action_chunk is None:
            raise MetadataError(f"policy family {self.policy_family!r} has no action chunk")
        return (self.action_chunk["horizon"], self.num_joints)


# ---------------------------------------------------------------------- serialization
def to_props(meta: PolicyMetadata) -> dict[str, str]:
    """Serialize to ONNX ``metadata_props``: one ``"sim2real.<field>"`` key per field.

    Values are JSON text; floats round-trip exactly because JSON uses ``repr``.
    """
    meta.validate()
    props: dict[str, str] = {}
    for f in fields(meta):
        value = getattr(meta, f.name)
        if f.name in ("obs_terms", "recurrent_state"):
            value = [list(item) for item in value]
        props[_key(f.name)] = json.dumps(value, allow_nan=False)
    return props


def from_props(props: Mapping[str, str]) -> PolicyMetadata:
    """Parse and validate metadata from ONNX ``metadata_props``.

    Keys without the ``"sim2real."`` prefix (e.g. a producer's own) are ignored, as are
    unknown ``sim2real.*`` keys; a missing key of :data:`OPTIONAL_FIELDS` reads as the
    field's default. Raises :class:`MetadataError` naming every missing required key,
    a format version other than :data:`FORMAT_VERSION`, undecodable JSON, or an
    inconsistent field.
    """
    version_key = _key("format_version")
    if version_key in props:
        version = _decode(version_key, props[version_key])
        if not isinstance(version, int) or isinstance(version, bool):
            raise MetadataError(f"field {version_key!r}: must be an integer, got {version!r}")
        if version != FORMAT_VERSION:
            newer = "a newer" if version > FORMAT_VERSION else "an unknown"
            raise MetadataError(
                f"policy metadata has {newer} format version {version}; this reader supports "
                f"format version {FORMAT_VERSION} only (update sim2real on the robot or "
                "re-export the policy)"
            )
    names = [f.name for f in fields(PolicyMetadata)]
    missing = [
        _key(name) for name in names if _key(name) not in props and name not in OPTIONAL_FIELDS
    ]
    if missing:
        # a file cut between two metadata entries still loads, with only the first ones
        partial = any(k.startswith(KEY_PREFIX) for k in props)
        hint = " (a truncated copy of the file?)" if partial else ""
        raise MetadataError(f"policy metadata is missing key(s){hint}: {', '.join(missing)}")
    values = {name: _decode(_key(name), props[_key(name)]) for name in names if _key(name) in props}
    return PolicyMetadata(**values)


def write_metadata(model: Any, meta: PolicyMetadata) -> Any:
    """Store ``meta`` in an ONNX model (export side; requires the ``onnx`` package).

    ``model`` is a path (the file is rewritten atomically, so a crash never leaves a
    half-written policy) or an ``onnx.ModelProto`` (modified in place and returned).
    Existing ``sim2real.*`` keys are replaced; other keys are kept. Raises
    :class:`MetadataError` if ``meta.opset`` disagrees with the model's default-domain
    opset, so that the recorded opset is never a guess.
    """
    import onnx

    props = to_props(meta)
    if isinstance(model, onnx.ModelProto):
        _set_props(model, props, meta.opset)
        return model
    path = os.fspath(model)
    proto = onnx.load(path, load_external_data=False)
    _set_props(proto, props, meta.opset)
    atomic_write(path, proto.SerializeToString())
    return path


def read_metadata(path: str | os.PathLike[str]) -> PolicyMetadata:
    """Read and validate the metadata of a policy file using onnxruntime only.

    Raises FileNotFoundError if the file does not exist, :class:`PolicyLoadError` if
    onnxruntime cannot load it, and :class:`MetadataError` if the metadata is invalid.
    """
    import onnxruntime as ort

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(2, "policy file not found", path)
    check_file_complete(path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise PolicyLoadError(
            f"cannot load policy file {path!r} (truncated or corrupted?): {exc}"
        ) from exc
    return from_props(session.get_modelmeta().custom_metadata_map)


def check_file_complete(path: str) -> None:
    """PolicyLoadError naming the path if the file ends inside one of its protobuf fields."""
    end = _protobuf_end(path)
    if end is not None:
        raise PolicyLoadError(
            f"cannot load policy file {path!r} (truncated or corrupted?): it ends at byte "
            f"{os.path.getsize(path)} inside a field that needs {end} bytes"
        )


# ---------------------------------------------------------------------- helpers
def _protobuf_end(path: str) -> int | None:
    """None if the file's top-level protobuf fields all end within the file, else the
    size the file would need.

    onnxruntime accepts a ModelProto cut between two metadata entries (they come after
    the graph), and the robot would then see "missing keys" where the truth is a
    truncated copy; walking the top-level fields finds the cut without the onnx package.
    Bytes that are not protobuf at all are left to onnxruntime to refuse.
    """
    with open(path, "rb") as f:
        data = f.read()
    pos, size = 0, len(data)

    def varint() -> int | None:
        nonlocal pos
        value = shift = 0
        while pos < size and shift < 64:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        return None

    while pos < size:
        tag = varint()
        if tag is None:
            return None
        wire = tag & 7
        if wire == 0:
            if varint() is None:
                return None
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length = varint()
            if length is None:
                return None
            pos += length
        elif wire == 5:
            pos += 4
        else:  # groups or garbage: not a ModelProto we wrote
            return None
        if pos > size:
            return pos
    return None


def _key(name: str) -> str:
    return KEY_PREFIX + name


def _fail(name: str, message: str) -> None:
    raise MetadataError(f"field {_key(name)!r}: {message}")


def _decode(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"field {key!r}: value is not valid JSON ({exc})") from None


def _set_props(model: Any, props: dict[str, str], opset: int) -> None:
    model_opset = next(
        (op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), None
    )
    if model_opset is not None and model_opset != opset:
        raise MetadataError(
            f"field {_key('opset')!r}: metadata says opset {opset} but the model imports "
            f"opset {model_opset}"
        )
    kept = [(p.key, p.value) for p in model.metadata_props if not p.key.startswith(KEY_PREFIX)]
    del model.metadata_props[:]
    for key, value in kept + sorted(props.items()):
        entry = model.metadata_props.add()
        entry.key = key
        entry.value = value


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return list(value)


def _as_int(value: Any) -> int:
    # Accept numpy integers but not bools or floats: a size of 2.5 or True is a bug.
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value.__index__())


def _as_float(value: Any) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _as_json_object(value: Any) -> dict[str, Any]:
    """A mapping with string keys, as plain JSON values (tuples become lists)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__}")
    for key in value:
        _as_str(key)
    try:
        return json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not plain JSON: {exc}") from None


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _as_pair(value: Any) -> list[Any]:
    pair = _as_list(value)
    if len(pair) != 2:
        raise ValueError(f"expected a [name, value] pair, got {value!r}")
    return pair


def _as_obs_terms(value: Any) -> list[tuple[str, int]]:
    return [(_as_str(name), _as_int(size)) for name, size in map(_as_pair, _as_list(value))]


def _as_recurrent_state(value: Any) -> list[tuple[str, list[int]]]:
    return [
        (_as_str(name), [_as_int(d) for d in _as_list(shape)])
        for name, shape in map(_as_pair, _as_list(value))
    ]


def _as_spec(
    value: Any,
    keys: tuple[str, ...],
    convert: Mapping[str, Any],
    optional: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A mapping with exactly ``keys`` (and any of ``optional``), each value converted
    (naming the key on failure)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping with keys {list(keys)}, got {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    unknown = [k for k in value if k not in keys and k not in optional]
    if missing or unknown:
        raise ValueError(f"expected keys {list(keys)}: missing {missing}, unknown {unknown}")
    out: dict[str, Any] = {}
    for key in (*keys, *(k for k in optional if k in value)):
        try:
            out[key] = convert[key](value[key])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"key {key!r}: {exc}") from None
    return out


def _as_float_list(value: Any) -> list[float]:
    return [_as_float(x) for x in _as_list(value)]


def _as_image_input(value: Any) -> dict[str, Any]:
    convert = dict.fromkeys(IMAGE_INPUT_KEYS, _as_str)
    convert.update(height=_as_int, width=_as_int, channels=_as_int)
    convert.update(mean=_as_float_list, std=_as_float_list)
    return _as_spec(value, IMAGE_INPUT_KEYS, convert)


def _as_instruction_input(value: Any) -> dict[str, Any]:
    convert = dict.fromkeys(INSTRUCTION_INPUT_KEYS, _as_int)
    convert.update(name=_as_str, tokenizer_file=_as_str, tokenizer_sha256=_as_str)
    convert["instructions"] = lambda v: [_as_str(x) for x in _as_list(v)]
    return _as_spec(value, INSTRUCTION_INPUT_KEYS, convert, INSTRUCTION_INPUT_OPTIONAL)


def _as_action_chunk(value: Any) -> dict[str, int]:
    return _as_spec(value, ACTION_CHUNK_KEYS, dict.fromkeys(ACTION_CHUNK_KEYS, _as_int))


def _as_str_dict(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping of strings, got {type(value).__name__}")
    return {_as_str(k): _as_str(v) for k, v in value.items()}
