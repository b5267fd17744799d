"""Pacing of a simulated robot against the wall clock, shared by the simulated-robot nodes.

A node's timer asks :meth:`SimClock.due` how many steps the simulation owes the wall
clock; when it has fallen further behind than it may catch up at once, the rest is
dropped, and the drop moves both the pacing origin and the stamps' origin, so that a
message's stamp stays the wall-clock instant its state was simulated for (stamps that
lagged by the dropped time would read as transport latency to every consumer).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SimClock"]


class SimClock:
    """Steps of ``dt`` simulated seconds, ``rtf`` simulated seconds per wall second.

    Args:
        dt: simulated seconds per step (> 0).
        rtf: real-time factor (> 0).
        max_catchup: steps one call of :meth:`due` may return (>= 1).
        monotonic, wall: clocks (injectable for tests): pacing and stamps.
    """

    def __init__(
        self,
        dt: float,
        rtf: float = 1.0,
        max_catchup: int = 10,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not dt > 0 or not rtf > 0 or int(max_catchup) < 1:
            raise ValueError(
                f"SimClock needs dt > 0, rtf > 0, max_catchup >= 1; got {dt}, {rtf}, {max_catchup}"
            )
        self.dt, self.rtf, self.max_catchup = float(dt), float(rtf), int(max_catchup)
        self._monotonic = monotonic
        self.t0 = monotonic()
        self.wall0 = wall()
        self.dropped_s = 0.0
        """Wall seconds of simulation dropped so far (overruns)."""

    def due(self, steps_done: int) -> tuple[int, bool]:
        """(steps to run now, whether some were dropped) for a simulation that has run
        ``steps_done`` steps."""
        elapsed = (self._monotonic() - self.t0) * self.rtf
        due = int(elapsed / self.dt) - steps_done
        if due <= self.max_catchup:
            return max(due, 0), False
        dropped = (due - self.max_catchup) * self.dt / self.rtf
        self.t0 += dropped
        self.wall0 += dropped
        self.dropped_s += dropped
        return self.max_catchup, True

    def stamp(self, steps_done: int) -> tuple[int, int]:
        """(sec, nanosec) of the wall-clock instant the state after ``steps_done`` steps
        belongs to."""
        t = self.wall0 + steps_done * self.dt / self.rtf
        sec = int(t)
        return sec, int((t - sec) * 1e9)

    def wall_elapsed(self) -> float:
        """Wall seconds since the start, less the dropped time (for real-time factors)."""
        return self._monotonic() - self.t0
