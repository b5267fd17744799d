"""sim2sim: run an exported ONNX policy in our simulator through the deployment path.

The file is loaded with :class:`deploy.runtime.OnnxPolicy` (onnxruntime, no torch) and
every env's action passes through its own :class:`deploy.safety.SafetyLayer`, as on the
robot; the episode statistics come from :func:`sim.evaluation.evaluate`, the function
that evaluates checkpoints, so the two reports are the same numbers computed the same
way.

Action conventions. The network outputs a raw action; the joint target is
``action_offset + action_scale * raw`` (position-controlled robots), and for the
torque-controlled Gymnasium tasks (scale 1, offset 0, limits = action bounds, see
:func:`deploy.export.metadata_from_checkpoint`) the target is the actuator command
itself. The safety layer works on targets; the simulator, like the training loop, takes
the raw action (the quadruped maps it to PD targets itself), so the filtered target is
turned back into a raw action before the step.

The env is the one the policy trained in, as its metadata records it
(:func:`env_settings`): the task's options (e.g. narrowed command ranges) always, and its
sim-to-real settings (randomization, noise, latency, pushes) when asked to randomize;
otherwise the nominal model. Overrides go over the recorded values; a file from before
they were recorded runs with the task's defaults.

Before anything runs, the file is checked against the task (:func:`make_env_for`):
observation layout, action size, joint order, control period, and the robot description
the metadata was made of (action scale and offset, default joint positions, PD gains,
within a relative 1e-6), so that an edited file or one for another robot is refused
rather than evaluated as if it were the original.

By default sim2sim disables the ramp-in and the rate limit, so that on the same seeds
the closed-loop return equals the checkpoint's; the clamps, non-finite checks and the
watchdog stay on. ``strict_safety=True`` uses the metadata's defaults (what the robot
runs), to see what they cost.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy.arrays import ActionMap
from deploy.metadata import PolicyLoadError, PolicyMetadata
from deploy.runtime import OnnxPolicy
from deploy.safety import COUNTER_NAMES, SafetyConfig, SafetyLayer
from sim.evaluation import evaluate

__all__ = [
    "EnvSettings",
    "Sim2SimActor",
    "Sim2SimError",
    "Sim2SimLoadError",
    "env_settings",
    "evaluate_onnx",
    "make_env_for",
]


class Sim2SimError(ValueError):
    """The policy file does not fit the task it is asked to run on."""


class Sim2SimLoadError(PolicyLoadError, ValueError):
    """A :class:`PolicyLoadError` that is also a ValueError, so the CLI reports it cleanly."""


def _sim_config(meta: PolicyMetadata, *, strict: bool) -> SafetyConfig:
    overrides: dict[str, Any] = {}
    if not strict:
        overrides.update(ramp_in_s=0.0, max_delta_per_step=math.inf)
    if meta.extra.get("control_mode") == "torque":
        # a torque robot's safe command is no torque, not its default joint positions
        overrides["safe_posture"] = np.zeros(meta.num_joints)
    return SafetyConfig.from_metadata(meta, **overrides)


class Sim2SimActor:
    """``act(obs, reset_mask) -> actions`` for :func:`sim.evaluation.evaluate`.

    Feeds the env's policy observation group (history frames already stacked by the
    env) to :meth:`OnnxPolicy.act_batch`, carries the recurrent state (zeroed for envs
    whose episode restarts), and passes each env's target through its own safety layer,
    activated at the start of every episode. Safety counters summed over envs are in
    :attr:`counters`.
    """

    def __init__(
        self,
        policy: OnnxPolicy,
        num_envs: int,
        control_period_s: float,
        *,
        safety: bool = True,
        strict_safety: bool = False,
    ) -> None:
        meta = policy.metadata
        self.policy = policy
        self.num_envs = int(num_envs)
        self.dt = float(control_period_s)
        self.action_map = ActionMap(meta.action_offset, meta.action_scale)
        self.state = policy.initial_state(self.num_envs)
        self.layers: list[SafetyLayer] | None = None
        if safety:
            config = _sim_config(meta, strict=strict_safety)
            self.layers = [SafetyLayer(config) for _ in range(self.num_envs)]
        self._t = np.zeros(self.num_envs)
        self._retired = dict.fromkeys(COUNTER_NAMES, 0)

    @property
    def counters(self) -> dict[str, int]:
        """Safety-layer intervention counts, summed over envs and episodes."""
        total = dict(self._retired)
        for layer in self.layers or ():
            for key, value in layer.counters.items():
                total[key] += value
        return total

    def __call__(self, obs: dict[str, Any], reset_mask: Any) -> np.ndarray:
        x = _numpy(obs["policy"]).astype(np.float32, copy=False)
        reset = _numpy(reset_mask).astype(bool).reshape(-1)
        for buf in self.state.values():
            buf[reset] = 0.0
        raw, next_state = self.policy.act_batch(x, self.state)
        if next_state:
            self.state = next_state
        if self.layers is None:
            return raw
        targets = self.action_map.to_targets(raw.astype(np.float64))
        out = np.empty_like(targets)
        for i in range(self.num_envs):
            if reset[i]:
                # a new episode: a fresh layer, so nothing of the last episode carries over
                for key, value in self.layers[i].counters.items():
                    self._retired[key] += value
                self.layers[i] = SafetyLayer(self.layers[i].config)
                self._t[i] = 0.0
                self.layers[i].activate(0.0)
            else:
                self._t[i] += self.dt
            layer, now = self.layers[i], self._t[i]
            layer.observe(now)
            out[i] = layer.filter(x[i], targets[i], now)
        # back to the env's convention: the raw action whose target is the filtered one
        return self.action_map.to_raw(out, fixed_raw=raw).astype(np.float32)


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor from the simulator
        return x.detach().cpu().numpy()
    return np.asarray(x)


# the simulator's own settings, which the metadata and the caller's num_envs fix
_NOT_TASK_OPTIONS = frozenset({"num_threads", "max_episode_steps", "dtype", "nan_action"})


@dataclass(frozen=True)
class EnvSettings:
    """What a policy file runs in: the task, its options and its sim-to-real settings."""

    task: str
    task_args: dict[str, Any]
    """The task constructor's options: the file's ``task_args`` with overrides over them."""
    sim_to_real: Any
    """The ``sim.randomization.SimToRealConfig`` of the env."""
    randomize: bool
    """Whether ``sim_to_real`` is the recorded randomization (else the nominal model)."""
    max_episode_steps: int | None


def env_settings(
    meta: PolicyMetadata,
    task: str | None = None,
    randomize: bool = False,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
) -> EnvSettings:
    """The env a policy file runs in, from its metadata, with overrides over it.

    ``task_args`` go over the file's task options (a file of another task than ``task``
    contributes none). ``randomize``: the file's sim-to-real settings (the task's
    defaults for a file that does not record them) with ``s2r`` over them; otherwise the
    nominal model, and ``s2r`` is an error. The observation history is always the file's.
    Raises :class:`Sim2SimError` naming an unknown option or field, or a bad value.
    """
    from sim.randomization import SimToRealConfig
    from sim.registry import sim_to_real_config, task_options

    task = task or meta.task
    if not task:
        raise Sim2SimError("the policy's metadata names no task; pass --task")
    own = task == meta.task  # the recorded settings are those of the policy's own task
    for name, given in (("task options", task_args), ("sim-to-real settings", s2r)):
        if given is not None and not isinstance(given, Mapping):
            raise Sim2SimError(f"{name} must be a mapping, got {given!r}")
    options = {**(meta.task_args if own else {}), **(task_args or {})}
    known = task_options(task)  # None: an external env, whose factory checks its options
    known = None if known is None else known - _NOT_TASK_OPTIONS
    unknown = [] if known is None else sorted(set(options) - known)
    if unknown:
        raise Sim2SimError(f"task {task!r} has no option(s) {unknown}; known: {sorted(known)}")
    if s2r and not randomize:
        raise Sim2SimError(
            f"sim-to-real settings {sorted(s2r)} change the randomization, which is off; "
            "turn it on (--randomize) to evaluate with them"
        )
    history = meta.obs_history_length
    if randomize:
        recorded = meta.sim_to_real if own and meta.sim_to_real is not None else {}
        if "obs_history" in (s2r or {}):
            raise Sim2SimError("obs_history is the policy file's own; it cannot be overridden")
        try:
            config = sim_to_real_config(task, {**recorded, **(s2r or {}), "obs_history": history})
        except ValueError as exc:
            raise Sim2SimError(f"sim-to-real settings: {exc}") from None
    else:
        config = SimToRealConfig(obs_history=history)
    max_steps = meta.extra.get("max_episode_steps", "")
    return EnvSettings(task, options, config, randomize, int(max_steps) if max_steps else None)


def make_env_for(
    meta: PolicyMetadata,
    task: str | None,
    num_envs: int,
    seed: int,
    randomize: bool,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
):
    """The simulator the policy runs in (:func:`env_settings`), checked against the
    file's metadata.

    Raises :class:`Sim2SimError` for bad overrides, and when the task's observation
    layout, action size, joint order, control period or robot description (action scale
    and offset, default joint positions, PD gains) differ from the file's.
    """
    from sim.registry import make

    settings = env_settings(meta, task, randomize, task_args, s2r)
    task = settings.task
    kwargs: dict[str, Any] = dict(settings.task_args)
    if settings.max_episode_steps is not None:
        kwargs["max_episode_steps"] = settings.max_episode_steps
    env = make(task, num_envs, seed=seed, device="cpu", s2r=settings.sim_to_real, **kwargs)
    try:
        _check_env(meta, env, task)
    except BaseException:
        env.close()
        raise
    return env


def _check_env(meta: PolicyMetadata, env: Any, task: str) -> None:
    group = env.observation_spec.policy
    if group.size != meta.obs_size:
        raise Sim2SimError(
            f"observation size mismatch: the policy file expects obs of size {meta.obs_size} "
            f"(frame {meta.obs_frame_size} x history {meta.obs_history_length}), but task "
            f"{task!r} gives {group.size} (frame {group.frame_size} x history {group.history})"
        )
    env_terms = [(t.name, t.size) for t in group.terms]
    if env_terms != [tuple(t) for t in meta.obs_terms] or group.history != meta.obs_history_length:
        raise Sim2SimError(
            f"observation layout mismatch: the policy file expects terms {meta.obs_terms} x "
            f"history {meta.obs_history_length}, task {task!r} gives {env_terms} x history "
            f"{group.history}"
        )
    if env.action_spec.size != meta.num_joints:
        raise Sim2SimError(
            f"action size mismatch: the policy file drives {meta.num_joints} joints, task "
            f"{task!r} takes {env.action_spec.size} actions"
        )
    if list(env.action_spec.joint_names) != list(meta.action_joint_names):
        raise Sim2SimError(
            f"joint order mismatch: the policy file drives {meta.action_joint_names}, task "
            f"{task!r} has {list(env.action_spec.joint_names)}"
        )
    _check_robot(meta, env, task)


ROBOT_FIELDS = ("action_scale", "action_offset", "default_joint_pos", "kp", "kd")
"""Metadata fields that must equal the task's robot description (``env.robot``)."""

ROBOT_RTOL = 1e-6
"""Relative tolerance of the comparison with the robot (the values travel as JSON)."""


def _check_robot(meta: PolicyMetadata, env: Any, task: str) -> None:
    """The metadata's robot fields against ``env.robot``, the description it was made of.

    ``deploy``'s side reads the joint target as ``action_offset + action_scale * raw`` and
    the safety layer filters that target, then turns it back into the raw action the
    simulator takes; a file whose scale, offset, default pose or gains were edited (or
    come from another robot) would otherwise evaluate exactly like the original (an
    action_scale of 0 even bypasses the safety filter). The training metadata copies
    these fields from ``env.robot`` (torque-controlled tasks: scale 1, offset 0, gains
    0), so they must agree within :data:`ROBOT_RTOL`; the control period too.
    """
    robot = env.robot
    period = float(env.dt)
    if not math.isclose(meta.control_period_s, period, rel_tol=1e-9):
        raise Sim2SimError(
            f"control period mismatch: the policy runs at {meta.control_period_s} s, task "
            f"{task!r} at {period} s"
        )
    names = list(meta.action_joint_names)
    for field in ROBOT_FIELDS:
        got = np.asarray(getattr(meta, field), dtype=np.float64).reshape(-1)
        want = np.asarray(getattr(robot, field), dtype=np.float64).reshape(-1)
        if got.shape != want.shape:
            raise Sim2SimError(
                f"{field} mismatch: the policy file has {got.size} values, the robot of "
                f"task {task!r} {want.size}"
            )
        close = np.isclose(got, want, rtol=ROBOT_RTOL, atol=0.0)
        if close.all():
            continue
        i = int(np.flatnonzero(~close)[0])
        joint = names[i] if i < len(names) else str(i)
        others = int((~close).sum()) - 1
        more = f" (and {others} other joint(s))" if others else ""
        raise Sim2SimError(
            f"{field} mismatch: the policy file has {field} {got[i]:.9g} for joint "
            f"{joint!r}{more}, the robot of task {task!r} has {want[i]:.9g}; file "
            f"{_floats(got)}, robot {_floats(want)} (an edited file, or a policy for "
            "another robot)"
        )


def _floats(values: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def evaluate_onnx(
    path: str | os.PathLike[str],
    task: str | None = None,
    episodes: int = 10,
    seed: int = 0,
    randomize: bool = False,
    safety: bool = True,
    *,
    strict_safety: bool = False,
    counters: dict[str, int] | None = None,
    zero_noise: bool = False,
    task_args: Mapping[str, Any] | None = None,
    s2r: Mapping[str, Any] | None = None,
    wrap: Callable[[Any, Any], Any] | None = None,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Evaluate an exported policy file in the simulator; the checkpoint's statistics.

    Returns ``{"task", "source", "randomize", **sim.evaluation.evaluate(...)}``, the
    keys of :func:`training.artifacts.evaluate_source` for a checkpoint. The task is the
    metadata's unless given, with the task options the policy trained with
    (``task_args`` over them). ``randomize`` turns on the sim-to-real settings it
    trained with (domain randomization, observation noise, action latency, pushes;
    ``s2r`` over them; the task's defaults for a file that does not record them). If
    ``counters`` is a dict, the summed safety-layer counts are written into it.
    ``wrap(act, env)``: an act function around the policy's (e.g. one that records a
    video). A generative policy
    (diffusion) samples with noise drawn from a Generator seeded by ``seed``, as it runs
    on the robot; ``zero_noise`` feeds it zeros instead (one fixed draw per decision,
    which understates a policy trained to sample). ``max_steps``: stop the episodes
    after this many control steps (None: run them to their end).

    Raises FileNotFoundError for a missing file, :class:`Sim2SimLoadError` (a
    PolicyLoadError) for a file onnxruntime cannot load, MetadataError for bad metadata
    and :class:`Sim2SimError` when the file does not fit the task.
    """
    try:
        policy = OnnxPolicy(path, seed=seed, deterministic=zero_noise)
    except PolicyLoadError as exc:
        raise Sim2SimLoadError(str(exc)) from exc
    meta = policy.metadata
    env = make_env_for(meta, task, episodes, seed, randomize, task_args, s2r)  # checked
    try:
        actor = Sim2SimActor(
            policy, env.num_envs, env.dt, safety=safety, strict_safety=strict_safety
        )
        stats = evaluate(wrap(actor, env) if wrap is not None else actor, env, episodes, max_steps)
    finally:
        env.close()
    if counters is not None:
        counters.update(actor.counters)
    out = {"task": task or meta.task, "source": str(path), "randomize": randomize, **stats}
    if policy.is_generative:
        out["zero_noise"] = zero_noise
    return out


def _main(argv: list[str] | None = None) -> int:  # python -m deploy.sim2sim, for debugging
    import argparse

    p = argparse.ArgumentParser(prog="python -m deploy.sim2sim")
    p.add_argument("policy")
    p.add_argument("--task", default=None)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--randomize", action="store_true")
    p.add_argument("--strict-safety", action="store_true")
    p.add_argument("--zero-noise", action="store_true")
    a = p.parse_args(argv)
    counters: dict[str, int] = {}
    stats = evaluate_onnx(
        a.policy,
        a.task,
        a.episodes,
        a.seed,
        a.randomize,
        strict_safety=a.strict_safety,
        counters=counters,
        zero_noise=a.zero_noise,
    )
    print(json.dumps({**stats, "safety": counters}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
