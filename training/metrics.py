"""Run metrics: a JSON-lines file people and scripts read, and TensorBoard."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (float(v) if isinstance(v, int | float) else v) for k, v in values.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": int(step), **clean}, allow_nan=True) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines written after the checkpoint so the curve has no duplicates."""
        if not self.enabled or not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line and json.loads(line)["step"] <= step
        ]
        self.path.write_text("".join(line + "\n" for line in keep))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
