"""Ant-v5: a quadruped runs forward; ends when the torso leaves the healthy z range.

The observation holds the (clipped) external contact forces `cfrc_ext`, which
Gymnasium computes with `mj_rnePostConstraint` after each step; `rne_post = True`
makes the engine do the same. After a reset Gymnasium only runs `mj_forward` on
freshly zeroed data, so its first observation has all contact forces zero; freshly
reset envs here observe zeros too.
"""

from __future__ import annotations

import numpy as np

from sim.tasks.gym_base import GymTask


class Ant(GymTask):
    name = "ant"
    xml = "ant.xml"
    frame_skip = 5
    rne_post = True
    base_body = "torso"
    forward_reward_weight = 1.0
    ctrl_cost_weight = 0.5
    contact_cost_weight = 5e-4
    healthy_reward = 1.0
    main_body = 1
    terminate_when_unhealthy = True
    healthy_z_range = (0.2, 1.0)
    contact_force_range = (-1.0, 1.0)
    reset_noise_scale = 0.1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fresh = np.zeros(self.num_envs, dtype=bool)  # reset since the last step

    def _task_obs_terms(self):
        m = self.model
        return {"policy": [("qpos", m.nq - 2), ("qvel", m.nv), ("cfrc_ext", (m.nbody - 1) * 6)]}

    def _contact_forces(self) -> np.ndarray:
        lo, hi = self.contact_force_range
        return np.clip(self.engine.get("cfrc_ext"), lo, hi)

    def _task_obs(self):
        forces = self._contact_forces()[:, 1:].reshape(self.num_envs, -1)
        return {
            "qpos": self.engine.get("qpos")[:, 2:],
            "qvel": self.engine.get("qvel"),
            "cfrc_ext": np.where(self._fresh[:, None], 0.0, forces),
        }

    def is_healthy(self) -> np.ndarray:
        qpos, qvel = self.engine.get("qpos"), self.engine.get("qvel")
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        lo, hi = self.healthy_z_range
        return finite & (lo <= qpos[:, 2]) & (qpos[:, 2] <= hi)

    def _task_pre_step(self):
        self._fresh[:] = False
        return self.engine.get("xpos")[:, self.main_body, :2].copy()

    def _task_reward(self, xy_before, actions):
        xy_after = self.engine.get("xpos")[:, self.main_body, :2]
        xy_velocity = (xy_after - xy_before) / self.dt
        x_velocity, y_velocity = xy_velocity[:, 0], xy_velocity[:, 1]
        healthy = self.is_healthy()
        forward = x_velocity * self.forward_reward_weight
        survive = healthy * self.healthy_reward
        ctrl = self._ctrl_cost(actions, self.ctrl_cost_weight)
        # every body's row, the world's included, as v5 sums them
        forces = self._contact_forces().reshape(self.num_envs, -1)
        contact = self.contact_cost_weight * np.square(forces).sum(axis=1)
        reward = (forward + survive) - (ctrl + contact)  # v5: rewards - costs
        terminated = ~healthy if self.terminate_when_unhealthy else np.zeros_like(healthy)
        qpos = self.engine.get("qpos")
        extras = {
            "x_position": qpos[:, 0].copy(),
            "y_position": qpos[:, 1].copy(),
            "distance_from_origin": np.linalg.norm(qpos[:, 0:2], axis=1),
            "x_velocity": x_velocity,
            "y_velocity": y_velocity,
            "reward_forward": forward,
            "reward_ctrl": -ctrl,
            "reward_contact": -contact,
            "reward_survive": survive,
        }
        return reward, terminated, extras

    def _task_reset(self, ids, rng):
        # v5: uniform noise on qpos, normal noise on qvel
        k, s = len(ids), self.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(-s, s, size=(k, self.model.nq))
        qvel = self.init_qvel + s * rng.standard_normal((k, self.model.nv))
        self._set_reset_state(ids, qpos, qvel)
        self._fresh[ids] = True
