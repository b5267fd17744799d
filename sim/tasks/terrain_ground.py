"""Heightfield ground with a terrain curriculum, for the legged velocity-tracking tasks.

The quadruped (`quadruped`, with its `terrain` option) and the Go1 (`go1_rough`, or
`go1` with `terrain`) stand on it through :class:`TerrainGround`, which
sim/tasks/quadruped.py's Quadruped mixes in and calls only where a terrain is set, so
flat ground stays as it was.

The terrain is sim/terrain.py's grid of tiles. Each env has a column of the grid (a
terrain kind) for good and a level: it spawns at the centre of its tile, and when its
episode ends it moves up a level if it walked more than half a tile, down if it walked
less than half of what its commands asked for over an episode (`next_levels`). The mean
level is the per-step info term `terrain_level`. All envs share the heightfield, each in
its own simulation, so robots on the same tile pass through each other. `level=` starts
every env on that level instead (with `curriculum=False` it stays there), to measure a
policy on one difficulty.

The actor observes what the robot measures, as on flat ground; the critic also gets a
height scan around the base (`height_scan`). Heights the flat task measures from the
floor (base height, foot contacts) are measured from the terrain under the robot; the
base touching the ground is MuJoCo's contact sensor. Levels, columns and the episode's
walk are arrays of the env, so its state_dict holds them and a resume is exact.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import mujoco
import numpy as np

from sim.terrain import Terrain, TerrainConfig, next_levels


def terrain_config(terrain: TerrainConfig | dict | bool | None) -> TerrainConfig | None:
    """The terrain a task option asks for: None or False for flat ground, True for the
    default tiles, a dict of TerrainConfig fields or a TerrainConfig; ValueError naming
    unknown fields."""
    if terrain is None or terrain is False:
        return None
    if terrain is True:
        return TerrainConfig()
    if isinstance(terrain, dict):
        known = {f.name for f in fields(TerrainConfig)}
        unknown = set(terrain) - known
        if unknown:
            raise ValueError(f"unknown terrain fields {sorted(unknown)}; known: {sorted(known)}")
        return TerrainConfig(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in terrain.items()}
        )
    if isinstance(terrain, TerrainConfig):
        return terrain
    raise ValueError(
        f"terrain must be true, false, a mapping of terrain fields or a TerrainConfig, got {terrain!r}"
    )


class TerrainGround:
    """The terrain half of a legged task; the task calls these where `self.terrain` is set."""

    terrain: Terrain | None = None
    spawn_jitter = 0.5  # m, uniform around the tile centre (the platforms span +-1 m)
    spawn_clearance = 0.4  # m: spawn above the highest ground this close to the base
    bounds_margin = 1.0  # m from the heightfield's edge: leaving it ends the episode
    scan_x = np.linspace(-0.8, 0.8, 17)
    scan_y = np.linspace(-0.5, 0.5, 11)

    # what the task provides
    base_body: str | None
    engine: Any
    num_envs: int
    dt: float
    max_episode_steps: int
    episode_length: np.ndarray
    commands: np.ndarray
    _rng: np.random.Generator
    _reset_qpos: np.ndarray
    min_base_height: float

    def _configure_terrain(
        self,
        terrain: TerrainConfig | dict | bool | None,
        terrain_seed: int,
        max_init_level: int,
        level: int | None,
        curriculum: bool,
        height_scan: bool,
    ) -> None:
        """Before the model is built: the terrain (None: flat ground) and its options."""
        cfg = terrain_config(terrain)
        self.terrain = None if cfg is None else Terrain(cfg, seed=terrain_seed)
        levels = cfg.num_levels if cfg is not None else 1
        if not (isinstance(max_init_level, int) and max_init_level >= 0):
            raise ValueError(f"max_init_level must be an integer >= 0, got {max_init_level!r}")
        self.max_init_level = min(int(max_init_level), levels - 1)
        if self.terrain is None and level is not None:
            raise ValueError("level needs a terrain (the terrain option)")
        if level is not None and not (
            isinstance(level, int) and not isinstance(level, bool) and 0 <= level < levels
        ):
            raise ValueError(f"level must be an integer in [0, {levels - 1}], got {level!r}")
        self.level = level
        self.curriculum = bool(curriculum)
        self.height_scan = bool(height_scan)
        if self.terrain is not None:
            # on stairs the ground under the base is not the ground the feet stand on:
            # falls end episodes through the base's contacts and the tilt, not its height
            self.min_base_height = -np.inf

    def _init_terrain_state(self) -> None:
        """After the env is built: each env's column and starting level."""
        assert self.terrain is not None
        n = self.num_envs
        # legged_gym's assignment: each env keeps one column (kind), levels start low
        self.terrain_cols = np.arange(n, dtype=np.int64) % self.terrain.cfg.num_cols
        if self.level is None:
            self.terrain_levels = self._rng.integers(0, self.max_init_level + 1, size=n)
        else:  # one difficulty for every env, e.g. to measure a policy on it
            self.terrain_levels = np.full(n, self.level, dtype=np.int64)
        self._spawn_xy = np.zeros((n, 2))
        self._end_xy = np.zeros((n, 2))
        self._asked = np.zeros(n)  # commanded planar distance so far this episode (m)
        gx, gy = np.meshgrid(self.scan_x, self.scan_y, indexing="ij")
        self._scan_points = np.stack([gx.ravel(), gy.ravel()], axis=1)
        self.engine.get("sensordata")  # bound before the first reset, as in Quadruped

    # ------------------------------------------------------------------ model
    def _compile_with_terrain(self, spec: mujoco.MjSpec, **geom: Any) -> mujoco.MjModel:
        """Compile `spec` (a robot without ground) on the heightfield, with a contact
        sensor between the base and the terrain; `geom`: the ground's geom settings."""
        assert self.terrain is not None
        self.terrain.add_to_spec(spec, **geom)
        spec.add_sensor(
            name="base_contact",
            type=mujoco.mjtSensor.mjSENS_CONTACT,
            objtype=mujoco.mjtObj.mjOBJ_BODY,
            objname=self.base_body,
            reftype=mujoco.mjtObj.mjOBJ_GEOM,
            refname="terrain",
            intprm=[1, 0, 1],  # data "found", no reduction, one slot
        )
        m = spec.compile()
        sid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SENSOR, "base_contact")
        self._base_contact_adr = int(m.sensor_adr[sid])
        return m

    # ------------------------------------------------------------------ ground
    def _terrain_base_contact(self) -> np.ndarray:
        return self.engine.get("sensordata")[:, self._base_contact_adr] > 0

    def _terrain_obs_terms(self, terms: dict[str, list[tuple[str, int]]]) -> None:
        if self.height_scan:
            terms["critic"] = terms["critic"] + [
                ("height_scan", len(self.scan_x) * len(self.scan_y))
            ]

    def _scan(self) -> np.ndarray:
        """Base height above the ground at points of a grid around it, turned with its
        heading (legged_gym's measured heights), less the standing height."""
        assert self.terrain is not None
        qpos = self.engine.get("qpos")
        w, x, y, z = qpos[:, 3], qpos[:, 4], qpos[:, 5], qpos[:, 6]
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
        px, py = self._scan_points[:, 0], self._scan_points[:, 1]
        pts = np.stack([qpos[:, 0:1] + c * px - s * py, qpos[:, 1:2] + s * px + c * py], axis=-1)
        rel = qpos[:, 2:3] - self.terrain.height_at(pts) - self._reset_qpos[2]
        return np.clip(rel, -1.0, 1.0)

    # ------------------------------------------------------------------ episodes
    def _terrain_ask(self) -> None:
        """Before the step's reward: count the distance the command in force asks for."""
        self._asked += np.linalg.norm(self.commands[:, :2], axis=1) * self.dt

    def _terrain_step(self, extras: dict[str, np.ndarray]) -> np.ndarray:
        """After the step: note where each robot is; per env, whether it left the terrain."""
        assert self.terrain is not None
        xy = self.engine.get("qpos")[:, 0:2]
        self._end_xy[...] = xy
        x0, x1, y0, y1 = self.terrain.extent
        m = self.bounds_margin
        extras["terrain_level"] = self.terrain_levels.astype(np.float64)
        return (xy[:, 0] < x0 + m) | (xy[:, 0] > x1 - m) | (xy[:, 1] < y0 + m) | (xy[:, 1] > y1 - m)

    def _terrain_curriculum(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        """Move the level of the envs among `ids` whose episode just ended (before the
        task draws their next command)."""
        assert self.terrain is not None
        ended = ids[self.episode_length[ids] > 0]
        if not (self.curriculum and len(ended)):
            return
        walked = np.linalg.norm(self._end_xy[ended] - self._spawn_xy[ended], axis=1)
        left = (self.max_episode_steps - self.episode_length[ended]) * self.dt
        asked = self._asked[ended] + np.linalg.norm(self.commands[ended, :2], axis=1) * left
        cfg = self.terrain.cfg
        self.terrain_levels[ended] = next_levels(
            self.terrain_levels[ended], walked, asked, cfg.tile_size, cfg.num_levels, rng
        )

    def _place_on_terrain(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        """Move the reset envs' robots (posed at the origin) to their tiles."""
        assert self.terrain is not None
        k = len(ids)
        origin = self.terrain.origins[self.terrain_levels[ids], self.terrain_cols[ids]]
        xy = origin[:, 0:2] + rng.uniform(-self.spawn_jitter, self.spawn_jitter, size=(k, 2))
        qpos = self.engine.get("qpos")[ids].copy()
        qpos[:, 0:2] = xy
        # the pose was settled on flat ground at height 0: lift it onto the highest ground
        # under the robot so that no foot starts inside a bump or a step
        qpos[:, 2] += self.terrain.max_height_around(xy, self.spawn_clearance)
        self.engine.set("qpos", qpos, ids)
        self._spawn_xy[ids] = xy
        self._end_xy[ids] = xy
        self._asked[ids] = 0.0
