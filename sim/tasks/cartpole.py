"""InvertedPendulum-v5 (task "cartpole"): keep the pole upright; +1 per step while it is."""

from __future__ import annotations

import numpy as np

from sim.tasks.gym_base import GymTask


class CartPole(GymTask):
    name = "cartpole"
    xml = "inverted_pendulum.xml"
    frame_skip = 2
    max_episode_steps = 1000
    reset_noise_scale = 0.01
    max_pole_angle = 0.2

    def _task_obs_terms(self):
        m = self.model
        return {"policy": [("qpos", m.nq), ("qvel", m.nv)]}

    def _task_obs(self):
        return {"qpos": self.engine.get("qpos"), "qvel": self.engine.get("qvel")}

    def _task_reward(self, pre, actions):
        qpos, qvel = self.engine.get("qpos"), self.engine.get("qvel")
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        terminated = ~finite | (np.abs(qpos[:, 1]) > self.max_pole_angle)
        survive = (~terminated).astype(np.float64)
        return survive, terminated, {"reward_survive": survive}

    def _task_reset(self, ids, rng):
        k, s = len(ids), self.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(-s, s, size=(k, self.model.nq))
        qvel = self.init_qvel + rng.uniform(-s, s, size=(k, self.model.nv))
        self._set_reset_state(ids, qpos, qvel)
