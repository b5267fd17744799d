"""One control step of a deployed VLA policy, without ROS: image + instruction + proprio ->
action chunk -> safety.

:class:`VLAController` is what the VLA policy node runs on every tick; the node only turns
messages into its arguments and its result into a message. Of our code it uses
:mod:`deploy.vla_runtime` (the ONNX VLA with its tokenizer and chunk execution),
:mod:`deploy.safety` and :mod:`deploy.arrays`, plus :mod:`sim2real_ros.vla_observation`.

What is sent, by the policy's ``control_mode`` (metadata ``extra``):

- ``position``: joint position targets, ``offset + scale * action``, as the locomotion
  policy node sends them (the robot's joint controllers run the PD loop);
- ``torque`` (the Gymnasium-style tasks, e.g. ``instructed_reach``): the action *is* the
  actuator command, in the units the simulator's actuator took it (its ``ctrl``; the
  metadata's ``extra["torque_limit"]`` is the torque at the bound). The safety layer's
  limits are then the action bounds (the export sets ``joint_pos_lower/upper`` to them),
  its per-step change limit bounds how fast the torque changes, and its safe "posture" is
  zero torque (as sim2sim's), because a torque robot's safe command is to stop pushing,
  not the default joint pose. The node publishes it as effort commands.

The step, at time ``now`` (one monotonic clock):

1. the proprio vector from the latest ``JointState`` (and end-effector point); a vector
   that cannot be built becomes all-NaN (a fault for the safety layer);
2. the watchdog is fed with the receive time of the older of the needed messages, only
   if the vector is finite and the latest valid image is younger than
   ``image_timeout_s``: a camera that stops trips the watchdog
   ``watchdog_timeout_s`` after its image went stale;
3. when the runtime starts a new chunk (:attr:`OnnxVLAPolicy.needs_observation`), the
   latest valid image is converted and the network runs; in between, the chunk's next
   action is taken without touching the image; no instruction, or a stale image at a
   chunk start, gives a NaN action (counted);
4. the action -> command -> :meth:`SafetyLayer.filter`: always finite, within the
   limits, rate limited, the safe command when stale or inactive.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from deploy.arrays import ActionMap, all_finite
from deploy.metadata import MetadataError, PolicyLoadError
from deploy.safety import DEFAULT_MAX_TARGET_SPEED, SafetyConfig, SafetyLayer
from deploy.vla_runtime import OnnxVLAPolicy
from sim2real_ros.controller import ConfigureError
from sim2real_ros.observation import ObservationError
from sim2real_ros.vla_observation import (
    ImageError,
    ProprioAssembler,
    check_image,
    image_into,
    normalize_instruction,
)

__all__ = ["CONTROL_MODES", "VLAController"]

CONTROL_MODES = ("position", "torque")

COUNTER_NAMES = (
    "images",
    "bad_image",
    "stale_image",
    "chunks",
    "instruction_changes",
    "bad_instruction",
    "no_instruction",
    "bad_observation",
)


class VLAController:
    """The VLA policy, its inputs and its safety layer, stepped per tick.

    Args:
        policy_path: the VLA ``.onnx`` file (its tokenizer beside it).
        control_period_s: loop period; ``None`` or 0: the metadata's.
        watchdog_timeout_s: ``None`` or 0: the safety layer's default (5 periods).
        image_timeout_s: an image older than this is stale (no new chunk from it, and
            the watchdog is not fed).
        ramp_in_s: blend time into the policy's commands after activation.
        max_command_rate: bound on how fast the command moves, per second (rad/s for
            position targets, actuator units/s for torques; 0 or ``inf``: none).
        hold_last_on_fault: non-finite proprio/action -> hold the last command (else the
            safe command: zero torque, or the default pose).
        instructions: the sentences the robot may be given; another one is refused,
            counted and logged. Empty: the sentences the export recorded (the task's),
            or, for a file without them, any sentence whose words the tokenizer knows.
        instruction: the first instruction ("" : none until one arrives).
        intra_op_threads, seed, deterministic: of :class:`OnnxVLAPolicy`.

    Raises:
        ConfigureError: a missing or broken file, a policy that is not a VLA, an unknown
            control mode or proprio term, or a bad first instruction.
    """

    def __init__(
        self,
        policy_path: str | os.PathLike[str],
        *,
        control_period_s: float | None = None,
        watchdog_timeout_s: float | None = None,
        image_timeout_s: float = 0.5,
        ramp_in_s: float = 0.5,
        max_command_rate: float = DEFAULT_MAX_TARGET_SPEED,
        hold_last_on_fault: bool = False,
        instructions: Sequence[str] = (),
        instruction: str = "",
        intra_op_threads: int = 1,
        seed: int = 0,
        deterministic: bool = True,
    ) -> None:
        path = os.fspath(policy_path)
        if not path:
            raise ConfigureError("no policy file given (parameter 'policy_path' is empty)")
        try:
            self.policy = OnnxVLAPolicy(
                path, intra_op_threads=intra_op_threads, seed=seed, deterministic=deterministic
            )
        except FileNotFoundError:
            raise ConfigureError(f"policy file not found: {path}") from None
        except (PolicyLoadError, MetadataError) as exc:
            raise ConfigureError(f"cannot use VLA policy file {path}: {exc}") from None
        meta = self.policy.metadata
        self.metadata = meta
        self.control_mode = str(meta.extra.get("control_mode", "position"))
        if self.control_mode not in CONTROL_MODES:
            raise ConfigureError(f"policy {path}: unknown control_mode {self.control_mode!r}")
        try:
            self.proprio = ProprioAssembler(
                meta.obs_terms, meta.action_joint_names, meta.default_joint_pos
            )
        except ObservationError as exc:
            raise ConfigureError(f"policy {path}: {exc}") from None
        self.instructions = [
            normalize_instruction(t) for t in (instructions or self.policy.trained_instructions)
        ]
        self.joint_names = list(meta.action_joint_names)
        self.num_joints = len(self.joint_names)
        self.image_height, self.image_width = self.policy.image_shape[:2]
        period = float(control_period_s or 0.0) or meta.control_period_s
        if not (math.isfinite(period) and period > 0):
            raise ConfigureError(f"control period must be > 0, got {period}")
        self.control_period_s = period
        self.image_timeout_s = float(image_timeout_s)
        if not self.image_timeout_s > 0:
            raise ConfigureError(f"image_timeout_s must be > 0, got {image_timeout_s}")
        rate = float(max_command_rate)
        overrides: dict[str, Any] = {
            "ramp_in_s": float(ramp_in_s),
            "hold_last_on_fault": bool(hold_last_on_fault),
            "max_delta_per_step": rate * period if rate > 0 else math.inf,
        }
        if self.control_mode == "torque":
            overrides["safe_posture"] = np.zeros(self.num_joints)  # no torque
        if watchdog_timeout_s:
            overrides["watchdog_timeout_s"] = float(watchdog_timeout_s)
        try:
            self.safety = SafetyLayer(SafetyConfig.from_metadata(meta, **overrides))
        except ValueError as exc:
            raise ConfigureError(f"safety settings: {exc}") from None
        self.safe_command = self.safety.config.safe_posture.copy()
        self.action_map = ActionMap(meta.action_offset, meta.action_scale)
        self.last_action = np.zeros(self.num_joints)
        self._nan_proprio = np.full(self.proprio.size, np.nan)
        self._nan_action = np.full(self.num_joints, np.nan)
        self._zeros = np.zeros(self.proprio.size)
        self._target = np.zeros(self.num_joints)
        self._image = np.zeros(self.policy.image_shape, dtype=np.uint8)
        self._image_msg: Any = None
        self._image_t = -math.inf
        self.chunk_image_msg: Any = None
        """The image message the last new chunk was computed from (None: no chunk yet)."""
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.last_error = ""
        if instruction:
            problem = self.set_instruction(instruction)
            if problem:
                raise ConfigureError(f"first instruction: {problem}")

    # ------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> bool:
        return self.safety.active

    @property
    def instruction(self) -> str | None:
        return self.policy.instruction

    def activate(self, now: float, joint_state: Any = None) -> None:
        """Start the policy: a fresh chunk, ramped in from the present command."""
        self.policy.reset()
        self.last_action.fill(0.0)
        current = None
        if self.control_mode == "position" and joint_state is not None:
            try:
                current = self.proprio.joint_positions(joint_state)
            except ObservationError:
                current = None
        self.safety.activate(now, current)

    def deactivate(self) -> None:
        self.safety.deactivate()

    # ------------------------------------------------------------------ inputs
    def set_instruction(self, text: str) -> str:
        """Use ``text`` from the next chunk on; "" or why it was refused (then the
        previous instruction stays)."""
        try:
            if self.instructions and normalize_instruction(text) not in self.instructions:
                raise ValueError(f"instruction {text!r} is not one of {self.instructions}")
            if text == self.policy.instruction:
                return ""
            self.policy.set_instruction(text)  # ValueError naming an unknown word
        except ValueError as exc:
            self.counters["bad_instruction"] += 1
            return str(exc)
        self.counters["instruction_changes"] += 1
        return ""

    def set_image(self, msg: Any, now: float) -> str:
        """Keep ``msg`` (received at ``now``) as the latest image; "" or why it was refused
        (then the previous image stays, and ages)."""
        try:
            check_image(msg, self.image_height, self.image_width)
        except ImageError as exc:
            self.counters["bad_image"] += 1
            return str(exc)
        self.counters["images"] += 1
        self._image_msg, self._image_t = msg, now
        return ""

    def image_fresh(self, now: float) -> bool:
        return now - self._image_t <= self.image_timeout_s

    # ------------------------------------------------------------------ the step
    def step(
        self, joint_state: Any, point: Any, sensor_time: float | None, now: float
    ) -> np.ndarray:
        """One control step at ``now``; the command to send (a new array).

        ``sensor_time``: receive time of the older of the needed JointState and point
        messages (None: none yet).
        """
        self.chunk_image_msg = None
        try:
            proprio = self.proprio.assemble(joint_state, point, self.last_action)
            self.last_error = ""
        except ObservationError as exc:
            self.counters["bad_observation"] += 1
            self.last_error = str(exc)
            proprio = self._nan_proprio
        fresh_image = self.image_fresh(now)
        if proprio is not self._nan_proprio:
            if not all_finite(proprio, self._zeros):
                self.counters["bad_observation"] += 1
                self.last_error = "non-finite sensor values (NaN or inf)"
            elif sensor_time is not None and fresh_image:
                self.safety.observe(sensor_time)  # only usable inputs feed the watchdog
        target = self.safe_command
        if self.safety.active:
            raw = self._action(proprio, fresh_image)
            target = self.action_map.to_targets(raw, out=self._target)
        out = self.safety.filter(proprio, target, now)
        self.action_map.to_raw(out, out=self.last_action)
        return out

    def _action(self, proprio: np.ndarray, fresh_image: bool) -> np.ndarray:
        policy = self.policy
        if policy.instruction is None:
            self.counters["no_instruction"] += 1
            return self._nan_action
        if not policy.needs_observation:
            return policy.next_action()
        if not fresh_image or self._image_msg is None:
            self.counters["stale_image"] += 1
            return self._nan_action
        msg = self._image_msg
        image_into(msg, self._image)
        try:
            action = policy.next_action(self._image, proprio)
        except ValueError as exc:  # unreachable: image and proprio are checked shapes
            self.last_error = str(exc)
            return self._nan_action
        self.counters["chunks"] += 1
        self.chunk_image_msg = msg
        return action
