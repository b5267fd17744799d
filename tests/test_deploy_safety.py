"""Tests of deploy.safety: each rule with exact outputs, and a property test that the
output is always finite and within the joint limits whatever comes in."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.metadata import PolicyMetadata
from deploy.safety import (
    DEFAULT_MAX_TARGET_SPEED,
    DEFAULT_RAMP_IN_S,
    DEFAULT_WATCHDOG_PERIODS,
    SafetyConfig,
    SafetyLayer,
)

LOWER = [-1.0, -2.0]
UPPER = [1.0, 2.0]
POSTURE = [0.0, 0.5]


def safety_config(**overrides) -> SafetyConfig:
    values = dict(
        joint_pos_lower=LOWER,
        joint_pos_upper=UPPER,
        max_delta_per_step=math.inf,
        watchdog_timeout_s=0.1,
        ramp_in_s=0.0,
        safe_posture=POSTURE,
    )
    values.update(overrides)
    return SafetyConfig(**values)


def make(**overrides) -> SafetyLayer:
    return SafetyLayer(safety_config(**overrides))


def active(now: float = 0.0, **overrides) -> SafetyLayer:
    layer = make(**overrides)
    layer.observe(now)
    layer.activate(now)
    return layer


OBS = np.zeros(3)


def test_inactive_outputs_safe_posture():
    layer = make()
    out = layer.filter(OBS, np.array([0.9, 0.9]), 0.0)
    np.testing.assert_array_equal(out, POSTURE)
    assert layer.counters["inactive"] == 1
    assert not layer.active


def test_safe_posture_is_clamped_to_limits():
    layer = make(safe_posture=[5.0, -1e308])
    np.testing.assert_array_equal(layer.filter(None, np.zeros(2), 0.0), [1.0, -2.0])


def test_passthrough_when_nothing_intervenes():
    layer = active()
    np.testing.assert_array_equal(layer.filter(OBS, np.array([0.3, -0.7]), 0.01), [0.3, -0.7])
    counters = layer.counters
    assert counters["steps"] == 1
    assert sum(v for k, v in counters.items() if k != "steps") == 0


def test_watchdog_after_timeout():
    layer = active()
    target = np.array([0.3, -0.7])
    np.testing.assert_array_equal(layer.filter(OBS, target, 0.1), target)  # exactly at timeout
    np.testing.assert_array_equal(layer.filter(OBS, target, 0.1001), POSTURE)
    assert layer.counters["watchdog"] == 1
    layer.observe(0.2)
    np.testing.assert_array_equal(layer.filter(OBS, target, 0.2), target)  # ramp_in_s = 0


def test_watchdog_when_never_observed_or_time_is_nan():
    layer = make()
    layer.activate(0.0)
    np.testing.assert_array_equal(layer.filter(OBS, np.array([0.3, 0.3]), 0.0), POSTURE)
    layer.observe(0.0)
    np.testing.assert_array_equal(layer.filter(OBS, np.array([0.3, 0.3]), math.nan), POSTURE)
    assert layer.counters["watchdog"] == 2


def test_ramp_in_halfway_and_end():
    layer = active(ramp_in_s=1.0, watchdog_timeout_s=10.0)
    target = np.array([0.5, 1.5])
    # Halfway: 0.5 * target + 0.5 * posture.
    np.testing.assert_allclose(layer.filter(OBS, target, 0.5), [0.25, 1.0], atol=1e-15)
    np.testing.assert_allclose(layer.filter(OBS, target, 0.75), [0.375, 1.25], atol=1e-15)
    np.testing.assert_array_equal(layer.filter(OBS, target, 1.0), target)
    np.testing.assert_array_equal(layer.filter(OBS, target, 5.0), target)


def test_ramp_in_starts_from_current_pos_and_clock_going_back():
    layer = make(ramp_in_s=1.0, watchdog_timeout_s=10.0)
    layer.observe(0.0)
    layer.activate(0.0, current_pos=np.array([-1.0, 2.0]))
    target = np.array([1.0, 0.0])
    np.testing.assert_array_equal(layer.filter(OBS, target, -3.0), [-1.0, 2.0])
    np.testing.assert_allclose(layer.filter(OBS, target, 0.25), [-0.5, 1.5], atol=1e-15)


def test_ramp_restarts_after_watchdog_recovery():
    layer = active(ramp_in_s=1.0, watchdog_timeout_s=0.5)
    target = np.array([1.0, 1.5])
    np.testing.assert_array_equal(layer.filter(OBS, target, 2.0), POSTURE)  # stale
    layer.observe(2.0)
    np.testing.assert_array_equal(layer.filter(OBS, target, 2.0), POSTURE)  # ramp restarts
    layer.observe(2.5)
    np.testing.assert_allclose(layer.filter(OBS, target, 2.5), [0.5, 1.0], atol=1e-15)


def test_rate_limit_relative_to_previous_output():
    layer = active(max_delta_per_step=0.125)
    target = np.array([1.0, 2.0])
    np.testing.assert_array_equal(layer.filter(OBS, target, 0.0), [0.125, 0.625])
    np.testing.assert_array_equal(layer.filter(OBS, target, 0.01), [0.25, 0.75])
    np.testing.assert_array_equal(layer.filter(OBS, np.array([0.25, 0.8]), 0.02), [0.25, 0.8])
    assert layer.counters["rate_limited"] == 2


def test_rate_limit_per_joint():
    layer = active(max_delta_per_step=[0.25, 1.0])
    np.testing.assert_array_equal(layer.filter(OBS, np.array([-1.0, -1.0]), 0.0), [-0.25, -0.5])


def test_clamp_to_joint_limits():
    layer = active()
    np.testing.assert_array_equal(layer.filter(OBS, np.array([3.0, -5.0]), 0.0), [1.0, -2.0])
    np.testing.assert_array_equal(layer.filter(OBS, np.array([1e308, -1e308]), 0.0), [1.0, -2.0])
    assert layer.counters["clamped"] == 2


def test_huge_limits_do_not_overflow():
    layer = active(
        joint_pos_lower=[-1e308, -1e308],
        joint_pos_upper=[1e308, 1e308],
        safe_posture=[0.0, 0.0],
        ramp_in_s=1.0,
        watchdog_timeout_s=10.0,
    )
    out = layer.filter(OBS, np.array([1e308, -1e308]), 0.5)
    np.testing.assert_array_equal(out, [0.5e308, -0.5e308])
    out = layer.filter(OBS, np.array([-1e308, 1e308]), 1.0)
    np.testing.assert_array_equal(out, [-1e308, 1e308])
    # A jump of 2e308 overflows; neither np.seterr nor warnings-as-errors may escape.
    with np.errstate(all="raise"):
        out = layer.filter(OBS, np.array([1e308, -1e308]), 1.5)
    np.testing.assert_array_equal(out, [1e308, -1e308])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = layer.filter(OBS, np.array([-1e308, 1e308]), 2.0)
    np.testing.assert_array_equal(out, [-1e308, 1e308])
    assert layer.counters["rate_limited"] == 0


def test_nonfinite_obs_and_action_hold_last_output():
    layer = active()
    last = layer.filter(OBS, np.array([0.3, -0.7]), 0.0)
    bad_obs = np.array([0.0, np.nan, 0.0])
    np.testing.assert_array_equal(layer.filter(bad_obs, np.array([0.9, 0.9]), 0.01), last)
    np.testing.assert_array_equal(layer.filter(OBS, np.array([np.inf, 0.0]), 0.02), last)
    np.testing.assert_array_equal(layer.filter(bad_obs, np.array([np.nan, 0.0]), 0.03), last)
    counters = layer.counters
    assert counters["nonfinite_obs"] == 2
    assert counters["nonfinite_action"] == 2


def test_nonfinite_goes_to_posture_when_not_holding():
    layer = active(hold_last_on_fault=False)
    layer.filter(OBS, np.array([0.3, -0.7]), 0.0)
    np.testing.assert_array_equal(layer.filter(OBS, np.array([np.nan, 0.0]), 0.01), POSTURE)


def test_nonfinite_right_after_activation_holds_safe_posture():
    layer = active()
    np.testing.assert_array_equal(layer.filter(OBS, np.array([np.nan, 0.0]), 0.0), POSTURE)


def test_deactivate_outputs_posture_and_reactivation_ramps_from_it():
    layer = active(ramp_in_s=1.0, watchdog_timeout_s=100.0)
    target = np.array([1.0, 1.5])
    layer.filter(OBS, target, 2.0)
    layer.deactivate()
    np.testing.assert_array_equal(layer.filter(OBS, target, 2.1), POSTURE)
    np.testing.assert_array_equal(layer.filter(OBS, target, 2.2), POSTURE)
    layer.activate(3.0)
    layer.activate(3.4)  # already active: does not restart the ramp
    np.testing.assert_allclose(layer.filter(OBS, target, 3.5), [0.5, 1.0], atol=1e-15)


def test_counters_and_reset():
    layer = active(max_delta_per_step=0.5)
    layer.filter(OBS, np.array([5.0, 0.5]), 0.0)  # clamped and rate limited
    layer.filter(OBS, np.array([np.nan, 0.5]), 0.0)
    layer.filter(OBS, np.array([0.0, 0.5]), 1.0)  # stale
    assert layer.counters == {
        "steps": 3,
        "inactive": 0,
        "watchdog": 1,
        "nonfinite_obs": 0,
        "nonfinite_action": 1,
        "rate_limited": 1,
        "clamped": 1,
        "bad_time": 0,
    }
    layer.reset_counters()
    assert set(layer.counters.values()) == {0}


def test_returned_arrays_are_independent():
    layer = active()
    first = layer.filter(OBS, np.array([0.1, 0.1]), 0.0)
    layer.filter(OBS, np.array([0.2, 0.2]), 0.0)
    np.testing.assert_array_equal(first, [0.1, 0.1])


def test_config_edits_after_construction_change_nothing():
    """The layer copies its limits and timings: a config edited later (validated once,
    at construction) cannot widen a limit, stop the watchdog or skip the ramp-in."""
    cfg = safety_config(joint_pos_upper=list(UPPER), ramp_in_s=1.0, hold_last_on_fault=False)
    layer = SafetyLayer(cfg)
    cfg.joint_pos_upper[0] = 10.0
    cfg.watchdog_timeout_s = math.inf
    cfg.ramp_in_s = 0.0
    cfg.hold_last_on_fault = True
    layer.observe(0.0)
    layer.activate(0.0)
    layer.observe(0.5)
    # ramp-in still 1 s: halfway from the posture (0.0, 0.5) to the clamped (1.0, 1.5)
    np.testing.assert_array_equal(layer.filter(OBS, np.array([5.0, 1.5]), 0.5), [0.5, 1.0])
    # still not holding on a fault: the safe posture
    np.testing.assert_array_equal(layer.filter(OBS, np.array([np.nan, 0.0]), 0.55), POSTURE)
    # the watchdog still fires 0.1 s after the last observation
    np.testing.assert_array_equal(layer.filter(OBS, np.array([0.3, 0.3]), 0.7), POSTURE)
    assert layer.counters["watchdog"] == 1


def test_config_validation():
    with pytest.raises(ValueError, match="lower"):
        make(joint_pos_lower=[2.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        make(joint_pos_upper=[np.inf, 1.0])
    with pytest.raises(ValueError, match="max_delta"):
        make(max_delta_per_step=0.0)
    with pytest.raises(ValueError, match="safe_posture"):
        make(safe_posture=[0.0])
    with pytest.raises(ValueError, match="target"):
        make().filter(None, np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="finite"):
        make().activate(math.nan)


def test_from_metadata_defaults_and_overrides():
    meta = PolicyMetadata(
        policy_family="gaussian_mlp",
        obs_terms=[("q", 2)],
        action_joint_names=["a", "b"],
        action_scale=[1.0, 1.0],
        action_offset=[0.0, 0.0],
        default_joint_pos=[0.2, 5.0],
        kp=[1.0, 1.0],
        kd=[0.1, 0.1],
        joint_pos_lower=LOWER,
        joint_pos_upper=UPPER,
        control_period_s=0.02,
    )
    cfg = SafetyConfig.from_metadata(meta)
    np.testing.assert_array_equal(cfg.safe_posture, [0.2, 2.0])  # clamped
    np.testing.assert_allclose(cfg.max_delta_per_step, [DEFAULT_MAX_TARGET_SPEED * 0.02] * 2)
    assert cfg.watchdog_timeout_s == pytest.approx(DEFAULT_WATCHDOG_PERIODS * 0.02)
    assert cfg.ramp_in_s == DEFAULT_RAMP_IN_S
    cfg = SafetyConfig.from_metadata(meta, ramp_in_s=2.0, safe_posture=[0.0, 0.0])
    assert cfg.ramp_in_s == 2.0
    np.testing.assert_array_equal(cfg.safe_posture, [0.0, 0.0])
    with pytest.raises(TypeError, match="ramp_in"):
        SafetyConfig.from_metadata(meta, ramp_in=2.0)


# ---------------------------------------------------------------------- properties
nasty = st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, 1e308, -1e308, 0.0])
value = st.one_of(nasty, st.floats(-10.0, 10.0))
any_time = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-10.0, 10.0))
N = 3
vec = st.lists(value, min_size=N, max_size=N).map(np.array)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), any_time),
        st.tuples(st.just("activate"), st.floats(-10.0, 10.0), st.none() | vec),
        st.tuples(st.just("deactivate")),
        st.tuples(st.just("filter"), st.none() | vec, vec, any_time),
    ),
    max_size=40,
)


@st.composite
def configs(draw) -> SafetyConfig:
    bound = st.one_of(st.floats(-1e308, 1e308), st.floats(-5.0, 5.0))
    a = draw(st.lists(bound, min_size=N, max_size=N))
    b = draw(st.lists(bound, min_size=N, max_size=N))
    return SafetyConfig(
        joint_pos_lower=np.minimum(a, b),
        joint_pos_upper=np.maximum(a, b),
        max_delta_per_step=draw(st.one_of(st.floats(1e-6, 1e308), st.just(math.inf))),
        watchdog_timeout_s=draw(st.one_of(st.floats(1e-3, 10.0), st.just(math.inf))),
        ramp_in_s=draw(st.floats(0.0, 5.0)),
        safe_posture=draw(st.lists(st.floats(-1e308, 1e308), min_size=N, max_size=N)),
        hold_last_on_fault=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), operations=ops)
def test_output_always_finite_and_within_limits(config, operations):
    layer = SafetyLayer(config)
    # Even with numpy told to raise on overflow, the layer must not raise.
    with np.errstate(all="raise"):
        for op in operations:
            if op[0] == "observe":
                layer.observe(op[1])
            elif op[0] == "activate":
                layer.activate(op[1], op[2])
            elif op[0] == "deactivate":
                layer.deactivate()
            else:
                out = layer.filter(op[1], op[2], op[3])
                assert out.shape == (N,)
                assert np.isfinite(out).all()
                assert (out >= config.joint_pos_lower).all()
                assert (out <= config.joint_pos_upper).all()


@settings(max_examples=200, deadline=None)
@given(
    targets=st.lists(st.lists(value, min_size=N, max_size=N), min_size=1, max_size=30),
    delta=st.floats(1e-3, 2.0),
    ramp=st.floats(0.0, 1.0),
)
def test_rate_limit_holds_for_every_step(targets, delta, ramp):
    layer = SafetyLayer(
        SafetyConfig(
            joint_pos_lower=[-3.0] * N,
            joint_pos_upper=[3.0] * N,
            max_delta_per_step=delta,
            watchdog_timeout_s=1.0,
            ramp_in_s=ramp,
            safe_posture=[0.5] * N,
        )
    )
    layer.observe(0.0)
    layer.activate(0.0)
    prev = np.full(N, 0.5)
    for i, target in enumerate(targets):
        now = 0.02 * i
        layer.observe(now)
        out = layer.filter(None, np.array(target), now)
        assert (np.abs(out - prev) <= delta * (1 + 1e-12)).all()
        prev = out


# ---------------------------------------------------------------------- timestamps
TARGET = np.array([0.3, -0.7])


def test_future_observation_time_cannot_disable_the_watchdog():
    """The issue's case: after observe(1e12), no data for 1000 s used to stay 'fresh'."""
    layer = active()  # observed at 0, watchdog 0.1 s
    layer.observe(1e12)
    # the observation from the future is rejected; the one at 0 is still fresh
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 0.05), TARGET)
    assert layer.counters["bad_time"] == 1
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 0.2), POSTURE)
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 1000.0), POSTURE)
    assert layer.counters["watchdog"] == 2
    # valid observations bring it back
    layer.observe(1000.0)
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 1000.0), TARGET)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf])
def test_nonfinite_observation_time_is_rejected_and_counted(bad):
    layer = active()
    layer.observe(bad)
    assert layer.counters["bad_time"] == 1
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 0.05), TARGET)  # the obs at 0
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 5.0), POSTURE)
    assert layer.counters["watchdog"] == 1


@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf])
def test_nonfinite_filter_time_is_stale(bad):
    layer = active()
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, bad), POSTURE)
    counters = layer.counters
    assert counters["watchdog"] == 1 and counters["bad_time"] == 1


def test_clock_going_back_cannot_keep_stale_data_fresh():
    """The clock jumps from 100 s back to 0 and the data stop: after the watchdog's
    timeout on the caller's clock, the safe posture (today: fresh for ~100 s)."""
    layer = active(100.0)
    for k in range(5):
        layer.observe(100.0 + 0.02 * k)
        np.testing.assert_array_equal(layer.filter(OBS, TARGET, 100.0 + 0.02 * k), TARGET)
    prev = layer.last_output
    outs = []
    for k in range(1, 20):  # 0.02 .. 0.38: backwards; observations stamped on it too
        layer.observe(0.02 * k)
        outs.append(layer.filter(OBS, np.array([0.9, 0.9]), 0.02 * k))
    # never the policy's new target: held for the 0.1 s budget (0.02 .. 0.12 on the
    # clock that went back; 0.12 is at the edge), then the posture
    for out in outs[:5]:
        np.testing.assert_array_equal(out, prev)
    for out in outs[6:]:
        np.testing.assert_array_equal(out, POSTURE)
    counters = layer.counters
    assert counters["watchdog"] >= 13
    assert counters["bad_time"] == 2 * 19  # every observation and filter time of the run


def test_clock_going_back_twice_is_stale_at_once():
    layer = active(ramp_in_s=0.0, watchdog_timeout_s=10.0)
    layer.filter(OBS, TARGET, 1.0)
    np.testing.assert_array_equal(layer.filter(OBS, np.zeros(2), 0.5), TARGET)  # held
    np.testing.assert_array_equal(layer.filter(OBS, np.zeros(2), 0.4), POSTURE)  # back again
    assert layer.counters["watchdog"] == 1


def test_backwards_observation_time_is_rejected():
    layer = active(watchdog_timeout_s=0.1)
    layer.observe(0.2)
    layer.observe(0.1)  # earlier than the one before: rejected, the later one stands
    assert layer.counters["bad_time"] == 1
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 0.3), TARGET)
    layer.observe(0.15)  # earlier than the last accepted observation
    assert layer.counters["bad_time"] == 2
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 0.31), POSTURE)


def test_repeated_observation_time_is_accepted():
    """The ROS controller observes the same sensor stamp until a new message comes."""
    layer = active(watchdog_timeout_s=0.1)
    for k in range(5):
        layer.observe(0.0)
        layer.filter(OBS, TARGET, 0.02 * k)
    assert layer.counters["bad_time"] == 0 and layer.counters["watchdog"] == 0


def test_activation_at_an_earlier_time_is_refused():
    layer = make()
    layer.filter(OBS, TARGET, 5.0)  # inactive, but the time is accepted
    layer.activate(4.0)
    assert not layer.active and layer.counters["bad_time"] == 1
    layer.observe(5.0)
    layer.activate(5.0)
    assert layer.active
    np.testing.assert_array_equal(layer.filter(OBS, TARGET, 5.01), TARGET)


def test_filter_without_allocation_beyond_the_output():
    """The time checks keep the hot path as it was: one new array per call, the output."""
    import tracemalloc

    layer = active(max_delta_per_step=0.5, ramp_in_s=0.5, watchdog_timeout_s=1.0)
    target = np.array([0.3, -0.7])
    for k in range(50):  # warm-up
        layer.observe(0.001 * k)
        layer.filter(OBS, target, 0.001 * k)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for k in range(50, 1050):
        layer.observe(0.001 * k)
        layer.filter(OBS, target, 0.001 * k)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 4096  # nothing kept per call


# A lenient model of "valid observation": finite, not earlier than the last valid one,
# not later than the accepted filter/activation time that judges it. The layer may be
# stricter (it never has a later valid observation than the model), never more lenient.
spec_value = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, 1e12, -1e12, 0.0, -0.0]),
    st.floats(-10.0, 10.0),
    st.floats(allow_nan=True, allow_infinity=True),
)
time_spec = st.one_of(
    st.tuples(st.just("abs"), spec_value),
    st.tuples(st.just("rel"), st.floats(-0.05, 0.3)),  # realistic: near the last time
)
time_ops = st.lists(
    st.tuples(st.sampled_from(["observe", "filter"]), time_spec), min_size=1, max_size=60
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=time_ops,
    t0=st.floats(-5.0, 5.0),
    first_obs=st.none() | spec_value,
    timeout=st.one_of(st.floats(1e-3, 1.0), st.just(math.inf)),
    ramp=st.floats(0.0, 0.5),
    hold=st.booleans(),
)
def test_no_valid_observation_within_the_timeout_means_the_safe_posture(
    ops, t0, first_obs, timeout, ramp, hold
):
    """Whatever the timestamps (inf, nan, huge, negative, decreasing): whenever no valid
    observation came within the watchdog timeout before a filter call, the output is the
    safe posture and the watchdog counter went up; a call whose own time is rejected
    never passes the policy's target."""
    config = SafetyConfig(
        joint_pos_lower=[-1.0] * N,
        joint_pos_upper=[1.0] * N,
        max_delta_per_step=math.inf,
        watchdog_timeout_s=timeout,
        ramp_in_s=ramp,
        safe_posture=[0.25] * N,
        hold_last_on_fault=hold,
    )
    posture = config.safe_posture
    target = np.full(N, -0.5)
    layer = SafetyLayer(config)
    pending: list[float] = []
    if first_obs is not None:
        layer.observe(first_obs)
        if math.isfinite(first_obs):
            pending.append(first_obs)
    layer.activate(t0)
    assert layer.active
    clock = t0  # the last accepted filter/activation time
    base = t0  # "rel" times count from the last finite time given
    valid_obs: float | None = None

    def judge(now: float, drop_future: bool) -> None:
        nonlocal valid_obs, pending
        later = []
        for t in pending:
            if t <= now:
                if valid_obs is None or t >= valid_obs:
                    valid_obs = t
            elif not drop_future:
                later.append(t)
        pending = later

    judge(t0, drop_future=False)
    stale = valid_obs is None or not clock - valid_obs <= timeout
    back_t0 = back_t = None

    for kind, (how, value) in ops:
        t = base + value if how == "rel" else value
        if math.isfinite(t):
            base = t
        before = layer.counters
        if kind == "observe":
            layer.observe(t)
            if math.isfinite(t):
                pending.append(t)
            else:
                assert layer.counters["bad_time"] == before["bad_time"] + 1
            continue
        prev = layer.last_output
        out = layer.filter(None, target, t)
        after = layer.counters
        assert np.isfinite(out).all()
        if math.isfinite(t) and t >= clock:  # an accepted time
            clock, back_t0 = t, None
            judge(t, drop_future=True)
            stale = valid_obs is None or not t - valid_obs <= timeout
            expired = stale
        else:
            assert after["bad_time"] >= before["bad_time"] + 1
            # never the policy's target: the held output or the safe posture
            assert np.array_equal(out, prev) or np.array_equal(out, posture)
            expired = True
            if math.isfinite(t) and not stale:
                if back_t0 is None:
                    back_t0 = back_t = t
                if t >= back_t:
                    back_t = t
                    age = (clock - valid_obs) + (t - back_t0)
                    expired = not age <= timeout
            stale = stale or expired
        if expired:
            np.testing.assert_array_equal(out, posture)
            assert after["watchdog"] == before["watchdog"] + 1
