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

Built in: ``gaussian_mlp`` (the deterministic mean action) and ``recurrent`` (GRU/LSTM,
the torch state layout ``[layers, B, hidden]`` transposed to the runtime's batch-first
``[B, layers, hidden]`` inside the graph).

The TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) is used: it is fast,
and it turns ``nn.GRU``/``nn.LSTM`` into ONNX's GRU/LSTM ops.
"""

from __future__ import annotations

import dataclasses
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
from deploy.metadata import PolicyMetadata, write_metadata

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


register_exporter("gaussian_mlp", _gaussian_exporter)
register_exporter("recurrent", _recurrent_exporter)


# ---------------------------------------------------------------------- export
def export_policy(
    inference_module: nn.Module,
    meta: PolicyMetadata,
    out_path: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    parity_batch: int = 8,
    seed: int = 0,
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
    inference_module = inference_module.cpu().eval()  # export on the CPU, in eval mode
    _check_finite_tensors(inference_module, "the inference module")
    wrapper = _EXPORTERS[family](inference_module, meta).eval()
    _check_finite_tensors(wrapper, f"the {family!r} exporter's wrapper")
    input_shapes = _input_shapes(meta)
    output_shapes = _output_shapes(meta)
    _check_module_sizes(inference_module, meta)

    out_path = Path(out_path)
    if out_path.is_dir():
        out_path = out_path / "policy.onnx"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    example = _random_inputs(inference_module, input_shapes, 1, seed)
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
            inputs = _random_inputs(inference_module, input_shapes, batch, seed + batch)
            error = max(error, _parity(model, wrapper, inputs, list(output_shapes)))
        if not error <= PARITY_TOLERANCE:
            raise ExportError(
                f"ONNX and torch outputs differ by up to {error:.3g} (tolerance "
                f"{PARITY_TOLERANCE:g}); the exported graph does not compute the policy"
            )
        meta.extra[PARITY_KEY] = f"{error:.3e}"
        write_metadata(model, meta)
        onnx.checker.check_model(model, full_check=True)

    from deploy.runtime import OnnxPolicy

    # the robot-side loader must accept graph and metadata before the file is in place
    return atomic_write(out_path, model.SerializeToString(), verify=OnnxPolicy)


def _input_shapes(meta: PolicyMetadata) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"obs": (meta.obs_size,)}
    if meta.noise_shape is not None:
        shapes["noise"] = tuple(meta.noise_shape)
    for name, shape in meta.recurrent_state:
        shapes[name] = tuple(shape)
    return shapes


def _output_shapes(meta: PolicyMetadata) -> dict[str, tuple[int, ...]]:
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
    module: nn.Module, shapes: Mapping[str, tuple[int, ...]], batch: int, seed: int
) -> dict[str, torch.Tensor]:
    """Random graph inputs: observations in the range the normalizer has seen."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        x = torch.randn(batch, *shape, generator=gen)
        if name == "obs":
            norm = getattr(module, "normalizer", None)
            mean, var = getattr(norm, "mean", None), getattr(norm, "var", None)
            if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
                if mean.shape == shape:
                    x = mean.float() + torch.sqrt(var.float()) * x
        elif name != "noise":  # recurrent state: the range of tanh/sigmoid-gated states
            x = torch.tanh(x)
        out[name] = x.contiguous()
    return out


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
