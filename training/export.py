"""Export a training run's policy to ONNX: checkpoint -> (module, metadata) -> file.

Any checkpoint kind of training.policy_kinds: its family builds the policy and its
deployment metadata, and ``deploy.export.export_policy`` writes the checked file
(tracing, checker, parity against torch, runtime load, atomic write). The family
exporters that deploy/ cannot know (it imports no policy code) are registered here.
"""

from __future__ import annotations

import os
from pathlib import Path

from deploy.export import DEFAULT_OPSET, export_policy, register_exporter, registered_families
from policies.diffusion import diffusion_exporter
from policies.flow import flow_exporter
from training.checkpoint import find_checkpoint, load_checkpoint
from training.policy_kinds import load_policy

__all__ = ["default_onnx_path", "export_run"]

for _family, _exporter in (("diffusion", diffusion_exporter), ("flow", flow_exporter)):
    if _family not in registered_families():
        register_exporter(_family, _exporter)


def default_onnx_path(source: str | os.PathLike[str]) -> Path:
    """``<run-dir>/policy.onnx`` for a run directory or a checkpoint inside its
    ``checkpoints/`` folder; else next to the checkpoint file."""
    src = Path(source)
    if src.is_dir():
        return src / "policy.onnx"
    ck_path = find_checkpoint(src)
    if ck_path.parent.name == "checkpoints":
        return ck_path.parent.parent / "policy.onnx"
    return ck_path.with_suffix(".onnx")


def export_run(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Export a run directory's latest checkpoint (or a checkpoint file) to ONNX.

    Returns the path; the measured ONNX-vs-torch error is in the metadata's
    ``extra[deploy.export.PARITY_KEY]``.
    """
    # training.vla_sft.VLA_KINDS, named here so that other exports do not import
    # transformers
    if load_checkpoint(find_checkpoint(source)).get("kind") in ("vla_sft", "vla_rl"):
        from training.vla_sft import export_vla_run  # image and instruction inputs

        return export_vla_run(source, out)
    loaded = load_policy(source)
    module = loaded.policy.inference_module().cpu()
    return export_policy(module, loaded.metadata(), out or default_onnx_path(source), opset=opset)
