"""Export a trained policy to a self-describing ONNX file (the training side; needs torch).

One generic path serves every policy family; a family contributes only an *exporter*: a
function that wraps the family's inference module (see :mod:`policies.base`) into a
torch module whose forward follows the runtime's graph layout (:mod:`deploy.metadata`)::

    forward(obs [B, obs_size], [noise [B, *noise_shape]], *state [B, *shape])
        -> (actions [B, num_joints], *next_state [B, *shape])

with inputs in the order ``obs``, ``noise`` (generative families only), then the
recurrent states in the order of ``metadata.recurrent_state``, and outputs ``actions``
then ``next_<state>`` in the same order. Everything else (tracing, the dynamic batch
axis, the checker, the metadata, the parity check against torch, an atomic write) is
:func:`export_policy`'s job, so a diffusion or flow policy (noise as an input, its
sampler unrolled for a fixed number of steps inside the wrapper) or a world-model actor
only has to call :func:`register_exporter` with its wrapper.

Built in: ``gaussian_mlp`` (the deterministic mean action), ``recurrent`` (GRU/LSTM,
the torch state layout ``[layers, B, hidden]`` transposed to the runtime's batch-first
``[B, layers, hidden]`` inside the graph) and ``vla_flow``.

A VLA family (:data:`deploy.metadata.VLA_FAMILIES`) has the typed graph of
:mod:`deploy.metadata`'s VLA contract instead::

    forward(image uint8 [B, H, W, 3], instruction_ids int64 [B, L], proprio [B, P],
            noise [B, *noise_shape]) -> actions [B, horizon, num_joints]

(the module of ``VLAPolicy.inference_module()``: flow steps unrolled, normalization
inside). Its parity inputs are valid ones: uint8 images, instructions of every length
made of the tokenizer's own ids, proprio in the range the normalizer has seen. Its
tokenizer file (``export_policy(..., tokenizer=...)``) is checked against the hash the
metadata records and copied next to the ``.onnx`` under the name the metadata records;
both files are loaded together by :class:`deploy.vla_runtime.OnnxVLAPolicy` before
either is moved into place.

The TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) is used: it is fast,
and it turns ``nn.GRU``/``nn.LSTM`` into ONNX's GRU/LSTM ops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from deploy.files import atomic_write
from deploy.metadata import VLA_PROPRIO_INPUT, PolicyMetadata, write_metadata

__all__ = [
    "DEFAULT_OPSET",
    "PARITY_TOLERANCE",
    "PARITY_KEY",
    "ExportError",
    "export_policy",
    "read_parity",
    "register_exporter",
    "registered_families",
]

DEFAULT_OPSET = 17
PARITY_TOLERANCE = 1e-4
"""Largest absolute difference between ONNX and torch outputs that an export accepts."""
PARITY_KEY = "export_parity_max_abs_error"
"""Key in ``metadata.extra`` under which the export records the measured parity."""

Exporter = Callable[[nn.Module, PolicyMetadata], nn.Module]
"""``(inference_module, metadata) -> wrapper`` whose forward follows the graph layout."""

_EXPORTERS: dict[str, Exporter] = {}


def _mish_symbolic(g: Any, x: Any) -> Any:
    """Mish as x * n / (2 - n), n = s (2 - s), s = sigmoid(x): tanh(softplus(x)) written
    with one sigmoid. The exporter's own form (Softplus, Tanh, Mul) costs onnxruntime
    ~3.7 us per 256-wide activation at batch 1 (its Softplus is not vectorized); this one
    ~2 us, so a 256x3 mish MLP runs in 21 us instead of 26. No cancellation: n is in
    [0, 1] and 2 - n in [1, 2]; where sigmoid saturates n -> 1 gives x and n -> 0 gives
    0, as mish does. Within 3e-6 of torch's mish over [-100, 100], the largest errors in
    the far negative tail (x ~ -17), where onnxruntime's sigmoid is approximate and mish
    is ~1e-6 itself."""
    two = g.op("Constant", value_t=torch.tensor(2.0))
    s = g.op("Sigmoid", x)
    n = g.op("Mul", s, g.op("Sub", two, s))
    return g.op("Div", g.op("Mul", x, n), g.op("Sub", two, n))


# registered for every opset the TorchScript exporter writes (9 and up)
torch.onnx.register_custom_op_symbolic("aten::mish", _mish_symbolic, 9)


class ExportError(RuntimeError):
    """The export failed: no exporter for the family, a non-finite weight or output, or the
    ONNX graph disagrees with torch."""


# ---------------------------------------------------------------------- registry
def register_exporter(family: str, fn: Exporter, *, replace: bool = False) -> None:
    """Register the exporter of a policy family (a value of ``metadata.policy_family``).

    ``fn(inference_module, metadata)`` returns a torch module whose forward takes the
    graph inputs and returns the graph outputs in the runtime's layout (see the module
    docstring). Registering a family twice is an error unless ``replace`` is True.
    """
    from deploy.metadata import POLICY_FAMILIES

    if family not in POLICY_FAMILIES:
        raise ValueError(f"unknown policy family {family!r}; choose one of {POLICY_FAMILIES}")
    if family in _EXPORTERS and not replace:
        raise ValueError(f"an exporter for {family!r} is already registered (pass replace=True)")
    _EXPORTERS[family] = fn


def registered_families() -> list[str]:
    """Policy families that :func:`export_policy` can export."""
    return sorted(_EXPORTERS)


class _MeanActionWrapper(nn.Module):
    """Gaussian MLP: ``forward(obs) -> actions`` (the mean; normalization inside)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.module(obs)


class _RecurrentWrapper(nn.Module):
    """Recurrent Gaussian: batch-first state in and out, torch's ``[L, B, H]`` inside."""

    def __init__(self, module: nn.Module, num_states: int) -> None:
        super().__init__()
        self.module = module
        self.num_states = num_states

    def forward(self, obs: torch.Tensor, *state: torch.Tensor):
        out = self.module(obs, *(s.transpose(0, 1) for s in state))
        return (out[0], *(s.transpose(0, 1) for s in out[1:]))


def _gaussian_exporter(module: nn.Module, meta: PolicyMetadata) -> nn.Module:
    if meta.recurrent_state or meta.noise_shape is not None:
        raise ExportError("a gaussian_mlp policy has neither recurrent state nor a noise input")
    return _MeanActionWrapper(module)


def _recurrent_exporter(module: nn.Module, meta: PolicyMetadata) -> nn.Module:
    info = getattr(module, "info", None)
    if info is not None:
        names = [name for name, _ in meta.recurrent_state]
        if tuple(names) != tuple(info.state_names):
            raise ExportError(
                f"metadata recurrent_state names {names} differ from the module's "
                f"state names {list(info.state_names)}"
            )
        for name, shape in meta.recurrent_state:
            if tuple(shape) != tuple(info.state_shape):
                raise ExportError(
                    f"metadata shape {shape} of state {name!r} differs from the module's "
                    f"[layers, hidden] = {list(info.state_shape)}"
                )
    if not meta.recurrent_state:
        raise ExportError("a recurrent policy needs metadata recurrent_state")
    return _RecurrentWrapper(module, len(meta.recurrent_state))


def _vla_exporter(module: nn.Module, meta: PolicyMetadata) -> nn.Module:
    """The VLA inference module already has the graph's layout; check that the metadata
    describes it (each attribute the module exposes, as ``VLAInference`` does)."""
    image, instr, chunk = meta.image_input, meta.instruction_input, meta.action_chunk
    assert image is not None and instr is not None and chunk is not None
    if image["height"] != image["width"]:
        raise ExportError(
            f"metadata image_input is {image['height']} x {image['width']}; the VLA backbone "
            "takes square images"
        )
    want = {
        "image_size": (image["height"], "image_input.height/width"),
        "max_instruction_tokens": (instr["max_tokens"], "instruction_input.max_tokens"),
        "pad_token_id": (instr["pad_id"], "instruction_input.pad_id"),
        "proprio_size": (meta.obs_size, "the sum of obs_terms (the proprio terms)"),
        "horizon": (chunk["horizon"], "action_chunk.horizon"),
        "act_steps": (chunk["act_steps"], "action_chunk.act_steps"),
        "action_size": (meta.num_joints, "the number of action_joint_names"),
        "steps": (meta.flow_steps, "flow_steps"),
        "noise_shape": (tuple(meta.noise_shape or ()), "noise_shape"),
    }
    backbone = getattr(module, "backbone", None)
    vocab = getattr(backbone, "vocab_size", None)
    for name, (value, field_name) in want.items():
        got = getattr(module, name, None)
        if got is not None and (tuple(got) if name == "noise_shape" else got) != value:
            raise ExportError(
                f"the VLA module's {name} is {got} but the metadata's {field_name} is {value}"
            )
    if vocab is not None and vocab != instr["vocab_size"]:
        raise ExportError(
            f"the VLA module embeds {vocab} tokens but the metadata's "
            f"instruction_input.vocab_size is {instr['vocab_size']}"
        )
    scale, shift = getattr(backbone, "pixel_scale", None), getattr(backbone, "pixel_shift", None)
    if isinstance(scale, torch.Tensor) and isinstance(shift, torch.Tensor):
        # the graph computes x * scale + shift with scale = 1 / (255 std), shift = -mean / std
        std = 1.0 / (255.0 * scale.double().reshape(-1))
        mean = -shift.double().reshape(-1) * std
        for key, values in (("mean", mean), ("std", std)):
            if not np.allclose(values.numpy(), image[key], rtol=1e-6, atol=1e-6):
                raise ExportError(
                    f"the VLA module normalizes images with {key} {values.tolist()} but the "
                    f"metadata's image_input.{key} is {image[key]}"
                )
    return module


register_exporter("gaussian_mlp", _gaussian_exporter)
register_exporter("recurrent", _recurrent_exporter)
register_exporter("vla_flow", _vla_exporter)


# ---------------------------------------------------------------------- export
def export_policy(
    inference_module: nn.Module,
    meta: PolicyMetadata,
    out_path: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    parity_batch: int = 8,
    seed: int = 0,
    tokenizer: str | os.PathLike[str] | None = None,
) -> Path:
    """Export an inference module with its metadata to ``out_path``; return the path.

    Steps: refuse a module with a non-finite parameter or floating-point buffer (the
    error names the first one); wrap the module with the exporter of
    ``meta.policy_family`` (its own tensors checked the same way); trace it with
    the TorchScript exporter (dynamic batch axis on every input and output); pin the
    graph's declared shapes to ``[batch, *fixed]``; ``onnx.checker.check_model(
    full_check=True)``; run onnxruntime and torch on random inputs (batch sizes
    ``parity_batch`` and 1) and raise :class:`ExportError` if any output is not finite
    in either (naming the output) or differs by more than :data:`PARITY_TOLERANCE`;
    store the metadata (``opset`` recorded, the measured error under
    ``extra[PARITY_KEY]``); load the file with :class:`deploy.runtime.
    OnnxPolicy` as the robot will; and only then move it into place atomically, so a
    failed export never leaves a file at ``out_path``.

    A VLA family (see the module docstring) needs ``tokenizer``, the instruction
    tokenizer's JSON file, whose sha256 must be the metadata's
    ``instruction_input.tokenizer_sha256`` (:func:`deploy.tokenizer.file_sha256`); it is
    copied next to ``out_path`` as ``instruction_input.tokenizer_file``, and the pair is
    loaded by :class:`deploy.vla_runtime.OnnxVLAPolicy` before either is moved into
    place (the tokenizer first: a new policy never appears without its tokenizer).
    """
    import onnx

    family = meta.policy_family
    if family not in _EXPORTERS:
        raise ExportError(
            f"no exporter registered for policy family {family!r}; registered: "
            f"{registered_families()} (a family adds one with deploy.export.register_exporter)"
        )
    module_family = getattr(inference_module, "policy_family", None)
    if module_family is not None and module_family != family:
        raise ExportError(
            f"the inference module is a {module_family!r} policy but the metadata says {family!r}"
        )
    meta = dataclasses.replace(meta, opset=int(opset), extra=dict(meta.extra))
    out_path = Path(out_path)
    if out_path.is_dir():
        out_path = out_path / "policy.onnx"
    vocab = _load_tokenizer(meta, tokenizer, out_path)
    inference_module = inference_module.cpu().eval()  # export on the CPU, in eval mode
    _check_finite_tensors(inference_module, "the inference module")
    wrapper = _EXPORTERS[family](inference_module, meta).eval()
    _check_finite_tensors(wrapper, f"the {family!r} exporter's wrapper")
    input_shapes = _input_shapes(meta)
    output_shapes = _output_shapes(meta)
    _check_module_sizes(inference_module, meta)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    example = _random_inputs(inference_module, meta, input_shapes, 1, seed, vocab)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=out_path.parent) as tmp:
        traced = Path(tmp) / "traced.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter is deprecated but it is the one that is fast and
            # exports nn.GRU/nn.LSTM; tracing warnings come from torch's RNN internals,
            # and the parity check below runs other batch sizes than the traced one
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=".*batch_size other than 1.*")
            torch.onnx.export(
                wrapper,
                tuple(example.values()),
                str(traced),
                dynamo=False,
                input_names=list(input_shapes),
                output_names=list(output_shapes),
                dynamic_axes={name: {0: "batch"} for name in [*input_shapes, *output_shapes]},
                opset_version=int(opset),
                do_constant_folding=True,
            )
        model = onnx.load(str(traced))
        _pin_shapes(model, input_shapes, output_shapes)
        onnx.checker.check_model(model, full_check=True)

        error = 0.0
        for batch in (parity_batch, 1):
            inputs = _random_inputs(
                inference_module, meta, input_shapes, batch, seed + batch, vocab
            )
            error = max(error, _parity(model, wrapper, inputs, list(output_shapes)))
        if not error <= PARITY_TOLERANCE:
            raise ExportError(
                f"ONNX and torch outputs differ by up to {error:.3g} (tolerance "
                f"{PARITY_TOLERANCE:g}); the exported graph does not compute the policy"
            )
        meta.extra[PARITY_KEY] = f"{error:.3e}"
        write_metadata(model, meta)
        onnx.checker.check_model(model, full_check=True)
        if vocab is not None:
            return _write_vla(model.SerializeToString(), vocab, out_path, Path(tmp))

    from deploy.runtime import OnnxPolicy

    # the robot-side loader must accept graph and metadata before the file is in place
    return atomic_write(out_path, model.SerializeToString(), verify=OnnxPolicy)


class _Vocabulary:
    """The export's view of a VLA tokenizer: its file's bytes and the ids instructions
    are made of (for valid parity inputs)."""

    def __init__(self, data: bytes, name: str, word_ids: list[int]) -> None:
        self.data = data
        self.name = name
        self.word_ids = word_ids


def _load_tokenizer(
    meta: PolicyMetadata, tokenizer: str | os.PathLike[str] | None, out_path: Path
) -> _Vocabulary | None:
    """The checked tokenizer of a VLA export; None for the other families."""
    spec = meta.instruction_input
    if spec is None:
        if tokenizer is not None:
            raise ExportError(
                f"a tokenizer was given but policy family {meta.policy_family!r} has no "
                "instruction input"
            )
        return None
    if tokenizer is None:
        raise ExportError(
            f"a {meta.policy_family!r} policy needs its instruction tokenizer: pass "
            "export_policy(..., tokenizer=<tokenizer.json>)"
        )
    if spec["tokenizer_file"] == out_path.name:
        raise ExportError(
            f"metadata instruction_input.tokenizer_file {spec['tokenizer_file']!r} is the "
            "policy file's own name"
        )
    from deploy.tokenizer import InstructionTokenizer, TokenizerFileError

    try:
        tok = InstructionTokenizer(
            tokenizer,
            max_tokens=spec["max_tokens"],
            pad_id=spec["pad_id"],
            vocab_size=spec["vocab_size"],
            sha256=spec["tokenizer_sha256"],
            what="tokenizer file given to the export",
        )
    except TokenizerFileError as exc:
        raise ExportError(f"{exc} (metadata sim2real.instruction_input)") from exc
    data = Path(tokenizer).read_bytes()
    if hashlib.sha256(data).hexdigest() != tok.sha256:
        raise ExportError(f"tokenizer file {os.fspath(tokenizer)!r} changed during the export")
    specials = {spec["pad_id"], tok.unk_id}
    word_ids = [i for i in range(tok.vocab_size) if i not in specials]
    if not word_ids:
        raise ExportError(f"tokenizer file {os.fspath(tokenizer)!r} has no word tokens")
    return _Vocabulary(data, spec["tokenizer_file"], word_ids)


def _write_vla(model: bytes, vocab: _Vocabulary, out_path: Path, tmp: Path) -> Path:
    """Load the policy and its tokenizer together as the robot will, then move both into
    place, the tokenizer first."""
    from deploy.vla_runtime import OnnxVLAPolicy

    staged = tmp / out_path.name
    staged.write_bytes(model)
    (tmp / vocab.name).write_bytes(vocab.data)
    OnnxVLAPolicy(staged)
    atomic_write(out_path.parent / vocab.name, vocab.data)
    return atomic_write(out_path, model)


def _input_shapes(meta: PolicyMetadata) -> dict[str, tuple[int, ...]]:
    if meta.is_vla:
        image, instr = meta.image_input, meta.instruction_input
        assert image is not None and instr is not None and meta.noise_shape is not None
        return {
            image["name"]: (image["height"], image["width"], image["channels"]),
            instr["name"]: (instr["max_tokens"],),
            VLA_PROPRIO_INPUT: (meta.obs_size,),
            "noise": tuple(meta.noise_shape),
        }
    shapes: dict[str, tuple[int, ...]] = {"obs": (meta.obs_size,)}
    if meta.noise_shape is not None:
        shapes["noise"] = tuple(meta.noise_shape)
    for name, shape in meta.recurrent_state:
        shapes[name] = tuple(shape)
    return shapes


def _output_shapes(meta: PolicyMetadata) -> dict[str, tuple[int, ...]]:
    if meta.is_vla:
        return {"actions": meta.chunk_shape}
    shapes: dict[str, tuple[int, ...]] = {"actions": (meta.num_joints,)}
    for name, shape in meta.recurrent_state:
        shapes["next_" + name] = tuple(shape)
    return shapes


def _check_module_sizes(module: nn.Module, meta: PolicyMetadata) -> None:
    info = getattr(module, "info", None)
    obs_size = getattr(info, "obs_size", None)
    action_size = getattr(info, "action_size", None)
    if obs_size is not None and obs_size != meta.obs_size:
        raise ExportError(
            f"the policy takes observations of size {obs_size} but the metadata "
            f"describes {meta.obs_size} (frame {meta.obs_frame_size} x history "
            f"{meta.obs_history_length})"
        )
    if action_size is not None and action_size != meta.num_joints:
        raise ExportError(
            f"the policy outputs {action_size} actions but the metadata names "
            f"{meta.num_joints} joints"
        )


def _check_finite_tensors(module: nn.Module, what: str) -> None:
    """Refuse a module with a NaN or infinite parameter or floating-point buffer.

    A non-finite weight makes a network whose every output is NaN (or one that is NaN
    for some inputs only); such a file would load, pass a parity check that compares
    NaN with NaN, and leave the robot's safety layer to replace every action.
    """
    for kind, named in (("parameter", module.named_parameters), ("buffer", module.named_buffers)):
        for name, tensor in named():
            if not (tensor.is_floating_point() or tensor.is_complex()):
                continue  # integer counters cannot be NaN
            finite = torch.isfinite(tensor.detach())
            if bool(finite.all()):
                continue
            bad = int(finite.numel() - int(finite.sum()))
            raise ExportError(
                f"{kind} {name!r} of {what} has {bad} non-finite value(s) (NaN or inf) of "
                f"{tensor.numel()}; refusing to export a policy that cannot compute finite "
                "actions (was the checkpoint saved after a diverged update?)"
            )


def _random_inputs(
    module: nn.Module,
    meta: PolicyMetadata,
    shapes: Mapping[str, tuple[int, ...]],
    batch: int,
    seed: int,
    vocab: _Vocabulary | None = None,
) -> dict[str, torch.Tensor]:
    """Random graph inputs that are valid ones: observations (and a VLA's proprio) in the
    range the normalizer has seen, uint8 images, instructions of the tokenizer's ids."""
    gen = torch.Generator().manual_seed(seed)
    image = meta.image_input["name"] if meta.image_input else None
    instruction = meta.instruction_input["name"] if meta.instruction_input else None
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name == image:
            out[name] = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8, generator=gen)
            continue
        if name == instruction:
            assert vocab is not None and meta.instruction_input is not None
            out[name] = _random_ids(vocab, meta.instruction_input["pad_id"], batch, shape[0], gen)
            continue
        x = torch.randn(batch, *shape, generator=gen)
        if name in ("obs", VLA_PROPRIO_INPUT):
            norm = getattr(module, "normalizer", None)
            if name == VLA_PROPRIO_INPUT:
                norm = getattr(getattr(module, "backbone", None), "proprio_normalizer", None)
            mean, var = getattr(norm, "mean", None), getattr(norm, "var", None)
            if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
                if mean.shape == shape:
                    x = mean.float() + torch.sqrt(var.float()) * x
        elif name != "noise":  # recurrent state: the range of tanh/sigmoid-gated states
            x = torch.tanh(x)
        out[name] = x.contiguous()
    return out


def _random_ids(
    vocab: _Vocabulary, pad_id: int, batch: int, max_tokens: int, gen: torch.Generator
) -> torch.Tensor:
    """Instructions of random lengths 1..max_tokens (the longest and the shortest always
    among them when the batch allows), the tokenizer's word ids, right-padded."""
    words = torch.tensor(vocab.word_ids, dtype=torch.long)
    ids = words[torch.randint(0, len(words), (batch, max_tokens), generator=gen)]
    lengths = torch.randint(1, max_tokens + 1, (batch,), generator=gen)
    lengths[0] = max_tokens
    if batch > 1:
        lengths[1] = 1
    ids[torch.arange(max_tokens).unsqueeze(0) >= lengths.unsqueeze(1)] = pad_id
    return ids.contiguous()


def _parity(
    model: Any, wrapper: nn.Module, inputs: Mapping[str, torch.Tensor], output_names: list[str]
) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    got = session.run(output_names, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = wrapper(*inputs.values())
    if isinstance(want, torch.Tensor):
        want = (want,)
    if len(want) != len(output_names):
        raise ExportError(
            f"the exporter's module returns {len(want)} outputs, the graph needs {output_names}"
        )
    error = 0.0
    for name, g, w in zip(output_names, got, want):
        w = w.detach().cpu().numpy()
        if g.shape != w.shape:
            raise ExportError(f"output {name!r}: ONNX shape {g.shape}, torch shape {w.shape}")
        # checked before the difference: max(0.0, nan) is 0.0, so a NaN policy would
        # otherwise export with "parity 0"
        for where, values in (("ONNX", g), ("torch", w)):
            finite = np.isfinite(values)
            if not finite.all():
                raise ExportError(
                    f"output {name!r} is not finite in {where}: {int(finite.size - finite.sum())}"
                    f" of {finite.size} values are NaN or inf on random inputs (batch "
                    f"{values.shape[0] if values.ndim else 1}); refusing to export a policy "
                    "that does not compute finite actions"
                )
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        error = max(error, float(diff.max()) if diff.size else 0.0)
        if not np.isfinite(error):  # finite outputs whose difference overflows float64
            raise ExportError(f"output {name!r}: ONNX and torch differ by {error}")
    return error


def _pin_shapes(model: Any, inputs: Mapping[str, tuple], outputs: Mapping[str, tuple]) -> None:
    """Declare every graph input/output as ``[batch, *fixed]`` (what the runtime checks)."""
    for values, shapes in ((model.graph.input, inputs), (model.graph.output, outputs)):
        for value in values:
            if value.name not in shapes:
                continue
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            dims.add().dim_param = "batch"
            for size in shapes[value.name]:
                dims.add().dim_value = int(size)


def read_parity(path: str | os.PathLike[str]) -> float | None:
    """The ONNX-vs-torch error an export measured and recorded, or None if absent."""
    from deploy.metadata import read_metadata

    value = read_metadata(path).extra.get(PARITY_KEY)
    return None if value is None else float(value)
