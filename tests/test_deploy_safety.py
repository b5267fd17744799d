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


def make(**overrides) -> SafetyLayer:
    values = dict(
        joint_pos_lower=LOWER,
        joint_pos_upper=UPPER,
        max_delta_per_step=math.inf,
        watchdog_timeout_s=0.1,
        ramp_in_s=0.0,
        safe_posture=POSTURE,
    )
    values.update(overrides)
    return SafetyLayer(SafetyConfig(**values))


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
    }
    layer.reset_counters()
    assert set(layer.counters.values()) == {0}


def test_returned_arrays_are_independent():
    layer = active()
    first = layer.filter(OBS, np.array([0.1, 0.1]), 0.0)
    layer.filter(OBS, np.array([0.2, 0.2]), 0.0)
    np.testing.assert_array_equal(first, [0.1, 0.1])


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
