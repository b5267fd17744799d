"""The quadruped's hooks in torch, for the step that stays on the device
(sim.device_step): Quadruped's observation, reward, constraints, commands, command
curriculum and reset, term by term, on tensors that share the Warp engine's memory;
on a terrain (`terrain=`, go1_rough) with sim/tasks/terrain_torch.py's heightfield
lookups and terrain curriculum.
"""

from __future__ import annotations

import numpy as np
import torch

from sim.device_step import DeviceStep
from sim.tasks.go1 import Go1, Go1Rough
from sim.tasks.quadruped import (
    _BOUNDING_BOX,
    _CAPSULE,
    _CYLINDER,
    _ELLIPSOID,
    _SPHERE,
    JOINTS,
    Quadruped,
)
from sim.tasks.terrain_torch import TerrainTorch


def quat_to_mat(q: torch.Tensor) -> torch.Tensor:
    """(n, 4) quaternions (w, x, y, z) -> (n, 3, 3) rotations (body to world)."""
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*q.shape[:-1], 3, 3)


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


class QuadrupedTorch(TerrainTorch, DeviceStep, Quadruped):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        n, dev, nf = self.num_envs, self.device, len(self.foot_geoms)
        c = self.const
        self.commands = torch.zeros(n, 3, device=dev)
        self.command_levels = torch.zeros(n, dtype=torch.int64, device=dev)
        self.tracking_sum = torch.zeros(n, device=dev)
        self.feet_air_time = torch.zeros(n, nf, device=dev)
        self.last_contacts = torch.zeros(n, nf, dtype=torch.bool, device=dev)
        self.prev_applied = torch.zeros(n, self.action_spec.size, device=dev)
        self.last_joint_vel = torch.zeros(n, len(JOINTS), device=dev)
        self._c = {
            "default_joint_pos": c(self.default_joint_pos),
            "jlo": c(self._jrange[:, 0]),
            "jhi": c(self._jrange[:, 1]),
            "reset_qpos": c(self._reset_qpos),
            "torque_limit": c(self.robot.torque_limit),
            "foot_radius": c(self._foot_radius),
            "bg_pos": c(self._bg_pos),
            "bg_rot": c(self._bg_rot),
            "bg_size": c(self._bg_size),
            "bg_aabb": c(self._bg_aabb),
        }
        self._ctrl64 = {
            "default_joint_pos": c(self.default_joint_pos, torch.float64),
            "action_scale": c(self.action_scale, torch.float64),
            "jlo": c(self._jrange[:, 0], torch.float64),
            "jhi": c(self._jrange[:, 1], torch.float64),
            "low": c(self.action_spec.low, torch.float64),
            "high": c(self.action_spec.high, torch.float64),
        }
        self._ti = {
            "jqpos": torch.as_tensor(self._jqpos, device=dev),
            "jdof": torch.as_tensor(self._jdof, device=dev),
            "act": torch.as_tensor(self._act, device=dev),
            "feet": torch.as_tensor(self._feet, device=dev),
        }
        if self.fixed_command is not None:
            self._c["fixed_command"] = c(self.fixed_command)
        if self.terrain is not None:
            self._t_init_terrain()

    # ------------------------------------------------------------------ commands
    def set_command(self, cmd, ids=None) -> None:
        """Quadruped.set_command, on the device's command tensor."""
        ids = np.arange(self.num_envs) if ids is None else np.asarray(ids, dtype=np.int64)
        cmd = np.asarray(cmd.cpu() if isinstance(cmd, torch.Tensor) else cmd, dtype=np.float64)
        if cmd.shape == (3,):
            cmd = np.broadcast_to(cmd, (len(ids), 3))
        if cmd.shape != (len(ids), 3):
            raise ValueError(f"command must have shape ({len(ids)}, 3) or (3,), got {cmd.shape}")
        if not np.isfinite(cmd).all():
            raise ValueError("command must be finite")
        self.commands[torch.as_tensor(ids, device=self.device)] = self.const(cmd)

    def _t_sample_commands(self, mask: torch.Tensor) -> None:
        if self.fixed_command is not None:
            cmd = self._c["fixed_command"].expand(self.num_envs, 3)
        else:
            n = self.num_envs
            cmd = torch.stack(
                [
                    self.uniform(*self.command_vx, (n,)),
                    self.uniform(*self.command_vy, (n,)),
                    self.uniform(*self.command_yaw, (n,)),
                ],
                dim=1,
            )
            if self.command_curriculum:
                cmd = cmd * ((self.command_levels + 1) / self.command_curriculum)[:, None]
            moving = cmd[:, :2].norm(dim=1) >= self.command_zero_below
            cmd = torch.cat([cmd[:, :2] * moving[:, None], cmd[:, 2:]], dim=1)
        self.commands = torch.where(mask[:, None], cmd, self.commands)

    # ------------------------------------------------------------------ state
    def _t_base_state(self) -> dict[str, torch.Tensor]:
        return self._per_step("base_state", self._t_compute_base_state)

    def _t_compute_base_state(self) -> dict[str, torch.Tensor]:
        qpos, qvel = self.field("qpos"), self.field("qvel")
        rot = quat_to_mat(qpos[:, 3:7])
        return {
            "height": qpos[:, 2] - self._t_ground(qpos[:, 0:2]),
            "rot": rot,
            "lin_vel": torch.einsum("nji,nj->ni", rot, qvel[:, 0:3]),
            "ang_vel": qvel[:, 3:6].clone(),
            "gravity": -rot[:, 2, :],
        }

    def _t_ground(self, xy: torch.Tensor) -> torch.Tensor | float:
        """Ground height under the points `xy` (..., 2): the floor, or the terrain's."""
        return self.floor_height if self.terrain is None else self._t_ground_under(xy)

    def _t_joint_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        def compute():
            qpos, qvel = self.field("qpos"), self.field("qvel")
            jpos = qpos[:, self._ti["jqpos"]] - self._c["default_joint_pos"]
            return jpos, qvel[:, self._ti["jdof"]]

        return self._per_step("joint_state", compute)

    def _t_base_lowest_point(self, base, qpos) -> torch.Tensor:
        if len(self._base_geoms) == 0:
            return torch.full((self.num_envs,), float("inf"), device=self.device)
        c = self._c
        rz = base["rot"][:, 2, :]
        center = qpos[:, 2:3] + rz @ c["bg_pos"].T
        gz = torch.einsum("nj,gjk->ngk", rz, c["bg_rot"])
        s = c["bg_size"]
        halves, offs = [], []
        for i, shape in enumerate(self._bg_shape):
            z = gz[:, i]
            zero = torch.zeros_like(z[:, 2])
            if shape == _SPHERE:
                half, off = zero + s[i, 0], zero
            elif shape == _CAPSULE:
                half, off = z[:, 2].abs() * s[i, 1] + s[i, 0], zero
            elif shape == _CYLINDER:
                side = (1 - z[:, 2] ** 2).clamp(0, 1).sqrt()
                half, off = z[:, 2].abs() * s[i, 1] + s[i, 0] * side, zero
            elif shape == _ELLIPSOID:
                half, off = ((z * s[i]) ** 2).sum(dim=1).sqrt(), zero
            else:
                assert shape == _BOUNDING_BOX
                off = z @ c["bg_aabb"][i, :3]
                half = z.abs() @ c["bg_aabb"][i, 3:]
            halves.append(half)
            offs.append(off)
        low = center + torch.stack(offs, dim=1) - torch.stack(halves, dim=1)
        return low.min(dim=1).values - self.floor_height

    def _t_foot_contacts(self) -> torch.Tensor:
        feet = self.field("geom_xpos")[:, self._ti["feet"]]
        ground = self._t_ground(feet[..., 0:2])
        return feet[..., 2] - self._c["foot_radius"] - ground < self.foot_contact_margin

    # ------------------------------------------------------------------ hooks
    def _t_obs(self):
        base = self._t_base_state()
        jpos, jvel = self._t_joint_state()
        obs = {
            "base_ang_vel": base["ang_vel"],
            "projected_gravity": base["gravity"],
            "command": self.commands,
            "joint_pos": jpos,
            "joint_vel": jvel,
            "last_action": self.last_action,
            "base_lin_vel": base["lin_vel"],
            "friction": self.friction[:, None],
            "added_mass": self.added_mass[:, None],
            "motor_strength": self.strength[:, self._ti["act"]],
            "base_height": base["height"][:, None],
        }
        if self.terrain is not None and self.height_scan:
            obs["height_scan"] = self._t_scan()
        return obs

    def _t_ctrl(self, actions: torch.Tensor) -> torch.Tensor:
        # in float64, rounded once when stored, as the numpy hooks do: a target one float32
        # ulp off is enough for two rollouts to part at the next foot contact on rough ground
        c = self._ctrl64
        a = actions.double()
        clipped = torch.maximum(torch.minimum(a, c["high"]), c["low"])
        target = c["default_joint_pos"] + c["action_scale"] * clipped
        target = torch.maximum(torch.minimum(target, c["jhi"]), c["jlo"])
        ctrl = torch.empty(self.num_envs, self.model.nu, device=self.device, dtype=torch.float64)
        ctrl[:, self._ti["act"]] = target
        return ctrl

    def _t_reward(self, pre, actions):
        if self.terrain is not None:
            self._t_terrain_ask()  # the command in force during this step, before a new draw
        w, dt = self.reward_weights, self.dt
        base = self._t_base_state()
        qpos = self.field("qpos")
        _, jvel = self._t_joint_state()
        cmd = self.commands
        lin_err2 = (cmd[:, :2] - base["lin_vel"][:, :2]).square().sum(dim=1)
        yaw_err2 = (cmd[:, 2] - base["ang_vel"][:, 2]).square()
        tau = self.field("actuator_force")
        contact = self._t_foot_contacts()
        contact_filt = contact | self.last_contacts
        self.last_contacts = contact
        first_contact = (self.feet_air_time > 0.0) & contact_filt
        self.feet_air_time = self.feet_air_time + dt
        air = ((self.feet_air_time - self.feet_air_time_target) * first_contact).sum(dim=1)
        air = air * (cmd[:, :2].norm(dim=1) > 0.1)
        short_step = (
            ((self.constraint_limits["foot_air_time"] - self.feet_air_time) * first_contact)
            .max(dim=1)
            .values
        )
        self.feet_air_time = self.feet_air_time * ~contact_filt
        terms = {
            "tracking_lin_vel": torch.exp(-lin_err2 / self.tracking_sigma),
            "tracking_ang_vel": torch.exp(-yaw_err2 / self.tracking_sigma),
            "lin_vel_z": base["lin_vel"][:, 2].square(),
            "ang_vel_xy": base["ang_vel"][:, :2].square().sum(dim=1),
            "orientation": base["gravity"][:, :2].square().sum(dim=1),
            "torques": tau.square().sum(dim=1),
            "dof_acc": ((jvel - self.last_joint_vel) / dt).square().sum(dim=1),
            "action_rate": (actions - self.prev_applied).square().sum(dim=1),
            "feet_air_time": air,
        }
        extras = {f"rew_{k}": v * (w[k] * dt) for k, v in terms.items()}
        reward = sum(extras.values())
        if self.only_positive_rewards:
            reward = reward.clamp_min(0.0)
        extras["lin_vel_error"] = lin_err2.sqrt()
        extras["ang_vel_error"] = yaw_err2.sqrt()
        extras["base_vx"] = base["lin_vel"][:, 0].clone()
        extras.update(self._t_constraint_violations(base, qpos, jvel, tau, short_step))
        if self.command_curriculum:
            self.tracking_sum = self.tracking_sum + terms["tracking_lin_vel"]
            extras["command_level"] = self.command_levels.float()
        self.last_joint_vel = jvel
        self.prev_applied = actions.clone()
        if self.terrain is not None:
            base_contact = self._t_terrain_base_contact()
        else:
            base_contact = self._t_base_lowest_point(base, qpos) < self.base_contact_margin
        low = base["height"] < self.min_base_height
        tilted = base["gravity"][:, 2] > -np.cos(self.max_tilt)
        terminated = base_contact | low | tilted
        if self.fixed_command is None and self._resample_steps is not None:
            self._t_sample_commands((self.episode_length + 1) % self._resample_steps == 0)
        if self.terrain is not None:
            terminated = terminated | self._t_terrain_step(extras)
        return reward, terminated, extras

    def _t_constraint_violations(self, base, qpos, jvel, tau, short_step):
        lim, c = self.constraint_limits, self._c
        mid, half = (c["jlo"] + c["jhi"]) / 2, (c["jhi"] - c["jlo"]) / 2 * lim["joint_pos"]
        q = qpos[:, self._ti["jqpos"]]
        beyond = torch.nan_to_num((q - mid).abs() - half, nan=0.0, neginf=0.0)
        force = tau[:, self._ti["act"]].abs()
        torque = force - lim["torque"] * c["torque_limit"]
        return {
            "cstr_joint_pos": beyond.clamp_min(0.0).max(dim=1).values,
            "cstr_torque": torque.clamp_min(0.0).max(dim=1).values,
            "cstr_joint_vel": (jvel.abs() - lim["joint_vel"]).clamp_min(0.0).max(dim=1).values,
            "cstr_foot_air_time": short_step.clamp_min(0.0),
            "cstr_orientation": (base["gravity"][:, :2].norm(dim=1) - lim["orientation"]).clamp_min(
                0.0
            ),
        }

    def _t_command_curriculum(self, mask: torch.Tensor) -> None:
        if self.command_curriculum:
            ended = mask & (self.episode_length > 0)
            tracking = self.tracking_sum / self.max_episode_steps
            step = (tracking > self.curriculum_up).long() - (tracking < self.curriculum_down).long()
            moved = (self.command_levels + step).clamp(0, self.command_curriculum - 1)
            self.command_levels = torch.where(ended, moved, self.command_levels)
        self.tracking_sum = torch.where(mask, 0.0, self.tracking_sum)

    def _t_reset(self, mask):
        if self.terrain is not None:
            self._t_terrain_curriculum(mask)
        self._t_command_curriculum(mask)
        n, c, jq = self.num_envs, self._c, self._ti["jqpos"]
        qpos = c["reset_qpos"].expand(n, -1).clone()
        qpos[:, 0:2] = 0.0
        yaw = self.uniform(*self.reset_yaw_range, (n,))
        yaw_q = torch.zeros(n, 4, device=self.device)
        yaw_q[:, 0], yaw_q[:, 3] = torch.cos(yaw / 2), torch.sin(yaw / 2)
        qpos[:, 3:7] = quat_mul(yaw_q, qpos[:, 3:7])
        noise = self.uniform(-self.reset_joint_noise, self.reset_joint_noise, (n, len(JOINTS)))
        jpos = qpos[:, jq] + noise
        qpos[:, jq] = torch.maximum(torch.minimum(jpos, c["jhi"]), c["jlo"])
        self.write("qpos", qpos, mask)
        self.write("qvel", torch.zeros(n, self.model.nv, device=self.device), mask)
        ctrl = torch.zeros(n, self.model.nu, device=self.device)
        ctrl[:, self._ti["act"]] = c["default_joint_pos"]
        self.write("ctrl", ctrl, mask)
        self._t_sample_commands(mask)
        m2 = mask[:, None]
        self.feet_air_time = torch.where(m2, 0.0, self.feet_air_time)
        self.last_contacts = self.last_contacts & ~m2
        self.prev_applied = torch.where(m2, 0.0, self.prev_applied)
        self.last_joint_vel = torch.where(m2, 0.0, self.last_joint_vel)
        if self.terrain is not None:
            self._t_place_on_terrain(mask)


class Go1Torch(QuadrupedTorch, Go1):
    """The Go1, its hooks in torch."""


class Go1RoughTorch(QuadrupedTorch, Go1Rough):
    """The Go1 on its terrain curriculum, its hooks in torch."""
