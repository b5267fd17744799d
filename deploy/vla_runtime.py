"""Run an exported vision-language-action policy on the robot (or in sim2sim evaluation).

Needs only numpy, onnxruntime and ``tokenizers``: no torch. The file's metadata (the VLA
contract of :mod:`deploy.metadata`) says how to feed it; :class:`OnnxVLAPolicy` checks at
load time that the graph's typed inputs and its chunk output agree with the metadata and
that the tokenizer next to the file is the one it was exported with, so a mismatch fails
on the bench with a message naming it, not on the robot with wrong actions.

One network call gives a chunk of ``horizon`` actions; a backbone pass costs far more
than a control period, so the robot runs the network at the chunk rate and executes the
first ``act_steps`` actions of each chunk before asking again, as training did (the
exported flow and diffusion graphs do the same inside the graph with
``action_chunk``/``chunk_step`` state, :class:`policies.chunked.ChunkInference`; here the
state is two Python fields, because the chunk call is the expensive one and must not
run at every control step). :meth:`OnnxVLAPolicy.next_action` is that loop;
:attr:`OnnxVLAPolicy.needs_observation` says when the next call will run the network,
so a caller grabs and converts a camera frame only then.

The instruction is tokenized once, by :meth:`OnnxVLAPolicy.set_instruction`, and its
ids are kept in the bound input: a control step never tokenizes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from deploy.arrays import ActionMap
from deploy.metadata import (
    VLA_PROPRIO_INPUT,
    MetadataError,
    PolicyLoadError,
    PolicyMetadata,
)
from deploy.runtime import open_session
from deploy.tokenizer import InstructionTokenizer, TokenizerFileError

__all__ = ["MetadataError", "OnnxVLAPolicy", "PolicyLoadError", "TokenizerFileError"]

_TYPES = {np.dtype(np.uint8): "tensor(uint8)", np.dtype(np.int64): "tensor(int64)"}
_FLOAT = "tensor(float)"


class OnnxVLAPolicy:
    """A VLA policy file and its tokenizer, loaded for inference with chunk execution.

    Args:
        path: the ``.onnx`` file; its tokenizer lies next to it under the name the
            metadata records (``instruction_input.tokenizer_file``).
        intra_op_threads: onnxruntime intra-op threads (1: no thread-pool wake-up jitter;
            more shortens a chunk call of a large backbone on an idle multi-core robot).
        providers: onnxruntime execution providers, in order of preference.
        seed: seed of the numpy Generator that draws the flow's noise.
        deterministic: feed zero noise (the mean-like chunk) instead of random noise.

    Raises:
        FileNotFoundError: the policy file does not exist.
        PolicyLoadError: onnxruntime cannot load it, it is not a VLA policy, or its graph
            disagrees with the metadata; :class:`deploy.tokenizer.TokenizerFileError`
            (a PolicyLoadError) for a missing, modified or unfitting tokenizer file.
        MetadataError: the metadata is missing, malformed or of another format version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        intra_op_threads: int = 1,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        seed: int | None = 0,
        deterministic: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.session, meta = open_session(self.path, intra_op_threads, providers)
        if not meta.is_vla:
            self._fail(
                f"policy family {meta.policy_family!r} has no image or instruction input; "
                "load it with deploy.runtime.OnnxPolicy"
            )
        self.metadata: PolicyMetadata = meta
        image, instr, chunk = meta.image_input, meta.instruction_input, meta.action_chunk
        assert image is not None and instr is not None and chunk is not None
        assert meta.noise_shape is not None
        self._image_spec = image
        self._image_shape = (image["height"], image["width"], image["channels"])
        self._inputs = {
            image["name"]: (np.dtype(np.uint8), self._image_shape),
            instr["name"]: (np.dtype(np.int64), (instr["max_tokens"],)),
            VLA_PROPRIO_INPUT: (np.dtype(np.float32), (meta.obs_size,)),
            "noise": (np.dtype(np.float32), tuple(meta.noise_shape)),
        }
        self._chunk_shape = meta.chunk_shape
        self._max_batch = self._check_graph()
        self.tokenizer = InstructionTokenizer.for_policy(self.path, meta)

        self.deterministic = bool(deterministic)
        self._rng = np.random.default_rng(seed)
        self.action_map = ActionMap(meta.action_offset, meta.action_scale)
        self._act_steps = chunk["act_steps"]
        # Bound inputs of the single-row path, fed by reference on every call.
        self._image = np.zeros((1, *self._image_shape), dtype=np.uint8)
        self._ids = np.full((1, instr["max_tokens"]), instr["pad_id"], dtype=np.int64)
        self._proprio = np.zeros((1, meta.obs_size), dtype=np.float32)
        self._noise = np.zeros((1, *meta.noise_shape), dtype=np.float32)
        self._feed = {
            image["name"]: self._image,
            instr["name"]: self._ids,
            VLA_PROPRIO_INPUT: self._proprio,
            "noise": self._noise,
        }
        self._instruction: str | None = None
        # Chunk execution: the chunk being executed and the index of its next action;
        # `_next == act_steps` means "sample a new chunk at the next step".
        self._chunk = np.zeros(self._chunk_shape, dtype=np.float32)
        self._next = self._act_steps
        self._counters = {"chunks": 0, "steps": 0, "nonfinite_inputs": 0, "nonfinite_chunks": 0}

    # ------------------------------------------------------------------ properties
    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the uint8 RGB image :meth:`act` takes."""
        return self._image_shape

    @property
    def camera(self) -> str:
        """Name of the camera the policy was trained with (metadata ``image_input``)."""
        return self._image_spec["camera"]

    @property
    def proprio_size(self) -> int:
        """Size of the proprio vector: the metadata's ``obs_terms``, concatenated in order."""
        return self.metadata.obs_size

    @property
    def num_joints(self) -> int:
        """Number of action joints, in the order of ``metadata.action_joint_names``."""
        return self.metadata.num_joints

    @property
    def horizon(self) -> int:
        """Actions per chunk (the graph's output)."""
        return self._chunk_shape[0]

    @property
    def act_steps(self) -> int:
        """Actions of each chunk that :meth:`next_action` executes before a new chunk."""
        return self._act_steps

    @property
    def instruction(self) -> str | None:
        """The instruction set by :meth:`set_instruction`, or None."""
        return self._instruction

    @property
    def trained_instructions(self) -> list[str]:
        """The sentences the task trained with, as the export recorded them ([]: not
        recorded; any sentence of known words tokenizes)."""
        return list(self.metadata.instruction_input.get("instructions", []))

    @property
    def needs_observation(self) -> bool:
        """Whether the next :meth:`next_action` runs the network (and needs an image)."""
        return self._next >= self._act_steps

    @property
    def counters(self) -> dict[str, int]:
        """Chunks computed, actions returned by :meth:`next_action`, and observations or
        chunks rejected for being non-finite (a copy)."""
        return dict(self._counters)

    # ------------------------------------------------------------------ instruction
    def set_instruction(self, text: str) -> np.ndarray:
        """Tokenize ``text`` once and feed its ids to every following chunk call.

        A different instruction drops the chunk being executed (the next step plans for
        the new task); the same text again is a no-op, so a node may re-publish it.
        Returns a copy of the ids. Raises ValueError naming an unknown word, or the
        token count of an over-long instruction; the previous instruction stays then.
        """
        if text == self._instruction:
            return self._ids[0].copy()
        ids = self.tokenizer.encode(text)
        self._ids[0] = ids
        self._instruction = text
        self._next = self._act_steps
        return ids.copy()

    # ------------------------------------------------------------------ hot path
    def act(
        self, image: np.ndarray, proprio: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        """One network call: the chunk ``[horizon, num_joints]`` of raw actions (before
        scale and offset) for this image, proprio and the current instruction.

        Args:
            image: uint8 ``[height, width, 3]``, RGB, channels last (ROS ``rgb8``); no
                scaling or normalization (the graph does it).
            proprio: the proprio terms of the metadata's ``obs_terms``, concatenated.
            noise: ``noise_shape`` values (or ``[1, *noise_shape]``); by default drawn
                from the seeded Generator, or zeros in deterministic mode.

        A proprio vector with NaN or inf gives an all-NaN chunk (the safety layer holds
        the last target) without running the network. Does not touch the chunk that
        :meth:`next_action` executes.
        """
        if self._instruction is None:
            raise RuntimeError("no instruction set: call set_instruction(text) first")
        self._stage(image, proprio, noise)
        if not np.isfinite(self._proprio).all():
            self._counters["nonfinite_inputs"] += 1
            return np.full(self._chunk_shape, np.nan, dtype=np.float32)
        chunk = self.session.run(["actions"], self._feed)[0][0]
        self._counters["chunks"] += 1
        if not np.isfinite(chunk).all():
            self._counters["nonfinite_chunks"] += 1
        return chunk

    def next_action(
        self,
        image: np.ndarray | None = None,
        proprio: np.ndarray | None = None,
        noise: np.ndarray | None = None,
    ) -> np.ndarray:
        """One control step: the next raw action ``[num_joints]`` of the chunk being
        executed, computing a new chunk from ``image`` and ``proprio`` first when the
        last one has had ``act_steps`` actions executed (:attr:`needs_observation`).

        ``image`` and ``proprio`` are only read then (None is fine in between). A
        non-finite chunk or proprio is not committed: the action is all NaN and the next
        step tries a new chunk again.
        """
        if self.needs_observation:
            if image is None or proprio is None:
                raise ValueError(
                    "this step starts a new chunk and needs the image and the proprio "
                    "(see needs_observation)"
                )
            chunk = self.act(image, proprio, noise)
            if not np.isfinite(chunk).all():
                return np.full(self.num_joints, np.nan, dtype=np.float32)
            self._chunk[...] = chunk
            self._next = 0
        action = self._chunk[self._next].copy()
        self._next += 1
        self._counters["steps"] += 1
        return action

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode: drop the chunk being executed (the instruction stays).

        If ``seed`` is given, the noise Generator is re-seeded too.
        """
        self._next = self._act_steps
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def to_joint_targets(self, raw_action: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Joint targets of raw actions ``[..., num_joints]`` (one action or a whole
        chunk): ``action_offset + action_scale * raw``, float64."""
        raw = np.asarray(raw_action)
        if raw.shape[-1:] != (self.num_joints,):
            raise ValueError(
                f"raw action must end in {self.num_joints} joints, got shape {raw.shape}"
            )
        return self.action_map.to_targets(raw, out)

    # ------------------------------------------------------------------ batch path
    def act_batch(
        self,
        images: np.ndarray,
        proprio: np.ndarray,
        instructions: Sequence[str] | np.ndarray,
        noise: np.ndarray | None = None,
    ) -> np.ndarray:
        """Chunks ``[B, horizon, num_joints]`` of a batch, for evaluation in simulation.

        ``instructions``: B strings (tokenized here) or ids ``[B, max_tokens]`` int64.
        No state of the single-row path is read or changed.
        """
        images = np.asarray(images)
        h, w, c = self._image_shape
        if images.ndim != 4 or images.shape[1:] != self._image_shape:
            raise ValueError(
                f"images must be uint8 [B, {h}, {w}, {c}] (RGB, channels last), got shape "
                f"{images.shape}"
            )
        self._check_image_dtype(images.dtype)
        batch = images.shape[0]
        if self._max_batch is not None and batch != self._max_batch:
            raise ValueError(f"this graph has a fixed batch size {self._max_batch}, got {batch}")
        if isinstance(instructions, np.ndarray):
            ids = instructions
            want = (batch, self._ids.shape[1])
            if ids.shape != want or ids.dtype != np.int64:
                raise ValueError(
                    f"instruction ids must be int64 {want}, got {ids.dtype} {ids.shape}"
                )
        else:
            ids = self.tokenizer.encode_batch(instructions)
            if ids.shape[0] != batch:
                raise ValueError(f"got {ids.shape[0]} instructions for {batch} images")
        pro = np.asarray(proprio, dtype=np.float32)
        if pro.shape != (batch, self.proprio_size):
            raise ValueError(
                f"proprio must have shape ({batch}, {self.proprio_size}) (terms "
                f"{self._terms()}), got {pro.shape}"
            )
        shape = (batch, *self._noise.shape[1:])
        if noise is not None:
            n = np.asarray(noise, dtype=np.float32)
            if n.shape != shape:
                raise ValueError(f"noise must have shape {shape}, got {n.shape}")
        elif self.deterministic:
            n = np.zeros(shape, dtype=np.float32)
        else:
            n = self._rng.standard_normal(shape, dtype=np.float32)
        meta = self.metadata
        assert meta.image_input is not None and meta.instruction_input is not None
        feed = {
            meta.image_input["name"]: np.ascontiguousarray(images),
            meta.instruction_input["name"]: ids,
            VLA_PROPRIO_INPUT: pro,
            "noise": n,
        }
        return self.session.run(["actions"], feed)[0]

    # ------------------------------------------------------------------ checks
    def _stage(self, image: Any, proprio: Any, noise: Any) -> None:
        """Copy one observation (and the noise) into the bound inputs, or a ValueError
        naming what is wrong with it."""
        img = np.asarray(image)
        if img.shape != self._image_shape:
            h, w, c = self._image_shape
            hint = ""
            if img.ndim == 3 and img.shape[0] == c and img.shape[-1] != c:
                hint = " (channels go last: HWC)"
            elif img.ndim == 3 and img.shape[:2] == (h, w):
                hint = f" ({img.shape[2]} channels; the policy takes {c}, RGB)"
            elif img.ndim == 3:
                hint = f" (resize the camera image to {h} x {w})"
            elif img.ndim == 4:
                hint = " (one image, not a batch: act_batch takes batches)"
            raise ValueError(
                f"image must be uint8 [{h}, {w}, {c}] (RGB, channels last, camera "
                f"{self.camera!r}), got shape {img.shape}{hint}"
            )
        self._check_image_dtype(img.dtype)
        pro = np.asarray(proprio)
        if pro.shape != (self.proprio_size,):
            raise ValueError(
                f"proprio must have shape ({self.proprio_size},) (terms {self._terms()}), "
                f"got shape {pro.shape}"
            )
        if not (np.issubdtype(pro.dtype, np.floating) or np.issubdtype(pro.dtype, np.integer)):
            raise ValueError(f"proprio must be numbers, got dtype {pro.dtype}")
        np.copyto(self._image[0], img)
        with np.errstate(over="ignore", invalid="ignore"):  # too large for float32: inf
            self._proprio[0] = pro
        if noise is not None:
            n = np.asarray(noise, dtype=np.float32)
            if n.size != self._noise.size:
                raise ValueError(
                    f"noise must have {self._noise.size} values (shape "
                    f"{self._noise.shape[1:]}), got shape {n.shape}"
                )
            self._noise.reshape(-1)[:] = n.reshape(-1)
        elif self.deterministic:
            self._noise.fill(0.0)
        else:
            self._rng.standard_normal(out=self._noise, dtype=np.float32)

    def _check_image_dtype(self, dtype: np.dtype) -> None:
        if dtype != np.uint8:
            # a float image in [0, 1] cast to uint8 would be black: refuse, never cast
            raise ValueError(
                f"image must be uint8 (0-255, RGB), got dtype {dtype}; the policy scales and "
                "normalizes inside"
            )

    def _terms(self) -> str:
        return ", ".join(f"{name}:{size}" for name, size in self.metadata.obs_terms)

    def _check_graph(self) -> int | None:
        """Check the graph's inputs and outputs against the metadata; the fixed batch size
        of the graph, or None if it is dynamic."""
        inputs = {node.name: node for node in self.session.get_inputs()}
        outputs = {node.name: node for node in self.session.get_outputs()}
        missing = [name for name in self._inputs if name not in inputs]
        unexpected = [name for name in inputs if name not in self._inputs]
        if missing or unexpected:
            self._fail(
                f"graph inputs {sorted(inputs)} do not match the metadata's VLA inputs "
                f"{list(self._inputs)}: missing {missing}, unexpected {unexpected}"
            )
        if "actions" not in outputs:
            self._fail(f"graph outputs {sorted(outputs)} lack the chunk output 'actions'")
        expected = [
            ("input", inputs[name], _TYPES.get(dtype, _FLOAT), shape)
            for name, (dtype, shape) in self._inputs.items()
        ]
        expected.append(("output", outputs["actions"], _FLOAT, self._chunk_shape))
        batch_dims = set()
        for kind, node, type_, trailing in expected:
            if node.type != type_:
                self._fail(f"graph {kind} {node.name!r} must be {type_}, got {node.type}")
            shape = list(node.shape)
            fixed = [d if isinstance(d, int) else None for d in shape[1:]]
            if len(shape) != len(trailing) + 1 or fixed != list(trailing):
                self._fail(
                    f"graph {kind} {node.name!r} has shape {shape}, the metadata says "
                    f"{['batch', *trailing]}"
                )
            if isinstance(shape[0], int):
                batch_dims.add(shape[0])
        if len(batch_dims) > 1 or (batch_dims and 1 not in batch_dims):
            self._fail(f"graph has fixed batch sizes {sorted(batch_dims)}; need 1 or dynamic")
        return batch_dims.pop() if batch_dims else None

    def _fail(self, message: str) -> None:
        raise PolicyLoadError(f"policy file {self.path!r}: {message}")
