"""Deployment metadata of a training checkpoint: what the robot side needs to run it.

The checkpoint payload (training.runner, training.bc_runner) carries the robot
description, the observation terms and history, the task, run id, code version and
config hash; these functions turn it into a :class:`deploy.metadata.PolicyMetadata`,
one per policy family. ``deploy.export`` then writes it into the ONNX file. The env the
policy trained in travels too (task options, sim-to-real settings, whether they were
on), so that sim2sim evaluates the file where it was trained.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from deploy.export import DEFAULT_OPSET
from deploy.metadata import PolicyMetadata
from sim.registry import sim_to_real_config
from training.checkpoint import CheckpointError

__all__ = ["diffusion_metadata", "flow_metadata", "metadata_from_checkpoint"]


def metadata_from_checkpoint(
    ck: Mapping[str, Any], action_bounds: tuple[Any, Any]
) -> PolicyMetadata:
    """The deployment metadata of a checkpoint payload (training.runner's format).

    Every field comes from the checkpoint: the policy observation terms and history
    length, the robot description (joint order, default pose, PD gains, action scale and
    offset, control period), the task, run id, code version and config hash; the policy
    family and recurrent state from the saved policy config.

    Joint limits, which the safety layer clamps the target to:

    - position control (``robot.control_mode == "position"``): the joints' position
      ranges; a joint without a range gets the targets its action bounds can reach,
      ``offset + scale * bound``.
    - torque control (the Gymnasium tasks): the target *is* the actuator command
      (``action_scale`` 1, ``action_offset`` 0), so ``joint_pos_lower/upper`` are set to
      the **action bounds** (the actuator control range): the safety layer then clamps
      the torque command to the actuator range, as the simulator does. The physical
      joint ranges are kept in ``extra["joint_range_lower"/"joint_range_upper"]`` and
      ``default_joint_pos`` stays the physical default pose; a torque robot's safe
      command is zero (``action_offset``), not that pose (sim2sim sets it so).

    ``action_bounds`` (low, high) are the task's action bounds. ``extra`` carries ``control_mode``,
    ``physics_dt``, ``torque_limit``, ``action_low``/``action_high`` (JSON) and
    ``max_episode_steps`` (empty for the task's default).

    The training env: ``task_args`` (``env.task_args``), ``sim_to_real`` (the task's
    sim-to-real defaults with ``env.s2r`` over them and the policy's observation history,
    as JSON; what ``sim2real eval --randomize`` turns on) and ``trained_randomized``
    (``env.randomize``).
    """
    try:
        robot = ck["robot"]
        arch = ck["architecture"]
        policy_cfg = arch["policy"]
        config = ck["config"]
        obs_terms = [(str(n), int(s)) for n, s in ck["obs_terms"]["policy"]]
        history = int(ck["obs_history"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint lacks what export needs: {exc!r}") from None
    mode = str(robot.get("control_mode", "torque"))
    if mode not in ("torque", "position"):
        raise CheckpointError(f"checkpoint robot has unknown control_mode {mode!r}")
    low = np.asarray(action_bounds[0], dtype=np.float64).reshape(-1)
    high = np.asarray(action_bounds[1], dtype=np.float64).reshape(-1)
    scale = np.asarray(robot["action_scale"], dtype=np.float64)
    offset = np.asarray(robot["action_offset"], dtype=np.float64)
    jlo = np.asarray(robot["joint_pos_lower"], dtype=np.float64)
    jhi = np.asarray(robot["joint_pos_upper"], dtype=np.float64)
    if mode == "torque":
        lower, upper = low.copy(), high.copy()
    else:
        reach = np.sort(np.stack([offset + scale * low, offset + scale * high]), axis=0)
        lower = np.where(np.isfinite(jlo), jlo, reach[0])
        upper = np.where(np.isfinite(jhi), jhi, reach[1])

    rnn_type = policy_cfg.get("rnn_type")
    if rnn_type is None:
        family, state = "gaussian_mlp", []
    else:
        names = ["h", "c"] if rnn_type == "lstm" else ["h"]
        shape = [int(policy_cfg["rnn_layers"]), int(policy_cfg["rnn_hidden"])]
        family, state = "recurrent", [(n, shape) for n in names]
    env_cfg = config.get("env", {})
    max_steps = env_cfg.get("max_episode_steps")
    extra = {
        "control_mode": mode,
        "physics_dt": repr(float(robot["physics_dt"])),
        "torque_limit": _json_floats(robot.get("torque_limit", [])),
        "action_low": _json_floats(low),
        "action_high": _json_floats(high),
        "joint_range_lower": _json_floats(jlo),
        "joint_range_upper": _json_floats(jhi),
        "max_episode_steps": "" if max_steps is None else str(int(max_steps)),
    }
    if rnn_type is not None:
        extra["rnn_type"] = str(rnn_type)
    for key in ("iteration", "env_steps"):
        if key in ck:
            extra[key] = str(ck[key])
    return PolicyMetadata(
        policy_family=family,
        obs_terms=obs_terms,
        action_joint_names=list(robot["joint_names"]),
        action_scale=scale,
        action_offset=offset,
        default_joint_pos=robot["default_joint_pos"],
        kp=robot["kp"],
        kd=robot["kd"],
        joint_pos_lower=lower,
        joint_pos_upper=upper,
        control_period_s=float(robot["control_dt"]),
        obs_history_length=history,
        recurrent_state=state,
        noise_shape=None,
        task=str(arch["task"]),
        run_id=str(ck.get("run_id", "")),
        code_version=str(ck.get("code_version", "")),
        config_hash=str(ck.get("config_hash", "")),
        opset=DEFAULT_OPSET,
        extra=extra,
        task_args=dict(env_cfg.get("task_args") or {}),
        sim_to_real=_sim_to_real(str(arch["task"]), env_cfg, history),
        trained_randomized=bool(env_cfg["randomize"]) if "randomize" in env_cfg else None,
    )


def _sim_to_real(task: str, env_cfg: Mapping[str, Any], history: int) -> dict[str, Any]:
    """The training config's sim-to-real settings as plain JSON (ranges as lists)."""
    try:
        s2r = sim_to_real_config(task, {**(env_cfg.get("s2r") or {}), "obs_history": history})
    except ValueError as exc:
        raise CheckpointError(f"checkpoint env.s2r does not fit task {task!r}: {exc}") from None
    return json.loads(json.dumps(dataclasses.asdict(s2r)))


def _json_floats(values: Any) -> str:
    """JSON list of floats, non-finite values as null (strict JSON)."""
    return json.dumps([v if math.isfinite(v) else None for v in map(float, np.ravel(values))])


def _generative_metadata(
    ck: Mapping[str, Any], family: str, info: Any, extra: dict[str, str]
) -> PolicyMetadata:
    """The Gaussian contract (robot, terms, history, run id, hashes) with a generative
    family's noise input and chunk-execution state (from its inference module's info)."""
    low = np.asarray(ck["action_low"], dtype=np.float64)
    high = np.asarray(ck["action_high"], dtype=np.float64)
    meta = metadata_from_checkpoint(ck, action_bounds=(low, high))
    return _as_generative(meta, family, info, {**extra, "checkpoint_kind": str(ck.get("kind"))})


def _as_generative(
    meta: PolicyMetadata, family: str, info: Any, extra: dict[str, str]
) -> PolicyMetadata:
    return dataclasses.replace(
        meta,
        policy_family=family,
        recurrent_state=info.recurrent_state,
        noise_shape=list(info.noise_shape),
        extra={**meta.extra, **extra},
    )


def diffusion_metadata(ck: Mapping[str, Any], policy: Any) -> PolicyMetadata:
    """Deployment metadata of a diffusion checkpoint: family "diffusion", the noise input
    [horizon, A] (x_0 of the DDIM chain) and the chunk-execution state."""
    info = policy.info
    return _generative_metadata(
        ck,
        "diffusion",
        info,
        {
            "diffusion_sampler": "ddim",
            "diffusion_steps": str(policy.cfg.sample_steps),
            "diffusion_horizon": str(info.horizon),
            "diffusion_act_steps": str(info.act_steps),
            "diffusion_ft_steps": str(policy.num_ft_steps),
        },
    )


def flow_metadata(ck: Mapping[str, Any], policy: Any) -> PolicyMetadata:
    """Deployment metadata of a flow checkpoint, for the deterministic-drift graph that
    export writes: family "flow", the noise input x_0 [horizon, A], the Euler step
    count and the chunk-execution state."""
    info = policy.inference_module().info
    return _generative_metadata(ck, "flow", info, _flow_fields(policy, info))


def as_flow(meta: PolicyMetadata, policy: Any) -> PolicyMetadata:
    """``meta`` (a Gaussian policy's contract: robot, terms, bounds) as ``policy``'s, a
    FlowPolicy's: what flow_metadata adds to a checkpoint's, for a policy that has none."""
    info = policy.inference_module().info
    return _as_generative(meta, "flow", info, _flow_fields(policy, info))


def _flow_fields(policy: Any, info: Any) -> dict[str, str]:
    return {
        "flow_steps": str(info.steps),
        "flow_horizon": str(info.horizon),
        "flow_act_steps": str(info.act_steps),
        "flow_shortcut": str(bool(policy.cfg.shortcut)).lower(),
    }
