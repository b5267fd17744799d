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
    """A run whose updates have for too long been skipped as non-finite, or moved the
    policy by an absurd KL: it learns nothing more, so it stops and names the checkpoint
    to go back to."""


class StallWatch:
    """Counts consecutive failed updates: ones that took no optimizer step because every
    step (or the whole batch) was non-finite (training.core.guard skips them and never
    rolls back), and ones whose steps were finite but moved the policy by an approximate
    KL above ``kl_limit`` (the learner's ``approx_kl``; 0: not watched).

    A diverged run otherwise spins to its budget doing nothing: FPO from scratch on
    hopper once skipped every step for 230 iterations after its consistency term blew
    up, and FPO from flow BC on halfcheetah ran 180k steps on weights whose losses were
    1e16, its updates finite (KL 18 per update for 52 updates, then alternating skipped
    and finite ones, which a watch of skipped steps alone never counted to its limit).
    ``limit`` consecutive failed updates raise :class:`TrainingDiverged` (0: never).
    """

    def __init__(self, limit: int, name: str, kl_limit: float = 0.0) -> None:
        self.limit = int(limit)
        self.name = name
        self.kl_limit = float(kl_limit)
        self.stalled = 0
        self.moved = False  # a failed update of this streak took (finite) steps
        self.first: tuple[int, int] | None = None  # (iteration, env step) of the stall
        self._skipped: float | None = None

    def observe(self, stats: dict[str, float], iteration: int, env_steps: int) -> None:
        """After an update: ``stats`` with the learner's ``minibatch_steps``, its
        cumulative ``nonfinite_steps`` and ``approx_kl`` (learners without the first two
        are not watched)."""
        steps, skipped = stats.get("minibatch_steps"), stats.get("nonfinite_steps")
        if steps is None or skipped is None:
            return
        grew = self._skipped is None or skipped > self._skipped
        self._skipped = skipped
        kl = stats.get("approx_kl")
        blown = steps > 0 and self.kl_limit > 0 and kl is not None and not kl <= self.kl_limit
        if (steps == 0 and grew) or blown:
            if self.stalled == 0:
                self.first = (iteration, env_steps)
                self.moved = False
            self.stalled += 1
            self.moved = self.moved or blown
        else:
            self.stalled, self.first, self.moved = 0, None, False

    @property
    def diverged(self) -> bool:
        return self.limit > 0 and self.stalled >= self.limit

    def error(self, checkpoint: Path, earlier: Path | None = None) -> TrainingDiverged:
        """The stop, naming ``checkpoint`` (just saved) or, when the failed updates
        changed the weights, ``earlier``: the newest checkpoint from before they began."""
        it, steps = self.first or (0, 0)
        if not self.moved:
            return TrainingDiverged(
                f"{self.name}: the last {self.stalled} updates took no step, every step or "
                f"batch non-finite since iteration {it} (env step {steps}): the run has "
                f"diverged and stopped. {checkpoint} holds the weights of the last good "
                "step; resume from an earlier checkpoint (checkpoints/iter_*.pt) with a "
                "lower rate, or set run.max_stalled_updates=0 to train on regardless"
            )
        back = (
            f"the newest checkpoint from before it is {earlier}"
            if earlier is not None
            else "no checkpoint from before it was kept"
        )
        return TrainingDiverged(
            f"{self.name}: the last {self.stalled} updates moved the policy by an "
            f"approximate KL above run.max_update_kl={self.kl_limit:g} (or took no step) "
            f"since iteration {it} (env step {steps}): the run has diverged and stopped. "
            f"Those updates changed the weights, so {checkpoint} holds diverged ones; "
            f"{back}. Resume from it with a lower rate, or set run.max_update_kl=0 to "
            "train on regardless"
        )


def checkpoint_before(directory: Path, iteration: int, suffix: str = "") -> Path | None:
    """The newest ``iter_N{suffix}.pt`` in ``directory`` with N < ``iteration``, if any."""
    best: tuple[int, Path] | None = None
    for p in directory.glob(f"iter_*{suffix}.pt"):
        stem = p.name[len("iter_") : -len(f"{suffix}.pt")]
        if stem.isdigit() and int(stem) < iteration and (best is None or int(stem) > best[0]):
            best = (int(stem), p)
    return None if best is None else best[1]
