"""Hopper-v5: hop forward on one leg; ends when the torso leaves the healthy ranges."""

from __future__ import annotations

import numpy as np

from sim.tasks.gym_base import GymTask


class Hopper(GymTask):
    name = "hopper"
    xml = "hopper.xml"
    frame_skip = 4
    forward_reward_weight = 1.0
    ctrl_cost_weight = 1e-3
    healthy_reward = 1.0
    terminate_when_unhealthy = True
    healthy_state_range: tuple[float, float] | None = (-100.0, 100.0)
    healthy_z_range = (0.7, float("inf"))
    healthy_angle_range = (-0.2, 0.2)
    reset_noise_scale = 5e-3
    qvel_clip = 10.0  # v5 clips the observed velocities to [-10, 10]

    def _task_obs_terms(self):
        m = self.model
        return {"policy": [("qpos", m.nq - 1), ("qvel", m.nv)]}

    def _task_obs(self):
        qvel = self.engine.get("qvel")
        return {
            "qpos": self.engine.get("qpos")[:, 1:],
            "qvel": np.clip(qvel, -self.qvel_clip, self.qvel_clip),
        }

    def is_healthy(self) -> np.ndarray:
        """v5's `is_healthy`: strict bounds on z, torso angle and (hopper) the rest of the state."""
        qpos = self.engine.get("qpos")
        z, angle = qpos[:, 1], qpos[:, 2]
        lo_z, hi_z = self.healthy_z_range
        lo_a, hi_a = self.healthy_angle_range
        healthy = (lo_z < z) & (z < hi_z) & (lo_a < angle) & (angle < hi_a)
        if self.healthy_state_range is not None:
            state = np.concatenate([qpos[:, 2:], self.engine.get("qvel")], axis=1)
            lo, hi = self.healthy_state_range
            healthy &= ((lo < state) & (state < hi)).all(axis=1)
        return healthy

    def _task_pre_step(self):
        return self.engine.get("qpos")[:, 0].copy()

    def _task_reward(self, x_before, actions):
        qpos = self.engine.get("qpos")
        x_after = qpos[:, 0]
        x_velocity = (x_after - x_before) / self.dt
        healthy = self.is_healthy()
        forward = self.forward_reward_weight * x_velocity
        survive = healthy * self.healthy_reward
        ctrl = self._ctrl_cost(actions, self.ctrl_cost_weight)
        reward = forward + survive - ctrl
        terminated = ~healthy if self.terminate_when_unhealthy else np.zeros_like(healthy)
        extras = {
            "x_position": x_after.copy(),
            "z_distance_from_origin": qpos[:, 1] - self.init_qpos[1],
            "x_velocity": x_velocity,
            "reward_forward": forward,
            "reward_ctrl": -ctrl,
            "reward_survive": survive,
        }
        return reward, terminated, extras

    def _task_reset(self, ids, rng):
        # v5 draws both qpos and qvel noise uniformly
        k, s = len(ids), self.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(-s, s, size=(k, self.model.nq))
        qvel = self.init_qvel + rng.uniform(-s, s, size=(k, self.model.nv))
        self._set_reset_state(ids, qpos, qvel)
