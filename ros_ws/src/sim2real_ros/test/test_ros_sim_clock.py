"""The simulated robots' pacing (sim2real_ros.sim_clock): steps due against the wall clock,
dropped overruns, and stamps that stay on the wall clock after a drop."""

from __future__ import annotations

import pytest
from sim2real_ros.sim_clock import SimClock


class FakeClocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def _clock(c: FakeClocks, **kw) -> SimClock:
    return SimClock(0.01, monotonic=lambda: c.mono, wall=lambda: c.wall, **kw)


def test_steps_due_follow_the_wall_clock_and_the_real_time_factor():
    c = FakeClocks()
    clock = _clock(c, max_catchup=100)
    assert clock.due(0) == (0, False)
    c.advance(0.0501)
    assert clock.due(0) == (5, False)
    assert clock.due(5) == (0, False)  # nothing owed once run
    half = _clock(c, rtf=0.5, max_catchup=100)
    c.advance(0.1001)
    assert half.due(0) == (5, False)  # 0.1 wall s at half speed: 0.05 simulated s


def test_an_overrun_drops_the_excess_and_stamps_stay_on_the_wall_clock():
    c = FakeClocks()
    clock = _clock(c, max_catchup=10)
    steps = 0
    c.advance(0.5001)  # a 0.5 s stall: 50 steps owed, 10 may be caught up
    due, dropped = clock.due(steps)
    assert (due, dropped) == (10, True)
    steps += due
    assert clock.dropped_s == pytest.approx(0.4)
    # the state after those 10 steps is the state of *now*, so its stamp is now
    sec, nsec = clock.stamp(steps)
    assert sec + nsec * 1e-9 == pytest.approx(c.wall, abs=0.01)  # within a step, not 0.4 s
    assert clock.wall_elapsed() == pytest.approx(0.1001)
    # and the pacing continues from there without owing the dropped steps
    c.advance(0.0301)
    assert clock.due(steps) == (3, False)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="dt > 0, rtf > 0, max_catchup >= 1"):
        SimClock(0.0)
    with pytest.raises(ValueError, match="max_catchup"):
        SimClock(0.01, max_catchup=0)
