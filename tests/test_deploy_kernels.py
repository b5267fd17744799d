"""The compiled kernels of the robot-side hot path (deploy.kernels) against numpy models
of what the numpy code computed before them, bit for bit; and no compilation on the
hot path whatever array types a caller sends."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy import kernels
from deploy.arrays import ActionMap
from deploy.kernels import affine, safety_track, stage_frame


def numpy_track(obs, target, lower, upper, delta, rate_limit, alpha, ramp_start, out):
    """The safety layer's numpy arithmetic as it was before the kernel (the model)."""
    flags = 0
    with np.errstate(all="ignore"):
        if not np.isfinite(obs).all():
            flags |= kernels.NONFINITE_OBS
        if not np.isfinite(target).all():
            flags |= kernels.NONFINITE_TARGET
        if flags:
            return flags, out
        goal = np.minimum(np.maximum(target, lower), upper)
        if (goal != target).any():
            flags |= kernels.CLAMPED
        blended = alpha < 1.0
        if blended:
            goal = goal * alpha + ramp_start * (1.0 - alpha)
        limited = False
        if rate_limit:
            step = goal - out
            limited = bool((np.abs(step) > delta).any())
            if limited:
                flags |= kernels.RATE_LIMITED
                goal = out + np.minimum(np.maximum(step, -delta), delta)
        if blended or limited:
            new = np.minimum(np.maximum(goal, lower), upper)
            if not np.isfinite(new).all():
                flags |= kernels.NONFINITE_OUT
        else:
            new = goal
    return flags, new


values = st.one_of(
    st.floats(-3, 3),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -0.0]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 6),
    data=st.data(),
    alpha=st.one_of(st.floats(0, 1.5), st.just(1.0), st.just(0.0)),
    huge=st.booleans(),
    delta_kind=st.sampled_from(["uniform", "per_joint", "inf", "mixed"]),
    obs_dtype=st.sampled_from([np.float32, np.float64]),
)
def test_safety_track_equals_the_numpy_arithmetic(n, data, alpha, huge, delta_kind, obs_dtype):
    vec = st.lists(values, min_size=n, max_size=n)
    lim = 1e308 if huge else 2.0
    lower = -np.abs(np.nan_to_num(np.array(data.draw(vec)), nan=1.0, posinf=lim, neginf=lim))
    upper = np.abs(np.nan_to_num(np.array(data.draw(vec)), nan=1.0, posinf=lim, neginf=lim))
    lower, upper = np.maximum(lower, -lim), np.minimum(upper, lim)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    delta = {
        "uniform": np.full(n, rng.uniform(0.01, 1.0)),
        "per_joint": rng.uniform(0.01, 1.0, n),
        "inf": np.full(n, np.inf),
        "mixed": np.where(rng.random(n) < 0.5, np.inf, rng.uniform(0.01, 1.0, n)),
    }[delta_kind]
    rate_limit = bool(np.isfinite(delta).any())
    target = np.array(data.draw(vec))
    with np.errstate(over="ignore"):  # 1e308 as float32: inf, on purpose
        obs = np.array(data.draw(st.lists(values, min_size=0, max_size=5)), dtype=obs_dtype)
    out = np.clip(rng.normal(size=n), lower, upper)
    ramp_start = np.clip(rng.normal(size=n), lower, upper)

    state = np.zeros((kernels.SAFETY_ROWS, n))
    state[kernels.LOWER], state[kernels.UPPER], state[kernels.DELTA] = lower, upper, delta
    state[kernels.RAMP_START], state[kernels.OUT] = ramp_start, out
    want_flags, want_out = numpy_track(
        obs, target, lower, upper, delta, rate_limit, alpha, ramp_start, out.copy()
    )
    flags = safety_track(obs, target, state, rate_limit, alpha)
    assert flags == want_flags
    np.testing.assert_array_equal(state[kernels.OUT], want_out)
    if flags & (kernels.NONFINITE_OBS | kernels.NONFINITE_TARGET):
        np.testing.assert_array_equal(state[kernels.OUT], out)  # nothing committed


def numpy_ring(frames: list[np.ndarray], history: int) -> list[np.ndarray | None]:
    """The stacked model input after each frame (None where the frame is rejected)."""
    ring: list[np.ndarray] = []
    inputs: list[np.ndarray | None] = []
    for frame in frames:
        with np.errstate(all="ignore"):
            f32 = frame.astype(np.float32)
        if not np.isfinite(f32).all():
            inputs.append(None)
            continue
        ring = [f32] * history if not ring else [*ring[1:], f32]
        inputs.append(np.concatenate(ring))
    return inputs


@settings(max_examples=100, deadline=None)
@given(
    history=st.integers(1, 4),
    size=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([np.float32, np.float64]),
    strided=st.booleans(),
)
def test_stage_frame_keeps_the_history_like_a_list(history, size, seed, dtype, strided):
    rng = np.random.default_rng(seed)
    frames = [rng.normal(size=size * 2 if strided else size) for _ in range(12)]
    frames[3][0] = np.nan
    frames[7][-1] = 1e300  # beyond float32: inf after the cast
    with np.errstate(over="ignore"):  # 1e300 as float32: inf, on purpose
        frames = [(f[::2] if strided else f).astype(dtype) for f in frames]
    ring = np.zeros((history, size), np.float32)
    model_in = np.zeros((history, size), np.float32)
    staged = np.zeros(size, np.float32)
    head, started = 0, False
    for frame, want in zip(frames, numpy_ring(frames, history), strict=True):
        before = model_in.copy()
        got = stage_frame(frame, staged, ring, model_in, head, started)
        if want is None:
            assert got == -1
            np.testing.assert_array_equal(model_in, before)
            continue
        head, started = got, True
        np.testing.assert_array_equal(model_in.reshape(-1), want)


def test_affine_equals_the_action_map():
    rng = np.random.default_rng(0)
    amap = ActionMap(rng.normal(size=12), rng.uniform(0.1, 2.0, 12))
    for dtype in (np.float32, np.float64):
        raw = rng.normal(size=12).astype(dtype)
        out = np.empty(12)
        affine(raw, amap.scale, amap.offset, out)
        np.testing.assert_array_equal(out, amap.to_targets(raw))


def test_no_compilation_on_the_hot_path(tmp_path):
    """After warm_up (run by OnnxPolicy and SafetyLayer), the types a caller may send
    compile nothing: a robot's first control step never waits for numba."""
    from deploy.safety import SafetyConfig, SafetyLayer

    kernels.warm_up()
    before = {k: len(k.signatures) for k in (safety_track, stage_frame, affine)}
    layer = SafetyLayer(
        SafetyConfig(
            joint_pos_lower=[-1.0, -1.0],
            joint_pos_upper=[1.0, 1.0],
            max_delta_per_step=0.1,
            watchdog_timeout_s=1.0,
            ramp_in_s=0.5,
            safe_posture=[0.0, 0.0],
        )
    )
    layer.observe(0.0)
    layer.activate(0.0)
    t = 0.0
    for obs in (
        np.zeros(6, np.float32),
        np.zeros(6),
        np.zeros(12)[::2],
        np.zeros((2, 3), np.float32),
        [0, 1, 2],
        np.zeros(3, np.int64),
        None,
    ):
        for target in (np.zeros(2), np.zeros(2, np.float32), [0.5, 0.5], np.zeros(4)[::2]):
            t += 0.01
            layer.observe(t)
            layer.filter(obs, target, t)
    for frame in (np.zeros(2, np.float32), np.zeros(4)[::2]):
        raw = frame.astype(np.float32)
        affine(raw, np.ones(2), np.zeros(2), np.empty(2))
    assert {k: len(k.signatures) for k in before} == before
