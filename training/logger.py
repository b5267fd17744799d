"""What a run reports while it trains: metrics, the progress bar, episode statistics.

The logger owns the episode bookkeeping (returns and lengths of the last 100 finished
episodes, the task's per-step terms averaged over a rollout), so no learner counts
episodes itself, and it is the one writer of ``metrics.jsonl`` / TensorBoard and of the
progress bar. Only rank 0 of a distributed run writes.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from training.metrics import MetricsLogger

__all__ = ["RunLogger"]

EPISODE_WINDOW = 100
"""Finished episodes that ``train/return`` and ``train/episode_length`` average over."""


class RunLogger:
    """Metrics, progress and episode statistics of one run (writes nothing unless enabled)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        progress: bool = True,
    ) -> None:
        self.enabled = enabled
        self.show_progress = enabled and progress
        self.metrics = MetricsLogger(run_dir, enabled=enabled, tensorboard=tensorboard)
        self.recent_returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.recent_lengths: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._finished: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._terms: dict[str, torch.Tensor] = {}
        self._steps = 0
        self.bar: Any = None

    def start_progress(self, total: int, initial: int, unit: str, desc: str) -> None:
        """Open the progress bar (when progress is on and something is left to do)."""
        if self.show_progress and initial < total:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                unit=unit,
                unit_scale=unit == "step",
                dynamic_ncols=True,
                desc=desc,
            )

    # ------------------------------------------------------------------ episodes
    def record_env_step(self, info: Mapping[str, Any]) -> None:
        """Note one env step's episode ends and task terms (no host sync here)."""
        # the task's per-step terms (reward components, tracking errors), averaged over
        # the rollout: what a user reads to see which term the policy is trading off
        for k, v in info.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim == 1:
                if k in self._terms:
                    self._terms[k].add_(v)
                else:
                    self._terms[k] = v.clone()
        if "episode" in info:
            ep = info["episode"]
            self._finished.append((ep["return"][ep["done"]], ep["length"][ep["done"]]))
        self._steps += 1

    def end_rollout(self) -> dict[str, float]:
        """Fold the rollout's finished episodes in; its rows for the log."""
        n = max(self._steps, 1)
        row = {f"env/{k}": float(v.mean()) / n for k, v in self._terms.items()}
        for r, length in self._finished:
            self.recent_returns.extend(r.cpu().tolist())
            self.recent_lengths.extend(length.cpu().tolist())
        self._finished, self._terms, self._steps = [], {}, 0
        return row

    @property
    def mean_return(self) -> float:
        """Mean return of the last finished episodes (stochastic policy); NaN before any."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.recent_lengths)) if self.recent_lengths else float("nan")

    # ------------------------------------------------------------------ output
    def log(self, step: int, row: Mapping[str, Any]) -> None:
        self.metrics.log(step, dict(row))

    def advance(self, n: int, **postfix: str) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(**postfix)

    def truncate_after(self, step: int) -> None:
        self.metrics.truncate_after(step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.metrics.close()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent_returns.clear()
        self.recent_lengths.clear()
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
