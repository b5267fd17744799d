"""Compiled kernels of the robot-side hot path: one call per control step instead of a
dozen small numpy calls.

At a control step's sizes (tens of values) a numpy call costs its overhead, about 1 us
here, whatever it computes; the safety filter made twelve of them and the runtime's
frame staging five, which together cost more than onnxruntime's own call. A numba
kernel costs one such overhead and does the arithmetic in a loop. The kernels compute
exactly what the numpy code did, operation for operation (no fused multiply-add, no
reordering: numba compiles without fastmath), and tests/test_deploy_kernels.py checks
them bit for bit against a numpy model.

numba ignores ``np.seterr``: an overflow here gives inf, never an exception, which is
what the safety layer's guarantees assume (it clamps every result into finite limits).

The kernels are compiled on first use and cached on disk (numba's ``cache=True``), and
:func:`warm_up` compiles every type the hot path sends, so that a robot's first control
step never waits for the compiler. Callers pass only the types :func:`warm_up`
compiles (1-D float32 or float64 arrays) and check sizes first: numba does not check
bounds.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = [
    "CLAMPED",
    "NONFINITE_OBS",
    "NONFINITE_OUT",
    "NONFINITE_TARGET",
    "RATE_LIMITED",
    "SAFETY_ROWS",
    "affine",
    "safety_track",
    "stage_frame",
    "warm_up",
]

NONFINITE_OBS = 1
NONFINITE_TARGET = 2
CLAMPED = 4
RATE_LIMITED = 8
NONFINITE_OUT = 16

# rows of safety_track's state
LOWER, UPPER, DELTA, RAMP_START, OUT, GOAL = range(6)
SAFETY_ROWS = 6


@njit(cache=True, nogil=True)
def _finite(x) -> bool:
    for i in range(x.shape[0]):
        if not math.isfinite(x[i]):
            return False
    return True


@njit(cache=True, nogil=True)
def safety_track(obs, target, state, rate_limit, alpha):
    """The safety layer's filter arithmetic for one step; returns a bit set of events.

    ``state`` holds the per-joint rows ``lower, upper, delta, ramp_start, out, goal``
    (one array: each array argument costs the dispatcher ~0.1 us).

    ``obs`` (any length, may be empty) and ``target`` are checked finite first; if
    either is not, nothing is written and the result says which. Else ``goal`` gets the
    target clamped to ``[lower, upper]``; for ``alpha < 1`` it is blended from
    ``ramp_start`` (``goal * alpha + start * (1 - alpha)``, no difference that could be
    inf - inf); with ``rate_limit`` the step from the last output ``out`` is clipped to
    ``+-delta`` per joint when any joint exceeds its delta; finally ``out`` gets the
    result, clamped again where it is not the clamped target itself.
    """
    lower, upper, delta = state[LOWER], state[UPPER], state[DELTA]
    ramp_start, out, goal = state[RAMP_START], state[OUT], state[GOAL]
    flags = 0
    if not _finite(obs):
        flags |= NONFINITE_OBS
    if not _finite(target):
        flags |= NONFINITE_TARGET
    if flags:
        return flags
    n = target.shape[0]
    for i in range(n):
        g = min(max(target[i], lower[i]), upper[i])
        if g != target[i]:
            flags |= CLAMPED
        goal[i] = g
    blended = alpha < 1.0
    if blended:
        beta = 1.0 - alpha
        for i in range(n):
            goal[i] = goal[i] * alpha + ramp_start[i] * beta
    limited = False
    if rate_limit:
        for i in range(n):
            if abs(goal[i] - out[i]) > delta[i]:
                limited = True
                break
        if limited:
            flags |= RATE_LIMITED
            for i in range(n):
                step = min(max(goal[i] - out[i], -delta[i]), delta[i])
                goal[i] = out[i] + step
    if blended or limited:
        for i in range(n):
            out[i] = min(max(goal[i], lower[i]), upper[i])
        # only limits near the float range can get here with an inf (unreachable by
        # construction otherwise); the caller sends the safe posture then
        if not _finite(out):
            flags |= NONFINITE_OUT
    else:
        for i in range(n):
            out[i] = goal[i]
    return flags


@njit(cache=True, nogil=True)
def stage_frame(frame, staged, ring, obs_frames, head, started):
    """Push one observation frame into the history; returns the new ring head, or -1.

    ``frame`` is cast into the float32 ``staged`` first, so that a value too large for
    float32 counts as inf; a non-finite frame commits nothing (-1). ``ring`` holds the
    last frames in arrival order with ``head`` at the oldest; ``obs_frames`` (the model
    input) gets them oldest first. Before the first frame (``started`` False) the whole
    history is filled with it.
    """
    f = staged.shape[0]
    finite = True
    for j in range(f):
        v = np.float32(frame[j])
        staged[j] = v
        if not math.isfinite(v):
            finite = False
    if not finite:
        return -1
    h = ring.shape[0]
    if h == 1:
        for j in range(f):
            obs_frames[0, j] = staged[j]
        return 0
    if not started:
        for k in range(h):
            for j in range(f):
                ring[k, j] = staged[j]
        head = 0
    else:
        for j in range(f):
            ring[head, j] = staged[j]
        head = (head + 1) % h
    for k in range(h):
        src = (head + k) % h
        for j in range(f):
            obs_frames[k, j] = ring[src, j]
    return head


@njit(cache=True, nogil=True)
def affine(raw, scale, offset, out):
    """``out = raw * scale + offset`` per element in float64 (the action map's targets):
    the same roundings as numpy's multiply-then-add into a float64 ``out``.

    Returns nothing: a returned array is boxed into a new numpy object on every call,
    which cost as much as the dispatch itself (measured 2.9 vs 1.6 us per call)."""
    for i in range(out.shape[0]):
        out[i] = raw[i] * scale[i] + offset[i]


def warm_up() -> None:
    """Compile (or load from numba's cache) every specialization the hot path uses: the
    caller's arrays (observation frame, raw action) as float32 or float64, contiguous
    or strided; the internal buffers as they are allocated."""
    y = np.zeros(2)
    for dtype in (np.float32, np.float64):
        for x in (np.zeros(2, dtype), np.zeros(4, dtype)[::2]):
            for target in (y, np.zeros(4)[::2]):
                safety_track(x, target, np.zeros((SAFETY_ROWS, 2)), True, 0.5)
            ring = np.zeros((2, 2), np.float32)
            stage_frame(x, np.zeros(2, np.float32), ring, np.zeros((2, 2), np.float32), 0, False)
            affine(x, y, y, np.zeros(2))
