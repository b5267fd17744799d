"""Run metrics: a JSON-lines file people and scripts read, and TensorBoard.

Every row is appended with one ``write`` on a file opened with O_APPEND, so a row is
whole or absent unless the process dies inside that one system call; a reader drops a
torn *last* line with a warning that names the file (what a kill -9 can leave), and a
resume rewrites the file atomically without the rows written after its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from deploy.files import atomic_write

__all__ = ["MetricsError", "MetricsLogger", "append_jsonl", "read_jsonl", "read_metrics"]


class MetricsError(ValueError):
    """A JSON-lines file that is damaged beyond its last line."""


def append_jsonl(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Append rows as JSON lines in one write (a row is never interleaved or half there
    unless the process dies inside the write itself)."""
    if not rows:
        return
    data = "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file; a torn last line (a write cut short) is dropped with
    a warning naming the file, any other bad line is a MetricsError naming file and line."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    rows = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rows.append(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            torn_tail = i == len(lines) - 1  # no newline after it: the last write was cut
            if torn_tail:
                warnings.warn(
                    f"{path}: dropped a torn last line (a write cut short): {raw[:60]!r}",
                    stacklevel=2,
                )
                continue
            raise MetricsError(f"{path}, line {i + 1}: not a JSON row ({e})") from None
    return rows


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    return read_jsonl(path)


def truncate_jsonl(path: str | os.PathLike, step: int) -> None:
    """Keep the rows up to ``step`` (a resume drops what was logged after its checkpoint);
    the file is replaced atomically."""
    path = Path(path)
    if not path.exists():
        return
    keep = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    atomic_write(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in keep))


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
        append_jsonl(self.path, [{"step": int(step), **clean}])
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines written after the checkpoint so the curve has no duplicates."""
        if self.enabled:
            truncate_jsonl(self.path, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
