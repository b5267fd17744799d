"""The Gymnasium v5 tasks' hooks in torch, for the step that stays on the device
(sim.device_step): the same terms as the numpy hooks beside each class, on tensors
that share the Warp engine's memory.
"""

from __future__ import annotations

import torch

from sim.device_step import DeviceStep
from sim.tasks.ant import Ant
from sim.tasks.cartpole import CartPole
from sim.tasks.halfcheetah import HalfCheetah
from sim.tasks.hopper import Hopper
from sim.tasks.walker2d import Walker2d


class _GymHooks(DeviceStep):
    # v5's reset noise: uniform on qpos, and on qvel uniform or normal by task
    qvel_noise = "uniform"

    def _t_ctrl_cost(self, actions: torch.Tensor, weight: float) -> torch.Tensor:
        return weight * actions.square().sum(dim=1)

    def _t_reset(self, mask):
        n, s = self.num_envs, self.reset_noise_scale
        qpos = self.const(self.init_qpos) + self.uniform(-s, s, (n, self.model.nq))
        if self.qvel_noise == "normal":
            noise = s * self.normal((n, self.model.nv))
        else:
            noise = self.uniform(-s, s, (n, self.model.nv))
        self.write("qpos", qpos, mask)
        self.write("qvel", self.const(self.init_qvel) + noise, mask)


class CartPoleTorch(_GymHooks, CartPole):
    def _t_obs(self):
        return {"qpos": self.field("qpos"), "qvel": self.field("qvel")}

    def _t_reward(self, pre, actions):
        qpos, qvel = self.field("qpos"), self.field("qvel")
        finite = torch.isfinite(qpos).all(dim=1) & torch.isfinite(qvel).all(dim=1)
        terminated = ~finite | (qpos[:, 1].abs() > self.max_pole_angle)
        survive = (~terminated).float()
        return survive, terminated, {"reward_survive": survive}


class HalfCheetahTorch(_GymHooks, HalfCheetah):
    qvel_noise = "normal"

    def _t_obs(self):
        return {"qpos": self.field("qpos")[:, 1:], "qvel": self.field("qvel")}

    def _t_pre_step(self):
        return self.field("qpos")[:, 0].clone()

    def _t_reward(self, x_before, actions):
        x_velocity = (self.field("qpos")[:, 0] - x_before) / self.dt
        forward = self.forward_reward_weight * x_velocity
        ctrl = self._t_ctrl_cost(actions, self.ctrl_cost_weight)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        extras = {"x_velocity": x_velocity, "reward_forward": forward, "reward_ctrl": -ctrl}
        return forward - ctrl, terminated, extras


class HopperTorch(_GymHooks, Hopper):
    def _t_obs(self):
        qvel = self.field("qvel").clamp(-self.qvel_clip, self.qvel_clip)
        return {"qpos": self.field("qpos")[:, 1:], "qvel": qvel}

    def _t_healthy(self) -> torch.Tensor:
        qpos = self.field("qpos")
        z, angle = qpos[:, 1], qpos[:, 2]
        lo_z, hi_z = self.healthy_z_range
        lo_a, hi_a = self.healthy_angle_range
        healthy = (lo_z < z) & (z < hi_z) & (lo_a < angle) & (angle < hi_a)
        if self.healthy_state_range is not None:
            state = torch.cat([qpos[:, 2:], self.field("qvel")], dim=1)
            lo, hi = self.healthy_state_range
            healthy &= ((lo < state) & (state < hi)).all(dim=1)
        return healthy

    def _t_pre_step(self):
        return self.field("qpos")[:, 0].clone()

    def _t_reward(self, x_before, actions):
        qpos = self.field("qpos")
        x_after = qpos[:, 0]
        x_velocity = (x_after - x_before) / self.dt
        healthy = self._t_healthy()
        forward = self.forward_reward_weight * x_velocity
        survive = healthy.float() * self.healthy_reward
        ctrl = self._t_ctrl_cost(actions, self.ctrl_cost_weight)
        terminated = ~healthy if self.terminate_when_unhealthy else torch.zeros_like(healthy)
        extras = {
            "x_position": x_after.clone(),
            "z_distance_from_origin": qpos[:, 1] - float(self.init_qpos[1]),
            "x_velocity": x_velocity,
            "reward_forward": forward,
            "reward_ctrl": -ctrl,
            "reward_survive": survive,
        }
        return forward + survive - ctrl, terminated, extras


class Walker2dTorch(HopperTorch, Walker2d):
    """Hopper's torch hooks with Walker2d's model and healthy ranges."""


class AntTorch(_GymHooks, Ant):
    qvel_noise = "normal"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fresh = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _t_contact_forces(self) -> torch.Tensor:
        lo, hi = self.contact_force_range
        return self.field("cfrc_ext").clamp(lo, hi)

    def _t_obs(self):
        forces = self._t_contact_forces()[:, 1:].reshape(self.num_envs, -1)
        return {
            "qpos": self.field("qpos")[:, 2:],
            "qvel": self.field("qvel"),
            "cfrc_ext": torch.where(self.fresh[:, None], 0.0, forces),
        }

    def _t_healthy(self) -> torch.Tensor:
        qpos, qvel = self.field("qpos"), self.field("qvel")
        finite = torch.isfinite(qpos).all(dim=1) & torch.isfinite(qvel).all(dim=1)
        lo, hi = self.healthy_z_range
        return finite & (lo <= qpos[:, 2]) & (qpos[:, 2] <= hi)

    def _t_pre_step(self):
        self.fresh = torch.zeros_like(self.fresh)
        return self.field("xpos")[:, self.main_body, :2].clone()

    def _t_reward(self, xy_before, actions):
        xy_velocity = (self.field("xpos")[:, self.main_body, :2] - xy_before) / self.dt
        x_velocity, y_velocity = xy_velocity[:, 0], xy_velocity[:, 1]
        healthy = self._t_healthy()
        forward = x_velocity * self.forward_reward_weight
        survive = healthy.float() * self.healthy_reward
        ctrl = self._t_ctrl_cost(actions, self.ctrl_cost_weight)
        forces = self._t_contact_forces().reshape(self.num_envs, -1)
        contact = self.contact_cost_weight * forces.square().sum(dim=1)
        terminated = ~healthy if self.terminate_when_unhealthy else torch.zeros_like(healthy)
        qpos = self.field("qpos")
        extras = {
            "x_position": qpos[:, 0].clone(),
            "y_position": qpos[:, 1].clone(),
            "distance_from_origin": qpos[:, 0:2].norm(dim=1),
            "x_velocity": x_velocity,
            "y_velocity": y_velocity,
            "reward_forward": forward,
            "reward_ctrl": -ctrl,
            "reward_contact": -contact,
            "reward_survive": survive,
        }
        return (forward + survive) - (ctrl + contact), terminated, extras

    def _t_reset(self, mask):
        super()._t_reset(mask)
        self.fresh = self.fresh | mask
