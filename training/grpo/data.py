"""Prompt data: a validated JSON-lines file, and the order prompts are drawn in.

Each line is a JSON object with at least ``"prompt"`` (a non-empty string) and
``"answer"`` (a string; numbers are accepted and turned into strings). Other fields
travel with the row and reach reward functions as keyword arguments.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.core import variance_curriculum_weights

REQUIRED = ("prompt", "answer")


class PromptDataError(ValueError):
    """A prompts file that cannot be used; the message names the line and the field."""


def validate_rows(rows: list[dict[str, Any]], source: str = "<rows>") -> list[dict[str, Any]]:
    """Check and normalise rows in memory; raise PromptDataError naming row and field."""
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{source}: line {i}"
        if not isinstance(row, dict):
            raise PromptDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        for name in REQUIRED:
            if name not in row:
                raise PromptDataError(f"{where}: missing field {name!r}")
        prompt, answer = row["prompt"], row["answer"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptDataError(
                f"{where}: field 'prompt' must be a non-empty string, got {prompt!r}"
            )
        if isinstance(answer, bool) or answer is None:
            raise PromptDataError(f"{where}: field 'answer' must be a string, got {answer!r}")
        if isinstance(answer, int | float):
            answer = str(answer)
        if not isinstance(answer, str):
            raise PromptDataError(f"{where}: field 'answer' must be a string, got {answer!r}")
        out.append({**row, "prompt": prompt, "answer": answer})
    if not out:
        raise PromptDataError(f"{source}: no prompts")
    keys = set(out[0])
    for i, row in enumerate(out, start=1):
        if set(row) != keys:
            raise PromptDataError(
                f"{source}: line {i} has fields {sorted(row)}, but line 1 has {sorted(keys)}; "
                f"every row must have the same fields (they reach reward functions as columns)"
            )
    return out


def load_prompts(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate a prompts file (JSON lines; blank lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise PromptDataError(
            f"{path}: line {line}: not UTF-8 text (byte {raw[e.start]:#04x}); a prompts file "
            f"is JSON lines"
        ) from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise PromptDataError(f"{path}: line {lineno}: not valid JSON ({e.msg})") from None
        lines.append(lineno)
    if not rows:
        raise PromptDataError(f"{path}: no prompts")
    try:
        return validate_rows(rows, str(path))
    except PromptDataError as e:
        # validate_rows counts non-blank rows; report the file's own line number
        msg = str(e)
        prefix = f"{path}: line "
        if msg.startswith(prefix):
            k, _, rest = msg[len(prefix) :].partition(":")
            if k.isdigit():
                raise PromptDataError(f"{prefix}{lines[int(k) - 1]}:{rest}") from None
        raise


class PromptSampler:
    """Which prompts each step trains on.

    Without a curriculum: epochs of a seeded permutation, so every prompt is seen once
    per epoch. With the variance curriculum (VCRL): prompts are drawn without
    replacement within a step with probabilities that favour prompts whose recent
    rewards vary most (see training.core.variance_curriculum_weights); each prompt keeps
    its last ``history`` rewards. The whole state (RNG, permutation, position, history)
    goes into checkpoints.
    """

    def __init__(
        self,
        num_prompts: int,
        seed: int,
        *,
        curriculum: bool = False,
        history: int = 16,
        temperature: float = 1.0,
        floor: float = 0.1,
    ) -> None:
        if num_prompts < 1:
            raise ValueError("PromptSampler needs at least one prompt")
        if history < 2:
            raise ValueError(f"curriculum history must be >= 2 rewards, got {history}")
        self.num_prompts = num_prompts
        self.curriculum = curriculum
        self.temperature = temperature
        self.floor = floor
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(num_prompts)
        self.position = 0
        self.epoch = 0
        self.history = np.full((num_prompts, history), np.nan)

    def next(self, n: int) -> np.ndarray:
        if n < 1:
            raise ValueError(f"need at least one prompt per draw, got {n}")
        if self.curriculum:
            probs = self.weights().numpy().astype(np.float64)
            probs /= probs.sum()
            replace = n > self.num_prompts
            return self.rng.choice(self.num_prompts, size=n, replace=replace, p=probs)
        out = []
        while len(out) < n:
            if self.position >= self.num_prompts:
                self.order = self.rng.permutation(self.num_prompts)
                self.position = 0
                self.epoch += 1
            take = min(n - len(out), self.num_prompts - self.position)
            out.extend(self.order[self.position : self.position + take].tolist())
            self.position += take
        return np.asarray(out, dtype=np.int64)

    def weights(self) -> torch.Tensor:
        return variance_curriculum_weights(
            torch.from_numpy(self.history), temperature=self.temperature, floor=self.floor
        )

    def record(self, prompt_index: int, rewards: np.ndarray) -> None:
        """Push a group's rewards (NaN for invalid ones is skipped) into the prompt's history."""
        r = np.asarray(rewards, dtype=np.float64)
        r = r[np.isfinite(r)]
        if r.size == 0:
            return
        k = self.history.shape[1]
        r = r[-k:]
        row = np.concatenate([self.history[prompt_index], r])[-k:]
        self.history[prompt_index] = row

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "order": self.order.copy(),
            "position": self.position,
            "epoch": self.epoch,
            "history": self.history.copy(),
            "num_prompts": self.num_prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"the checkpoint's prompt order covers {state['num_prompts']} prompts, but the "
                f"prompts file has {self.num_prompts}"
            )
        if state["history"].shape[1] != self.history.shape[1]:
            raise ValueError("curriculum.history differs from the checkpoint's")
        self.rng.bit_generator.state = state["rng"]
        self.order = np.asarray(state["order"]).copy()
        self.position = int(state["position"])
        self.epoch = int(state["epoch"])
        self.history = np.asarray(state["history"], dtype=np.float64).copy()


__all__ = ["PromptDataError", "PromptSampler", "load_prompts", "validate_rows"]
