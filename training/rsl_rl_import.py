"""An rsl_rl 5.x checkpoint (the ``model_<N>.pt`` its OnPolicyRunner saves) to our ONNX.

rsl_rl saves state dicts only: ``actor_state_dict`` (an ``MLPModel``: optional
``obs_normalizer``, the ``mlp`` layers, the Gaussian ``distribution``'s std), the critic,
the optimizer and ``iter``. So the file is read without executing code
(``torch.load(weights_only=True)``), the actor's layer sizes and normalizer are read off
its tensors, and the deterministic actor (normalizer, MLP, mean action) is rebuilt as a
plain torch module that needs no rsl_rl. What the file cannot say is supplied here: the
task it was trained on (for the deployment metadata, built from the task as our own
exports are) and the MLP's activation (rsl_rl's default ``elu`` unless told).

Supported: ``MLPModel`` actors with a ``GaussianDistribution`` (scalar or log std) that
read the ``policy`` observation group. Recurrent (``RNNModel``) and CNN actors, and the
state-dependent-std or Beta distributions (whose output head needs the train config to
interpret), are refused with an error that says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from deploy.export import DEFAULT_OPSET, export_policy
from deploy.metadata import PolicyMetadata
from policies.base import PolicyInfo
from sim.randomization import SimToRealConfig
from sim.registry import make
from training.checkpoint import CheckpointError
from training.metadata import metadata_from_checkpoint
from training.run_control import code_version

__all__ = [
    "ACTIVATIONS",
    "RslRlActor",
    "RslRlImportError",
    "default_onnx_path",
    "export_rsl_rl",
    "import_rsl_rl",
    "load_rsl_rl_checkpoint",
    "rsl_rl_actor",
]

# rsl_rl.utils.resolve_nn_activation's names; the checkpoint does not record which one
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "elu": nn.ELU,
    "selu": nn.SELU,
    "relu": nn.ReLU,
    "crelu": nn.CELU,
    "lrelu": nn.LeakyReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "gelu": nn.GELU,
    "swish": nn.SiLU,
    "mish": nn.Mish,
    "identity": nn.Identity,
}

# EmpiricalNormalization's eps, which MLPModel never changes: (x - mean) / (std + eps)
NORMALIZER_EPS = 1e-2

_LINEAR = re.compile(r"^mlp\.(\d+)\.(weight|bias)$")
_NORMALIZER_KEYS = {f"obs_normalizer.{k}" for k in ("_mean", "_var", "_std", "count")}
_STD_KEYS = {"distribution.std_param": "scalar", "distribution.log_std_param": "log"}


class RslRlImportError(CheckpointError):
    """The file is not an rsl_rl 5.x checkpoint this importer can read, or it does not fit
    the task it is exported for."""


# ---------------------------------------------------------------------- the actor
class _Normalizer(nn.Module):
    """rsl_rl's EmpiricalNormalization at inference: ``(x - mean) / (std + eps)``."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.reshape(-1).to(torch.float32).clone())
        self.register_buffer("std", std.reshape(-1).to(torch.float32).clone())

    @property
    def var(self) -> torch.Tensor:
        """Seen variance (deploy.export draws its parity inputs from mean and var)."""
        return self.std.square()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / (self.std + NORMALIZER_EPS)


class RslRlActor(nn.Module):
    """The deterministic rsl_rl MLP actor: ``forward(obs) -> actions`` (the Gaussian's
    mean), observation normalization inside; what ``deploy.export`` exports."""

    def __init__(self, normalizer: nn.Module, mlp: nn.Sequential, info: PolicyInfo) -> None:
        super().__init__()
        self.normalizer = normalizer
        self.mlp = mlp
        self.info = info
        self.policy_family = info.policy_family

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.normalizer(obs))


def rsl_rl_actor(state: Mapping[str, torch.Tensor], activation: str = "elu") -> RslRlActor:
    """Rebuild an rsl_rl 5.x ``MLPModel`` actor from its state dict (in eval mode).

    Layer sizes come from the tensors; ``activation`` is the train config's
    ``actor.activation``, which the state dict does not hold. Raises
    :class:`RslRlImportError` for actors this importer does not support or malformed
    state dicts, naming what is wrong.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; rsl_rl's are {sorted(ACTIVATIONS)}")
    keys = set(state)
    if any(k.startswith("rnn.") for k in keys):
        raise RslRlImportError(
            "the actor is recurrent (rsl_rl RNNModel); only MLPModel actors can be imported"
        )
    if any(k.startswith("cnns.") for k in keys):
        raise RslRlImportError(
            "the actor has CNN encoders (rsl_rl CNNModel); only MLPModel actors can be imported"
        )
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for k in keys:
        m = _LINEAR.match(k)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = state[k]
    std_keys = keys & set(_STD_KEYS)
    unknown = (
        keys
        - _NORMALIZER_KEYS
        - set(_STD_KEYS)
        - {f"mlp.{i}.{p}" for i in layers for p in ("weight", "bias")}
    )
    if unknown:
        raise RslRlImportError(
            f"the actor state dict has entries an rsl_rl 5.x MLPModel does not: {sorted(unknown)}"
        )
    if not layers:
        raise RslRlImportError("the actor state dict has no mlp layers (mlp.<i>.weight)")
    if not std_keys:
        raise RslRlImportError(
            "the actor has no distribution.std_param / log_std_param: a state-dependent std "
            "(HeteroscedasticGaussianDistribution) or Beta distribution, or no distribution; "
            "only GaussianDistribution actors can be imported"
        )

    indices = sorted(layers)
    # rsl_rl's MLP puts an activation module between Linear layers: 0, 2, 4, ...
    if indices != list(range(0, 2 * len(indices), 2)):
        raise RslRlImportError(f"unexpected MLP layout: Linear layers at mlp indices {indices}")
    modules: list[nn.Module] = []
    size = None
    for n, i in enumerate(indices):
        w, b = layers[i].get("weight"), layers[i].get("bias")
        if w is None or b is None or w.ndim != 2 or b.shape != (w.shape[0],):
            raise RslRlImportError(f"mlp.{i} is not a Linear layer (weight [out, in], bias [out])")
        if size is not None and w.shape[1] != size:
            raise RslRlImportError(
                f"mlp.{i} takes {w.shape[1]} inputs but the layer before gives {size}"
            )
        linear = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(w)
            linear.bias.copy_(b)
        modules.append(linear)
        if n < len(indices) - 1:
            modules.append(ACTIVATIONS[activation]())
        size = w.shape[0]
    obs_size = int(layers[indices[0]]["weight"].shape[1])
    action_size = int(size)

    (std_key,) = std_keys
    if tuple(state[std_key].shape) != (action_size,):
        raise RslRlImportError(
            f"{std_key} has shape {tuple(state[std_key].shape)} but the MLP outputs "
            f"{action_size} actions"
        )

    normalizer: nn.Module = nn.Identity()
    if keys & _NORMALIZER_KEYS:
        if not {"obs_normalizer._mean", "obs_normalizer._std"} <= keys:
            raise RslRlImportError("obs_normalizer lacks _mean or _std")
        mean, std = state["obs_normalizer._mean"], state["obs_normalizer._std"]
        if mean.numel() != obs_size or std.numel() != obs_size:
            raise RslRlImportError(
                f"obs_normalizer has {mean.numel()} entries but the MLP takes {obs_size} inputs"
            )
        normalizer = _Normalizer(mean, std)
    info = PolicyInfo("gaussian_mlp", obs_size, action_size)
    return RslRlActor(normalizer, nn.Sequential(*modules), info).eval()


# ---------------------------------------------------------------------- the file
def load_rsl_rl_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The payload of an rsl_rl 5.x checkpoint, read with ``weights_only=True``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no rsl_rl checkpoint at {path}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for foreign or truncated files
        raise RslRlImportError(
            f"{path} is not an rsl_rl checkpoint: torch.load(weights_only=True) cannot read it "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(ck, dict):
        raise RslRlImportError(
            f"{path} is not an rsl_rl checkpoint (it holds a {type(ck).__name__})"
        )
    if "actor_state_dict" not in ck:
        if "kind" in ck or "format" in ck:
            hint = "it is a sim2real checkpoint: export it with `sim2real export <run-dir or file>`"
        elif "model_state_dict" in ck:
            hint = (
                "it is from an rsl_rl before 5.0 (one 'model_state_dict'); this importer reads "
                "5.x's 'actor_state_dict'"
            )
        else:
            hint = f"it has no 'actor_state_dict' (entries: {sorted(map(str, ck))[:8]})"
        raise RslRlImportError(f"{path} is not an rsl_rl 5.x checkpoint: {hint}")
    actor = ck["actor_state_dict"]
    if not isinstance(actor, dict) or not all(isinstance(v, torch.Tensor) for v in actor.values()):
        raise RslRlImportError(f"{path}: 'actor_state_dict' is not a state dict of tensors")
    return ck


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_rsl_rl(
    path: str | os.PathLike, task: str, *, activation: str = "elu"
) -> tuple[RslRlActor, PolicyMetadata]:
    """(inference module, deployment metadata) of an rsl_rl 5.x checkpoint trained on
    ``task`` (through ``sim.rsl_rl_env.RslRlVecEnv``), for ``deploy.export.export_policy``.

    The metadata is made as for our own checkpoints (``training.metadata``), from the
    task's nominal env: observation terms and history, joint names, robot description,
    action bounds, control period. rsl_rl's checkpoint holds no train config, so
    ``config_hash`` is the first 16 hex digits of the file's SHA-256 (all of it in
    ``extra["rsl_rl_sha256"]``), ``run_id`` the name of the rsl_rl log directory, and
    ``code_version`` that of this code, which defines the task. ``extra`` also records
    ``checkpoint_kind="rsl_rl"``, the file name, the activation and the iteration.

    Raises :class:`RslRlImportError` when the file is not a supported rsl_rl checkpoint or
    its actor does not take the task's policy observation or drive its action size.
    """
    path = Path(path)
    ck = load_rsl_rl_checkpoint(path)
    actor = rsl_rl_actor(ck["actor_state_dict"], activation)
    env = make(task, 1, s2r=SimToRealConfig())  # nominal: what sim2sim checks the file against
    try:
        group = env.observation_spec.policy
        terms = [(t.name, t.size) for t in group.terms]
        if actor.info.obs_size != group.size:
            raise RslRlImportError(
                f"observation size mismatch: the actor in {path} takes {actor.info.obs_size} "
                f"inputs, but task {task!r} gives a policy observation of {group.size} "
                f"(terms {terms} x history {group.history}); was it trained on another task, "
                "or on other obs_groups than ['policy']?"
            )
        if actor.info.action_size != env.action_spec.size:
            raise RslRlImportError(
                f"action size mismatch: the actor in {path} outputs {actor.info.action_size} "
                f"actions, but task {task!r} takes {env.action_spec.size} "
                f"({list(env.action_spec.joint_names)})"
            )
        sha = _sha256(path)
        # the keys of training.runner.run_payload that metadata_from_checkpoint reads
        payload = {
            "robot": env.robot.to_dict(),
            "architecture": {"task": task, "policy": {"rnn_type": None}},
            "config": {"env": {"task": task, "max_episode_steps": None}},
            "obs_terms": {"policy": terms},
            "obs_history": group.history,
            "run_id": path.resolve().parent.name,
            "code_version": code_version(),
            "config_hash": sha[:16],
            "iteration": int(ck.get("iter", -1)),
        }
        bounds = (
            np.asarray(env.action_spec.low, dtype=np.float64),
            np.asarray(env.action_spec.high, dtype=np.float64),
        )
    finally:
        env.close()
    meta = metadata_from_checkpoint(payload, action_bounds=bounds)
    extra = {
        **meta.extra,
        "checkpoint_kind": "rsl_rl",
        "rsl_rl_checkpoint": path.name,
        "rsl_rl_sha256": sha,
        "rsl_rl_activation": activation,
        "rsl_rl_obs_normalization": str(isinstance(actor.normalizer, _Normalizer)).lower(),
    }
    return actor, dataclasses.replace(meta, extra=extra)


def default_onnx_path(path: str | os.PathLike) -> Path:
    """``model_<N>.onnx`` next to ``model_<N>.pt``."""
    return Path(path).with_suffix(".onnx")


def export_rsl_rl(
    path: str | os.PathLike,
    task: str,
    out: str | os.PathLike | None = None,
    *,
    activation: str = "elu",
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Export an rsl_rl 5.x checkpoint trained on ``task`` to our ONNX format (checked by
    ``deploy.export.export_policy``: parity with torch, runtime load, atomic write)."""
    module, meta = import_rsl_rl(path, task, activation=activation)
    return export_policy(module, meta, out or default_onnx_path(path), opset=opset)
