"""What every training loop needs around it: graceful interruption and the code version."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any


def code_version() -> str:
    """Short git hash of this checkout, "unknown" outside git; saved in checkpoints."""
    try:
        here = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Interrupt:
    """First SIGINT/SIGTERM: finish the step, checkpoint, stop. Second: stop now."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
