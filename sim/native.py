"""Native kernels for stepping one MjData per environment on numba's thread pool.

`mujoco.batch.Batch` is the default engine. This pool exists for the tasks whose
reference (Gymnasium) reads quantities that a plain `mj_step` never computes:
`cfrc_ext` after `mj_rnePostConstraint` on the data that the last RK4 stage left.
Batch keeps no per-simulation MjData we could run that on, so those tasks keep one
MjData per env here and call MuJoCo's C functions directly, without the GIL.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import mujoco
import numba
import numpy as np
from numba import njit, prange
from numba.np.ufunc import parallel as _numba_parallel

# numba's default threading layer is GNU OpenMP, whose idle threads spin-wait for the
# next parallel region; it shares the libgomp that torch loaded, so OMP_WAIT_POLICY set
# here comes too late. Between steps (the policy, the PPO update) a spinning thread
# burned ~40% of a core: two humanoid trainings side by side ran at 470 env steps/s
# each, 2 000 each without the spin (2026-12-04, 2 cores). numba's own workqueue layer
# sleeps when idle. It must not be entered from two threads at once, hence LAUNCH,
# held around every parallel kernel. A layer the user chose (NUMBA_THREADING_LAYER), or
# one already started, is left as it is.
# a private flag: a numba without it counts as not started (setting the layer late is inert)
_started = getattr(_numba_parallel, "_is_initialized", False)
if numba.config.THREADING_LAYER == "default" and not _started:
    numba.config.THREADING_LAYER = "workqueue"
LAUNCH = threading.Lock()

_U64 = ctypes.c_uint64


def _libmujoco() -> ctypes.CDLL:
    # The bindings already loaded this library; dlopen returns the same handle, so
    # the pointers of Python MjModel/MjData objects are valid for these functions.
    here = os.path.dirname(mujoco.__file__)
    candidates = sorted(glob.glob(os.path.join(here, "libmujoco.so*"))) + sorted(
        glob.glob(os.path.join(here, "libmujoco*.dylib"))
    )
    if not candidates:
        raise ImportError(f"libmujoco not found next to the mujoco package in {here}")
    return ctypes.CDLL(candidates[0])


def _fn(lib: ctypes.CDLL, name: str, nargs: int, restype=None):
    f = getattr(lib, name)
    # Pointers travel as uint64: the same ABI on x86-64 and arm64, and numba
    # passes integers straight through.
    f.argtypes = [_U64] * nargs
    f.restype = restype
    return f


_lib = _libmujoco()
_mj_step = _fn(_lib, "mj_step", 2)
_mj_forward = _fn(_lib, "mj_forward", 2)
_mj_rne_post = _fn(_lib, "mj_rnePostConstraint", 2)
_mj_reset = _fn(_lib, "mj_resetData", 2)
_mj_setconst = _fn(_lib, "mj_setConst", 2)
_memcpy = _fn(ctypes.CDLL(None), "memcpy", 3, _U64)


def _step_pool(m_addr, d_addr, ctrl_addr, ctrl, nsub, rne_post, nchunk):  # pragma: no cover
    n = d_addr.shape[0]
    row = ctrl.shape[1] * 8
    base = ctrl.ctypes.data
    # contiguous blocks, one per thread: each env's sequence of calls is the same
    # whatever the thread count, so results do not depend on it
    for c in prange(nchunk):
        lo = c * n // nchunk
        hi = (c + 1) * n // nchunk
        for i in range(lo, hi):
            if row > 0:
                _memcpy(ctrl_addr[i], base + i * row, row)
            for _ in range(nsub):
                _mj_step(m_addr[i], d_addr[i])
            if rne_post:
                _mj_rne_post(m_addr[i], d_addr[i])


def _reset_pool(m_addr, d_addr, ids, nchunk):  # pragma: no cover
    n = ids.shape[0]
    for c in prange(nchunk):
        for k in range(c * n // nchunk, (c + 1) * n // nchunk):
            _mj_reset(m_addr[ids[k]], d_addr[ids[k]])


def _forward_pool(m_addr, d_addr, ids, rne_post, nchunk):  # pragma: no cover
    n = ids.shape[0]
    for c in prange(nchunk):
        for k in range(c * n // nchunk, (c + 1) * n // nchunk):
            _mj_forward(m_addr[ids[k]], d_addr[ids[k]])
            if rne_post:
                _mj_rne_post(m_addr[ids[k]], d_addr[ids[k]])


def _setconst_pool(m_addr, d_addr, ids, nchunk):  # pragma: no cover
    n = ids.shape[0]
    for c in prange(nchunk):
        for k in range(c * n // nchunk, (c + 1) * n // nchunk):
            _mj_setconst(m_addr[ids[k]], d_addr[ids[k]])


@njit(parallel=True, nogil=True)
def _gather_parallel(addrs, nbytes, out):  # pragma: no cover
    base = out.ctypes.data
    for i in prange(addrs.shape[0]):
        _memcpy(base + i * nbytes, addrs[i], nbytes)


@njit(nogil=True)
def _gather_serial(addrs, nbytes, out):  # pragma: no cover
    base = out.ctypes.data
    for i in range(addrs.shape[0]):
        _memcpy(base + i * nbytes, addrs[i], nbytes)


# Each kernel twice: on numba's pool, and serially on the calling thread for one chunk,
# where a parallel region would only wake threads that have nothing to do.
# prange is range in the serial compilation, so both run the same calls in the same order.
_parallel = njit(parallel=True, nogil=True)
_serial = njit(nogil=True)
step_pool, step_serial = _parallel(_step_pool), _serial(_step_pool)
reset_pool, reset_serial = _parallel(_reset_pool), _serial(_reset_pool)
forward_pool, forward_serial = _parallel(_forward_pool), _serial(_forward_pool)
setconst_pool, setconst_serial = _parallel(_setconst_pool), _serial(_setconst_pool)


# below this many envs, starting a parallel region costs more than the copies
_PARALLEL_GATHER_MIN = 256


def gather(addrs: np.ndarray, nbytes: int, out: np.ndarray, parallel: bool = True) -> None:
    if parallel and addrs.shape[0] >= _PARALLEL_GATHER_MIN:
        with LAUNCH:
            _gather_parallel(addrs, nbytes, out)
    else:
        _gather_serial(addrs, nbytes, out)


@njit(nogil=True)
def scatter(addrs, nbytes, src, ids):  # pragma: no cover
    base = src.ctypes.data
    for k in range(ids.shape[0]):
        _memcpy(addrs[ids[k]], base + k * nbytes, nbytes)


def addresses(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([a.ctypes.data for a in arrays], dtype=np.uint64)
