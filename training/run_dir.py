"""One rule for every learner's run directory: a directory holds one run.

- A fresh run starts in a directory that does not exist or is empty. A directory that
  already holds a run is refused with the way out spelled out: resume it, or choose
  another directory; one with metrics but no checkpoint (a run stopped before its first
  checkpoint) must be deleted or avoided, never appended to.
- A resume writes into the run its checkpoint belongs to, or into a new directory the
  user names, which must be empty; the resumed run's metrics up to the checkpoint come
  along, so the new directory holds the whole curve and nothing of another run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from training.checkpoint import find_checkpoint

__all__ = ["RunDirError", "checkpoint_run_dir", "prepare_run_dir"]

_SHARED_FILES = ("metrics.jsonl",)
"""Files a resume into a new directory carries over (then truncated to the checkpoint)."""


class RunDirError(ValueError):
    """A run directory that the requested run may not write into."""


def checkpoint_run_dir(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint file belongs to (``<run>/checkpoints/x.pt``)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def _contents(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def prepare_run_dir(run_dir: str | os.PathLike, resume: str | os.PathLike | None) -> Path:
    """Check that this run may write into ``run_dir`` and create it; returns it.

    Raises RunDirError naming the directory, what is in it and what to do instead.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} is a file")
    inside = _contents(run_dir)
    if resume is None:
        if (run_dir / "checkpoints" / "latest.pt").exists():
            raise RunDirError(
                f"run directory {run_dir} already holds a run; resume it (--resume {run_dir}) "
                f"or choose another directory (--run-dir)"
            )
        if (run_dir / "metrics.jsonl").exists():
            raise RunDirError(
                f"run directory {run_dir} holds metrics.jsonl but no checkpoint: a run that "
                f"stopped before its first checkpoint. Delete it (rm -r {run_dir}) to start "
                f"over there, or choose another directory (--run-dir)"
            )
        if inside:
            raise RunDirError(
                f"run directory {run_dir} is not empty ({', '.join(inside[:5])}); a new run "
                f"starts in an empty or new directory (--run-dir)"
            )
    else:
        source = checkpoint_run_dir(find_checkpoint(resume))
        same = source is not None and run_dir.resolve() == source.resolve()
        if not same:
            if inside:
                where = f"run {source}" if source is not None else f"checkpoint {resume}"
                raise RunDirError(
                    f"--run-dir {run_dir} is not empty ({', '.join(inside[:5])}): resuming "
                    f"{where} writes into that run itself or into a new, empty directory"
                )
            run_dir.mkdir(parents=True, exist_ok=True)
            for name in _SHARED_FILES:
                if source is not None and (source / name).exists():
                    shutil.copy2(source / name, run_dir / name)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    # a write that a kill cut short leaves its temporary file (never the checkpoint itself)
    for stale in (run_dir / "checkpoints").glob(".*.tmp"):
        stale.unlink()
    return run_dir
