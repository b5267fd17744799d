"""Is the machine quiet enough to time something? The speed benchmarks' protocol.

A figure taken while other jobs hold the cores measures them as much as us. Every speed
benchmark therefore (1) records the load average and the runnable processes before and
after, and samples the runnable processes between its rounds, (2) runs ours and the
peer in interleaved rounds (ours, peer, ours, peer, ...) and reports the median of the
per-round ratios, which a burst of load hits on both sides alike, and (3) writes its
figure into docs/ only when the machine was idle, unless told to write it marked as
taken on a busy machine.

"Busy" here: on average over the samples, more runnable processes than the benchmark's
own threads account for (the direct evidence), or the 1-minute load average at the
start above ``max_load``. That default is 1.0, a whole core held by others over the last
minute: the average decays with a one-minute time constant, so a benchmark started
right after another reads about 0.5 from that one alone.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["LoadMonitor", "Sample", "interleaved_rounds", "median_ratio", "wait_for_quiet"]

DEFAULT_MAX_LOAD = 1.0
"""1-minute load average above which the machine counts as busy at the start."""


@dataclass(frozen=True)
class Sample:
    """One reading of ``/proc/loadavg``: load averages and runnable scheduling entities."""

    load1: float
    load5: float
    load15: float
    runnable: int  # running or ready to run, this process's threads included

    @classmethod
    def read(cls) -> Sample:
        try:
            with open("/proc/loadavg") as f:
                parts = f.read().split()
            return cls(
                float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3].split("/")[0])
            )
        except (OSError, ValueError, IndexError):  # not Linux: the load averages only
            l1, l5, l15 = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
            return cls(l1, l5, l15, -1)

    def __str__(self) -> str:
        run = "?" if self.runnable < 0 else str(self.runnable)
        return f"load {self.load1:.2f}, {self.load5:.2f}, {self.load15:.2f}; {run} runnable"


@dataclass
class LoadMonitor:
    """Records the machine's load around a benchmark and judges whether it was idle.

    Args:
        own_threads: runnable threads the benchmark itself may have at a sample (the
            sampling thread counts as one).
        max_load: busy if the 1-minute load average at the start is above this.
    """

    own_threads: int = 1
    max_load: float = DEFAULT_MAX_LOAD
    before: Sample = field(default_factory=Sample.read)
    samples: list[Sample] = field(default_factory=list)
    after: Sample | None = None

    def sample(self) -> None:
        """Take a reading between rounds."""
        self.samples.append(Sample.read())

    def stop(self) -> None:
        """Take the final reading."""
        self.after = Sample.read()

    @property
    def others_runnable(self) -> float:
        """Mean runnable entities beyond the benchmark's own, over the samples (0 if none)."""
        counts = [s.runnable for s in self.samples if s.runnable >= 0]
        if not counts:
            return 0.0
        return max(0.0, statistics.fmean(counts) - self.own_threads)

    @property
    def busy(self) -> bool:
        return self.before.load1 > self.max_load or self.others_runnable > 0.5

    def describe(self) -> str:
        after = str(self.after) if self.after is not None else "not taken"
        verdict = "BUSY machine: figures marked" if self.busy else "idle machine"
        return (
            f"{verdict} (before: {self.before}; after: {after}; other runnable processes "
            f"between rounds {self.others_runnable:.2f} on average over {len(self.samples)} "
            f"samples; busy above load {self.max_load:g} at the start or 0.5 others)"
        )

    def may_write(self, allow_busy: bool) -> tuple[bool, str]:
        """Whether a figure may go into docs/, and the line that says why (or why not)."""
        if not self.busy:
            return True, self.describe()
        if allow_busy:
            return True, "**" + self.describe() + "**"
        return False, (
            self.describe() + ": not written to docs/ (rerun on a quiet machine, or pass "
            "--allow-busy to write it marked as busy)"
        )


def wait_for_quiet(
    max_load: float = DEFAULT_MAX_LOAD, timeout_s: float = 120.0, poll_s: float = 2.0
) -> Sample:
    """Wait (up to ``timeout_s``) until the 1-minute load average is at most ``max_load``;
    the last reading. After an earlier benchmark the average takes tens of seconds to
    decay, and a run started before that would count as busy."""
    deadline = time.monotonic() + timeout_s
    sample = Sample.read()
    while sample.load1 > max_load and time.monotonic() < deadline:
        time.sleep(poll_s)
        sample = Sample.read()
    return sample


def interleaved_rounds(
    fns: dict[str, Callable[[], float]],
    rounds: int,
    monitor: LoadMonitor | None = None,
) -> dict[str, list[float]]:
    """Run each measurement once per round, in turn (a, b, a, b, ...); values per name.

    Each function measures one thing once and returns its figure (a rate, a time).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name].append(float(fn()))
            if monitor is not None:
                monitor.sample()
    return out


def median_ratio(ours: Sequence[float], peer: Sequence[float]) -> float:
    """Median over rounds of ours / peer (rounds paired in order)."""
    if len(ours) != len(peer) or not ours:
        raise ValueError("ratios need the same, non-zero number of rounds on both sides")
    return statistics.median(o / p for o, p in zip(ours, peer, strict=True))
