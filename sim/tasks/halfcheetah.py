"""HalfCheetah-v5: run forward; no termination."""

from __future__ import annotations

import numpy as np

from sim.tasks.gym_base import GymTask


class HalfCheetah(GymTask):
    name = "halfcheetah"
    xml = "half_cheetah.xml"
    frame_skip = 5
    forward_reward_weight = 1.0
    ctrl_cost_weight = 0.1
    reset_noise_scale = 0.1

    def _task_obs_terms(self):
        m = self.model
        return {"policy": [("qpos", m.nq - 1), ("qvel", m.nv)]}

    def _task_obs(self):
        return {"qpos": self.engine.get("qpos")[:, 1:], "qvel": self.engine.get("qvel")}

    def _task_pre_step(self):
        return self.engine.get("qpos")[:, 0].copy()

    def _task_reward(self, x_before, actions):
        x_after = self.engine.get("qpos")[:, 0]
        x_velocity = (x_after - x_before) / self.dt
        forward = self.forward_reward_weight * x_velocity
        ctrl = self._ctrl_cost(actions, self.ctrl_cost_weight)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return (
            forward - ctrl,
            terminated,
            {"x_velocity": x_velocity, "reward_forward": forward, "reward_ctrl": -ctrl},
        )

    def _task_reset(self, ids, rng):
        k, s = len(ids), self.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(-s, s, size=(k, self.model.nq))
        qvel = self.init_qvel + s * rng.standard_normal((k, self.model.nv))
        self._set_reset_state(ids, qpos, qvel)
