"""The Unitree Go1 tasks: the model built from the installed assets, standing, terrain,
curriculum, and the asset installer (on a fake wheel: no network, no pip)."""

from __future__ import annotations

import json
import zipfile

import mujoco
import numpy as np
import pytest
import torch

import sim
from sim import robot_assets
from sim.randomization import SimToRealConfig
from sim.robot_assets import GO1, AssetsNotInstalledError
from sim.tasks.go1 import (
    ACTION_SCALE,
    DEFAULT_JOINT_POS,
    KD,
    KP,
    TORQUE_LIMIT,
    armature,
)
from sim.tasks.quadruped import JOINTS
from sim.terrain import Terrain, TerrainConfig, next_levels

NOMINAL = SimToRealConfig()  # no randomization, noise, latency or pushes
NUM_KINDS = len(TerrainConfig().kinds)
# the tasks on terrain with its curriculum: the Go1's, and the quadruped's option (on a
# smaller grid of tiles) that shares its code (sim/tasks/terrain_ground.py)
ON_TERRAIN = pytest.mark.parametrize(
    "task, terrain",
    [("go1_rough", {}), ("quadruped", {"terrain": {"num_levels": 5, "num_cols": 5}})],
)


@pytest.fixture(scope="module", autouse=True)
def _installed_assets():
    try:
        robot_assets.go1_model_dir()
    except AssetsNotInstalledError as e:  # setup installs them; a skip would hide that
        pytest.fail(str(e))


def _env(task="go1", n=2, s2r=NOMINAL, seed=0, **kw):
    kw.setdefault("num_threads", 1)
    kw.setdefault("dtype", torch.float64)
    env = sim.make(task, n, seed=seed, s2r=s2r, **kw)
    env.reset()
    return env


def _zeros(env):
    return torch.zeros(env.num_envs, env.action_spec.size, dtype=torch.float64)


def _stand(env, steps):
    """Zero actions (PD holding the home pose) for `steps`; heights above the ground and
    gravity in the base frame, per step."""
    heights, up = [], []
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(_zeros(env))
        assert not (term | trunc).any(), f"episodes ended: {np.nonzero(term.numpy())[0]}"
        base = env._base_state()
        heights.append(base["height"].copy())
        up.append(-base["gravity"][:, 2])
    return np.array(heights), np.array(up)


# ---------------------------------------------------------------------- the model
def test_model_has_our_actuators_and_the_go1_physics():
    env = _env("go1", 1)
    m = env.model
    assert m.nu == 12
    names = [
        mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, m.actuator_trnid[a, 0]) for a in range(12)
    ]
    assert names == list(JOINTS)  # actuators in our FL, FR, RL, RR order
    trunk = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "trunk")
    assert m.body_mass[trunk] == pytest.approx(5.204)
    assert m.body_subtreemass[trunk] == pytest.approx(5.204 + 4 * (0.68 + 1.009 + 0.195862))
    limits = {"hip": 23.7, "thigh": 23.7, "calf": 35.55}
    for a, joint in enumerate(JOINTS):
        part = joint.split("_")[1]
        np.testing.assert_allclose(m.actuator_forcerange[a], [-limits[part], limits[part]])
        j = m.actuator_trnid[a, 0]
        # ctrl range = joint range; the rotor inertia through a 6:1 (knee 9:1) gearbox
        np.testing.assert_allclose(m.actuator_ctrlrange[a], m.jnt_range[j])
        gear = 9.0 if part == "calf" else 6.0
        assert m.dof_armature[m.jnt_dofadr[j]] == pytest.approx(0.000111842 * gear**2)
        assert armature(joint) == pytest.approx(0.000111842 * gear**2)
    np.testing.assert_allclose(
        m.jnt_range[m.actuator_trnid[:3, 0]], [[-0.863, 0.863], [-0.686, 4.501], [-2.818, -0.888]]
    )
    # PD inside MuJoCo: kp on the target, -kp on the position, -kd on the velocity
    np.testing.assert_allclose(m.actuator_gainprm[:, 0], KP)
    np.testing.assert_allclose(m.actuator_biasprm[:, 1], -KP)
    np.testing.assert_allclose(m.actuator_biasprm[:, 2], -KD)
    assert m.opt.timestep == pytest.approx(0.002) and m.narena == 1 << 20
    # robot geoms collide with the ground only
    robot = m.geom_bodyid > 0
    assert (m.geom_conaffinity[robot] == 0).all()


def test_robot_description_carries_the_go1():
    env = _env("go1", 1)
    r = env.robot
    assert r.joint_names == JOINTS and env.action_spec.joint_names == JOINTS
    np.testing.assert_allclose(r.default_joint_pos, DEFAULT_JOINT_POS)
    np.testing.assert_allclose(r.default_joint_pos[:3], [0.1, 0.9, -1.8])  # FL
    np.testing.assert_allclose(r.default_joint_pos[3:6], [-0.1, 0.9, -1.8])  # FR mirrors
    np.testing.assert_allclose(r.kp, KP)
    np.testing.assert_allclose(r.kd, KD)
    np.testing.assert_allclose(r.kp[:3], [15.895, 15.895, 35.764], atol=1e-3)
    np.testing.assert_allclose(r.torque_limit, TORQUE_LIMIT)
    np.testing.assert_allclose(r.action_scale, ACTION_SCALE)
    np.testing.assert_allclose(r.action_scale * r.kp, 0.25 * TORQUE_LIMIT)
    assert r.control_mode == "position"
    assert r.physics_dt == pytest.approx(0.002) and r.control_dt == pytest.approx(0.02)


def test_tasks_are_registered_with_the_quadruped_observations():
    assert {"go1", "go1_rough"} <= set(sim.task_names())
    assert {"terrain", "terrain_seed", "max_init_level", "curriculum", "height_scan"} <= (
        sim.registry.task_options("go1_rough")
    )
    flat, rough = _env("go1", 1), _env("go1_rough", 1)
    quad = sim.make("quadruped", 1, s2r=NOMINAL)
    # the actor sees what the robot measures, on either ground
    assert flat.observation_spec.policy == quad.observation_spec.policy
    assert rough.observation_spec.policy == quad.observation_spec.policy
    critic = rough.observation_spec["critic"]
    assert critic.terms[-1].name == "height_scan" and critic.terms[-1].size == 17 * 11
    assert "height_scan" not in {t.name for t in flat.observation_spec["critic"].terms}


# ---------------------------------------------------------------------- standing
def test_stands_two_seconds_on_flat_ground():
    env = _env("go1", 4)
    heights, up = _stand(env, 100)
    assert heights.min() > 0.22 and heights.max() < 0.30
    assert up.min() > 0.99
    assert np.abs(env.engine.get("qpos")[:, 0:2]).max() < 0.05  # no creeping


def test_stands_two_seconds_on_the_lowest_level_of_every_kind():
    # one env per column: every terrain kind, at level 0
    env = _env("go1_rough", 2 * NUM_KINDS, max_init_level=0)
    assert (env.terrain_levels == 0).all()
    heights, up = _stand(env, 100)
    assert heights.min() > 0.2
    assert up.min() > 0.95
    # each robot stands on its own tile's centre
    origins = env.terrain.origins[0, env.terrain_cols, :2]
    assert np.abs(env.engine.get("qpos")[:, 0:2] - origins).max() < env.spawn_jitter + 0.05


def test_heights_are_measured_from_the_terrain_under_the_robot():
    # a level-5 "stairs_down" tile: its centre platform stands 0.8 m above the floor
    env = _env("go1_rough", NUM_KINDS, max_init_level=0, curriculum=False)
    env.terrain_levels[:] = 5
    env.spawn_jitter = 0.0  # the 2 m platform then holds the whole height scan
    env.reset()
    col = list(env.terrain.cfg.kinds).index("stairs_down")
    assert env.terrain.origins[5, col, 2] > 0.7
    heights, _ = _stand(env, 25)
    assert 0.2 < heights[-1, col] < 0.3
    assert env._foot_contacts()[col].all()  # feet on the platform count as on the ground
    scan = env._task_obs()["height_scan"][col]
    assert np.abs(scan).max() < 0.05  # the critic's scan: flat platform around the base


def test_base_contact_and_leaving_the_terrain_end_episodes():
    env = _env("go1_rough", 3, max_init_level=0)
    qpos, qvel = env.engine.get("qpos").copy(), np.zeros((3, env.model.nv))
    ground = env.terrain.height_at(qpos[:, 0:2])
    qpos[1, 2] = ground[1] + 0.03  # trunk (half height 0.05) pressed into the ground
    x_max = env.terrain.extent[1]
    qpos[2, 0] = x_max - 0.5  # within bounds_margin of the heightfield's edge
    qpos[2, 2] = env.terrain.height_at(qpos[2:3, 0:2])[0] + env._reset_qpos[2]
    env.set_state(qpos, qvel)
    touching = env._base_touches_ground(None, None)
    assert touching.tolist() == [False, True, False]
    _, _, term, _, _ = env.step(_zeros(env))
    assert term.tolist() == [False, True, True]


# ---------------------------------------------------------------------- determinism
@pytest.mark.parametrize("task", ["go1", "go1_rough"])
def test_same_seed_same_trajectory(task):
    def rollout(seed):
        env = _env(task, 3, s2r=None, seed=seed)  # the task's randomization, noise, latency
        rng = np.random.default_rng(0)
        out = []
        for _ in range(15):
            a = torch.as_tensor(rng.normal(size=(3, 12)), dtype=torch.float64)
            obs, rew, *_ = env.step(a)
            out.append(torch.cat([obs["critic"].flatten(), rew]))
        return torch.stack(out)

    a, b, c = rollout(1), rollout(1), rollout(2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@ON_TERRAIN
def test_resume_continues_the_curriculum_exactly(task, terrain):
    def make():
        return _env(task, 4, s2r=None, max_episode_steps=10, **terrain)

    a, rng = make(), np.random.default_rng(0)
    actions = [torch.as_tensor(rng.normal(size=(4, 12))) for _ in range(40)]
    for t in range(15):
        a.step(actions[t])
    b = make()
    b.load_state_dict(a.state_dict())
    start = a.terrain_levels.copy()
    for t in range(15, 40):  # across two more episode ends, with their level changes
        oa, ra, *_ = a.step(actions[t])
        ob, rb, *_ = b.step(actions[t])
        assert torch.equal(oa["critic"], ob["critic"]), t
        # Quadruped's dof_acc sums a restored C-ordered copy of the last joint velocities
        # where the original env holds an F-ordered one: equal up to summation order
        torch.testing.assert_close(ra, rb, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.terrain_levels, b.terrain_levels)
    np.testing.assert_array_equal(a._spawn_xy, b._spawn_xy)
    assert not np.array_equal(a.terrain_levels, start)  # the levels did move


# ---------------------------------------------------------------------- terrain
def test_heightfield_is_deterministic_per_seed_and_roughens_with_level():
    cfg = TerrainConfig(num_levels=5, num_cols=5, tile_size=4.0, border=2.0)
    a, b, c = Terrain(cfg, seed=3), Terrain(cfg, seed=3), Terrain(cfg, seed=4)
    np.testing.assert_array_equal(a.heights, b.heights)
    assert not np.array_equal(a.heights, c.heights)
    rough = a.level_roughness()
    assert (np.diff(rough) > 0).all(), rough
    # within a kind, too: the bumps of "rough" tiles and the steps of stairs grow
    n, bpx = a.tile_px, a.border_px

    def tile(level, col):
        return a.heights[
            bpx + col * n : bpx + (col + 1) * n, bpx + level * n : bpx + (level + 1) * n
        ]

    spans = [np.ptp(tile(level, 0)) for level in range(5)]
    assert (np.diff(spans) > 0).all(), spans
    assert np.ptp(tile(0, 1)) == 0.0  # the easiest slope is flat
    # the world origin lies on the flat border, where the standing pose is settled
    assert (
        a.height_at(np.zeros((1, 2)))[0] == 0.0
        and a.max_height_around(np.zeros((1, 2)), 0.5)[0] == 0.0
    )


def test_the_simulated_ground_is_the_generated_one():
    env = _env("go1_rough", 1, terrain={"num_levels": 4, "num_cols": 5}, terrain_seed=7)
    t = env.terrain
    assert t.heights.shape == (env.model.hfield_nrow[0], env.model.hfield_ncol[0])
    assert np.array_equal(
        t.heights, Terrain(TerrainConfig(num_levels=4, num_cols=5), seed=7).heights
    )
    d = mujoco.MjData(env.model)
    mujoco.mj_forward(env.model, d)
    rng = np.random.default_rng(0)
    x0, x1, y0, y1 = t.extent
    pts = np.stack([rng.uniform(x0 + 1, x1 - 1, 200), rng.uniform(y0 + 1, y1 - 1, 200)], axis=1)
    hit = np.empty(200)
    gid = np.zeros(1, dtype=np.int32)
    for i, (x, y) in enumerate(pts):
        dist = mujoco.mj_ray(
            env.model, d, np.array([x, y, 5.0]), np.array([0, 0, -1.0]), None, 1, -1, gid
        )
        hit[i] = 5.0 - dist
    err = np.abs(hit - t.height_at(pts))
    # bilinear against MuJoCo's triangles: equal on smooth ground, off by a little at step edges
    assert np.median(err) < 1e-4 and err.max() < 0.02


def test_unknown_terrain_settings_are_refused():
    with pytest.raises(ValueError, match="unknown terrain fields"):
        sim.make("go1_rough", 1, terrain={"levels": 3})
    with pytest.raises(ValueError, match="unknown terrain kinds"):
        TerrainConfig(kinds=("lava",))


# ---------------------------------------------------------------------- curriculum
def test_curriculum_rule():
    rng = np.random.default_rng(0)
    levels = np.array([3, 3, 3, 0, 9, 5])
    walked = np.array([5.0, 0.1, 2.0, 0.0, 6.0, 0.0])
    asked = np.array([20.0, 20.0, 3.0, 20.0, 20.0, 0.0])
    new = next_levels(levels, walked, asked, tile_size=8.0, num_levels=10, rng=rng)
    # far: up; short of half the ask: down; between: stays; never below 0; the hardest
    # level solved: a random level; a robot told to stand still that stood still: stays
    assert new[:4].tolist() == [4, 2, 3, 0]
    assert 0 <= new[4] < 10
    assert new[5] == 5


@ON_TERRAIN
def test_curriculum_moves_walkers_up_and_standers_down(task, terrain):
    cmd = [1.0, 0.0, 0.0]  # asks 1 m over a 1 s episode
    env = _env(task, 2, fixed_command=cmd, max_episode_steps=50, max_init_level=0, **terrain)
    env.terrain_levels[:] = 3
    env.reset()
    assert env.terrain_levels.tolist() == [3, 3]
    for step in range(50):
        if step == 25:  # carry robot 0 five metres ahead, onto the same height over the ground
            qpos, qvel = env.engine.get("qpos").copy(), env.engine.get("qvel").copy()
            lift = qpos[0, 2] - env.terrain.height_at(qpos[0:1, 0:2])[0]
            qpos[0, 0] += 5.0
            qpos[0, 2] = env.terrain.max_height_around(qpos[0:1, 0:2], 0.4)[0] + lift
            env.set_state(qpos, qvel)
        _, _, term, trunc, info = env.step(_zeros(env))
        assert info["terrain_level"].tolist() == [3.0, 3.0]
    assert (term | trunc).all()
    # robot 0 walked more than half a tile: level 4; robot 1 stood still with 1 m asked: 2
    assert env.terrain_levels.tolist() == [4, 2]
    _, _, _, _, info = env.step(_zeros(env))
    assert info["terrain_level"].tolist() == [4.0, 2.0]
    # each respawned at the centre of its new tile
    origins = env.terrain.origins[env.terrain_levels, env.terrain_cols, :2]
    assert np.abs(env._spawn_xy - origins).max() <= env.spawn_jitter


@ON_TERRAIN
def test_curriculum_can_be_switched_off(task, terrain):
    cmd = [1.0, 0.0, 0.0]
    env = _env(task, 2, fixed_command=cmd, max_episode_steps=5, curriculum=False, **terrain)
    before = env.terrain_levels.copy()
    for _ in range(5):
        env.step(_zeros(env))
    np.testing.assert_array_equal(env.terrain_levels, before)


# ---------------------------------------------------------------------- assets
def test_missing_assets_name_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(robot_assets.ASSETS_ENV, str(tmp_path))
    with pytest.raises(AssetsNotInstalledError, match=r"python -m sim\.robot_assets install"):
        robot_assets.go1_model_dir()
    with pytest.raises(AssetsNotInstalledError, match=str(tmp_path)):
        sim.make("go1", 1)


def _fake_wheel(path, version="1.6.0"):
    root = "mjlab/asset_zoo/robots/unitree_go1/"
    files = {
        f"mjlab-{version}.dist-info/METADATA": "Name: mjlab\n",
        f"mjlab-{version}.dist-info/licenses/LICENSE": "Apache License 2.0 (fake)\n",
        f"{root}xmls/go1.xml": "<mujoco/>\n",
        f"{root}xmls/assets/trunk.stl": "solid trunk\n",
        f"{root}xmls/assets/calf.stl": "solid calf\n",
        f"{root}xmls/assets/notes.txt": "not a mesh\n",
        f"{root}go1_constants.py": "# code stays in the wheel\n",
        "mjlab/asset_zoo/robots/unitree_g1/xmls/g1.xml": "<mujoco/>\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_install_extracts_only_the_model_meshes_and_licence(tmp_path):
    wheel = _fake_wheel(tmp_path / "mjlab-1.6.0-py3-none-any.whl")
    d = robot_assets.install(GO1, tmp_path / "assets", wheel=wheel)
    assert d == tmp_path / "assets" / "unitree_go1"
    got = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert got == ["LICENSE", "assets/calf.stl", "assets/trunk.stl", "go1.xml", "manifest.json"]
    assert (d / "go1.xml").read_text() == "<mujoco/>\n"
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["source"]["package"] == "mjlab" and manifest["source"]["version"] == "1.6.0"
    assert "BSD-3-Clause" in manifest["provenance"] and "Apache-2.0" in manifest["provenance"]
    assert set(manifest["files"]) == {"LICENSE", "assets/calf.stl", "assets/trunk.stl", "go1.xml"}
    assert robot_assets.verify(GO1, tmp_path / "assets") == []
    assert robot_assets.model_dir(GO1, tmp_path / "assets") == d


def test_install_is_idempotent_and_repairs_a_damaged_copy(tmp_path, monkeypatch):
    wheel = _fake_wheel(tmp_path / "mjlab-1.6.0-py3-none-any.whl")
    downloads = []

    def fake_download(asset, into):
        downloads.append(asset.requirement)
        return wheel

    monkeypatch.setattr(robot_assets, "download_wheel", fake_download)
    root = tmp_path / "assets"
    d = robot_assets.install(GO1, root)
    assert downloads == ["mjlab==1.6.0"]
    robot_assets.install(GO1, root)  # a verified copy: nothing to download
    assert downloads == ["mjlab==1.6.0"]
    (d / "assets" / "calf.stl").write_text("changed")
    assert any("calf.stl" in p for p in robot_assets.verify(GO1, root))
    assert robot_assets.main(["verify", "--root", str(root)]) == 1
    robot_assets.install(GO1, root)
    assert len(downloads) == 2 and robot_assets.verify(GO1, root) == []
    assert robot_assets.main(["verify", "--root", str(root)]) == 0


def test_install_refuses_another_version(tmp_path):
    wheel = _fake_wheel(tmp_path / "mjlab-1.5.0-py3-none-any.whl", version="1.5.0")
    with pytest.raises(ValueError, match=r"not the wheel of mjlab==1\.6\.0"):
        robot_assets.install(GO1, tmp_path / "assets", wheel=wheel)
    assert not (tmp_path / "assets" / "unitree_go1").exists()
