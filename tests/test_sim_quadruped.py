"""The quadruped locomotion task: specs, standing, sim-to-real models, bring-your-own MJCF."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch

import sim
from sim.mjcf import load_model
from sim.randomization import SimToRealConfig
from sim.tasks.quadruped import (
    DEFAULT_MODEL,
    JOINTS,
    Quadruped,
    quat_mul,
    quat_to_mat,
    yaw_quat,
)

NOMINAL = SimToRealConfig()  # no randomization, noise, latency or pushes
NP = 45  # policy frame size


def _env(n=4, s2r=NOMINAL, seed=0, **kw) -> Quadruped:
    kw.setdefault("num_threads", 2)
    kw.setdefault("dtype", torch.float64)
    env = sim.make("quadruped", n, seed=seed, s2r=s2r, **kw)
    env.reset()
    return env


def _zeros(env):
    return torch.zeros(env.num_envs, env.action_spec.size, dtype=torch.float64)


def _xml_text():
    with open(DEFAULT_MODEL) as f:
        return f.read()


# ---------------------------------------------------------------------- specs
def test_specs_and_rates():
    env = _env(2)
    pol = env.observation_spec.policy
    assert [(t.name, t.size) for t in pol.terms] == [
        ("base_ang_vel", 3),
        ("projected_gravity", 3),
        ("command", 3),
        ("joint_pos", 12),
        ("joint_vel", 12),
        ("last_action", 12),
    ]
    assert pol.size == NP
    critic = env.observation_spec["critic"]
    assert critic.size > pol.size
    assert critic.terms[: len(pol.terms)] == pol.terms
    assert {t.name for t in critic.terms} >= {
        "base_lin_vel",
        "friction",
        "added_mass",
        "motor_strength",
        "base_height",
    }
    assert env.action_spec.size == 12 and env.action_spec.joint_names == JOINTS
    assert np.all(env.action_spec.low < 0) and np.all(env.action_spec.high > 0)
    assert env.physics_rate_hz == pytest.approx(500.0)
    assert env.control_rate_hz == pytest.approx(50.0)
    assert env.max_episode_steps == 1000
    obs = env.reset()
    assert obs["policy"].shape == (2, NP) and obs["critic"].shape == (2, critic.size)
    assert "quadruped" in sim.task_names()


def test_robot_description_matches_model():
    env = _env(1)
    m, r = env.model, env.robot
    assert r.control_mode == "position" and r.joint_names == JOINTS
    assert r.physics_dt == pytest.approx(0.002) and r.control_dt == pytest.approx(0.02)
    for i, name in enumerate(JOINTS):
        j = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        a = [k for k in range(m.nu) if m.actuator_trnid[k, 0] == j]
        assert len(a) == 1
        a = a[0]
        assert r.kp[i] == m.actuator_gainprm[a, 0] == -m.actuator_biasprm[a, 1]
        assert r.kd[i] == -m.actuator_biasprm[a, 2]
        assert r.torque_limit[i] == m.actuator_forcerange[a, 1]
        assert (r.joint_pos_lower[i], r.joint_pos_upper[i]) == tuple(m.jnt_range[j])
        assert r.default_joint_pos[i] == m.key_qpos[0, m.jnt_qposadr[j]]
    np.testing.assert_array_equal(r.action_scale, 0.25)
    np.testing.assert_array_equal(r.action_offset, r.default_joint_pos)
    assert 20 <= r.kp.min() and r.kp.max() <= 40
    assert 0.5 <= r.kd.min() and r.kd.max() <= 1.0
    assert 25 <= r.torque_limit.min() and r.torque_limit.max() <= 35
    assert list(r.to_dict()["joint_names"]) == list(JOINTS)
    # a Go1/ANYmal-class weight
    assert 10.0 < m.body_subtreemass[1] < 15.0


def test_zero_action_targets_the_standing_pose():
    env = _env(2)
    env.step(_zeros(env))
    np.testing.assert_allclose(
        env.engine.get("ctrl")[:, : len(JOINTS)], np.tile(env.robot.default_joint_pos, (2, 1))
    )


# ---------------------------------------------------------------------- standing
@pytest.mark.parametrize("s2r", ["nominal", "randomized"])
def test_stands_under_pd_at_default_pose(s2r):
    cfg = NOMINAL
    if s2r == "randomized":
        d = Quadruped.default_s2r()
        cfg = SimToRealConfig(**{**d.__dict__, "push_interval_s": None})
    env = _env(8, cfg, seed=3)
    heights, tilts = [], []
    for _ in range(100):  # 2 s
        obs, rew, term, trunc, info = env.step(_zeros(env))
        assert not term.any() and not trunc.any()
        heights.append(env.engine.get("qpos")[:, 2].copy())
        tilts.append(obs["critic"][:, 3:6].numpy()[:, 2].copy())
    h = np.array(heights[25:])  # after the first half second of settling
    assert np.all(h > 0.25) and np.all(h < 0.34)
    assert np.all(h.max(axis=0) - h.min(axis=0) < 0.01)
    assert np.all(np.array(tilts) < -0.98)  # upright
    # it stands still
    assert np.abs(env.engine.get("qvel")[:, :6]).max() < 0.05


# ---------------------------------------------------------------------- randomization
def _draws(env):
    e = env.engine
    return {
        "mass": e.model_field("body_mass").copy(),
        "friction": e.model_field("geom_friction")[:, :, 0].copy(),
        "kp": e.model_field("actuator_gainprm")[:, :, 0].copy(),
        "kv": -e.model_field("actuator_biasprm")[:, :, 2].copy(),
        "force": e.model_field("actuator_forcerange")[:, :, 1].copy(),
    }


def _check_ranges(env, d):
    cfg, r, m = env.s2r, env.randomizer, env.model
    nom_mass = m.body_mass
    base = env._base_id
    others = [b for b in range(1, m.nbody) if b != base]
    ratio = d["mass"][:, others] / nom_mass[others]
    # one scale per env for every body
    np.testing.assert_allclose(ratio, ratio[:, :1].repeat(len(others), axis=1))
    assert np.all((ratio >= cfg.mass_scale[0]) & (ratio <= cfg.mass_scale[1]))
    added = d["mass"][:, base] - nom_mass[base] * ratio[:, 0]
    assert np.all((added >= cfg.added_base_mass[0] - 1e-9) & (added <= cfg.added_base_mass[1]))
    np.testing.assert_allclose(added, r.added_mass)
    f = d["friction"] / m.geom_friction[:, 0]
    assert np.all((f >= cfg.friction_scale[0]) & (f <= cfg.friction_scale[1]))
    np.testing.assert_allclose(f[:, 0], r.friction)
    s = d["force"] / m.actuator_forcerange[:, 1]
    assert np.all((s >= cfg.motor_strength[0]) & (s <= cfg.motor_strength[1]))
    np.testing.assert_allclose(s, r.strength)
    kp = d["kp"] / m.actuator_gainprm[:, 0] / s
    kd = d["kv"] / -m.actuator_biasprm[:, 2] / s
    assert np.all((kp >= cfg.kp_scale[0] - 1e-12) & (kp <= cfg.kp_scale[1] + 1e-12))
    assert np.all((kd >= cfg.kd_scale[0] - 1e-12) & (kd <= cfg.kd_scale[1] + 1e-12))


def test_randomization_ranges_redraws_and_no_compounding():
    cfg = SimToRealConfig(
        mass_scale=(0.8, 1.2),
        added_base_mass=(-1.0, 2.0),
        friction_scale=(0.5, 1.25),
        motor_strength=(0.9, 1.1),
        kp_scale=(0.8, 1.2),
        kd_scale=(0.7, 1.3),
    )
    env = _env(6, cfg, seed=1)
    nominal = (env.model.body_mass.copy(), env.model.geom_friction.copy())
    first = _draws(env)
    _check_ranges(env, first)
    # envs differ from each other
    for v in first.values():
        assert len(np.unique(v.reshape(len(v), -1), axis=0)) == 6
    # the critic sees the current draws
    obs = env._obs["critic"].numpy()
    sl = env.observation_spec["critic"].slices()
    np.testing.assert_allclose(obs[:, sl["friction"]][:, 0], env.randomizer.friction)
    np.testing.assert_allclose(obs[:, sl["added_mass"]][:, 0], env.randomizer.added_mass)
    np.testing.assert_allclose(obs[:, sl["motor_strength"]], env.randomizer.strength)
    for _ in range(15):
        env.reset()
    later = _draws(env)
    _check_ranges(env, later)  # still within the ranges: draws never compound
    for k in first:
        assert not np.allclose(first[k], later[k]), k
    # the nominal model is untouched
    np.testing.assert_array_equal(env.model.body_mass, nominal[0])
    np.testing.assert_array_equal(env.model.geom_friction, nominal[1])
    # same seed, same draws; another seed, other draws
    again = _draws(_env(6, cfg, seed=1))
    other = _draws(_env(6, cfg, seed=2))
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
        assert not np.allclose(first[k], other[k])


def test_episode_end_redraws_only_that_env():
    env = _env(3, Quadruped.default_s2r(), seed=4, max_episode_steps=1000)
    before = _draws(env)
    q = env.engine.get("qpos")[0].copy()
    q[2] = 0.1  # env 0 sinks: terminated, reset inside the step
    env.engine.set("qpos", q[None], np.array([0]))
    _, _, term, _, _ = env.step(_zeros(env))
    assert term.tolist() == [True, False, False]
    after = _draws(env)
    for k in before:
        assert not np.allclose(before[k][0], after[k][0])
        np.testing.assert_array_equal(before[k][1:], after[k][1:])


def test_randomization_disabled_keeps_nominal_values():
    env = _env(3, NOMINAL)
    for _ in range(3):
        env.reset()
    d = _draws(env)
    m = env.model
    np.testing.assert_array_equal(d["mass"], np.tile(m.body_mass, (3, 1)))
    np.testing.assert_array_equal(d["friction"], np.tile(m.geom_friction[:, 0], (3, 1)))
    np.testing.assert_array_equal(d["kp"], np.tile(m.actuator_gainprm[:, 0], (3, 1)))
    np.testing.assert_array_equal(d["force"], np.tile(m.actuator_forcerange[:, 1], (3, 1)))
    np.testing.assert_array_equal(env.randomizer.strength, 1.0)
    np.testing.assert_array_equal(env.randomizer.added_mass, 0.0)


# ---------------------------------------------------------------------- latency
@pytest.mark.parametrize("delay", [0, 2])
def test_action_latency_delays_ctrl_targets(delay):
    env = _env(2, SimToRealConfig(action_latency=(delay, delay)))
    default = env.robot.default_joint_pos
    a = np.zeros((2, 12))
    a[:, 4] = 1.0  # FR thigh
    seen = []
    for t in range(5):
        env.step(a if t >= 1 else np.zeros((2, 12)))
        seen.append(env.engine.get("ctrl")[:, 4].copy())
    seen = np.array(seen)
    expect = np.where(np.arange(5) >= 1 + delay, default[4] + 0.25, default[4])
    np.testing.assert_allclose(seen, np.stack([expect, expect], axis=1))


# ---------------------------------------------------------------------- noise and bias
def test_observation_noise_has_configured_std():
    env = _env(64, SimToRealConfig(obs_noise={"joint_pos": 0.05, "base_ang_vel": 0.2}))
    sl = env.observation_spec.policy.slices()
    diffs = []
    for _ in range(10):
        obs, *_ = env.step(_zeros(env))
        diffs.append((obs["policy"] - obs["critic"][:, :NP]).numpy())
    d = np.concatenate(diffs)
    assert d[:, sl["joint_pos"]].std() == pytest.approx(0.05, rel=0.1)
    assert d[:, sl["base_ang_vel"]].std() == pytest.approx(0.2, rel=0.1)
    assert abs(d[:, sl["joint_pos"]].mean()) < 0.01
    for k in ("projected_gravity", "command", "joint_vel", "last_action"):
        np.testing.assert_array_equal(d[:, sl[k]], 0.0)


def test_zero_noise_observation_equals_clean_copy():
    env = _env(4, NOMINAL)
    for _ in range(3):
        obs, *_ = env.step(np.random.default_rng(0).uniform(-1, 1, (4, 12)))
        np.testing.assert_array_equal(obs["policy"].numpy(), obs["critic"][:, :NP].numpy())


def test_observation_bias_is_constant_within_an_episode():
    env = _env(64, SimToRealConfig(obs_bias={"projected_gravity": 0.1}))
    sl = env.observation_spec.policy.slices()["projected_gravity"]
    diffs = []
    for _ in range(3):
        obs, *_ = env.step(_zeros(env))
        diffs.append((obs["policy"] - obs["critic"][:, :NP]).numpy()[:, sl])
    np.testing.assert_allclose(diffs[0], diffs[2])
    assert diffs[0].std() == pytest.approx(0.1, rel=0.2)
    env.reset()
    obs = env._obs
    new = (obs["policy"] - obs["critic"][:, :NP]).numpy()[:, sl]
    assert not np.allclose(new, diffs[0])  # redrawn per episode


def test_unknown_noise_term_is_refused():
    with pytest.raises(ValueError, match="unknown observation terms.*joint_torque"):
        sim.make("quadruped", 1, s2r=SimToRealConfig(obs_noise={"joint_torque": 0.1}))
    with pytest.raises(ValueError, match="unknown observation terms"):
        sim.make("quadruped", 1, s2r={"obs_bias": {"base_lin_vel": 0.1}})  # critic only


# ---------------------------------------------------------------------- pushes
def _planar_speed(cfg, seed, steps=40):
    env = _env(4, cfg, seed=seed)
    v = []
    for _ in range(steps):
        env.step(_zeros(env))
        v.append(env.engine.get("qvel")[:, :2].copy())
    return np.array(v)


def test_pushes_kick_the_base_and_follow_the_seed():
    push = SimToRealConfig(push_interval_s=0.15, push_velocity=1.0)
    calm = _planar_speed(NOMINAL, 0)
    a = _planar_speed(push, 0)
    b = _planar_speed(push, 0)
    c = _planar_speed(push, 1)
    assert np.abs(calm[25:]).max() < 0.03
    speed = np.linalg.norm(a, axis=2)
    assert speed.max() > 0.3
    # several separate kicks per env within 0.8 s
    jumps = (np.diff(speed, axis=0) > 0.1).sum(axis=0)
    assert np.all(jumps >= 2)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


# ---------------------------------------------------------------------- history
def test_observation_history_stacks_oldest_first():
    env = _env(3, SimToRealConfig(obs_history=3))
    assert env.observation_spec.policy.size == 3 * NP
    obs = env._obs
    f0 = obs["critic"][:, :NP].numpy()
    np.testing.assert_array_equal(obs["policy"].numpy(), np.tile(f0, 3))
    rng = np.random.default_rng(0)
    frames = [f0]
    for t in range(3):
        if t == 2:  # env 0 ends its episode in this step
            q = env.engine.get("qpos")[0].copy()
            q[2] = 0.1
            env.engine.set("qpos", q[None], np.array([0]))
        obs, _, term, _, info = env.step(rng.uniform(-0.5, 0.5, (3, 12)))
        frames.append(obs["critic"][:, :NP].numpy())
        p = obs["policy"].numpy()
        if t == 0:
            np.testing.assert_array_equal(p, np.concatenate([f0, f0, frames[1]], axis=1))
        if t == 1:
            np.testing.assert_array_equal(p, np.concatenate(frames[:3], axis=1))
    assert term.tolist() == [True, False, False]
    # the reset env starts over with its first frame; the others keep their stream
    np.testing.assert_array_equal(p[0], np.tile(frames[3][0], 3))
    np.testing.assert_array_equal(p[1:], np.concatenate([f[1:] for f in frames[1:]], axis=1))
    last = info["final_obs"]["policy"].numpy()
    np.testing.assert_array_equal(last[1:], p[1:])
    obs, *_ = env.step(np.zeros((3, 12)))
    f4 = obs["critic"][:, :NP].numpy()
    p = obs["policy"].numpy()
    np.testing.assert_array_equal(p[0], np.concatenate([frames[3][0], frames[3][0], f4[0]]))
    np.testing.assert_array_equal(p[1:], np.concatenate([frames[2][1:], frames[3][1:], f4[1:]], 1))


# ---------------------------------------------------------------------- commands
def test_commands_sampled_in_ranges_and_resampled():
    env = _env(
        64,
        command_vx=(0.5, 1.0),
        command_vy=(-0.3, 0.3),
        command_yaw=(-0.5, 0.5),
        command_resample_s=0.1,
    )
    sl = env.observation_spec.policy.slices()["command"]
    c0 = env._obs["policy"][:, sl].numpy().copy()
    assert np.all((c0[:, 0] >= 0.5) & (c0[:, 0] <= 1.0))
    assert np.all(np.abs(c0[:, 1]) <= 0.3) and np.all(np.abs(c0[:, 2]) <= 0.5)
    assert len(np.unique(c0[:, 0])) == 64
    for _ in range(4):
        obs, *_ = env.step(_zeros(env))
        np.testing.assert_array_equal(obs["policy"][:, sl].numpy(), c0)
    obs, *_ = env.step(_zeros(env))  # 5 steps = 0.1 s: a new draw
    c1 = obs["policy"][:, sl].numpy()
    assert not np.any(np.all(c1 == c0, axis=1))
    assert np.all((c1[:, 0] >= 0.5) & (c1[:, 0] <= 1.0))


def test_infinite_resample_interval_keeps_the_first_command():
    env = _env(2, command_resample_s=float("inf"), max_episode_steps=2000)
    c0 = env.commands.copy()
    env.episode_length[:] = 499  # the next step would be a 10 s draw
    env.step(_zeros(env))
    np.testing.assert_array_equal(env.commands, c0)


def test_small_planar_commands_mean_stand_still():
    env = _env(64, command_vx=(-0.1, 0.1), command_vy=(-0.1, 0.1))
    np.testing.assert_array_equal(env.commands[:, :2], 0.0)
    assert np.all(env.commands[:, 2] != 0.0)


def test_fixed_and_set_command():
    env = _env(3, fixed_command=(0.8, 0.0, 0.2), command_resample_s=0.04)
    sl = env.observation_spec.policy.slices()["command"]
    for _ in range(5):
        obs, *_ = env.step(_zeros(env))
        np.testing.assert_array_equal(
            obs["policy"][:, sl].numpy(), np.tile([0.8, 0.0, 0.2], (3, 1))
        )
    cmd = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [-1.0, 0.0, 1.0]])
    env.set_command(cmd)
    obs, *_ = env.step(_zeros(env))
    np.testing.assert_array_equal(obs["policy"][:, sl].numpy(), cmd)
    env.set_command([0.0, 0.0, 0.0], ids=[1])
    assert env.commands[1].tolist() == [0.0, 0.0, 0.0] and env.commands[0, 0] == 0.1
    env.reset()  # the fixed command comes back
    np.testing.assert_array_equal(env.commands, np.tile([0.8, 0.0, 0.2], (3, 1)))
    with pytest.raises(ValueError, match="shape"):
        env.set_command(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="finite"):
        env.set_command([np.nan, 0.0, 0.0])
    with pytest.raises(ValueError, match="fixed_command"):
        sim.make("quadruped", 1, fixed_command=(1.0, 0.0))
    with pytest.raises(ValueError, match="command_vx"):
        sim.make("quadruped", 1, command_vx=(1.0, -1.0))
    with pytest.raises(ValueError, match="unknown reward terms"):
        sim.make("quadruped", 1, reward_weights={"speed": 1.0})


# ---------------------------------------------------------------------- state and reward
def test_base_frame_quantities_match_mujoco_sensors():
    env = _env(5, NOMINAL)
    env.engine.get("sensordata")  # bind before the forward() of set_state fills it
    rng = np.random.default_rng(7)
    q = env.engine.get("qpos").copy()
    v = rng.normal(size=(5, env.model.nv))
    quat = rng.normal(size=(5, 4))
    q[:, 3:7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    q[:, 2] = 1.0
    env.set_state(q, v)
    crit = env._obs["critic"].numpy()
    sl = env.observation_spec["critic"].slices()
    sens = env.engine.get("sensordata")
    m = env.model
    adr = {
        mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_SENSOR, i): m.sensor_adr[i]
        for i in range(m.nsensor)
    }
    np.testing.assert_allclose(crit[:, sl["base_ang_vel"]], sens[:, adr["imu_gyro"] :][:, :3])
    np.testing.assert_allclose(crit[:, sl["base_lin_vel"]], sens[:, adr["imu_linvel"] :][:, :3])
    r = quat_to_mat(q[:, 3:7])
    np.testing.assert_allclose(crit[:, sl["projected_gravity"]], -r[:, 2, :])
    np.testing.assert_allclose(np.linalg.norm(crit[:, sl["projected_gravity"]], axis=1), 1.0)
    np.testing.assert_allclose(crit[:, sl["base_height"]][:, 0], 1.0)
    jp = crit[:, sl["joint_pos"]] + env.robot.default_joint_pos
    np.testing.assert_allclose(jp, q[:, 7:])
    np.testing.assert_allclose(crit[:, sl["joint_vel"]], v[:, 6:])


def test_tracking_errors_and_air_time_reward():
    env = _env(2, fixed_command=(0.5, 0.0, 0.0))
    for _ in range(30):
        _, rew, _, _, info = env.step(_zeros(env))
    # standing still while asked to walk at 0.5 m/s
    np.testing.assert_allclose(info["lin_vel_error"].numpy(), 0.5, atol=0.02)
    np.testing.assert_allclose(info["ang_vel_error"].numpy(), 0.0, atol=0.02)
    expect = env.dt * (math.exp(-0.25 / 0.25) + 0.5)
    np.testing.assert_allclose(rew.numpy(), expect, atol=2e-3)
    terms = [k for k in info if k.startswith("rew_")]
    total = sum(info[k] for k in terms)
    np.testing.assert_allclose(total.numpy(), rew.numpy())
    # every foot lands after 0.8 s in the air: 4 * (0.8 + dt - 0.5), paid once
    env.feet_air_time[:] = 0.8
    env.last_contacts[:] = False
    _, _, _, _, info = env.step(_zeros(env))
    np.testing.assert_allclose(
        info["rew_feet_air_time"].numpy(), 4 * (0.8 + env.dt - 0.5) * env.dt, rtol=1e-6
    )
    _, _, _, _, info = env.step(_zeros(env))
    np.testing.assert_array_equal(info["rew_feet_air_time"].numpy(), 0.0)
    # no air-time reward without a planar command
    env.set_command([0.0, 0.0, 0.5])
    env.feet_air_time[:] = 0.8
    env.last_contacts[:] = False
    _, _, _, _, info = env.step(_zeros(env))
    np.testing.assert_array_equal(info["rew_feet_air_time"].numpy(), 0.0)


@pytest.mark.parametrize("clip", [True, False])
def test_only_positive_rewards_clips_the_summed_reward(clip):
    # penalties only: the summed reward is <= 0 on every step
    no_tracking = {"tracking_lin_vel": 0.0, "tracking_ang_vel": 0.0, "feet_air_time": 0.0}
    env = _env(4, reward_weights=no_tracking, only_positive_rewards=clip)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        a = torch.randn(env.num_envs, env.action_spec.size, generator=g, dtype=torch.float64)
        _, rew, _, _, info = env.step(a)
        total = sum(info[k] for k in info if k.startswith("rew_"))
        assert (total < 0).all()
        expect = torch.zeros_like(total) if clip else total
        torch.testing.assert_close(rew, expect.to(rew.dtype))


def test_terminations():
    env = _env(4, NOMINAL)
    q = env.engine.get("qpos").copy()
    q[1, 2] = 0.15  # too low
    q[2, 3:7] = [math.cos(0.6), math.sin(0.6), 0.0, 0.0]  # rolled by 69 degrees
    env.engine.set("qpos", q)
    _, _, term, trunc, info = env.step(_zeros(env))
    assert term.tolist() == [False, True, True, False] and not trunc.any()
    assert "episode" in info
    # the trunk touching the floor, judged from its box
    base = env._base_state()
    lowest = env._base_lowest_point(base, env.engine.get("qpos"))
    np.testing.assert_allclose(lowest, env.engine.get("qpos")[:, 2] - 0.055, atol=0.01)
    q = env.engine.get("qpos").copy()
    q[:, 2] = 0.5
    q[:, 3:7] = [math.cos(math.pi / 4), math.sin(math.pi / 4), 0, 0]  # on its side
    env.engine.set("qpos", q)
    lowest = env._base_lowest_point(env._base_state(), q)
    np.testing.assert_allclose(lowest, 0.5 - 0.095, atol=1e-9)
    # judged alone: lying on its back, the trunk rests on the floor
    env = _env(2, NOMINAL)
    env.min_base_height = 0.0
    env.max_tilt = math.pi
    q = env.engine.get("qpos").copy()
    q[0, 2] = 0.056
    q[0, 3:7] = [0.0, 1.0, 0.0, 0.0]
    env.engine.set("qpos", q)
    _, _, term, _, _ = env.step(_zeros(env))
    assert term.tolist() == [True, False]


def test_reset_pose_yaw_and_velocity():
    env = _env(16, NOMINAL, seed=9)
    q, v = env.get_state()["qpos"], env.get_state()["qvel"]
    np.testing.assert_array_equal(v, 0.0)
    np.testing.assert_array_equal(q[:, :2], 0.0)
    # the standing pose settled on its PD targets: a little lower than the keyframe
    settled = env._reset_qpos
    assert 0.25 < settled[2] < env.model.key_qpos[0, 2]
    np.testing.assert_allclose(q[:, 2], settled[2])
    yaw = 2 * np.arctan2(q[:, 6], q[:, 3])
    assert np.ptp(yaw) > 2.0
    np.testing.assert_allclose(q[:, 3:7], quat_mul(yaw_quat(yaw), settled[None, 3:7]), atol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(q[:, 3:7], axis=1), 1.0)
    dev = q[:, 7:] - settled[7:]
    assert np.abs(dev).max() <= env.reset_joint_noise and np.abs(dev).max() > 0
    np.testing.assert_allclose(settled[7:], env.robot.default_joint_pos, atol=0.2)


def test_same_seed_same_trajectory_with_default_s2r():
    def run(threads, seed=3):
        env = _env(4, Quadruped.default_s2r(), seed=seed, num_threads=threads)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(25):
            obs, rew, *_ = env.step(rng.uniform(-1, 1, (4, 12)))
            out += [obs["policy"].numpy(), obs["critic"].numpy(), rew.numpy()]
        return out

    a, b, c = run(1), run(2), run(1, seed=4)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(a[0], c[0])


def test_default_s2r_is_the_training_setup():
    cfg = Quadruped.default_s2r()
    assert cfg.randomizes_model and cfg.action_latency == (0, 1)
    assert cfg.push_interval_s and cfg.push_velocity > 0
    assert set(cfg.obs_noise) == {"base_ang_vel", "projected_gravity", "joint_pos", "joint_vel"}
    env = sim.make("quadruped", 2, seed=0)
    assert env.s2r == cfg


# ---------------------------------------------------------------------- bring your own robot
def test_own_mjcf_loads(tmp_path):
    path = tmp_path / "my_robot.xml"
    path.write_text(_xml_text().replace('kp="30"', 'kp="35"'))
    env = _env(2, model_path=str(path))
    np.testing.assert_array_equal(env.robot.kp, 35.0)
    assert env.observation_spec.policy.size == NP
    env.step(_zeros(env))


# the trunk as each geom shape: (MJCF type and size, lowest point below the base origin
# upright, and rolled 90 degrees about x), by hand from the shape's size
TRUNK_SHAPES = {
    "sphere": ('type="sphere" size="0.07"', 0.07, 0.07),
    # a capsule's and a cylinder's axis is the geom's z: upright it points down at the floor
    "capsule": ('type="capsule" size="0.05 0.12"', 0.12 + 0.05, 0.05),
    "cylinder": ('type="cylinder" size="0.06 0.1"', 0.1, 0.06),
    "ellipsoid": ('type="ellipsoid" size="0.19 0.095 0.055"', 0.055, 0.095),
    "box": ('type="box" size="0.19 0.095 0.055"', 0.055, 0.095),
}


@pytest.mark.parametrize("shape", list(TRUNK_SHAPES))
def test_trunk_contact_height_for_every_geom_shape(tmp_path, shape):
    """Each shape's rule in _base_lowest_point, against its size by hand: upright and
    on its side, at a height where nothing touches the floor."""
    mjcf, upright, on_side = TRUNK_SHAPES[shape]
    path = tmp_path / f"trunk_{shape}.xml"
    text = _xml_text()
    box = 'type="box" size="0.19 0.095 0.055"'
    assert text.count(box) == 1
    path.write_text(text.replace(box, mjcf))
    env = _env(2, model_path=str(path))
    q = env.engine.get("qpos").copy()
    q[:, 2] = 0.6
    q[0, 3:7] = [1.0, 0.0, 0.0, 0.0]
    q[1, 3:7] = [math.cos(math.pi / 4), math.sin(math.pi / 4), 0, 0]  # rolled about x
    env.engine.set("qpos", q)
    env.engine.forward(np.arange(2))
    lowest = env._base_lowest_point(env._compute_base_state(), q)
    np.testing.assert_allclose(lowest, [0.6 - upright, 0.6 - on_side], atol=1e-9)


def test_missing_mjcf_names_the_path(tmp_path):
    path = tmp_path / "nope" / "robot.xml"
    with pytest.raises(FileNotFoundError, match="robot.xml"):
        sim.make("quadruped", 1, model_path=str(path))
    with pytest.raises(FileNotFoundError, match="directory"):
        load_model(tmp_path)


def test_malformed_mjcf(tmp_path):
    path = tmp_path / "broken.xml"
    path.write_text(_xml_text()[:2000])
    with pytest.raises(ValueError, match=r"could not load MJCF .*broken\.xml: .*XML") as e:
        sim.make("quadruped", 1, model_path=str(path))
    assert isinstance(e.value.__cause__, ValueError)
    path.write_text("this is not xml at all")
    with pytest.raises(ValueError, match="could not load MJCF"):
        load_model(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (('name="base"', 'name="trunk_body"'), "lacks the body 'base'"),
        (("RR_calf_joint", "RR_knee"), "lacks the joint 'RR_calf_joint'"),
        (('name="FL_foot"', 'name="FL_toe"'), "lacks the geom 'FL_foot'"),
        (('<key name="home"', '<key name="stand"'), "lacks the keyframe 'home'"),
        (
            ('<position name="FL_calf" joint="FL_calf_joint" class="calf"/>', ""),
            "lacks actuators for the joints \\['FL_calf_joint'\\]",
        ),
        (
            ('<position name="FL_hip"', '<motor gear="1" name="FL_hip"'),
            "not position actuators",
        ),
        (('<freejoint name="base_free"/>', ""), "no free joint"),
    ],
)
def test_mjcf_without_expected_parts(tmp_path, edit, message):
    text = _xml_text()
    assert edit[0] in text
    text = text.replace(*edit)
    if "freejoint" in edit[0]:  # the keyframe must match the model's size
        text = text.replace('qpos="0 0 0.325  1 0 0 0', 'qpos="')
    if edit[0].startswith('<position name="FL_calf"'):  # the keyframe must match too
        text = text.replace(
            'ctrl="0.1 0.8 -1.5   -0.1 0.8 -1.5   0.1 1.0 -1.5   -0.1 1.0 -1.5"', ""
        )
    if "<motor" in edit[1]:
        text = text.replace(
            '<motor gear="1" name="FL_hip" joint="FL_hip_joint" class="hip"/>',
            '<motor gear="1" name="FL_hip" joint="FL_hip_joint"/>',
        )
    path = tmp_path / "robot.xml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        sim.make("quadruped", 1, model_path=str(path))
    assert "robot.xml" in str(e.value)


# ---------------------------------------------------------------------- terrain
SMALL_TERRAIN = {"num_levels": 5, "num_cols": 5}


def test_flat_by_default_and_a_heightfield_with_the_terrain_option():
    flat = _env(1)
    assert flat.terrain is None and not hasattr(flat, "terrain_levels")
    assert mujoco.mjtGeom.mjGEOM_PLANE in flat.model.geom_type
    rough = _env(5, terrain=SMALL_TERRAIN, max_init_level=0, num_threads=1)
    m = rough.model
    assert m.nhfield == 1 and mujoco.mjtGeom.mjGEOM_PLANE not in m.geom_type
    # the heightfield took over the file's floor contact settings
    hf = list(m.geom_type).index(mujoco.mjtGeom.mjGEOM_HFIELD)
    np.testing.assert_allclose(m.geom_friction[hf], [1.0, 0.005, 0.0001])
    # the same actor observations; the critic also scans the ground
    assert rough.observation_spec.policy.size == flat.observation_spec.policy.size
    assert rough.observation_spec["critic"].size == flat.observation_spec["critic"].size + 187
    # one env per kind, level 0: each stands a second on its tile, heights from the ground
    assert (rough.terrain_levels == 0).all()
    for _ in range(50):
        _, _, term, trunc, info = rough.step(_zeros(rough))
        assert not (term | trunc).any()
    assert info["terrain_level"].tolist() == [0.0] * 5
    assert (rough._base_state()["height"] > 0.2).all()
    origins = rough.terrain.origins[0, rough.terrain_cols, :2]
    assert np.abs(rough.engine.get("qpos")[:, :2] - origins).max() < 1.0


# the terrain curriculum's level moves, its switch and exact resume: tests/test_sim_go1.py
# runs them on the quadruped's terrain too (ON_TERRAIN)


def test_bad_terrain_options_are_refused():
    with pytest.raises(ValueError, match="unknown terrain fields"):
        sim.make("quadruped", 1, terrain={"levels": 3})
    with pytest.raises(ValueError, match="level needs a terrain"):
        sim.make("quadruped", 1, level=2)
