"""The VecEnv contract and its CPU MuJoCo implementation.

Conventions follow Isaac Lab / rsl_rl: observations are named groups of torch
tensors, episodes reset inside `step`, and the true last observation of an ended
episode is returned in `info["final_obs"]` so that time-outs bootstrap correctly.
A task subclasses `MujocoVecEnv` and fills in a few vectorized hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

import mujoco
import numpy as np
import torch

from sim.engine import SimulationFailure, engine_state, load_engine_state, make_engine
from sim.kernels import all_finite, finish_step
from sim.randomization import LatencyQueue, ModelRandomizer, ObsHistory, SimToRealConfig
from sim.spec import (
    ActionSpec,
    JointIndices,
    ObservationSpec,
    ObsGroup,
    ObsTerm,
    RobotDescription,
)

# torch dtypes numpy can build directly, so a CPU tensor is one numpy copy, no torch op
_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bool: np.bool_,
    torch.int64: np.int64,
    torch.int32: np.int32,
}


def joint_indices_of(model: mujoco.MjModel, joint_names: tuple[str, ...]) -> JointIndices:
    """The actuator, qpos and dof index of each named joint of `model`.

    Each joint's actuator is the one actuator with a joint transmission on it; a joint
    that no actuator, or more than one, drives has no single index, so ValueError.
    """
    driven = model.actuator_trntype == mujoco.mjtTrn.mjTRN_JOINT
    jids, acts = [], []
    for name in joint_names:
        j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if j < 0:
            raise ValueError(f"the model has no joint named {name!r}")
        hits = np.nonzero(driven & (model.actuator_trnid[:, 0] == j))[0]
        if len(hits) != 1:
            raise ValueError(
                f"joint {name!r} is driven by {len(hits)} actuators; joint indices need "
                "exactly one actuator per action joint"
            )
        jids.append(j)
        acts.append(int(hits[0]))
    ids = np.array(jids, dtype=np.int64)
    return JointIndices(
        tuple(joint_names),
        np.array(acts, dtype=np.int64),
        model.jnt_qposadr[ids],
        model.jnt_dofadr[ids],
    )


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can use (MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(model: mujoco.MjModel, num_envs: int, task: str) -> None:
    """Refuse at once a batch whose simulator state cannot fit in memory, with the
    estimate, instead of allocating for minutes and failing (or swapping) later.

    The estimate is a lower bound: MjData's buffer (the state and everything the step
    writes) per env, without MuJoCo's arena or the observation buffers.
    """
    available = available_memory()
    if available is None:
        return
    per_env = mujoco.MjData(model).nbuffer
    need = per_env * num_envs
    if need > available:
        raise ValueError(
            f"num_envs={num_envs} of task {task!r} needs at least {need / 2**30:.1f} GiB for "
            f"the simulator state ({per_env / 1024:.1f} KiB per env), but {available / 2**30:.1f}"
            f" GiB of memory are available; use at most {available // per_env:,} envs"
        )


class MujocoVecEnv:
    """N copies of one MuJoCo task, stepped in native code, batched end to end.

    Subclasses set the class attributes and implement the `_task_*` hooks; every
    hook works on whole (num_envs, ...) numpy arrays.
    """

    name: str = ""
    frame_skip: int = 1
    max_episode_steps: int = 1000
    rne_post: bool = False  # needs cfrc_ext as Gymnasium computes it
    base_body: str | None = None  # body that receives pushes and added mass
    # constraints the task reports as info "cstr_<name>" (violation >= 0), for CaT
    constraint_names: tuple[str, ...] = ()

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        s2r: SimToRealConfig | None = None,
        num_threads: int = 0,
        dtype: torch.dtype = torch.float32,
        nan_action: str = "raise",
        max_episode_steps: int | None = None,
        backend: str = "c",
    ):
        if not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if nan_action not in ("raise", "reset"):
            raise ValueError(f"nan_action must be 'raise' or 'reset', got {nan_action!r}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.nan_action = nan_action
        if max_episode_steps is not None:
            if max_episode_steps < 1:
                raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
            self.max_episode_steps = int(max_episode_steps)
        self.s2r = s2r if s2r is not None else self.default_s2r()
        self.model = self._task_model()
        if backend == "c":
            # a diverged simulation keeps its bad state, so that the step sees it and ends
            # the episode (sim.kernels.finish_step); with MuJoCo's auto-reset it would
            # carry on silently from the model's default pose, mid-episode
            self.model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
        check_memory(self.model, self.num_envs, self.name)
        # backend "warp" steps the batch with MuJoCo Warp on `device` (sim.warp_engine)
        self.backend = backend
        self.engine = make_engine(
            self.model,
            self.num_envs,
            num_threads,
            rne_post=self.rne_post,
            backend=backend,
            device=str(self.device),
        )
        self.physics_dt = float(self.model.opt.timestep)
        self.dt = self.physics_dt * self.frame_skip  # control period
        self._rng = np.random.default_rng(seed)
        self._base_id = (
            mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, self.base_body)
            if self.base_body
            else None
        )
        self.randomizer = ModelRandomizer(
            self.engine,
            self.s2r,
            self._base_id,
            position_actuators=self.robot.control_mode == "position",
        )
        terms = self._task_obs_terms()
        policy = ObsGroup(
            tuple(ObsTerm(n, s) for n, s in terms["policy"]), history=self.s2r.obs_history
        )
        groups = {"policy": policy}
        if "critic" in terms:
            groups["critic"] = ObsGroup(tuple(ObsTerm(n, s) for n, s in terms["critic"]))
        self.observation_spec = ObservationSpec(groups)
        low, high = self._task_action_bounds()
        self.action_spec = ActionSpec(len(low), low, high, self.robot.joint_names)
        n, a = self.num_envs, self.action_spec.size
        self._noise_std = self._per_term(self.s2r.obs_noise, "obs_noise")
        self._bias_std = self._per_term(self.s2r.obs_bias, "obs_bias")
        self._bias = np.zeros((n, policy.frame_size))
        self._latency = LatencyQueue(n, a, self.s2r.action_latency[1])
        self._history = ObsHistory(n, policy.frame_size, policy.history)
        self.episode_length = np.zeros(n, dtype=np.int64)
        self.episode_return = np.zeros(n)
        self.last_action = np.zeros((n, a))
        self._next_push = np.full(n, np.inf)
        self._obs: dict[str, torch.Tensor] | None = None
        self._all = np.arange(n)
        self._no_env = np.zeros(n, dtype=bool)  # never written: "no env" for the step kernel
        self._term_sizes = {
            g: [(t.name, t.size) for t in spec.terms]
            for g, spec in self.observation_spec.groups.items()
        }
        self._cpu = self.device.type == "cpu"
        self._memo: dict[str, Any] | None = None
        self._noise_flags()

    # ------------------------------------------------------------------ task hooks
    @classmethod
    def default_s2r(cls) -> SimToRealConfig:
        return SimToRealConfig()

    def _task_model(self) -> mujoco.MjModel:
        raise NotImplementedError

    @property
    def robot(self) -> RobotDescription:
        raise NotImplementedError

    def _task_obs_terms(self) -> dict[str, list[tuple[str, int]]]:
        raise NotImplementedError

    def _task_action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.model.actuator_ctrlrange[:, 0].copy(), self.model.actuator_ctrlrange[
            :, 1
        ].copy()

    def _task_ctrl(self, actions: np.ndarray) -> np.ndarray:
        """Map policy actions to MuJoCo controls."""
        return actions

    def _task_pre_step(self) -> Any:
        """Read what the reward needs from before the physics step."""
        return None

    def _task_obs(self) -> dict[str, np.ndarray]:
        """Every observation term, by name, as (num_envs, size) arrays."""
        raise NotImplementedError

    def _task_reward(self, pre: Any, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
        """(reward, terminated, per-term extras) for the step just taken."""
        raise NotImplementedError

    def _task_reset(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        """Write the initial state of envs `ids` into the engine (after mj_resetData)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    def _per_step(self, key: str, compute: Any) -> Any:
        """`compute()`, computed once between a step's physics and its resets.

        A task's reward and its observation both read the state the step left (the base
        pose of a legged robot, say); inside `step` that state does not change until the
        ended episodes reset, so the second reader takes the first one's value. Outside
        `step` (reset, set_state) every call computes. Readers must not write the value.
        """
        memo = self._memo
        if memo is None:
            return compute()
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def _per_term(self, stds: dict[str, float], what: str) -> np.ndarray:
        group = self.observation_spec.policy
        slices = group.slices()
        unknown = set(stds) - set(slices)
        if unknown:
            raise ValueError(
                f"{what} names unknown observation terms {sorted(unknown)}; terms: {list(slices)}"
            )
        out = np.zeros(group.frame_size)
        for k, v in stds.items():
            out[slices[k]] = v
        return out

    def _noise_flags(self) -> None:
        # asked every step; the stds change only at construction and load_state_dict
        self._has_noise = bool(self._noise_std.any())
        self._has_bias = bool(self._bias_std.any())

    def _assemble(self, terms: dict[str, np.ndarray], group: str) -> np.ndarray:
        n = self.num_envs
        return np.concatenate(
            [terms[name].reshape(n, size) for name, size in self._term_sizes[group]], axis=1
        )

    def _to_torch(self, x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        np_dtype = _NUMPY_DTYPES.get(dtype)
        if self._cpu and np_dtype is not None:
            # a fresh copy, so never a view of an internal buffer; numpy's cast rounds as
            # torch's does, and costs a third of from_numpy().to() at a few envs
            return torch.from_numpy(np.array(x, dtype=np_dtype, order="C"))
        t = torch.from_numpy(np.ascontiguousarray(x))
        out = t.to(device=self.device, dtype=dtype)
        # never hand out a view of an internal buffer (e.g. dtype=float64 on CPU)
        return out.clone() if out.data_ptr() == t.data_ptr() else out

    def _rows_to_torch(
        self, rows: list[np.ndarray], dtype: torch.dtype
    ) -> tuple[torch.Tensor, ...]:
        """Equal-length 1-D arrays as tensors: one copy and one transfer for them all (the
        tensors are rows of one fresh block, which nothing else holds)."""
        np_dtype = _NUMPY_DTYPES.get(dtype)
        if np_dtype is None:
            return tuple(self._to_torch(r, dtype) for r in rows)
        block = torch.from_numpy(np.array(rows, dtype=np_dtype))
        if not self._cpu:
            block = block.to(self.device)
        return block.unbind(0)

    def _observe(self, reset_ids: np.ndarray | None) -> dict[str, torch.Tensor]:
        terms = self._task_obs()
        frame = self._assemble(terms, "policy")
        if self._has_noise:
            frame = frame + self._rng.standard_normal(frame.shape) * self._noise_std
        if self._has_bias:
            frame = frame + self._bias
        if reset_ids is not None:
            # only the reset envs get a new frame; the others keep their history as it is
            # (pushing here too would stack their current frame twice)
            self._history.reset(reset_ids, frame[reset_ids])
            policy = self._history.buf.reshape(self.num_envs, -1)
        else:
            policy = self._history.push(frame)
        obs = {"policy": policy}
        if "critic" in self.observation_spec.groups:
            obs["critic"] = self._assemble(terms, "critic")
        return {k: self._to_torch(v) for k, v in obs.items()}

    def _reset_envs(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        eng = self.engine
        eng.reset(ids)
        self.randomizer.apply(ids, self._rng)
        self._task_reset(ids, self._rng)
        eng.forward(ids)
        lo, hi = self.s2r.action_latency
        self._latency.reset(ids, self._rng.integers(lo, hi + 1, size=len(ids)), 0.0)
        if self._has_bias:
            self._bias[ids] = (
                self._rng.standard_normal((len(ids), self._bias.shape[1])) * self._bias_std
            )
        if self.s2r.push_interval_s:
            self._next_push[ids] = self._rng.exponential(self.s2r.push_interval_s, size=len(ids))
        self.episode_length[ids] = 0
        self.episode_return[ids] = 0.0
        self.last_action[ids] = 0.0

    def _validate_actions(self, actions: Any) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            if not actions.is_floating_point():
                raise TypeError(
                    f"actions must be a floating-point tensor, got dtype {actions.dtype}"
                )
            if actions.device.type == "cpu" and actions.dtype in (torch.float32, torch.float64):
                # numpy's cast is torch's, without a torch op (a few us per step)
                actions = actions.detach().numpy().astype(np.float64, copy=False)
            else:
                actions = actions.detach().to("cpu", torch.float64).numpy()
        else:
            actions = np.asarray(actions)
            if actions.dtype.kind != "f":
                raise TypeError(f"actions must be floating point, got dtype {actions.dtype}")
            actions = actions.astype(np.float64, copy=False)
        want = (self.num_envs, self.action_spec.size)
        if actions.shape != want:
            raise ValueError(
                f"actions must have shape {want} (num_envs, action size), got {tuple(actions.shape)}"
            )
        return actions

    def _apply_pushes(self) -> None:
        if not self.s2r.push_interval_s or self._base_id is None:
            return
        t = self.episode_length * self.dt
        due = np.nonzero(t >= self._next_push)[0]
        if len(due) == 0:
            return
        # a push is a sudden change of the base's planar velocity (a free joint's
        # first two velocity coordinates, as in legged_gym)
        qvel = self.engine.get("qvel")[due].copy()
        qvel[:, :2] += self._rng.uniform(
            -self.s2r.push_velocity, self.s2r.push_velocity, size=(len(due), 2)
        )
        self.engine.set("qvel", qvel, due)
        self._next_push[due] = t[due] + self._rng.exponential(
            self.s2r.push_interval_s, size=len(due)
        )

    def body_ids(self, bodies: Sequence[str] | None = None) -> np.ndarray:
        """Model ids of the named bodies (None: the task's base body); ValueError naming
        a body the model lacks, or a task without a base body."""
        if bodies is None:
            if self.base_body is None:
                raise ValueError(f"task {self.name!r} names no base body; name the bodies")
            bodies = (self.base_body,)
        ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, b) for b in bodies]
        missing = [b for b, i in zip(bodies, ids) if i < 0]
        if missing or not ids:
            raise ValueError(f"task {self.name!r} has no bodies {missing or list(bodies)}")
        return np.array(ids, dtype=np.int64)

    def set_external_forces(self, forces: Any, bodies: Sequence[str] | None = None) -> None:
        """Apply world-frame forces (N) at the centres of mass of `bodies` (None: the base
        body) in every env, from the next physics step until they are set again or the
        env resets (MuJoCo's xfrc_applied, which a reset zeroes); e.g. an adversary's.

        `forces`: (num_envs, len(bodies), 3), or (num_envs, 3) for one body; finite.
        """
        ids = self.body_ids(bodies)
        if isinstance(forces, torch.Tensor):
            forces = forces.detach().to("cpu", torch.float64).numpy()
        forces = np.asarray(forces, dtype=np.float64)
        if forces.shape == (self.num_envs, 3) and len(ids) == 1:
            forces = forces[:, None, :]
        if forces.shape != (self.num_envs, len(ids), 3):
            raise ValueError(
                f"forces must have shape {(self.num_envs, len(ids), 3)} (num_envs, bodies, 3), "
                f"got {forces.shape}"
            )
        if not np.isfinite(forces).all():
            raise ValueError("external forces must be finite")
        # xfrc_applied is integration state: the engine keeps it, and checkpoints with it
        xfrc = self.engine.get("xfrc_applied").copy()
        xfrc[:, ids, :3] = forces
        xfrc[:, ids, 3:] = 0.0
        self.engine.set("xfrc_applied", xfrc)

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._reset_envs(self._all)
        self._obs = self._observe(self._all)
        return self._obs

    def step(self, actions: Any):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        n = self.num_envs
        prev_obs = self._obs
        actions = self._validate_actions(actions)
        bad = self._no_env
        if not all_finite(actions):
            bad = ~np.isfinite(actions).all(axis=1)
            if self.nan_action == "raise":
                raise ValueError(
                    f"non-finite actions (NaN or inf) for envs {np.nonzero(bad)[0][:16].tolist()}; "
                    "nothing was stepped"
                )
            actions = actions.copy()
            actions[bad] = 0.0
        applied = self._latency.push(actions)
        self._apply_pushes()
        pre = self._task_pre_step()
        failed = self._no_env
        try:
            self.engine.step(self._task_ctrl(applied), self.frame_skip)
        except SimulationFailure as e:
            failed = np.zeros(n, dtype=bool)
            failed[e.ids] = True
        rew = np.empty(n)
        flags = np.empty((3, n), dtype=bool)  # unstable, terminated, truncated
        self._memo = {}
        try:
            reward, terminated, extras = self._task_reward(pre, applied)
            # a diverged simulation ends its episode instead of poisoning the batch: its
            # reward becomes 0 and it terminates (one kernel, with the episode counters)
            ndone = finish_step(
                self.engine.get("qpos"),
                self.engine.get("qvel"),
                np.asarray(reward),
                np.asarray(terminated, dtype=bool),
                bad,
                failed,
                self.episode_length,
                self.max_episode_steps,
                self.episode_return,
                rew,
                flags,
            )
            self.last_action = actions.copy()
            obs = self._observe(None)
        finally:
            self._memo = None
        # reward and the task's per-env terms leave as rows of one tensor, the flags as
        # rows of another: two conversions a step instead of one per value
        names = [k for k, v in extras.items() if getattr(v, "shape", None) == (n,)]
        rows = self._rows_to_torch([rew] + [extras[k] for k in names], self.dtype)
        reward_t, extra_t = rows[0], dict(zip(names, rows[1:]))
        info: dict[str, Any] = {
            k: extra_t[k] if k in extra_t else self._to_torch(v) for k, v in extras.items()
        }
        unstable_t, terminated_t, truncated_t = self._rows_to_torch(flags, torch.bool)
        info["unstable"] = unstable_t
        if ndone:
            done = flags[1] | flags[2]
            done_ids = np.nonzero(done)[0]
            info["final_obs"] = {k: v.clone() for k, v in obs.items()}
            if flags[0].any():
                self._contain_unstable(flags[0], info, prev_obs)
            info["episode"] = {
                "done": self._to_torch(done, torch.bool),
                "return": self._to_torch(self.episode_return.copy()),
                "length": self._to_torch(self.episode_length.copy(), torch.int64),
            }
            self._reset_envs(done_ids)
            fresh = self._observe(done_ids)
            mask = self._to_torch(done, torch.bool)
            # the env axis is the first of every group, flat or not (an image group is
            # [N, H, W, C]): a [N, 1] mask would broadcast along W when N == H
            obs = {
                k: torch.where(mask.view(-1, *([1] * (v.dim() - 1))), fresh[k], v)
                for k, v in obs.items()
            }
        else:
            info["final_obs"] = obs
        self._obs = obs
        return obs, reward_t, terminated_t, truncated_t, info

    def _contain_unstable(
        self, unstable: np.ndarray, info: dict[str, Any], prev_obs: dict[str, torch.Tensor]
    ) -> None:
        """An unstable env (diverged simulation, bad actions) ends its episode with its
        last sane observation as the final one and zeros in its per-env info terms: a
        NaN or 1e30 there would reach a critic's bootstrap (0 * NaN is NaN), a replay
        buffer, or a running statistic such as CaT's maxima, and stay."""
        mask = self._to_torch(unstable, torch.bool)
        final = info["final_obs"]
        for k, v in final.items():
            v[mask] = prev_obs[k][mask]
        n = self.num_envs
        for v in info.values():
            if isinstance(v, torch.Tensor) and v.shape == (n,) and v.is_floating_point():
                v[mask] = 0.0

    # ------------------------------------------------------------------ checkpointing
    def _stateful_parts(self) -> dict[str, object]:
        return {
            "env": self,
            "randomizer": self.randomizer,
            "latency": self._latency,
            "history": self._history,
        }

    def state_dict(self) -> dict[str, Any]:
        """All that is needed to continue these episodes exactly: physics state,
        per-env model parameters, episode counters, queues, task state, RNG state.

        Task state is captured generically: every numpy array attribute of the env
        (and of its sim-to-real helpers), so tasks need no code of their own.
        """
        arrays = {}
        for part, obj in self._stateful_parts().items():
            for k, v in vars(obj).items():
                if isinstance(v, np.ndarray):
                    arrays[f"{part}.{k}"] = v.copy()
        return {
            "task": self.name,
            "num_envs": self.num_envs,
            "arrays": arrays,
            "latency_head": self._latency.head,
            "rng": self._rng.bit_generator.state,
            "engine": engine_state(self.engine),
        }

    def _check_state_fits(self, state: dict[str, Any]) -> None:
        if state.get("task") != self.name or state.get("num_envs") != self.num_envs:
            raise ValueError(
                f"env state is for task {state.get('task')!r} with {state.get('num_envs')} envs; "
                f"this env is {self.name!r} with {self.num_envs}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state_fits(state)
        if "tensors" in state:
            raise ValueError(
                "env state was saved by an env with torch task hooks (hooks='torch'); this "
                "env runs its hooks in numpy: their states do not convert"
            )
        parts = self._stateful_parts()
        for key, value in state["arrays"].items():
            part, _, attr = key.partition(".")
            obj = parts[part]
            current = getattr(obj, attr, None)
            if not isinstance(current, np.ndarray) or current.shape != value.shape:
                raise ValueError(f"env state field {key} does not fit this env")
            current[...] = value
        self._latency.head = int(state["latency_head"])
        self._obs = {}  # episodes are under way: step() may continue them
        self._rng.bit_generator.state = state["rng"]
        load_engine_state(self.engine, state["engine"])
        self._noise_flags()

    # ------------------------------------------------------------------ extras
    def get_state(self) -> dict[str, np.ndarray]:
        """Physics state of every env (qpos, qvel), e.g. to start Gymnasium from it."""
        return {"qpos": self.engine.get("qpos").copy(), "qvel": self.engine.get("qvel").copy()}

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray, ids: np.ndarray | None = None) -> None:
        ids = self._all if ids is None else np.asarray(ids)
        self.engine.set("qpos", qpos, ids)
        self.engine.set("qvel", qvel, ids)
        self.engine.forward(ids)
        self._obs = self._observe(ids)

    def render(
        self, env_id: int = 0, width: int = 480, height: int = 360, camera: str | int = -1
    ) -> np.ndarray:
        """An RGB frame of one env (offscreen; set MUJOCO_GL=egl on a headless machine)."""
        if not hasattr(self, "_renderer"):
            self._renderer = mujoco.Renderer(self.model, height=height, width=width)
        data = self.engine.get_data(env_id)
        self._renderer.update_scene(data, camera=camera)
        return self._renderer.render()

    def close(self) -> None:
        if hasattr(self, "_renderer"):
            self._renderer.close()

    @cached_property
    def joint_indices(self) -> JointIndices:
        """Actuator, qpos and dof index of each action joint, in `action_spec.joint_names`
        order (read-only arrays; ValueError where an action joint has no single actuator).

        Derived from the model; tasks that index their joints themselves override it.
        """
        return joint_indices_of(self.model, self.action_spec.joint_names)

    @property
    def control_rate_hz(self) -> float:
        return 1.0 / self.dt

    @property
    def physics_rate_hz(self) -> float:
        return 1.0 / self.physics_dt

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(task={self.name!r}, num_envs={self.num_envs}, dt={self.dt:g})"
        )
