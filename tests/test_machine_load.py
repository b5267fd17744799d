"""The speed benchmarks' idle-machine protocol (sim.machine_load)."""

from __future__ import annotations

import pytest

from sim.machine_load import (
    LoadMonitor,
    Sample,
    interleaved_rounds,
    median_ratio,
    wait_for_quiet,
)


def idle(load1: float = 0.1, runnable: int = 1) -> Sample:
    return Sample(load1, 0.2, 0.3, runnable)


def test_sample_reads_proc_loadavg():
    s = Sample.read()
    assert s.load1 >= 0 and s.load5 >= 0 and s.load15 >= 0
    assert s.runnable >= 1  # this process is running while it reads


def test_idle_machine_may_write():
    m = LoadMonitor(own_threads=1, before=idle())
    m.samples = [idle(runnable=1), idle(runnable=2), idle(runnable=1)]
    m.stop()
    assert not m.busy and m.others_runnable == pytest.approx(1 / 3)
    ok, why = m.may_write(allow_busy=False)
    assert ok and why.startswith("idle machine")


def test_high_load_at_start_is_busy_and_refused_unless_allowed():
    assert not LoadMonitor(own_threads=1, before=idle(load1=0.6)).busy  # a decaying average
    m = LoadMonitor(own_threads=1, before=idle(load1=1.7))
    m.sample()
    assert m.busy
    ok, why = m.may_write(allow_busy=False)
    assert not ok and "not written" in why and "--allow-busy" in why
    ok, why = m.may_write(allow_busy=True)
    assert ok and why.startswith("**BUSY machine")


def test_other_runnable_processes_during_the_rounds_make_it_busy():
    m = LoadMonitor(own_threads=2, before=idle())
    m.samples = [idle(runnable=3), idle(runnable=4), idle(runnable=3)]
    assert m.others_runnable == pytest.approx(4 / 3) and m.busy
    m.samples = [idle(runnable=2), idle(runnable=3)]
    assert m.others_runnable == pytest.approx(0.5) and not m.busy


def test_rounds_interleave_and_the_ratio_is_the_median_of_rounds():
    calls: list[str] = []
    seq = iter([10.0, 5.0, 12.0, 4.0, 100.0, 5.0])

    def measure(name):
        def fn():
            calls.append(name)
            return next(seq)

        return fn

    m = LoadMonitor(before=idle())
    out = interleaved_rounds({"ours": measure("ours"), "peer": measure("peer")}, 3, m)
    assert calls == ["ours", "peer"] * 3
    assert out == {"ours": [10.0, 12.0, 100.0], "peer": [5.0, 4.0, 5.0]}
    assert len(m.samples) == 6
    # per round 2, 3, 20: the median is 3, not the pooled 122/14 an outlier inflates
    assert median_ratio(out["ours"], out["peer"]) == 3.0


def test_bad_rounds_are_errors():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved_rounds({"a": lambda: 1.0}, 0)
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        median_ratio([1.0, 2.0], [1.0])


def test_waiting_for_a_quiet_machine_gives_up_at_its_timeout():
    s = wait_for_quiet(max_load=-1.0, timeout_s=0.05, poll_s=0.01)  # never quiet enough
    assert s.load1 > -1.0
    s = wait_for_quiet(max_load=1e9, timeout_s=10.0)  # already quiet: returns at once
    assert s.load1 < 1e9
