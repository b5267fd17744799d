"""Humanoid-v5: a 3D biped runs forward; ends when the torso leaves the healthy z range.

The observation is v5's: positions without x and y, velocities, and the bodies'
com-based inertia (`cinert`), velocity (`cvel`), actuator forces (`qfrc_actuator`,
free joint excluded) and external contact forces (`cfrc_ext`), the world body's
rows left out. `cfrc_ext` needs `mj_rnePostConstraint` after each step, as
Gymnasium runs it (`rne_post = True`). After a reset Gymnasium only runs
`mj_forward` on freshly zeroed data, so its first observation has all contact
forces zero; freshly reset envs here observe zeros too.

Gymnasium's `include_*_in_observation` options leave the last four terms out of the
policy's observation, as v5 does. `privileged_critic=True` gives the critic its own
group with every v5 term, so a policy that reads only what a robot can measure (joint
positions and velocities) still trains against a critic that sees the contact forces.
"""

from __future__ import annotations

import numpy as np

from sim.tasks.gym_base import GymTask


class Humanoid(GymTask):
    name = "humanoid"
    xml = "humanoid.xml"
    frame_skip = 5
    rne_post = True
    base_body = "torso"
    forward_reward_weight = 1.25
    ctrl_cost_weight = 0.1
    contact_cost_weight = 5e-7
    contact_cost_range = (-np.inf, 10.0)
    healthy_reward = 5.0
    terminate_when_unhealthy = True
    healthy_z_range = (1.0, 2.0)
    reset_noise_scale = 1e-2

    def __init__(
        self,
        *args,
        include_cinert_in_observation: bool = True,
        include_cvel_in_observation: bool = True,
        include_qfrc_actuator_in_observation: bool = True,
        include_cfrc_ext_in_observation: bool = True,
        privileged_critic: bool = False,
        **kwargs,
    ):
        options = {
            "include_cinert_in_observation": include_cinert_in_observation,
            "include_cvel_in_observation": include_cvel_in_observation,
            "include_qfrc_actuator_in_observation": include_qfrc_actuator_in_observation,
            "include_cfrc_ext_in_observation": include_cfrc_ext_in_observation,
            "privileged_critic": privileged_critic,
        }
        for name, flag in options.items():
            if not isinstance(flag, bool):
                raise ValueError(f"humanoid: {name} must be true or false, got {flag!r}")
        self._policy_terms = {"qpos", "qvel"} | {
            name.removeprefix("include_").removesuffix("_in_observation")
            for name, on in options.items()
            if name.startswith("include_") and on
        }
        self._privileged_critic = privileged_critic
        super().__init__(*args, **kwargs)
        self._fresh = np.zeros(self.num_envs, dtype=bool)  # reset since the last step
        self._mass = self.model.body_mass.copy()

    def _task_obs_terms(self):
        m = self.model
        b = m.nbody - 1
        every = [
            ("qpos", m.nq - 2),
            ("qvel", m.nv),
            ("cinert", b * 10),
            ("cvel", b * 6),
            ("qfrc_actuator", m.nv - 6),
            ("cfrc_ext", b * 6),
        ]
        groups = {"policy": [(t, k) for t, k in every if t in self._policy_terms]}
        if self._privileged_critic:
            groups["critic"] = every
        return groups

    def _task_obs(self):
        n, get = self.num_envs, self.engine.get
        wanted = self._policy_terms if not self._privileged_critic else None
        terms = {"qpos": get("qpos")[:, 2:], "qvel": get("qvel")}
        if wanted is None or "cinert" in wanted:
            terms["cinert"] = get("cinert")[:, 1:].reshape(n, -1)
        if wanted is None or "cvel" in wanted:
            terms["cvel"] = get("cvel")[:, 1:].reshape(n, -1)
        if wanted is None or "qfrc_actuator" in wanted:
            terms["qfrc_actuator"] = get("qfrc_actuator")[:, 6:]
        if wanted is None or "cfrc_ext" in wanted:
            cfrc_ext = get("cfrc_ext")[:, 1:].reshape(n, -1)
            terms["cfrc_ext"] = np.where(self._fresh[:, None], 0.0, cfrc_ext)
        return terms

    def mass_center(self) -> np.ndarray:
        """(num_envs, 2): x, y of the center of mass, as v5's `mass_center`."""
        xipos = self.engine.get("xipos")
        if self.s2r.mass_scale is None and self.s2r.added_base_mass is None:
            num = np.einsum("b,nbj->nj", self._mass, xipos)
            return num[:, :2] / self._mass.sum()
        mass = self.engine.model_field("body_mass")  # randomized per env
        num = np.einsum("nb,nbj->nj", mass, xipos)
        return num[:, :2] / mass.sum(axis=1, keepdims=True)

    def is_healthy(self) -> np.ndarray:
        z = self.engine.get("qpos")[:, 2]
        lo, hi = self.healthy_z_range
        return (lo < z) & (z < hi)

    def _task_pre_step(self):
        self._fresh[:] = False
        return self.mass_center()

    def _task_reward(self, xy_before, actions):
        xy_velocity = (self.mass_center() - xy_before) / self.dt
        x_velocity, y_velocity = xy_velocity[:, 0], xy_velocity[:, 1]
        healthy = self.is_healthy()
        forward = self.forward_reward_weight * x_velocity
        survive = healthy * self.healthy_reward
        # v5 charges the controls as written into MjData
        ctrl = self._ctrl_cost(self.engine.get("ctrl"), self.ctrl_cost_weight)
        forces = self.engine.get("cfrc_ext").reshape(self.num_envs, -1)
        contact = np.clip(
            self.contact_cost_weight * np.square(forces).sum(axis=1), *self.contact_cost_range
        )
        reward = (forward + survive) - (ctrl + contact)  # v5: rewards - costs
        terminated = ~healthy if self.terminate_when_unhealthy else np.zeros_like(healthy)
        qpos = self.engine.get("qpos")
        extras = {
            "x_position": qpos[:, 0].copy(),
            "y_position": qpos[:, 1].copy(),
            "distance_from_origin": np.linalg.norm(qpos[:, 0:2], axis=1),
            "x_velocity": x_velocity,
            "y_velocity": y_velocity,
            "reward_survive": survive,
            "reward_forward": forward,
            "reward_ctrl": -ctrl,
            "reward_contact": -contact,
        }
        return reward, terminated, extras

    def _task_reset(self, ids, rng):
        # v5 draws both qpos and qvel noise uniformly
        k, s = len(ids), self.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(-s, s, size=(k, self.model.nq))
        qvel = self.init_qvel + rng.uniform(-s, s, size=(k, self.model.nv))
        self._set_reset_state(ids, qpos, qvel)
        self._fresh[ids] = True
