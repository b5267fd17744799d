"""The terrain half of a legged task (sim/tasks/terrain_ground.py) in torch, for the
step that stays on the device: heightfield lookups, the height scan, the terrain
curriculum and the placement of reset robots on their tiles, under masks.
"""

from __future__ import annotations

import numpy as np
import torch


class TorchHeightfield:
    """sim.terrain.Terrain's lookups on a copy of its heights on the device."""

    def __init__(self, terrain, device: torch.device):
        self.terrain = terrain
        self.heights = torch.as_tensor(terrain.heights, dtype=torch.float32, device=device)
        self.origins = torch.as_tensor(terrain.origins, dtype=torch.float32, device=device)
        self.x0, self.y0, self.res = terrain.x0, terrain.y0, terrain.cfg.resolution

    def height_at(self, xy: torch.Tensor) -> torch.Tensor:
        """Terrain.height_at: bilinear between samples, the edge's height beyond."""
        ny, nx = self.heights.shape
        fx = ((xy[..., 0] - self.x0) / self.res).clamp(0.0, nx - 1)
        fy = ((xy[..., 1] - self.y0) / self.res).clamp(0.0, ny - 1)
        ix = fx.long().clamp_max(nx - 2)
        iy = fy.long().clamp_max(ny - 2)
        tx, ty = fx - ix, fy - iy
        h = self.heights
        low = h[iy, ix] * (1 - tx) + h[iy, ix + 1] * tx
        high = h[iy + 1, ix] * (1 - tx) + h[iy + 1, ix + 1] * tx
        return low * (1 - ty) + high * ty

    def max_height_around(self, xy: torch.Tensor, radius: float) -> torch.Tensor:
        """Terrain.max_height_around: the highest sample within a square around each point."""
        ny, nx = self.heights.shape
        w = int(np.ceil(radius / self.res))
        off = torch.arange(-w, w + 1, device=xy.device)
        cx = torch.round((xy[:, 0] - self.x0) / self.res).long()
        cy = torch.round((xy[:, 1] - self.y0) / self.res).long()
        ix = (cx[:, None] + off[None, :]).clamp(0, nx - 1)
        iy = (cy[:, None] + off[None, :]).clamp(0, ny - 1)
        return self.heights[iy[:, :, None], ix[:, None, :]].amax(dim=(1, 2))


class TerrainTorch:
    """Mixed into a DeviceStep legged task beside TerrainGround: the same terrain, its
    state as tensors (levels, columns, spawn and end points, distance asked)."""

    def _t_init_terrain(self) -> None:
        dev, n, cfg = self.device, self.num_envs, self.terrain.cfg
        self._hf = TorchHeightfield(self.terrain, dev)
        self.terrain_cols = torch.arange(n, device=dev) % cfg.num_cols
        if self.level is None:
            self.terrain_levels = torch.randint(
                0, self.max_init_level + 1, (n,), generator=self._gen, device=dev
            )
        else:
            self.terrain_levels = torch.full((n,), self.level, dtype=torch.int64, device=dev)
        self.spawn_xy = torch.zeros(n, 2, device=dev)
        self.end_xy = torch.zeros(n, 2, device=dev)
        self.asked = torch.zeros(n, device=dev)
        self._t_scan_points = self.const(self._scan_points)

    def _t_ground_under(self, xy: torch.Tensor) -> torch.Tensor:
        return self._hf.height_at(xy)

    def _t_terrain_base_contact(self) -> torch.Tensor:
        return self.field("sensordata")[:, self._base_contact_adr] > 0

    def _t_scan(self) -> torch.Tensor:
        """TerrainGround._scan: heights under a grid turned with the base's heading."""
        qpos = self.field("qpos")
        w, x, y, z = qpos[:, 3], qpos[:, 4], qpos[:, 5], qpos[:, 6]
        yaw = torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        c, s = torch.cos(yaw)[:, None], torch.sin(yaw)[:, None]
        px, py = self._t_scan_points[:, 0], self._t_scan_points[:, 1]
        pts = torch.stack([qpos[:, 0:1] + c * px - s * py, qpos[:, 1:2] + s * px + c * py], dim=-1)
        rel = qpos[:, 2:3] - self._hf.height_at(pts) - float(self._reset_qpos[2])
        return rel.clamp(-1.0, 1.0)

    def _t_terrain_ask(self) -> None:
        self.asked = self.asked + self.commands[:, :2].norm(dim=1) * self.dt

    def _t_terrain_step(self, extras: dict[str, torch.Tensor]) -> torch.Tensor:
        xy = self.field("qpos")[:, 0:2]
        self.end_xy = xy.clone()
        x0, x1, y0, y1 = self.terrain.extent
        m = self.bounds_margin
        extras["terrain_level"] = self.terrain_levels.float()
        return (xy[:, 0] < x0 + m) | (xy[:, 0] > x1 - m) | (xy[:, 1] < y0 + m) | (xy[:, 1] > y1 - m)

    def _t_terrain_curriculum(self, mask: torch.Tensor) -> None:
        """sim.terrain.next_levels for the envs of `mask` whose episode just ended."""
        if not self.curriculum:
            return
        ended = mask & (self.episode_length > 0)
        cfg = self.terrain.cfg
        walked = (self.end_xy - self.spawn_xy).norm(dim=1)
        left = (self.max_episode_steps - self.episode_length) * self.dt
        asked = self.asked + self.commands[:, :2].norm(dim=1) * left
        up = walked > cfg.tile_size / 2
        down = ~up & (walked < 0.5 * asked)
        new = self.terrain_levels + up.long() - down.long()
        anywhere = torch.randint(
            0, cfg.num_levels, new.shape, generator=self._gen, device=self.device
        )
        new = torch.where(new >= cfg.num_levels, anywhere, new).clamp(0, cfg.num_levels - 1)
        self.terrain_levels = torch.where(ended, new, self.terrain_levels)

    def _t_place_on_terrain(self, mask: torch.Tensor) -> None:
        """Move the reset robots (posed at the origin) to their tiles, above the ground."""
        n, j = self.num_envs, self.spawn_jitter
        origin = self._hf.origins[self.terrain_levels, self.terrain_cols]
        xy = origin[:, 0:2] + self.uniform(-j, j, (n, 2))
        qpos = self.field("qpos").clone()
        qpos[:, 0:2] = xy
        qpos[:, 2] += self._hf.max_height_around(xy, self.spawn_clearance)
        self.write("qpos", qpos, mask)
        m2 = mask[:, None]
        self.spawn_xy = torch.where(m2, xy, self.spawn_xy)
        self.end_xy = torch.where(m2, xy, self.end_xy)
        self.asked = torch.where(mask, 0.0, self.asked)
