"""Heightfield terrain for legged robots: a grid of tiles that get harder level by level.

The terrain curriculum of legged_gym (Rudin et al., 2021), in numpy. One heightfield
holds `num_levels` x `num_cols` square tiles: the level (along x) sets a tile's
difficulty from 0 to 1, the column (along y) its kind, cycling through `kinds`:

- "rough": random uniform bumps whose amplitude grows with the level;
- "slope" and "rough_slope": a pyramid whose sides steepen with the level (bumps on
  the rough one); up from the tile's edge to a flat platform at its centre on every
  other occurrence of the kind, down into a pit on the others;
- "stairs_down" and "stairs_up": a pyramid of steps whose height grows with the level,
  seen from the robot on the centre platform: it steps down (or up) to leave it.

Everything is drawn from `seed`, so the same seed gives the same ground. A flat border
at height 0 surrounds the tiles; the world origin lies inside it, half a border away
from the tiles, so a robot can be settled there as on a flat floor.

`next_levels` is the curriculum's rule: an env whose robot walked far enough moves to
the next level, one that walked less than half of what it was asked moves down.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

KINDS = ("rough", "slope", "rough_slope", "stairs_down", "stairs_up")
Range = tuple[float, float]


@dataclass(frozen=True)
class TerrainConfig:
    """Layout and difficulty of the tile grid; (easy, hard) pairs span levels 0..last."""

    num_levels: int = 10
    """Tiles along x; level l has difficulty l / (num_levels - 1)."""
    num_cols: int = 10
    """Tiles along y, of the kinds in `kinds`, cycled."""
    tile_size: float = 8.0
    """Side of a square tile (m)."""
    resolution: float = 0.1
    """Distance between height samples (m)."""
    border: float = 10.0
    """Width of the flat ground around the tiles (m)."""
    kinds: tuple[str, ...] = KINDS
    roughness: Range = (0.02, 0.10)
    """Half range of the uniform bumps of "rough" tiles (m)."""
    roughness_cell: float = 0.2
    """Distance between independent bump heights (m); heights between them interpolate."""
    slope_roughness: float = 0.03
    """Half range of the bumps on "rough_slope" tiles (m)."""
    slope: Range = (0.0, 0.4)
    """Rise over run of the pyramid sides."""
    step_height: Range = (0.05, 0.20)
    step_width: float = 0.31
    platform: float = 2.0
    """Side of the flat square at the centre of slope and stairs tiles (m)."""
    base_thickness: float = 1.0
    """Depth of the heightfield's solid base below its lowest point (m)."""

    def __post_init__(self) -> None:
        if self.num_levels < 1 or self.num_cols < 1:
            raise ValueError("num_levels and num_cols must be >= 1")
        unknown = set(self.kinds) - set(KINDS)
        if not self.kinds or unknown:
            raise ValueError(f"unknown terrain kinds {sorted(unknown)}; known: {list(KINDS)}")
        if not self.resolution > 0 or not self.tile_size > 2 * self.resolution:
            raise ValueError("resolution must be > 0 and tile_size > 2 * resolution")
        if self.platform >= self.tile_size:
            raise ValueError("platform must be smaller than tile_size")


class Terrain:
    """The heights of one generated terrain, and lookups into them.

    `heights[iy, ix]` is the ground at x = x0 + ix * resolution, y = y0 + iy * resolution
    (MuJoCo's heightfield layout: rows along y).
    """

    def __init__(self, cfg: TerrainConfig | None = None, seed: int = 0):
        self.cfg = cfg = cfg or TerrainConfig()
        self.seed = int(seed)
        res = cfg.resolution
        self.tile_px = int(round(cfg.tile_size / res))
        self.border_px = int(round(cfg.border / res))
        nx = cfg.num_levels * self.tile_px + 2 * self.border_px + 1
        ny = cfg.num_cols * self.tile_px + 2 * self.border_px + 1
        # the world origin half a border in from the grid's corner: on flat ground
        self.x0 = self.y0 = -self.border_px * res / 2
        rng = np.random.default_rng(self.seed)
        h = np.zeros((ny, nx))
        for level in range(cfg.num_levels):
            difficulty = level / max(cfg.num_levels - 1, 1)
            for col in range(cfg.num_cols):
                ix = self.border_px + level * self.tile_px
                iy = self.border_px + col * self.tile_px
                h[iy : iy + self.tile_px, ix : ix + self.tile_px] = self._tile(col, difficulty, rng)
        self.heights = h
        # tile centres, (num_levels, num_cols, 3): where envs of that level and column spawn
        c = self.border_px + (np.arange(max(cfg.num_levels, cfg.num_cols)) + 0.5) * self.tile_px
        cx = self.x0 + c[: cfg.num_levels] * res
        cy = self.y0 + c[: cfg.num_cols] * res
        xy = np.stack(np.meshgrid(cx, cy, indexing="ij"), axis=-1)
        self.origins = np.concatenate([xy, self.height_at(xy)[..., None]], axis=-1)

    # ------------------------------------------------------------------ generation
    def kind(self, col: int) -> str:
        return self.cfg.kinds[col % len(self.cfg.kinds)]

    def _tile(self, col: int, difficulty: float, rng: np.random.Generator) -> np.ndarray:
        cfg, n, res = self.cfg, self.tile_px, self.cfg.resolution
        kind = self.kind(col)

        def lerp(r: Range) -> float:
            return r[0] + (r[1] - r[0]) * difficulty

        # Chebyshev distance of each sample to the tile's edge: pyramids rise with it and
        # meet their neighbours at height 0
        j = np.arange(n)
        to_edge = np.minimum(j, n - j) * res
        d = np.minimum(to_edge[:, None], to_edge[None, :])
        ramp = cfg.tile_size / 2 - cfg.platform / 2  # run from the edge to the platform
        # every other tile of a pyramid kind is a pit instead
        sign = 1.0 if (col // len(cfg.kinds)) % 2 == 0 else -1.0
        if kind == "rough":
            return self._bumps(n, lerp(cfg.roughness), rng)
        if kind in ("slope", "rough_slope"):
            tile = sign * lerp(cfg.slope) * np.minimum(d, ramp)
            if kind == "rough_slope":
                tile = tile + self._bumps(n, cfg.slope_roughness, rng)
            return tile
        steps = np.floor(np.minimum(d, ramp) / cfg.step_width)
        up = 1.0 if kind == "stairs_down" else -1.0  # the centre is a peak, or a pit
        return up * lerp(cfg.step_height) * steps

    def _bumps(self, n: int, amplitude: float, rng: np.random.Generator) -> np.ndarray:
        """Uniform heights in [-amplitude, amplitude] every `roughness_cell`, bilinear
        between them (legged_gym's random_uniform_terrain, without its quantization)."""
        k = max(1, int(round(self.cfg.roughness_cell / self.cfg.resolution)))
        m = n // k + 2
        coarse = rng.uniform(-amplitude, amplitude, size=(m, m))
        t = np.arange(n) / k
        i = np.minimum(t.astype(np.int64), m - 2)
        f = t - i
        rows = coarse[i] * (1 - f)[:, None] + coarse[i + 1] * f[:, None]
        return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]

    # ------------------------------------------------------------------ lookups
    @property
    def extent(self) -> tuple[float, float, float, float]:
        """(x_min, x_max, y_min, y_max) of the heightfield (m)."""
        ny, nx = self.heights.shape
        r = self.cfg.resolution
        return self.x0, self.x0 + (nx - 1) * r, self.y0, self.y0 + (ny - 1) * r

    def height_at(self, xy: np.ndarray) -> np.ndarray:
        """Ground height at world points `xy` (..., 2), bilinear between samples (the
        edge's height beyond the heightfield)."""
        xy = np.asarray(xy, dtype=np.float64)
        ny, nx = self.heights.shape
        r = self.cfg.resolution
        fx = np.clip((xy[..., 0] - self.x0) / r, 0.0, nx - 1)
        fy = np.clip((xy[..., 1] - self.y0) / r, 0.0, ny - 1)
        ix = np.minimum(fx.astype(np.int64), nx - 2)
        iy = np.minimum(fy.astype(np.int64), ny - 2)
        tx, ty = fx - ix, fy - iy
        h = self.heights
        low = h[iy, ix] * (1 - tx) + h[iy, ix + 1] * tx
        high = h[iy + 1, ix] * (1 - tx) + h[iy + 1, ix + 1] * tx
        return low * (1 - ty) + high * ty

    def max_height_around(self, xy: np.ndarray, radius: float) -> np.ndarray:
        """Highest sample within the square of half side `radius` around each point (k, 2)."""
        r = self.cfg.resolution
        ny, nx = self.heights.shape
        w = int(np.ceil(radius / r))
        off = np.arange(-w, w + 1)
        cx = np.rint((xy[:, 0] - self.x0) / r).astype(np.int64)
        cy = np.rint((xy[:, 1] - self.y0) / r).astype(np.int64)
        ix = np.clip(cx[:, None] + off[None, :], 0, nx - 1)
        iy = np.clip(cy[:, None] + off[None, :], 0, ny - 1)
        return self.heights[iy[:, :, None], ix[:, None, :]].max(axis=(1, 2))

    def level_roughness(self) -> np.ndarray:
        """Mean absolute height difference between neighbouring samples, per level."""
        out = np.empty(self.cfg.num_levels)
        b, n = self.border_px, self.tile_px
        for level in range(self.cfg.num_levels):
            h = self.heights[b : b + self.cfg.num_cols * n, b + level * n : b + (level + 1) * n]
            out[level] = 0.5 * (
                np.abs(np.diff(h, axis=0)).mean() + np.abs(np.diff(h, axis=1)).mean()
            )
        return out

    # ------------------------------------------------------------------ MuJoCo
    def add_to_spec(self, spec: mujoco.MjSpec, name: str = "terrain", **geom) -> mujoco.MjsGeom:
        """Add the heightfield asset and its geom (keyword overrides: contype, friction...)."""
        h = self.heights
        lo, hi = float(h.min()), float(h.max())
        span = max(hi - lo, 1e-6)  # MuJoCo needs a positive elevation range
        x_min, x_max, y_min, y_max = self.extent
        hf = spec.add_hfield(
            name=name,
            nrow=h.shape[0],
            ncol=h.shape[1],
            size=[(x_max - x_min) / 2, (y_max - y_min) / 2, span, self.cfg.base_thickness],
        )
        hf.userdata = ((h - lo) / span).astype(np.float32).ravel().tolist()
        return spec.worldbody.add_geom(
            name=name,
            type=mujoco.mjtGeom.mjGEOM_HFIELD,
            hfieldname=name,
            pos=[(x_min + x_max) / 2, (y_min + y_max) / 2, lo],
            **geom,
        )


def next_levels(
    levels: np.ndarray,
    walked: np.ndarray,
    asked: np.ndarray,
    tile_size: float,
    num_levels: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """legged_gym's terrain curriculum for envs whose episodes just ended.

    Up a level when the robot walked (straight-line distance from its spawn point)
    more than half a tile; down when it walked less than half of `asked`, the distance
    its commands asked for over a whole episode. A robot that leaves the hardest level
    starts again at a random level, so that the hardest tiles do not crowd and the
    easier ones are not forgotten.
    """
    up = walked > tile_size / 2
    down = ~up & (walked < 0.5 * asked)
    new = levels + up.astype(np.int64) - down.astype(np.int64)
    top = new >= num_levels
    if top.any():
        new[top] = rng.integers(0, num_levels, size=int(top.sum()))
    return np.clip(new, 0, num_levels - 1)
