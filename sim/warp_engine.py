"""MuJoCo Warp as a physics engine behind the same interface as sim.engine's.

`WarpEngine` steps all envs as the worlds of one `mujoco_warp` batch, on a CUDA device
or on Warp's CPU device, and offers what `BatchEngine` and `PoolEngine` offer (`get`,
`set`, `model_field`, `set_model_field`, `set_const`, `step`, `reset`, `forward`,
`get_data`, `get_model`), so every task runs on it unchanged: `sim.make(task, n,
backend="warp")`.

What differs from the C engines, and why:

- Warp computes in float32. From the same state and controls the trajectories agree
  to ~1e-3 after 100 control steps (tests/test_sim_warp.py measures it per task).
- `get` returns the device arrays as numpy. On Warp's CPU device that is a view of
  the engine's memory, as `BatchEngine.get` is; on a CUDA device it is a host copy,
  made once per field between two physics calls, and `set` writes through it: the
  numpy task hooks run on the host, one round trip per field and control step.
  `tensor` and `model_tensor` are zero-copy torch views of the same arrays on the
  device, for the torch task hooks (sim.device_step) that never leave it. On CUDA the
  physics substeps of a control step run as one captured CUDA graph.
- A batch forward pass, reset or set_const runs on every world (Warp's kernels take
  no world mask). `forward(ids)` and `set_const(ids)` therefore put back, for the
  worlds outside `ids`, every data field a task has read (and the solver's warm
  start), so that those envs see what the C engines would give them: the values of
  their last step, untouched.
- Per-env model fields (domain randomization) are batched when first written: the
  field, and for `set_const` the constants derived from it, become (num_envs, ...)
  arrays, which Warp's kernels index by world.

Warp compiles its kernels on first use (minutes on a CPU) and caches them; the cache
lives in `$SIM2REAL_WARP_CACHE` (default `~/.cache/sim2real/warp`) so that only the
first run on a machine pays.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import mujoco
import numpy as np

# constants mj_setConst derives from masses, inertias and gears: batched with them
_SET_CONST_OUTPUTS = (
    "body_subtreemass",
    "dof_invweight0",
    "body_invweight0",
    "tendon_invweight0",
    "actuator_acc0",
)
# fields forward() and set_const() may rewrite that a task does not read but the next
# step depends on (the solver's warm start)
_ALWAYS_KEPT = ("qacc_warmstart",)


_warp_ready = False


def warp_cache_dir() -> Path:
    """Where Warp's compiled kernels are kept ($SIM2REAL_WARP_CACHE)."""
    return Path(
        os.environ.get("SIM2REAL_WARP_CACHE") or Path.home() / ".cache" / "sim2real" / "warp"
    )


def _import_warp():
    """(warp, mujoco_warp), initialised with the project's kernel cache; ImportError
    that says which extra installs them."""
    try:
        import mujoco_warp
        import warp
    except ImportError as e:
        raise ImportError(
            "backend 'warp' needs mujoco-warp and warp-lang: pip install -e '.[gpu]' "
            f"({e})"
        ) from e
    global _warp_ready
    if not _warp_ready:
        # read by the first init() only (Warp appends its version); set again after it,
        # the path would be taken as the versioned folder itself
        cache = warp_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        warp.config.kernel_cache_dir = str(cache)
        warp.config.log_level = warp.LOG_WARNING  # no banner, no line per kernel module
        warp.init()
        _warp_ready = True
    return warp, mujoco_warp


def warp_device(device) -> str:
    """Warp's name for the device a torch device names: 'cpu' or 'cuda:N'."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cpu":
        return "cpu"
    if kind == "cuda":
        index = getattr(device, "index", None)
        return f"cuda:{0 if index is None else index}"
    raise ValueError(f"backend 'warp' runs on 'cpu' or 'cuda' devices, not {device!r}")


class WarpEngine:
    """All envs as the worlds of one MuJoCo Warp batch (see the module docstring)."""

    def __init__(
        self, model: mujoco.MjModel, num_envs: int, device: str = "cpu", rne_post: bool = False
    ):
        self.wp, self.mjw = _import_warp()
        self.model = model
        self.num_envs = num_envs
        self.device = device
        self.rne_post = rne_post
        self.written_model_fields: set[str] = set()
        self._read: set[str] = set()
        with self.wp.ScopedDevice(device):
            try:
                self.m = self.mjw.put_model(model)
            except NotImplementedError as e:  # e.g. humanoid.xml's PGS solver
                raise ValueError(
                    f"MuJoCo Warp cannot simulate this model: {e} Use backend 'c'."
                ) from e
            self.d = self.mjw.make_data(model, nworld=num_envs)
        self._is_cpu = device == "cpu"
        # CUDA only: host copies of data fields, valid until the next physics call, and
        # the captured graphs of `nsub` substeps
        self._host: dict[str, np.ndarray] = {}
        self._graphs: dict[int | str, object] = {}

    # -- data fields ---------------------------------------------------------------
    def _array(self, name: str):
        arr = getattr(self.d, name, None)
        if arr is None or not hasattr(arr, "numpy"):
            raise KeyError(f"MuJoCo Warp's Data has no array field {name!r}")
        return arr

    def get(self, name: str) -> np.ndarray:
        # on the CPU device a live view, as BatchEngine's bound arrays: callers that keep
        # a value must copy it
        self._read.add(name)
        return self._host_view(name)

    def _host_view(self, name: str) -> np.ndarray:
        if self._is_cpu:
            return self._array(name).numpy()
        if name not in self._host:
            self._host[name] = self._array(name).numpy()
        return self._host[name]

    def _device_changed(self) -> None:
        self._host.clear()

    def set(self, name: str, values: np.ndarray, ids: np.ndarray | None = None) -> None:
        host = self._host_view(name)
        if ids is None:
            host[...] = values
        else:
            host[np.asarray(ids, dtype=np.int64)] = values
        if not self._is_cpu:
            self._array(name).assign(host)

    # -- model fields --------------------------------------------------------------
    def _batched(self, name: str):
        """The model field `name` as a (num_envs, ...) array, made so on first use."""
        arr = getattr(self.m, name, None)
        if arr is None or not hasattr(arr, "numpy"):
            raise KeyError(f"MuJoCo Warp's Model has no array field {name!r}")
        if arr.shape[0] != self.num_envs:
            if arr.shape[0] != 1:
                raise ValueError(
                    f"model field {name!r} has a leading size of {arr.shape[0]}, neither 1 "
                    f"nor num_envs={self.num_envs}: it is not a per-world field in MuJoCo Warp"
                )
            tiled = np.repeat(arr.numpy(), self.num_envs, axis=0)
            arr = self.wp.array(tiled, dtype=arr.dtype, device=self.device)
            setattr(self.m, name, arr)
            self._graphs.clear()  # captured with the old array's address
        return arr

    def model_field(self, name: str) -> np.ndarray:
        return np.array(self._batched(name).numpy(), copy=True)

    def set_model_field(self, name: str, values: np.ndarray, ids: np.ndarray) -> None:
        arr = self._batched(name)
        host = arr.numpy()
        host[np.asarray(ids, dtype=np.int64)] = values
        if not self._is_cpu:
            arr.assign(host)
        self.written_model_fields.add(name)

    def set_const(self, ids: np.ndarray) -> None:
        for name in _SET_CONST_OUTPUTS:
            field = getattr(self.m, name, None)
            if field is not None and hasattr(field, "shape") and field.shape[0] == 1:
                self._batched(name)
        with self._others_kept(ids):
            self.mjw.set_const(self.m, self.d)
            self._device_changed()

    # -- stepping ------------------------------------------------------------------
    def step(self, ctrl: np.ndarray, nsub: int) -> None:
        self.set("ctrl", ctrl)
        self.physics(nsub)

    def physics(self, nsub: int) -> None:
        """`nsub` physics steps from the controls in place (written through `tensor`)."""
        with self._ordered_with_torch():
            self._physics(nsub)

    def _physics(self, nsub: int) -> None:
        if self._is_cpu:  # Warp has no graphs on the CPU
            self._substeps(nsub)
        else:
            if nsub not in self._graphs:
                self._substeps(nsub)  # compiles and loads every kernel before capture
                with self.wp.ScopedCapture(device=self.device) as capture:
                    self._substeps(nsub)
                self._graphs[nsub] = capture.graph
            self.wp.capture_launch(self._graphs[nsub])
        self._device_changed()

    def _substeps(self, nsub: int) -> None:
        for _ in range(nsub):
            self.mjw.step(self.m, self.d)
        if self.rne_post:
            self.mjw.rne_postconstraint(self.m, self.d)

    def reset(self, ids: np.ndarray) -> None:
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[np.asarray(ids, dtype=np.int64)] = True
        self.mjw.reset_data(
            self.m, self.d, reset=self.wp.array(mask, dtype=bool, device=self.device)
        )
        self._device_changed()

    def forward(self, ids: np.ndarray) -> None:
        with self._others_kept(ids):
            self.mjw.forward(self.m, self.d)
            if self.rne_post:
                self.mjw.rne_postconstraint(self.m, self.d)
            self._device_changed()

    @contextlib.contextmanager
    def _others_kept(self, ids: np.ndarray) -> Iterator[None]:
        """Run a whole-batch pass, then put back what it changed in the worlds outside
        `ids` among the fields that tasks read (and the warm start)."""
        others = np.setdiff1d(np.arange(self.num_envs), np.asarray(ids, dtype=np.int64))
        names = sorted(self._read | set(_ALWAYS_KEPT)) if len(others) else []
        kept = {n: self._host_view(n)[others].copy() for n in names}
        yield
        for n, v in kept.items():
            self.set(n, v, others)

    # -- torch views, for task hooks that stay on the device (sim.device_step) -------
    def tensor(self, name: str):
        """Data field `name` as a torch tensor sharing the engine's memory on its
        device ((num_envs, ...); vectors as a trailing axis): reads see the last physics
        call, writes reach the next one."""
        self._read.add(name)
        return self.wp.to_torch(self._array(name), requires_grad=False)

    def model_tensor(self, name: str):
        """Model field `name` batched per world (sim.randomization), as a torch view.
        Take every view before the first `physics` call: batching a field later moves
        it, and a view taken before would write to the old array."""
        field = self._batched(name)
        self.written_model_fields.add(name)
        return self.wp.to_torch(field, requires_grad=False)

    @contextlib.contextmanager
    def _ordered_with_torch(self) -> Iterator[None]:
        """On CUDA, order Warp's stream after torch's current one and torch's after
        Warp's: the torch ops that wrote the inputs (controls, reset states, model
        fields) finish before the kernels read them, and the kernels before the torch
        ops that read their outputs. Neither waits on the host."""
        if self._is_cpu:
            yield
            return
        import torch

        theirs = self.wp.stream_from_torch(torch.cuda.current_stream(torch.device(self.device)))
        mine = self.wp.get_stream(self.device)
        mine.wait_stream(theirs)
        yield
        theirs.wait_stream(mine)

    def reset_where(self, mask) -> None:
        """mj_resetData for the worlds where the torch bool tensor `mask` is set."""
        with self._ordered_with_torch():
            reset = self.wp.from_torch(mask, dtype=self.wp.bool)
            self.mjw.reset_data(self.m, self.d, reset=reset)
        self._device_changed()

    def forward_all(self) -> None:
        """A forward pass of every world (the caller keeps what it must of the others);
        on CUDA one captured graph, as the substeps."""
        with self._ordered_with_torch():
            if self._is_cpu:
                self._forward()
            else:
                if "forward" not in self._graphs:
                    self._forward()  # compiles and loads every kernel before capture
                    with self.wp.ScopedCapture(device=self.device) as capture:
                        self._forward()
                    self._graphs["forward"] = capture.graph
                self.wp.capture_launch(self._graphs["forward"])
        self._device_changed()

    def _forward(self) -> None:
        self.mjw.forward(self.m, self.d)
        if self.rne_post:
            self.mjw.rne_postconstraint(self.m, self.d)

    def set_const_all(self) -> None:
        """mj_setConst of every world, its outputs batched per world."""
        for name in _SET_CONST_OUTPUTS:
            field = getattr(self.m, name, None)
            if field is not None and hasattr(field, "shape") and field.shape[0] == 1:
                self._batched(name)
        with self._ordered_with_torch():
            self.mjw.set_const(self.m, self.d)
        self._device_changed()

    # -- single envs (rendering, inspection) ----------------------------------------
    def get_model(self, i: int) -> mujoco.MjModel:
        """Env `i`'s MjModel: the nominal one with its per-env fields written in."""
        if not self.written_model_fields:
            return self.model
        m = copy.copy(self.model)
        for name in self.written_model_fields:
            value = self.model_field(name)[i]
            getattr(m, name)[...] = value.reshape(getattr(m, name).shape)
        mujoco.mj_setConst(m, mujoco.MjData(m))
        return m

    def get_data(self, i: int) -> mujoco.MjData:
        """A C MjData of env `i`'s state, forwarded (a copy: writing it changes nothing)."""
        m = self.get_model(i)
        d = mujoco.MjData(m)
        for name in ("qpos", "qvel", "act", "ctrl", "qfrc_applied", "xfrc_applied"):
            dst = getattr(d, name)
            if dst.size:
                dst[...] = self._array(name).numpy()[i].reshape(dst.shape)
        d.time = float(self._array("time").numpy()[i])
        mujoco.mj_forward(m, d)
        return d
