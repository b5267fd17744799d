"""Task hooks in torch (sim/device_step.py, sim/tasks/*_torch.py) against the numpy
hooks, both on the MuJoCo Warp engine on Warp's CPU device: the same state and actions
give the same observations, rewards and episode ends; masked resets leave the other
envs as they were; randomization, latency, pushes and noise draw on the device;
checkpoints resume exactly; PPO trains on it.

SIM2REAL_TEST_WARP_DEVICE=cuda runs them with Warp and the hooks on a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")

from sim.randomization import SimToRealConfig  # noqa: E402
from sim.registry import make, resolve_hooks, task_class, torch_hook_tasks  # noqa: E402

DEVICE = os.environ.get("SIM2REAL_TEST_WARP_DEVICE", "cpu")
TASKS = ["cartpole", "halfcheetah", "hopper", "walker2d", "ant", "quadruped"]


def _actions(env, step: int, amplitude: float = 0.8) -> torch.Tensor:
    """Smooth, different per env and joint, `amplitude` of the half range."""
    n, a = env.num_envs, env.action_spec.size
    phase = np.arange(n)[:, None] * 0.7 + np.arange(a)[None, :] * 1.3
    low, high = env.action_spec.low, env.action_spec.high
    mid, half = (high + low) / 2, (high - low) / 2
    return torch.as_tensor(mid + amplitude * half * np.sin(0.3 * step + phase), dtype=torch.float32)


def _pair(task: str, num_envs: int = 6, **kwargs):
    """(numpy hooks, torch hooks) on the Warp engine, nominal model, the same start."""
    s2r = kwargs.pop("s2r", SimToRealConfig())
    ref = make(
        task, num_envs, seed=3, s2r=s2r, backend="warp", device=DEVICE, hooks="numpy", **kwargs
    )
    dev = make(
        task, num_envs, seed=3, s2r=s2r, backend="warp", device=DEVICE, hooks="torch", **kwargs
    )
    ref.reset(), dev.reset()
    state = dev.get_state()
    ref.set_state(state["qpos"], state["qvel"])
    if hasattr(dev, "commands"):  # the commands each drew
        ref.set_command(dev.commands.cpu().numpy())
    if dev.__dict__.get("terrain") is not None:  # the level each env started on
        ref.terrain_levels[:] = dev.terrain_levels.cpu().numpy()
    return ref, dev


def _close(a, b, what: str, atol: float = 2e-4) -> None:
    torch.testing.assert_close(a.cpu().float(), b.cpu().float(), rtol=1e-4, atol=atol, msg=what)


SMALL_TERRAIN = {"terrain": {"num_levels": 5, "num_cols": 5}}


@pytest.mark.parametrize(
    "task, options",
    [(t, {}) for t in TASKS] + [("go1", {}), ("quadruped", SMALL_TERRAIN), ("go1_rough", {})],
)
def test_torch_hooks_step_as_the_numpy_hooks_until_each_env_ends(task, options):
    """Step by step, each env until its first episode ends (and that step's final
    observation): the envs still running after another one reset must not notice."""
    ref, dev = _pair(task, **options)
    dev.skip_idle_resets = False  # the GPU's step: the masked reset path every step
    try:
        assert type(dev).__name__.endswith("Torch") and dev.device.type == DEVICE
        running = torch.ones(dev.num_envs, dtype=torch.bool)
        ended_some = False
        for t in range(60):
            # the pole falls later; on a terrain, a walk that reaches other tiles
            a = _actions(
                ref, t, {"cartpole": 0.05}.get(task, 0.3 if options or task == "go1_rough" else 0.8)
            )
            o_r, r_r, te_r, tr_r, i_r = ref.step(a)
            o_d, r_d, te_d, tr_d, i_d = dev.step(a.to(dev.device))
            te_d, tr_d = te_d.cpu(), tr_d.cpu()
            assert torch.equal(te_r[running], te_d[running]), f"terminations differ at {t}"
            assert torch.equal(tr_r[running], tr_d[running])
            _close(r_r[running], r_d.cpu()[running], f"reward at step {t}")
            for k in ("x_velocity", "rew_tracking_lin_vel", "cstr_torque", "reward_contact"):
                if k in i_r:
                    _close(i_r[k][running], i_d[k].cpu()[running], f"{k} at step {t}")
            for g in o_r:
                final_r, final_d = i_r["final_obs"][g], i_d["final_obs"][g].cpu()
                _close(final_r[running], final_d[running], f"final obs {g} at {t}", atol=1e-3)
            done = (te_d | tr_d) & running
            if done.any():
                ended_some = True
                ep = i_d["episode"]
                assert ep["done"].cpu()[done].all()
                assert (ep["length"].cpu()[done] == t + 1).all()
            running &= ~done
            for g in o_r:
                _close(o_r[g][running], o_d[g].cpu()[running], f"obs {g} at {t}", atol=1e-3)
            if DEVICE == "cpu":  # one engine, the same inputs: the same physics, bit for bit
                q_r, q_d = (torch.as_tensor(e.get_state()["qpos"]) for e in (ref, dev))
                assert torch.equal(q_r[running], q_d[running]), f"qpos differs at step {t}"
            if not running.any():
                break
        if task in ("hopper", "walker2d", "cartpole"):
            assert ended_some  # the masked reset was exercised beside running envs
    finally:
        ref.close(), dev.close()


def _fall(env, ids):
    """Put envs `ids` into a state that ends their episode at the next step."""
    qpos, qvel = env.get_state()["qpos"], env.get_state()["qvel"]
    if env.name == "quadruped":
        qpos[ids, 3:7] = (0.0, 1.0, 0.0, 0.0)  # upside down: tilted past the limit
    else:
        qpos[ids, 2] = 0.3  # below the healthy height
    env.set_state(qpos, qvel)


@pytest.mark.parametrize("task", ["quadruped", "hopper"])
def test_a_masked_reset_restarts_the_ended_envs_and_leaves_the_others_running(task):
    ref, dev = _pair(task, num_envs=5)
    try:
        for env in (ref, dev):
            _fall(env, [1, 3])
        returns = torch.zeros(5)
        running = torch.tensor([True, False, True, False, True])
        for t in range(12):
            a = 0.3 * _actions(ref, t)
            _, r_r, te_r, _, _ = ref.step(a)
            o_d, r_d, te_d, _, i_d = dev.step(a.to(dev.device))
            returns += r_d.cpu()
            if t == 0:
                assert te_d.cpu().tolist() == [False, True, False, True, False]
                ep = i_d["episode"]
                assert ep["done"].cpu().tolist() == [False, True, False, True, False]
                _close(ep["return"].cpu()[[1, 3]], returns[[1, 3]], "episode return")
                assert ep["length"].cpu()[[1, 3]].tolist() == [1, 1]
                assert dev.episode_length.cpu().tolist() == [1, 0, 1, 0, 1]
                # the restarted envs stand again, near the task's initial state
                qpos = torch.as_tensor(dev.get_state()["qpos"])
                init = dev._c["reset_qpos"] if task == "quadruped" else dev.const(dev.init_qpos)
                assert (qpos[[1, 3], 2] - init.cpu()[2]).abs().max() < 0.02
                for g, v in o_d.items():
                    assert not torch.equal(v.cpu()[1], i_d["final_obs"][g].cpu()[1])
            keep = running.nonzero()[:, 0].tolist()
            assert torch.equal(te_r[keep], te_d.cpu()[keep]), f"terminations differ at {t}"
            _close(r_r[keep], r_d.cpu()[keep], f"reward of the running envs at {t}")
            _close(
                torch.as_tensor(ref.get_state()["qvel"])[keep],
                torch.as_tensor(dev.get_state()["qvel"])[keep],
                f"qvel at {t}",
                atol=1e-3,
            )
            running &= ~te_d.cpu()
        assert running.sum() >= 2  # others ran on beside the reset ones
    finally:
        ref.close(), dev.close()


def test_external_forces_push_the_base_as_on_the_numpy_hooks():
    ref, dev = _pair("quadruped", num_envs=3)
    try:
        force = np.array([[60.0, 0.0, 0.0], [0.0, -60.0, 0.0], [0.0, 0.0, 0.0]])
        for env in (ref, dev):
            env.set_external_forces(force)
        for t in range(5):
            ref.step(0.3 * _actions(ref, t))
            dev.step(0.3 * _actions(ref, t).to(dev.device))
        qvel_r = torch.as_tensor(ref.get_state()["qvel"])
        qvel_d = torch.as_tensor(dev.get_state()["qvel"])
        _close(qvel_r, qvel_d, "qvel under external forces", atol=1e-3)
        assert qvel_d[0, 0] > 0.15 and qvel_d[1, 1] < -0.15  # pushed the way the force points
        with pytest.raises(ValueError, match=r"shape \(3, 1, 3\)"):
            dev.set_external_forces(np.zeros((3, 2)))
        with pytest.raises(ValueError, match="finite"):
            dev.set_external_forces(np.full((3, 3), np.nan))
    finally:
        ref.close(), dev.close()


@pytest.mark.parametrize("task", ["halfcheetah", "hopper", "ant"])
def test_resets_draw_the_v5_noise_of_the_numpy_hooks(task):
    """Uniform qpos noise, and qvel noise uniform (hopper) or normal (halfcheetah, ant)
    of the task's scale: the spread of 512 resets on both hooks."""
    kw = dict(s2r=SimToRealConfig(), backend="warp", device=DEVICE)
    spread = {}
    for hooks in ("numpy", "torch"):
        env = make(task, 512, seed=0, hooks=hooks, **kw)
        env.reset()
        state = env.get_state()
        spread[hooks] = [
            float(np.abs(state["qpos"] - env.init_qpos).max()),
            float((state["qpos"] - env.init_qpos).std()),
            float(np.abs(state["qvel"]).max()),
            float(state["qvel"].std()),
        ]
        env.close()
    s = task_class(task).reset_noise_scale
    assert spread["torch"][0] <= s + 1e-6 and spread["torch"][2] > 0
    np.testing.assert_allclose(spread["torch"][1::2], spread["numpy"][1::2], rtol=0.05)
    # the qvel's largest draw tells uniform (at most the scale) from normal (beyond it)
    assert (spread["torch"][2] > s) == (spread["numpy"][2] > s) == (task != "hopper")


def test_the_terrain_curriculum_and_spawns_on_the_device_follow_the_numpy_rules():
    """Levels move by sim.terrain.next_levels (up after half a tile, down after less
    than half the distance asked, off the top to a random level); the reset robots
    stand on their own tile, above its highest ground."""
    from sim.terrain import next_levels

    env = make(
        "quadruped", 8, seed=0, backend="warp", device=DEVICE, hooks="torch", **SMALL_TERRAIN
    )
    try:
        env.reset()
        cfg = env.terrain.cfg
        levels = torch.tensor([0, 1, 2, 3, 4, 4, 2, 1], device=env.device)
        env.terrain_levels = levels.clone()
        env.episode_length = torch.full((8,), 200, device=env.device)
        walked = torch.tensor([5.0, 0.1, 3.0, 0.2, 5.0, 1.0, 0.0, 2.0], device=env.device)
        env.spawn_xy = torch.zeros(8, 2, device=env.device)
        env.end_xy = torch.stack([walked, torch.zeros_like(walked)], dim=1)
        env.asked = torch.full((8,), 3.0, device=env.device)
        env.commands = torch.zeros(8, 3, device=env.device)
        mask = torch.ones(8, dtype=torch.bool, device=env.device)
        mask[7] = False  # still running: its level stays
        env._t_terrain_curriculum(mask)
        got = env.terrain_levels.cpu().numpy()
        want = next_levels(
            levels.cpu().numpy(), walked.cpu().numpy(), np.full(8, 3.0), cfg.tile_size,
            cfg.num_levels, np.random.default_rng(0),
        )  # fmt: skip
        top = (levels.cpu().numpy() + (walked.cpu().numpy() > cfg.tile_size / 2)) >= cfg.num_levels
        np.testing.assert_array_equal(got[:7][~top[:7]], want[:7][~top[:7]])
        assert got[7] == 1 and ((0 <= got[top]) & (got[top] < cfg.num_levels)).all()
        # placement: the reset robots spawn on their tile, above the ground under them
        env._t_reset_where(mask)
        qpos = torch.as_tensor(env.get_state()["qpos"])
        origin = env._hf.origins[env.terrain_levels, env.terrain_cols].cpu()
        off = (qpos[:7, 0:2] - origin[:7, 0:2]).abs()
        assert off.max() <= env.spawn_jitter + 1e-5
        ground = env._hf.height_at(qpos[:, 0:2].to(env.device)).cpu()
        assert (qpos[:7, 2] - ground[:7] > 0.2).all()
        _close(env.spawn_xy[:7], qpos[:7, 0:2], "spawn points")
    finally:
        env.close()


def test_randomization_draws_per_env_on_the_device_and_a_reset_redraws_only_its_envs():
    s2r = SimToRealConfig(
        mass_scale=(0.8, 1.2),
        added_base_mass=(-1.0, 2.0),
        friction_scale=(0.5, 1.25),
        motor_strength=(0.7, 1.1),
        kp_scale=(0.9, 1.1),
        kd_scale=(0.9, 1.1),
    )
    env = make("quadruped", 16, seed=0, s2r=s2r, backend="warp", device=DEVICE, hooks="torch")
    try:
        env.reset()
        r = env.randomizer
        mass = env.engine.model_tensor("body_mass").cpu().double()
        scale, added = env.mass_scale.cpu().double(), env.added_mass.cpu().double()
        assert 0.8 <= scale.min() and scale.max() <= 1.2 and scale.std() > 0.05
        assert -1.0 <= added.min() and added.max() <= 2.0
        want = torch.as_tensor(r.nominal_mass)[None] * scale[:, None]
        want[:, env._base_id] += added
        torch.testing.assert_close(mass, want, rtol=1e-5, atol=1e-5)
        # mj_setConst ran per world: the base's subtree carries each env's own mass
        subtree = env.engine.model_tensor("body_subtreemass").cpu().double()
        torch.testing.assert_close(
            subtree[:, env._base_id], mass[:, env._base_id :].sum(1), rtol=1e-5, atol=1e-5
        )
        fr = env.engine.model_tensor("geom_friction").cpu().double()[:, :, 0]
        torch.testing.assert_close(
            fr,
            torch.as_tensor(r.nominal_friction[:, 0])[None] * env.friction.cpu().double()[:, None],
            rtol=1e-5,
            atol=1e-6,
        )
        gain = env.engine.model_tensor("actuator_gainprm").cpu().double()[:, :, 0]
        kp_over_strength = (
            gain / torch.as_tensor(r.nominal_gain[:, 0])[None] / env.strength.cpu().double()
        )
        assert 0.9 - 1e-5 <= kp_over_strength.min() and kp_over_strength.max() <= 1.1 + 1e-5
        force = env.engine.model_tensor("actuator_forcerange").cpu().double()
        torch.testing.assert_close(
            force,
            torch.as_tensor(r.nominal_force)[None] * env.strength.cpu().double()[..., None],
            rtol=1e-5,
            atol=1e-5,
        )
        # the critic sees the draws
        obs = env._t_observe(None)
        critic = env.observation_spec.groups["critic"].slices()
        _close(obs["critic"][:, critic["friction"]][:, 0], env.friction, "privileged friction")
        # a partial reset redraws its envs only
        before = env.engine.model_tensor("body_mass").clone()
        mask = torch.zeros(16, dtype=torch.bool, device=env.device)
        mask[[2, 9]] = True
        env._t_reset_where(mask)
        after = env.engine.model_tensor("body_mass")
        changed = (after != before).any(dim=1).cpu()
        assert changed.nonzero()[:, 0].tolist() == [2, 9]
    finally:
        env.close()


def test_latency_pushes_and_noise_act_on_the_device():
    base = dict(backend="warp", device=DEVICE, hooks="torch", seed=1)
    late = make("quadruped", 4, s2r=SimToRealConfig(action_latency=(1, 1)), **base)
    late.reset()
    a0, a1 = _actions(late, 0), _actions(late, 1)
    late.step(a0)  # the robot gets the reset's zeros
    ctrl0 = late.field("ctrl").clone().cpu()
    _close(ctrl0, torch.as_tensor(late._t_ctrl(torch.zeros_like(a0))).cpu(), "delayed zeros")
    late.step(a1)  # now a0
    _close(late.field("ctrl").cpu(), late._t_ctrl(a0.to(late.device)).cpu(), "a0 one step late")
    late.close()

    pushed = make(
        "quadruped", 64, s2r=SimToRealConfig(push_interval_s=0.02, push_velocity=1.0), **base
    )
    calm = make("quadruped", 64, s2r=SimToRealConfig(), **base)
    for env in (pushed, calm):
        env.reset()
        for _ in range(3):
            env.step(torch.zeros(64, 12))
    speed = {
        k: e.field("qvel")[:, :2].norm(dim=1).mean().item() for k, e in (("p", pushed), ("c", calm))
    }
    assert speed["p"] > 0.2 and speed["c"] < 0.05, speed
    pushed.close(), calm.close()

    noisy = make("quadruped", 256, s2r=SimToRealConfig(obs_noise={"joint_vel": 0.5}), **base)
    obs = noisy.reset()["policy"]
    sl = noisy.observation_spec.policy.slices()
    state_jvel = noisy.field("qvel")[:, noisy._ti["jdof"]]
    err = obs[:, sl["joint_vel"]] - state_jvel
    assert 0.45 < float(err.std()) < 0.55
    assert float((obs[:, sl["joint_pos"]] - noisy._t_joint_state()[0]).abs().max()) < 1e-6
    noisy.close()


def test_the_same_seed_repeats_a_run_and_a_checkpoint_resumes_it_exactly():
    def run(env, steps, start):
        out = []
        for t in range(start, start + steps):
            o, r, te, tr, _ = env.step(_actions(env, t).to(env.device))
            out.append(torch.cat([o["policy"].flatten(), r, te.float(), tr.float()]).cpu())
        return torch.stack(out)

    kw = dict(backend="warp", device=DEVICE, hooks="torch", max_episode_steps=7)
    a = make("quadruped", 4, seed=5, **kw)
    b = make("quadruped", 4, seed=5, **kw)
    c = make("quadruped", 4, seed=6, **kw)
    for e in (a, b, c):
        e.reset()
    first = run(a, 10, 0)
    assert torch.equal(first, run(b, 10, 0))
    assert not torch.equal(first, run(c, 10, 0))
    state = a.state_dict()
    ahead = run(a, 12, 10)  # episodes end at 7 and 14: resets, redraws, pushes
    resumed = make("quadruped", 4, seed=99, **kw)
    resumed.load_state_dict(state)
    assert torch.equal(ahead, run(resumed, 12, 10))
    numpy_env = make("quadruped", 4, seed=5, backend="warp", device=DEVICE, hooks="numpy")
    with pytest.raises(ValueError, match="numpy task hooks"):
        resumed.load_state_dict(numpy_env.state_dict())
    with pytest.raises(ValueError, match="torch task hooks"):
        numpy_env.load_state_dict(state)
    with pytest.raises(ValueError, match="task 'quadruped' with 4 envs"):
        make("cartpole", 4, **kw).load_state_dict(state)
    for e in (a, b, c, resumed, numpy_env):
        e.close()


def test_non_finite_actions_raise_or_end_the_episode():
    env = make("hopper", 3, seed=0, backend="warp", device=DEVICE, hooks="torch")
    env.reset()
    bad = torch.zeros(3, 3)
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite actions .* envs \[1\]"):
        env.step(bad)
    env.nan_action = "reset"
    obs0 = env._tobs["policy"].clone()
    _, r, te, _, info = env.step(bad)
    assert info["unstable"].cpu().tolist() == [False, True, False]
    assert te.cpu()[1] and r.cpu()[1] == 0.0
    _close(info["final_obs"]["policy"][1], obs0[1], "last sane observation")
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        env.step(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        env.step(torch.zeros(3, 3, dtype=torch.int64))
    env.close()


def test_bad_hook_requests_are_named():
    with pytest.raises(ValueError, match="use backend='warp'"):
        make("cartpole", 2, hooks="torch")
    with pytest.raises(ValueError, match="'humanoid' has no torch hooks"):
        make("humanoid", 2, backend="warp", hooks="torch")
    # nor can Warp build it: its MJCF picks the PGS solver, which MuJoCo Warp lacks
    with pytest.raises(ValueError, match="MuJoCo Warp cannot simulate this model: .*PGS"):
        make("humanoid", 2, backend="warp")
    with pytest.raises(ValueError, match="hooks must be one of"):
        make("cartpole", 2, backend="warp", hooks="cuda")
    assert set(TASKS) <= set(torch_hook_tasks())
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_hooks("quadruped", "auto", "warp", cuda) == "torch"
    assert resolve_hooks("quadruped", "auto", "warp", cpu) == "numpy"
    assert resolve_hooks("quadruped", "auto", "c", cuda) == "numpy"
    assert resolve_hooks("go1_rough", "auto", "warp", cuda, {"terrain": True}) == "torch"
    assert resolve_hooks("humanoid", "auto", "warp", cuda) == "numpy"
    from training.train_configs import build_ppo_config

    with pytest.raises(ValueError, match="env.hooks must be one of"):
        build_ppo_config("cartpole", ["env.hooks=gpu"])
    with pytest.raises(ValueError, match="env.hooks"):
        build_ppo_config("cartpole", ['env.task_args={"hooks": "torch"}'])


def _mean_episode_length(policy, steps: int = 150) -> float:
    """Mean length of the episodes the deterministic policy ends in `steps` steps of a
    fresh 16-env cartpole on the torch hooks (the unfinished ones count as long as they
    ran)."""
    env = make("cartpole", 16, seed=11, backend="warp", device=DEVICE, hooks="torch")
    obs, lengths = env.reset(), []
    with torch.no_grad():
        for _ in range(steps):
            obs, _, _, _, info = env.step(policy.act_inference(obs))
            ep = info["episode"]
            lengths += ep["length"][ep["done"]].tolist()
    lengths += env.episode_length.tolist()
    env.close()
    return float(np.mean(lengths))


def test_ppo_learns_on_the_torch_hooks(tmp_path):
    """Cartpole on the device step through the one runner: after 8k steps the trained
    policy balances clearly longer than the same network untrained (about twice as
    long, 50 against 24 steps, with this seed)."""
    import copy

    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = ["run.progress=false", "run.tensorboard=false", "env.num_envs=16", "run.seed=0"]
    over += ["env.backend=warp", "env.hooks=torch", "ppo.num_steps=32", "run.total_steps=8192"]
    runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp_path / "r")
    try:
        assert type(runner.env).__name__ == "CartPoleTorch"
        untrained = copy.deepcopy(runner.policy).eval()
        summary = runner.train()
        assert summary["iterations"] == 16 and summary["env_steps"] == 8192
        before = _mean_episode_length(untrained)
        after = _mean_episode_length(runner.policy.eval())
        assert after > 1.5 * before, (before, after)
    finally:
        runner.close()


def test_a_config_saved_before_env_hooks_keeps_the_numpy_hooks():
    """An older run resumed on CUDA must rebuild the env whose state it saved."""
    from training.config import from_dict
    from training.train_configs import EnvConfig

    old = from_dict(EnvConfig, {"task": "quadruped", "backend": "warp"})
    assert old.hooks == "numpy"
    assert EnvConfig(task="quadruped").hooks == "auto"


def test_a_run_on_the_torch_hooks_resumes_exactly(tmp_path):
    """The one runner's checkpoint carries the torch-hooks env (its tensors, generator
    and the engine's randomized model): 3 + 3 iterations equal 6, with the quadruped's
    randomization, latency, noise and pushes on."""
    from training.checkpoint import load_checkpoint
    from training.runner import OnPolicyRunner, parameters_vector
    from training.train_configs import build_ppo_config

    over = ["run.progress=false", "run.tensorboard=false", "run.video=false", "run.seed=0"]
    over += ["env.num_envs=6", "ppo.num_steps=8", "policy.actor_hidden=32,32"]
    over += ["policy.critic_hidden=32,32", "env.backend=warp", "env.hooks=torch"]

    def train(name: str, steps: int, resume=None):
        cfg = build_ppo_config("quadruped", over + [f"run.total_steps={steps}"])
        runner = OnPolicyRunner(cfg, tmp_path / name, resume=resume)
        try:
            runner.train()
            return runner.env_steps, parameters_vector(runner.policy)
        finally:
            runner.close()

    whole = train("whole", 288)
    train("split", 144)
    resumed = train("split", 288, resume=tmp_path / "split")
    assert resumed[0] == whole[0] == 288
    assert torch.equal(resumed[1], whole[1])
    env = load_checkpoint(tmp_path / "split" / "checkpoints" / "latest.pt")["env"]
    assert env["hooks"] == "torch" and "model.body_mass" in env["engine"]
