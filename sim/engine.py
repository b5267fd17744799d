"""Batched physics engines: N copies of one MuJoCo model stepped in native code.

Both engines offer the same small interface, so tasks never see which one runs:
`get`/`set` for data fields as (num_envs, ...) arrays, `model_field`/`set_model_field`
for per-env model parameters (domain randomization), `step`, `reset`, `forward`.
"""

from __future__ import annotations

import copy
import os

import mujoco
import numba
import numpy as np

from sim import native

# Data fields that are part of the integration state: writable, persistent.
STATE_FIELDS = (
    "qpos",
    "qvel",
    "act",
    "qacc_warmstart",
    "ctrl",
    "qfrc_applied",
    "xfrc_applied",
    "time",
)


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class SimulationFailure(RuntimeError):
    """MuJoCo raised an error in some simulations; `ids` names them."""

    def __init__(self, ids: np.ndarray, message: str):
        self.ids = np.asarray(ids)
        super().__init__(message)


class BatchEngine:
    """`mujoco.batch.Batch`: state rows stepped on MuJoCo's own thread pool."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, nthread: int = 0):
        self.model = model
        self.num_envs = num_envs
        self.nthread = nthread or default_threads()
        # imported here, not at module level: mujoco.batch is MuJoCo 4's, and `sim` also
        # serves the venvs of frameworks that pin MuJoCo 3 (mjlab) through sim.external
        from mujoco import batch as mjbatch

        self._simulation_error = mjbatch.SimulationError
        self._b = mjbatch.Batch(model, nsim=num_envs, nthread=self.nthread)
        self._ctrl = self._b.bind("ctrl")
        # Batch.bind rebuilds its view on every call (~15 us, five or more per env step);
        # the views it returns never move: state fields are slices of the state rows the
        # batch allocates once, outputs are buffers it registers once
        self._views: dict[str, np.ndarray] = {"ctrl": self._ctrl}
        self.written_model_fields: set[str] = set()

    def get(self, name: str) -> np.ndarray:
        # bound arrays are live views; callers that keep a value must copy it
        arr = self._views.get(name)
        if arr is None:
            arr = self._views[name] = self._b.bind(name)
            if name not in STATE_FIELDS:
                # an output field bound between calls reads zero until the next call;
                # a forward pass fills it without touching the integration state
                self._b.forward()
        return arr

    def set(self, name: str, values: np.ndarray, ids: np.ndarray | None = None) -> None:
        arr = self._views.get(name)
        if arr is None:
            arr = self._b.bind(name)
        if ids is None:
            arr[...] = values
        else:
            arr[ids] = values

    def model_field(self, name: str) -> np.ndarray:
        return self._b.expand(name)

    def set_model_field(self, name: str, values: np.ndarray, ids: np.ndarray) -> None:
        self._b.expand(name)[ids] = values
        self.written_model_fields.add(name)

    def set_const(self, ids: np.ndarray) -> None:
        self._b.set_const(ids)

    def step(self, ctrl: np.ndarray, nsub: int) -> None:
        self._ctrl[...] = ctrl
        try:
            self._b.step(nstep=nsub)
        except self._simulation_error as e:
            raise SimulationFailure(e.ids, str(e)) from e

    def reset(self, ids: np.ndarray) -> None:
        self._b.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)

    def forward(self, ids: np.ndarray) -> None:
        self._b.forward(ids)

    def get_data(self, i: int) -> mujoco.MjData:
        d = self._b.get_data(i)
        mujoco.mj_forward(self.get_model(i), d)
        return d

    def get_model(self, i: int) -> mujoco.MjModel:
        return self._b.get_model(i)


class PoolEngine:
    """One MjData (and, when randomized, one MjModel) per env, stepped by `sim.native`.

    `rne_post=True` runs `mj_rnePostConstraint` after every env step, as Gymnasium's
    MuJoCo envs do, so that `cfrc_ext` matches theirs bit for bit.
    """

    def __init__(
        self, model: mujoco.MjModel, num_envs: int, nthread: int = 0, rne_post: bool = False
    ):
        self.model = model
        self.num_envs = num_envs
        self.nthread = nthread or default_threads()
        # numba starts its whole pool for every parallel region unless told how many
        # threads to use: with fewer chunks than pool threads the rest would only wake
        self._pool_threads = max(1, min(self.nthread, numba.config.NUMBA_NUM_THREADS))
        # one chunk runs on the calling thread: no parallel region, no pool thread woken
        serial = self._serial = self.nthread == 1
        self._step = native.step_serial if serial else native.step_pool
        self._reset = native.reset_serial if serial else native.reset_pool
        self._forward = native.forward_serial if serial else native.forward_pool
        self._setconst = native.setconst_serial if serial else native.setconst_pool
        self.rne_post = rne_post
        self._models: list[mujoco.MjModel] = [model]
        self._datas = [mujoco.MjData(model) for _ in range(num_envs)]
        self._m_addr = np.full(num_envs, model._address, dtype=np.uint64)
        self._d_addr = np.array([d._address for d in self._datas], dtype=np.uint64)
        self._addr_cache: dict[tuple[str, str], tuple[np.ndarray, int, tuple, np.dtype]] = {}
        self._scalar: dict[str, bool] = {}
        self._per_env_models = False
        self.written_model_fields: set[str] = set()

    # -- data fields ---------------------------------------------------------------
    def _field(self, kind: str, name: str):
        key = (kind, name)
        if key not in self._addr_cache:
            objs = self._datas if kind == "data" else self._models
            values = [getattr(o, name) for o in objs]
            # only arrays the bindings expose as views of MuJoCo's own buffers have a
            # lasting address; np.asarray of a scalar such as MjData.time is a temporary,
            # and caching its address would read and write freed memory
            if not all(isinstance(v, np.ndarray) for v in values):
                raise TypeError(f"{kind} field {name!r} is not an array; access it by attribute")
            a0 = values[0]
            if not a0.flags.c_contiguous:
                raise ValueError(f"{kind} field {name!r} is not contiguous")
            self._addr_cache[key] = (native.addresses(values), a0.nbytes, a0.shape, a0.dtype)
        return self._addr_cache[key]

    def _is_scalar(self, name: str) -> bool:
        # asked on every get/set of the env step: one getattr per field, once
        if name not in self._scalar:
            self._scalar[name] = not isinstance(getattr(self._datas[0], name), np.ndarray)
        return self._scalar[name]

    def get(self, name: str) -> np.ndarray:
        if self._is_scalar(name):
            return np.array([getattr(d, name) for d in self._datas])
        addrs, nbytes, shape, dtype = self._field("data", name)
        out = np.empty((self.num_envs, *shape), dtype=dtype)
        if nbytes:
            native.gather(addrs, nbytes, out, parallel=not self._serial)
        return out

    def set(self, name: str, values: np.ndarray, ids: np.ndarray | None = None) -> None:
        ids = np.arange(self.num_envs) if ids is None else np.asarray(ids, dtype=np.int64)
        if self._is_scalar(name):
            for i, v in zip(ids, np.broadcast_to(values, (len(ids),))):
                setattr(self._datas[i], name, v.item())
            return
        addrs, nbytes, shape, dtype = self._field("data", name)
        src = np.ascontiguousarray(np.broadcast_to(values, (len(ids), *shape)), dtype=dtype)
        if nbytes:
            native.scatter(addrs, nbytes, src, ids)

    # -- model fields --------------------------------------------------------------
    def _ensure_per_env_models(self) -> None:
        if self._per_env_models:
            return
        self._models = [copy.copy(self.model) for _ in range(self.num_envs)]
        self._m_addr = np.array([m._address for m in self._models], dtype=np.uint64)
        self._addr_cache = {k: v for k, v in self._addr_cache.items() if k[0] == "data"}
        self._per_env_models = True

    def model_field(self, name: str) -> np.ndarray:
        self._ensure_per_env_models()
        addrs, nbytes, shape, dtype = self._field("model", name)
        out = np.empty((self.num_envs, *shape), dtype=dtype)
        native.gather(addrs, nbytes, out, parallel=not self._serial)
        return out

    def set_model_field(self, name: str, values: np.ndarray, ids: np.ndarray) -> None:
        self._ensure_per_env_models()
        addrs, nbytes, shape, dtype = self._field("model", name)
        src = np.ascontiguousarray(np.broadcast_to(values, (len(ids), *shape)), dtype=dtype)
        native.scatter(addrs, nbytes, src, np.asarray(ids, dtype=np.int64))
        self.written_model_fields.add(name)

    def _run(self, kernel, *args) -> None:
        # a serial engine never starts numba's pool (set_num_threads would launch it)
        if self._serial:
            kernel(*args)
            return
        with native.LAUNCH:
            numba.set_num_threads(self._pool_threads)
            kernel(*args)

    def set_const(self, ids: np.ndarray) -> None:
        self._run(self._setconst, self._m_addr, self._d_addr, np.asarray(ids, np.int64), self.nthread)

    # -- stepping ------------------------------------------------------------------
    def step(self, ctrl: np.ndarray, nsub: int) -> None:
        ctrl = np.ascontiguousarray(ctrl, dtype=np.float64)
        addrs = self._field("data", "ctrl")[0]
        self._run(
            self._step, self._m_addr, self._d_addr, addrs, ctrl, nsub, self.rne_post, self.nthread
        )

    def reset(self, ids: np.ndarray) -> None:
        self._run(self._reset, self._m_addr, self._d_addr, np.asarray(ids, np.int64), self.nthread)

    def forward(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        self._run(self._forward, self._m_addr, self._d_addr, ids, self.rne_post, self.nthread)

    def get_data(self, i: int) -> mujoco.MjData:
        return self._datas[i]

    def get_model(self, i: int) -> mujoco.MjModel:
        return self._models[i] if self._per_env_models else self.model


BACKENDS = ("c", "warp")


def make_engine(
    model: mujoco.MjModel,
    num_envs: int,
    nthread: int = 0,
    rne_post: bool = False,
    backend: str = "c",
    device: str = "cpu",
):
    """The engine of `backend`: 'c' (C MuJoCo on CPU threads) or 'warp' (MuJoCo Warp on
    `device`, sim.warp_engine)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown simulator backend {backend!r}; known: {list(BACKENDS)}")
    if backend == "warp":
        from sim.warp_engine import WarpEngine, warp_device

        return WarpEngine(model, num_envs, warp_device(device), rne_post=rne_post)
    if rne_post:
        return PoolEngine(model, num_envs, nthread, rne_post=True)
    return BatchEngine(model, num_envs, nthread)


def engine_state(engine) -> dict[str, np.ndarray]:
    """Everything needed to continue the simulations exactly: integration state and
    the per-env model parameters written by domain randomization."""
    out: dict[str, np.ndarray] = {}
    if isinstance(engine, BatchEngine):
        out["state_rows"] = engine._b.state.copy()
    else:
        for f in STATE_FIELDS:
            out[f"data.{f}"] = engine.get(f).copy()
    for name in sorted(engine.written_model_fields):
        out[f"model.{name}"] = np.array(engine.model_field(name), copy=True)
    return out


def load_engine_state(engine, state: dict[str, np.ndarray]) -> None:
    all_ids = np.arange(engine.num_envs)
    for key, value in state.items():
        kind, _, name = key.partition(".")
        if key == "state_rows":
            if engine._b.state.shape != value.shape:
                raise ValueError(
                    f"simulator state has shape {value.shape}, this env needs {engine._b.state.shape}"
                )
            engine._b.state[...] = value
        elif kind == "data":
            engine.set(name, value, all_ids)
        elif kind == "model":
            engine.set_model_field(name, value, all_ids)
    if any(k.startswith("model.") for k in state):
        engine.set_const(all_ids)
