"""Checkpoints: written atomically, loaded without executing code.

A checkpoint is a nested dict of tensors and plain Python values saved with
`torch.save` and read back with `torch.load(weights_only=True)`, which refuses
anything that would run code. numpy arrays are stored as tensors and restored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.files import atomic_write

FORMAT = 1
_ND = "__ndarray__"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or that does not fit what loads it."""


def _pack(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {_ND: torch.from_numpy(np.ascontiguousarray(obj)).clone()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _pack(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_pack(v) for v in obj)
    return obj


def _unpack(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_ND}:
            return obj[_ND].numpy()
        return {k: _unpack(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_unpack(v) for v in obj)
    return obj


def nonfinite_tensor(state: Any, prefix: str = "") -> str | None:
    """The name of the first floating-point tensor with a NaN or inf in a (nested) state
    dict, or None."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            return prefix or "tensor"
        return None
    if isinstance(state, dict):
        for k, v in state.items():
            found = nonfinite_tensor(v, f"{prefix}.{k}" if prefix else str(k))
            if found:
                return found
    return None


WEIGHT_KEYS = ("policy", "trainable")
"""Payload entries holding a learner's weights, which must be finite to be saved."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write `payload` so that a crash at any moment leaves the old file or the new one.

    Weights that are not finite are refused (CheckpointError naming the tensor): the
    checkpoint on disk stays the last good one instead of becoming a NaN policy.
    """
    for key in WEIGHT_KEYS:
        bad = nonfinite_tensor(payload.get(key), key)
        if bad is not None:
            raise CheckpointError(
                f"refusing to save {path}: {bad} is not finite (NaN or inf); the previous "
                f"checkpoint is kept"
            )
    packed = {"format": FORMAT, **_pack(payload)}
    return atomic_write(path, lambda tmp: torch.save(packed, tmp))


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a sim2real checkpoint (format {FORMAT})")
    return _unpack(data)


def find_checkpoint(run_or_file: str | os.PathLike) -> Path:
    """A checkpoint file, or the latest checkpoint of a run directory."""
    p = Path(run_or_file)
    if p.is_dir():
        latest = p / "checkpoints" / "latest.pt"
        if latest.exists():
            return latest
        raise FileNotFoundError(f"run directory {p} has no checkpoints/latest.pt")
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint or run directory at {p}")
    return p
