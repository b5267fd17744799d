"""Numba kernels for the per-step bookkeeping of `MujocoVecEnv.step`.

At a few envs each numpy call costs a microsecond or more whatever its size, and the
step's flags (finite checks, unstable, terminated, truncated, counters) took a dozen
of them; one kernel call does the same work in one pass. The arithmetic is the same
element by element (a zeroed reward, one addition to the return), so the values are
bit for bit those of the numpy expressions they replace.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def all_finite(x):  # pragma: no cover
    """Whether every element of the 2-D array `x` is finite."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if not np.isfinite(x[i, j]):
                return False
    return True


# MuJoCo's own bound for a sane state value (mjMAXVAL): beyond it mj_step warns that
# the simulation is unstable
MAX_STATE_VALUE = 1e10


@njit(nogil=True, cache=True)
def _diverged(x, i):  # pragma: no cover
    for j in range(x.shape[1]):
        # written so that NaN fails it too
        if not abs(x[i, j]) <= MAX_STATE_VALUE:
            return True
    return False


@njit(nogil=True, cache=True)
def finish_step(
    qpos,
    qvel,
    reward,
    terminated,
    bad,
    failed,
    episode_length,
    max_steps,
    episode_return,
    out,
    flags,
):  # pragma: no cover
    """The end of a step for every env, in place; returns how many episodes ended.

    An env is unstable when its actions were bad, its simulation failed, its reward is
    not finite, or a qpos or qvel value is not finite or beyond MAX_STATE_VALUE (the
    values MuJoCo calls unstable): its reward becomes 0 and its episode terminates.
    Writes the reward into `out` and unstable, terminated and truncated into the rows of
    `flags`; counts the step into `episode_length` and adds the reward to
    `episode_return`.
    """
    ndone = 0
    for i in range(reward.shape[0]):
        unstable = bad[i] or failed[i] or not np.isfinite(reward[i])
        if not unstable:
            unstable = _diverged(qpos, i) or _diverged(qvel, i)
        r = 0.0 if unstable else reward[i]
        term = terminated[i] or unstable
        episode_length[i] += 1
        trunc = episode_length[i] >= max_steps and not term
        episode_return[i] += r
        out[i] = r
        flags[0, i] = unstable
        flags[1, i] = term
        flags[2, i] = trunc
        if term or trunc:
            ndone += 1
    return ndone
