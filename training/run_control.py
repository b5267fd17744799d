"""What every training loop needs around it: the loop itself with graceful interruption
and checkpoint cadence, and the code version saved in checkpoints."""

from __future__ import annotations

import functools
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any


@functools.cache
def code_version() -> str:
    """Short git hash of this checkout, "unknown" outside git; saved in checkpoints.

    Asked once per process: every checkpoint carries it, and a git subprocess per
    checkpoint would cost more than writing the checkpoint itself."""
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


def stop_agreed(requested: bool) -> bool:
    """Under torch.distributed every rank must stop at the same iteration: any rank's
    request stops them all. Alone: the request itself."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return requested
    flag = torch.tensor([1.0 if requested else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item() > 0)


def train_loop(
    done: int,
    total: int,
    step: Callable[[], int],
    save: Callable[[], Any],
    checkpoint_every: int,
) -> bool:
    """The loop every learner runs: ``step()`` until ``total``, checkpoints, Ctrl-C.

    ``step()`` does one unit of work (an iteration, an update) with its logging and
    returns the new count. A checkpoint is saved every ``checkpoint_every`` units, at the
    end, and when an interrupt was requested (first SIGINT/SIGTERM: finish the unit,
    save, stop). Returns True if it stopped early.
    """
    with Interrupt() as interrupt:
        while done < total:
            done = step()
            stop = stop_agreed(interrupt.requested)
            last = done >= total
            if done % checkpoint_every == 0 or last or stop:
                save()
            if stop and not last:
                return True
    return False


class TrainingDiverged(RuntimeError):
    """A run whose updates have all been skipped as non-finite for too long: it learns
    nothing more, so it stops (its checkpoint keeps the last good weights)."""


class StallWatch:
    """Counts consecutive updates that took no optimizer step because every step (or the
    whole batch) was non-finite (training.core.guard skips them and never rolls back).

    A diverged run otherwise spins to its budget doing nothing: FPO from scratch on
    hopper once skipped every step for 230 iterations after its consistency term blew
    up. ``limit`` consecutive stalled updates raise :class:`TrainingDiverged` (0: never).
    """

    def __init__(self, limit: int, name: str) -> None:
        self.limit = int(limit)
        self.name = name
        self.stalled = 0
        self.first: tuple[int, int] | None = None  # (iteration, env step) of the stall
        self._skipped: float | None = None

    def observe(self, stats: dict[str, float], iteration: int, env_steps: int) -> None:
        """After an update: ``stats`` with the learner's ``minibatch_steps`` and its
        cumulative ``nonfinite_steps`` (learners without them are not watched)."""
        steps, skipped = stats.get("minibatch_steps"), stats.get("nonfinite_steps")
        if steps is None or skipped is None:
            return
        grew = self._skipped is None or skipped > self._skipped
        self._skipped = skipped
        if steps == 0 and grew:
            if self.stalled == 0:
                self.first = (iteration, env_steps)
            self.stalled += 1
        else:
            self.stalled, self.first = 0, None

    @property
    def diverged(self) -> bool:
        return self.limit > 0 and self.stalled >= self.limit

    def error(self, checkpoint: Path) -> TrainingDiverged:
        it, steps = self.first or (0, 0)
        return TrainingDiverged(
            f"{self.name}: the last {self.stalled} updates took no step, every step or "
            f"batch non-finite since iteration {it} (env step {steps}): the run has "
            f"diverged and stopped. {checkpoint} holds the weights of the last good step; "
            "resume from an earlier checkpoint (checkpoints/iter_*.pt) with a lower rate, "
            "or set run.max_stalled_updates=0 to train on regardless"
        )
