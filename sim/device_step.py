"""A task's step as torch ops on the simulator's device: no host round trip per step.

With backend "warp" a task's numpy hooks (MujocoVecEnv) run on the host, so on a GPU
every field a task reads crosses to the host and back once per control step. A task
that also writes its hooks in torch (`_t_obs`, `_t_reward`, `_t_reset`, and where it
needs them `_t_pre_step`, `_t_ctrl`) runs, with `DeviceStep` before it in the class's
bases, a step made of torch ops on tensors that share the Warp engine's memory: actions,
latency, pushes, controls, physics (one CUDA graph), reward, episode ends, resets,
domain randomization, noise and history all stay on the device. `sim.make(...,
backend="warp", hooks="torch")` builds one; on CUDA it is the default where the task
has the hooks (sim.registry).

What differs from the numpy step, and why:

- Random draws come from a torch generator on the device seeded with `seed`: the same
  distributions as the numpy step's, other numbers.
- Which envs ended is never asked on the host: every step runs the reset path under
  the mask of ended envs (mj_resetData of those worlds, a forward pass of all, the
  fields a task reads put back in the others), and `info["episode"]` is in every
  step's info, its `done` saying which envs it is about. On Warp's CPU device, where
  asking costs nothing, the step skips that path when no env ended
  (`skip_idle_resets`; the draws then differ from a GPU run's of the same seed).
- nan_action="raise" asks the device once a step whether the actions are finite (one
  scalar); "reset" ends the episodes of the bad envs without asking.
- Warp computes in float32, and the hooks compute in float32 too, but for what a task
  writes into the simulation that the numpy hooks compute in float64 (the legged
  tasks' PD targets): that is rounded once, as theirs, so both give the same physics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sim.engine import engine_state, load_engine_state
from sim.kernels import MAX_STATE_VALUE

# fields a forward pass rewrites that the next step depends on though no hook reads them
_KEEP_ALWAYS = ("qacc_warmstart",)


class DeviceStep:
    """Mixin before a MujocoVecEnv task class: its reset, step and state in torch."""

    def __init__(
        self,
        num_envs: int = 1,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        s2r=None,
        **kwargs,
    ):
        kwargs.setdefault("backend", "warp")
        if kwargs["backend"] != "warp":
            raise ValueError(
                f"torch task hooks need backend 'warp' (tensors on the engine's memory), "
                f"not {kwargs['backend']!r}"
            )
        super().__init__(num_envs, seed, device, s2r, **kwargs)
        dev, n, a = self.device, self.num_envs, self.action_spec.size
        self._gen = torch.Generator(device=dev)
        self._gen.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        self._views: dict[str, torch.Tensor] = {}
        self._tobs: dict[str, torch.Tensor] | None = None
        self._model_views = self._randomized_fields()
        policy = self.observation_spec.policy
        self._t_noise_std = self.const(self._noise_std)
        self._t_bias_std = self.const(self._bias_std)
        self.obs_bias = torch.zeros(n, policy.frame_size, device=dev)
        depth = self.s2r.action_latency[1] + 1
        self.latency_buf = torch.zeros(depth, n, a, device=dev)
        self.latency_delay = torch.zeros(n, dtype=torch.int64, device=dev)
        self._latency_head = 0
        self.history = torch.zeros(n, policy.history, policy.frame_size, device=dev)
        self.episode_length = torch.zeros(n, dtype=torch.int64, device=dev)
        self.episode_return = torch.zeros(n, device=dev)
        self.last_action = torch.zeros(n, a, device=dev)
        self.next_push = torch.full((n,), float("inf"), device=dev)
        r = self.randomizer
        self.friction = torch.ones(n, device=dev)
        self.added_mass = torch.zeros(n, device=dev)
        self.mass_scale = torch.ones(n, device=dev)
        self.strength = torch.ones(n, self.model.nu, device=dev)
        self._nominal = {
            "body_mass": self.const(r.nominal_mass),
            "body_inertia": self.const(self.model.body_inertia),
            "geom_friction": self.const(r.nominal_friction),
            "actuator_gear": self.const(r.nominal_gear),
            "actuator_gainprm": self.const(r.nominal_gain),
            "actuator_biasprm": self.const(r.nominal_bias),
            "actuator_forcerange": self.const(r.nominal_force),
        }
        self._rows = torch.arange(n, device=dev)
        # on a CUDA device, asking whether any env ended would wait for the device
        self.skip_idle_resets = dev.type == "cpu"
        if "body_mass" in self._model_views:
            self.engine.set_const_all()  # batches its outputs now, before any graph

    @classmethod
    def torch_unsupported(cls, options: dict[str, Any]) -> str | None:
        """Why the task's torch hooks cannot run with these constructor options (None:
        they can); sim.registry then keeps the numpy hooks, or names the reason."""
        return None

    # ------------------------------------------------------------------ helpers
    def const(self, x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A constant of the task (numpy, number) as a tensor on the env's device."""
        return torch.as_tensor(np.asarray(x), dtype=dtype, device=self.device)

    def field(self, name: str) -> torch.Tensor:
        """Data field `name` of every env as a torch view of the engine's memory."""
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self.engine.tensor(name)
        return view

    def write(self, name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Write `values` ((num_envs, ...)) into data field `name`, in the envs of `mask`."""
        view = self.field(name)
        if mask is None:
            view.copy_(values)
        else:
            view.copy_(torch.where(_rows(mask, view), values.to(view.dtype), view))

    def uniform(self, low: float, high: float, shape) -> torch.Tensor:
        x = torch.rand(shape, generator=self._gen, device=self.device)
        return low + (high - low) * x

    def normal(self, shape) -> torch.Tensor:
        return torch.randn(shape, generator=self._gen, device=self.device)

    # ------------------------------------------------------------------ torch hooks
    def _t_pre_step(self) -> Any:
        return None

    def _t_ctrl(self, actions: torch.Tensor) -> torch.Tensor:
        return actions

    def _t_obs(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _t_reward(self, pre: Any, actions: torch.Tensor):
        raise NotImplementedError

    def _t_reset(self, mask: torch.Tensor) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ randomization
    def _randomized_fields(self) -> dict[str, torch.Tensor]:
        """Views of the model fields the sim-to-real config draws, batched now."""
        cfg, names = self.s2r, []
        if cfg.mass_scale is not None or cfg.added_base_mass is not None:
            names += ["body_mass", "body_inertia"]
        if cfg.friction_scale is not None:
            names.append("geom_friction")
        if cfg.motor_strength is not None or cfg.kp_scale is not None or cfg.kd_scale is not None:
            if self.randomizer.position_actuators:
                names += ["actuator_gainprm", "actuator_biasprm", "actuator_forcerange"]
            else:
                names.append("actuator_gear")
        return {name: self.engine.model_tensor(name) for name in names}

    def _draw(self, r, shape) -> torch.Tensor:
        if r is None:
            return torch.ones(shape, device=self.device)
        return self.uniform(r[0], r[1], shape)

    def _set_model(self, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        view = self._model_views[name]
        view.copy_(torch.where(_rows(mask, view), values.to(view.dtype), view))

    def _t_randomize(self, mask: torch.Tensor) -> None:
        """ModelRandomizer.apply under a mask: every env draws, the masked ones take it."""
        cfg, n, nom = self.s2r, self.num_envs, self._nominal
        views = self._model_views
        if "body_mass" in views:
            scale = self._draw(cfg.mass_scale, (n, 1))
            mass = nom["body_mass"] * scale
            added = torch.zeros(n, device=self.device)
            if cfg.added_base_mass is not None and self._base_id is not None:
                added = self.uniform(*cfg.added_base_mass, (n,))
                mass[:, self._base_id] += added
            self.mass_scale = torch.where(mask, scale[:, 0], self.mass_scale)
            self.added_mass = torch.where(mask, added, self.added_mass)
            self._set_model("body_mass", mass, mask)
            ratio = mass / nom["body_mass"].clamp_min(1e-12)
            self._set_model("body_inertia", nom["body_inertia"] * ratio[..., None], mask)
            # every world; the others' constants come out as they were (same masses)
            self.engine.set_const_all()
        if "geom_friction" in views:
            f = self._draw(cfg.friction_scale, (n, 1))
            fr = nom["geom_friction"].expand(n, -1, -1).clone()
            fr[:, :, 0] *= f
            self.friction = torch.where(mask, f[:, 0], self.friction)
            self._set_model("geom_friction", fr, mask)
        if "actuator_gainprm" in views or "actuator_gear" in views:
            nu = self.model.nu
            s = self._draw(cfg.motor_strength, (n, nu))
            self.strength = torch.where(mask[:, None], s, self.strength)
            if "actuator_gainprm" in views:
                kp = self._draw(cfg.kp_scale, (n, nu)) * s
                kd = self._draw(cfg.kd_scale, (n, nu)) * s
                gain = nom["actuator_gainprm"].expand(n, -1, -1).clone()
                bias = nom["actuator_biasprm"].expand(n, -1, -1).clone()
                gain[:, :, 0] *= kp
                bias[:, :, 1] *= kp
                bias[:, :, 2] *= kd
                self._set_model("actuator_gainprm", gain, mask)
                self._set_model("actuator_biasprm", bias, mask)
                self._set_model(
                    "actuator_forcerange", nom["actuator_forcerange"] * s[..., None], mask
                )
            else:
                gear = nom["actuator_gear"].expand(n, -1, -1).clone()
                gear[:, :, 0] *= s
                self._set_model("actuator_gear", gear, mask)

    # ------------------------------------------------------------------ resets
    def _forward_where(self, mask: torch.Tensor, between=None) -> None:
        """Run `between()` (writes under `mask`) and a forward pass of all worlds, then
        put back, outside `mask`, every field a hook has read: the other envs see the
        values of their last step, as the C engines' masked forward leaves them."""
        names = set(self._views) | set(_KEEP_ALWAYS)
        kept = {name: self.field(name).clone() for name in names}
        if between is not None:
            between()
        self.engine.forward_all()
        for name, old in kept.items():
            view = self.field(name)
            view.copy_(torch.where(_rows(mask, view), view, old))

    def _t_reset_where(self, mask: torch.Tensor) -> None:
        def reset_state() -> None:
            self.engine.reset_where(mask)
            self._t_randomize(mask)
            self._t_reset(mask)

        self._forward_where(mask, reset_state)
        n, cfg = self.num_envs, self.s2r
        lo, hi = cfg.action_latency
        delay = torch.randint(lo, hi + 1, (n,), generator=self._gen, device=self.device)
        self.latency_delay = torch.where(mask, delay, self.latency_delay)
        self.latency_buf = torch.where(mask[None, :, None], 0.0, self.latency_buf)
        if self._has_bias:
            bias = self.normal(self.obs_bias.shape) * self._t_bias_std
            self.obs_bias = torch.where(mask[:, None], bias, self.obs_bias)
        if cfg.push_interval_s:
            wait = torch.empty(n, device=self.device).exponential_(
                1.0 / cfg.push_interval_s, generator=self._gen
            )
            self.next_push = torch.where(mask, wait, self.next_push)
        self.episode_length = torch.where(mask, 0, self.episode_length)
        self.episode_return = torch.where(mask, 0.0, self.episode_return)
        self.last_action = torch.where(mask[:, None], 0.0, self.last_action)

    # ------------------------------------------------------------------ observation
    def _t_observe(self, reset_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        terms = self._t_obs()
        n = self.num_envs

        def group(name: str) -> torch.Tensor:
            parts = [terms[t].reshape(n, size).float() for t, size in self._term_sizes[name]]
            return torch.cat(parts, dim=1)

        frame = group("policy")
        if self._has_noise:
            frame = frame + self.normal(frame.shape) * self._t_noise_std
        if self._has_bias:
            frame = frame + self.obs_bias
        if reset_mask is None:
            self.history = torch.cat([self.history[:, 1:], frame[:, None]], dim=1)
        else:
            self.history = torch.where(reset_mask[:, None, None], frame[:, None], self.history)
        obs = {"policy": self.history.reshape(n, -1)}
        if "critic" in self.observation_spec.groups:
            obs["critic"] = group("critic")
        return {k: v.to(self.dtype) for k, v in obs.items()}

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        if seed is not None:
            self._gen.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        everyone = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._t_reset_where(everyone)
        self._tobs = self._t_observe(everyone)
        return self._tobs

    def _t_actions(self, actions: Any) -> torch.Tensor:
        if not isinstance(actions, torch.Tensor):
            actions = np.asarray(actions)
            if actions.dtype.kind != "f":
                raise TypeError(f"actions must be floating point, got dtype {actions.dtype}")
            actions = torch.from_numpy(actions)
        elif not actions.is_floating_point():
            raise TypeError(f"actions must be a floating-point tensor, got dtype {actions.dtype}")
        want = (self.num_envs, self.action_spec.size)
        if tuple(actions.shape) != want:
            raise ValueError(
                f"actions must have shape {want} (num_envs, action size), got {tuple(actions.shape)}"
            )
        return actions.detach().to(self.device, torch.float32)

    def _t_latency(self, actions: torch.Tensor) -> torch.Tensor:
        depth = self.latency_buf.shape[0]
        if depth == 1:
            return actions
        self._latency_head = (self._latency_head + 1) % depth
        self.latency_buf[self._latency_head] = actions
        return self.latency_buf[(self._latency_head - self.latency_delay) % depth, self._rows]

    def _t_pushes(self) -> None:
        cfg = self.s2r
        if not cfg.push_interval_s or self._base_id is None:
            return
        t = self.episode_length * self.dt
        due = t >= self.next_push
        n = self.num_envs
        kick = self.uniform(-cfg.push_velocity, cfg.push_velocity, (n, 2))
        qvel = self.field("qvel")
        qvel[:, :2] += torch.where(due[:, None], kick, 0.0)
        wait = torch.empty(n, device=self.device).exponential_(
            1.0 / cfg.push_interval_s, generator=self._gen
        )
        self.next_push = torch.where(due, t + wait, self.next_push)

    def step(self, actions: Any):
        if self._tobs is None:
            raise RuntimeError("call reset() before step()")
        prev_obs = self._tobs
        actions = self._t_actions(actions)
        bad = ~torch.isfinite(actions).all(dim=1)
        if self.nan_action == "raise" and bool(bad.any()):
            raise ValueError(
                f"non-finite actions (NaN or inf) for envs {bad.nonzero()[:16, 0].tolist()}; "
                "nothing was stepped"
            )
        actions = torch.where(bad[:, None], 0.0, actions)
        applied = self._t_latency(actions)
        self._t_pushes()
        pre = self._t_pre_step()
        self.write("ctrl", self._t_ctrl(applied))
        self.engine.physics(self.frame_skip)
        self._memo = {}
        try:
            reward, terminated, extras = self._t_reward(pre, applied)
            reward = reward.float()
            unstable = bad | ~torch.isfinite(reward)
            for name in ("qpos", "qvel"):
                unstable |= ~(self.field(name).abs() <= MAX_STATE_VALUE).all(dim=1)
            reward = torch.where(unstable, 0.0, reward)
            terminated = terminated | unstable
            self.episode_length = self.episode_length + 1
            truncated = (self.episode_length >= self.max_episode_steps) & ~terminated
            self.episode_return = self.episode_return + reward
            self.last_action = actions.clone()
            obs = self._t_observe(None)
        finally:
            self._memo = None
        done = terminated | truncated
        info: dict[str, Any] = {k: v.to(self.dtype) for k, v in extras.items()}
        # an unstable env ends with its last sane observation and zeros in its terms
        # (MujocoVecEnv._contain_unstable)
        final = {
            k: torch.where(_rows(unstable, v), prev_obs[k], v) if prev_obs else v
            for k, v in obs.items()
        }
        for k, v in info.items():
            if v.shape == (self.num_envs,) and v.is_floating_point():
                info[k] = torch.where(unstable, 0.0, v)
        info["unstable"] = unstable
        info["final_obs"] = final
        info["episode"] = {
            "done": done,
            "return": self.episode_return.to(self.dtype),
            "length": self.episode_length.clone(),
        }
        if not (self.skip_idle_resets and not bool(done.any())):
            self._t_reset_where(done)
            fresh = self._t_observe(done)
            obs = {k: torch.where(_rows(done, v), fresh[k], v) for k, v in obs.items()}
        self._tobs = obs
        return obs, reward.to(self.dtype), terminated, truncated, info

    # ------------------------------------------------------------------ state
    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}

    def _sync(self) -> None:
        # before the engine's numpy side (checkpoints) reads or writes memory that
        # torch ops queued on the device may still be writing
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def state_dict(self) -> dict[str, Any]:
        """All that continues these episodes exactly: the engine's state and batched
        model fields, every tensor of the env and task, the generator's state."""
        self._sync()
        return {
            "task": self.name,
            "num_envs": self.num_envs,
            "hooks": "torch",
            "tensors": {k: v.detach().cpu().clone() for k, v in self._tensor_state().items()},
            "latency_head": self._latency_head,
            "rng": self._gen.get_state(),
            "engine": engine_state(self.engine),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state_fits(state)
        if state.get("hooks") != "torch":
            raise ValueError(
                "env state was saved by an env with numpy task hooks; this env runs its "
                "hooks in torch (hooks='torch'): their states do not convert"
            )
        mine = self._tensor_state()
        for key, value in state["tensors"].items():
            if key not in mine or mine[key].shape != value.shape:
                raise ValueError(f"env state field {key} does not fit this env")
            setattr(self, key, value.to(self.device))
        self._latency_head = int(state["latency_head"])
        self._gen.set_state(state["rng"])
        self._sync()
        load_engine_state(self.engine, state["engine"])
        self._tobs = {}  # episodes are under way: step() may continue them

    def set_external_forces(self, forces: Any, bodies=None) -> None:
        """MujocoVecEnv.set_external_forces, written on the device."""
        ids = torch.as_tensor(self.body_ids(bodies), device=self.device)
        forces = torch.as_tensor(forces, dtype=torch.float32).to(self.device)
        if forces.shape == (self.num_envs, 3) and len(ids) == 1:
            forces = forces[:, None, :]
        if tuple(forces.shape) != (self.num_envs, len(ids), 3):
            raise ValueError(
                f"forces must have shape {(self.num_envs, len(ids), 3)} (num_envs, bodies, 3), "
                f"got {tuple(forces.shape)}"
            )
        if not bool(torch.isfinite(forces).all()):
            raise ValueError("external forces must be finite")
        xfrc = self.field("xfrc_applied")
        xfrc[:, ids, :3] = forces
        xfrc[:, ids, 3:] = 0.0

    def get_state(self) -> dict[str, np.ndarray]:
        return {f: self.field(f).detach().cpu().numpy().copy() for f in ("qpos", "qvel")}

    def set_state(self, qpos: Any, qvel: Any, ids: Any = None) -> None:
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        if ids is None:
            mask[:] = True
        else:
            mask[torch.as_tensor(np.asarray(ids), dtype=torch.int64, device=self.device)] = True

        def write() -> None:
            for name, values in (("qpos", qpos), ("qvel", qvel)):
                full = self.field(name).clone()
                full[mask] = torch.as_tensor(np.asarray(values), dtype=full.dtype).to(self.device)
                self.write(name, full, mask)

        self._forward_where(mask, write)
        self._tobs = self._t_observe(mask)


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The per-env `mask` shaped to broadcast over `like`'s trailing axes."""
    return mask.view(-1, *([1] * (like.dim() - 1)))
