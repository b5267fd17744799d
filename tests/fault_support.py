"""Fault injection for training runs: kill -9 a real `sim2real train` process at a chosen
point (inside a checkpoint write, inside a metrics write, before the first checkpoint,
or at a random moment), resume it until it finishes, and compare the result with an
uninterrupted run.

Run as a script, this module is the child: ``python fault_support.py <fault> -- <sim2real
arguments>`` installs the fault, then runs the command line in-process. Faults:

- ``checkpoint:N``: the N-th checkpoint write stops half-way (half the bytes in the
  temporary file), then the process is killed.
- ``metrics:N``: the N-th metrics row is written half, then the process is killed.
- ``after:S``: the process is killed S seconds after it started (a random moment).
- ``none``: no fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIMING_KEYS = ("perf/",)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(fault: str) -> None:
    kind, _, arg = fault.partition(":")
    if kind == "none":
        return
    if kind == "after":
        timer = threading.Timer(float(arg), _die)
        timer.daemon = True
        timer.start()
        return
    n = int(arg)
    calls = {"n": 0}
    if kind == "checkpoint":
        import torch

        from training import checkpoint

        real_save = torch.save

        def torn_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            calls["n"] += 1
            if calls["n"] < n:
                return real_save(obj, f, *args, **kwargs)
            real_save(obj, f, *args, **kwargs)
            size = os.path.getsize(f)
            with open(f, "r+b") as fh:  # the write was cut short: half the file is there
                fh.truncate(size // 2)
            _die()

        checkpoint.torch.save = torn_save  # the name checkpoint.save_checkpoint calls
        return
    if kind == "metrics":
        from training import metrics

        real_append = metrics.append_jsonl

        def torn_append(path: Any, rows: list[dict[str, Any]]) -> None:
            if not str(path).endswith("metrics.jsonl"):
                return real_append(path, rows)
            calls["n"] += 1
            if calls["n"] < n:
                return real_append(path, rows)
            import json

            line = json.dumps(rows[0]).encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, line[: len(line) // 2])
            os.close(fd)
            _die()

        metrics.append_jsonl = torn_append
        return
    raise SystemExit(f"unknown fault {fault!r}")


def run_child(fault: str, args: list[str], cwd: Path, timeout: float = 300) -> int:
    """Run `sim2real <args>` in a child process with ``fault``; its return code (-9 when
    the fault killed it)."""
    env = {**os.environ, "MUJOCO_GL": "egl", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), fault, "--", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=timeout)
    if done.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(
            f"{' '.join(args)} with fault {fault} failed ({done.returncode}):\n"
            f"{done.stderr.decode()[-3000:]}"
        )
    return done.returncode


def train_until_done(fault: str, train_args: list[str], run_dir: Path, cwd: Path) -> int:
    """Start a run with ``fault``, then resume it (no fault) until it finishes; a run
    killed before its first checkpoint is started over, as the refusal message says.
    Returns how many times it was killed."""
    import shutil

    kills = 0
    rc = run_child(fault, [*train_args, "--run-dir", str(run_dir)], cwd)
    while rc != 0:
        kills += 1
        if (run_dir / "checkpoints" / "latest.pt").exists():
            flags = [a for a in train_args if a == "--no-artifacts"]
            rc = run_child("none", ["train", train_args[1], "--resume", str(run_dir), *flags], cwd)
        else:  # killed before its first checkpoint, or before it wrote anything
            shutil.rmtree(run_dir, ignore_errors=True)
            rc = run_child("none", [*train_args, "--run-dir", str(run_dir)], cwd)
    return kills


def same_result(a: Path, b: Path, weights: str = "policy") -> tuple[bool, str]:
    """Do two finished runs hold the same final weights and the same metrics (timings
    aside)? (False, why) otherwise."""
    import math

    import torch

    from training.checkpoint import load_checkpoint
    from training.metrics import read_metrics

    wa = load_checkpoint(a / "checkpoints" / "latest.pt")[weights]
    wb = load_checkpoint(b / "checkpoints" / "latest.pt")[weights]
    for k in wa:
        if not torch.equal(wa[k], wb[k]):
            return False, f"weights differ at {k}"

    def rows(run: Path) -> list[dict[str, Any]]:
        out = []
        for r in read_metrics(run / "metrics.jsonl"):
            out.append({k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)})
        return out

    ra, rb = rows(a), rows(b)
    if len(ra) != len(rb):
        return False, f"{len(ra)} metric rows against {len(rb)}"
    for i, (x, y) in enumerate(zip(ra, rb)):
        for k in set(x) | set(y):
            u, v = x.get(k), y.get(k)
            nan = isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)
            if u != v and not nan:
                return False, f"metric row {i} {k}: {u!r} != {v!r}"
    return True, ""


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    fault, sep, *rest = sys.argv[1:]
    assert sep == "--", "usage: fault_support.py <fault> -- <sim2real args>"
    install(fault)
    from training.cli import main

    sys.exit(main(rest))
