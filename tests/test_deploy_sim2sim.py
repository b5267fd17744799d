"""deploy.sim2sim: the exported file in the simulator, through the runtime and safety layer."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch

from deploy.metadata import read_metadata, write_metadata
from deploy.runtime import OnnxPolicy
from deploy.safety import DEFAULT_MAX_TARGET_SPEED, DEFAULT_RAMP_IN_S
from deploy.sim2sim import Sim2SimActor, Sim2SimError, evaluate_onnx, make_env_for
from sim.evaluation import evaluate
from training.artifacts import evaluate_source
from training.export import export_run
from training.policy_kinds import load_policy
from training.runner import OnPolicyRunner
from training.train_configs import build_ppo_config

QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train(root, name, task, overrides):
    run = root / name
    OnPolicyRunner(build_ppo_config(task, QUIET + overrides), run).train()
    return run, export_run(run)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory, one_torch_thread):
    # a few thousand steps: episodes of a few hundred steps, long enough for the returns
    # to drift apart if the deployed path computed anything differently
    root = tmp_path_factory.mktemp("sim2sim")
    return _train(root, "cartpole", "cartpole", ["run.total_steps=6144", "run.seed=2"])


@pytest.fixture(scope="module")
def quadruped(tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("sim2sim-quad")
    return _train(
        root,
        "quadruped",
        "quadruped",
        [
            "run.total_steps=96",
            "env.num_envs=6",
            "ppo.num_steps=8",
            "env.max_episode_steps=150",
            "policy.actor_hidden=32,32",
            "policy.critic_hidden=32,32",
        ],
    )


def _close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        if key == "source":
            continue
        if isinstance(a[key], float) or key == "returns":  # per-episode floats too
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key
        else:
            assert b[key] == a[key], key


@pytest.mark.parametrize("seed", [0, 7])
def test_cartpole_closed_loop_matches_checkpoint(cartpole, seed):
    run, onnx_path = cartpole
    want = evaluate_source(run, episodes=6, seed=seed)
    counters: dict[str, int] = {}
    got = evaluate_onnx(onnx_path, episodes=6, seed=seed, counters=counters)
    assert want["length_mean"] > 30  # episodes long enough to tell policies apart
    _close(want, got)
    assert got["source"] == str(onnx_path) and got["task"] == "cartpole"
    assert counters["steps"] >= got["length_mean"] * 6
    assert counters["nonfinite_obs"] == counters["nonfinite_action"] == counters["watchdog"] == 0
    if seed == 0:  # the CLI's dispatch: evaluate_source sends .onnx files here
        via_source = evaluate_source(onnx_path, episodes=6, seed=seed)
        assert via_source.pop("safety") == counters  # the safety layer's counts, always
        _close(want, via_source)


def test_quadruped_closed_loop_with_randomization_matches_checkpoint(quadruped):
    run, onnx_path = quadruped
    meta = read_metadata(onnx_path)
    assert meta.extra["max_episode_steps"] == "150"
    for randomize in (False, True):
        want = evaluate_source(run, episodes=3, seed=2, randomize=randomize)
        got = evaluate_onnx(onnx_path, episodes=3, seed=2, randomize=randomize)
        assert got["randomize"] is randomize
        assert "lin_vel_error_mean" in got
        _close(want, got)


def test_strict_safety_uses_the_robot_defaults(quadruped):
    _, onnx_path = quadruped
    policy = OnnxPolicy(onnx_path, deterministic=True)
    dt = policy.metadata.control_period_s
    loose = Sim2SimActor(policy, 1, dt).layers[0].config
    strict = Sim2SimActor(policy, 1, dt, strict_safety=True).layers[0].config
    assert loose.ramp_in_s == 0 and np.isinf(loose.max_delta_per_step).all()
    assert strict.ramp_in_s == DEFAULT_RAMP_IN_S
    np.testing.assert_allclose(strict.max_delta_per_step, DEFAULT_MAX_TARGET_SPEED * dt)
    np.testing.assert_array_equal(strict.safe_posture, policy.metadata.default_joint_pos)
    assert Sim2SimActor(policy, 1, dt, safety=False).layers is None
    counters: dict[str, int] = {}
    a = evaluate_onnx(onnx_path, episodes=2, seed=0)
    b = evaluate_onnx(onnx_path, episodes=2, seed=0, strict_safety=True, counters=counters)
    assert a["return_mean"] != b["return_mean"]  # the 1 s ramp-in changes the first second
    assert counters["steps"] > 0 and counters["inactive"] == 0


def test_recurrent_closed_loop_matches_torch(tmp_path):
    run, onnx_path = _train(
        tmp_path,
        "lstm",
        "cartpole",
        ["run.total_steps=512", "env.num_envs=8", "ppo.num_steps=16"]
        + ["policy.rnn_type=lstm", "policy.rnn_hidden=16"],
    )
    policy = load_policy(run).policy
    module = policy.inference_module()

    class TorchRecurrent:  # the reference: torch, state zeroed at episode starts
        def __init__(self, n):
            self.state = module.initial_state(n)

        def __call__(self, obs, reset):
            keep = (~reset).float().view(1, -1, 1)
            out = module(obs["policy"], *(s * keep for s in self.state))
            self.state = out[1:]
            return out[0]

    meta = read_metadata(onnx_path)
    episodes = 5
    env = make_env_for(meta, None, episodes, seed=4, randomize=False)
    want = evaluate(TorchRecurrent(episodes), env, episodes)
    env.close()
    got = evaluate_onnx(onnx_path, episodes=episodes, seed=4)
    _close({"task": "cartpole", "source": "", "randomize": False, **want}, got)


def test_wrong_task_is_a_clear_error(cartpole):
    _, onnx_path = cartpole
    with pytest.raises(Sim2SimError, match=r"observation size mismatch.*size 4.*'hopper' gives 11"):
        evaluate_onnx(onnx_path, task="hopper", episodes=1)
    with pytest.raises(ValueError, match="unknown task"):
        evaluate_onnx(onnx_path, task="nope", episodes=1)


def test_actor_filters_every_env_and_converts_back(quadruped):
    _, onnx_path = quadruped
    policy = OnnxPolicy(onnx_path, deterministic=True)
    meta = policy.metadata
    actor = Sim2SimActor(policy, 2, meta.control_period_s)
    obs = {"policy": np.zeros((2, meta.obs_size), np.float32)}
    raw = actor(obs, np.array([True, True]))
    want, _ = policy.act_batch(obs["policy"])
    np.testing.assert_allclose(raw, want, atol=1e-6)
    # a non-finite observation: the layer holds its last output, the env gets that action
    bad = {"policy": np.full((2, meta.obs_size), np.nan, np.float32)}
    held = actor(bad, np.array([False, False]))
    np.testing.assert_allclose(held, raw, atol=1e-6)
    assert actor.counters["nonfinite_obs"] == 2


def test_torque_task_safe_command_is_zero(cartpole):
    _, onnx_path = cartpole
    policy = OnnxPolicy(onnx_path, deterministic=True)
    meta = policy.metadata
    assert meta.extra["control_mode"] == "torque"
    config = Sim2SimActor(policy, 1, meta.control_period_s).layers[0].config
    np.testing.assert_array_equal(config.safe_posture, np.zeros(meta.num_joints))
    np.testing.assert_array_equal(config.joint_pos_lower, [-3.0])  # the actuator range


# ---------------------------------------------------------------------- metadata vs robot
def _edited(src, dst, **changes):
    """A copy of a real exported file whose metadata fields were changed."""
    shutil.copyfile(src, dst)
    write_metadata(dst, dataclasses.replace(read_metadata(src), **changes))
    return dst


def test_sim2sim_refuses_action_scale_zero(quadruped, tmp_path):
    """An action_scale of 0 used to evaluate like the original (and bypass the filter)."""
    _, onnx_path = quadruped
    n = read_metadata(onnx_path).num_joints
    path = _edited(onnx_path, tmp_path / "scale0.onnx", action_scale=[0.0] * n)
    with pytest.raises(Sim2SimError, match=r"action_scale mismatch.* has action_scale 0 .*0\.25"):
        evaluate_onnx(path, episodes=1)


def test_sim2sim_refuses_other_pd_gains(quadruped, tmp_path):
    _, onnx_path = quadruped
    meta = read_metadata(onnx_path)
    kp = list(meta.kp)
    kp[3] = 45.0
    path = _edited(onnx_path, tmp_path / "kp.onnx", kp=kp)
    with pytest.raises(Sim2SimError, match=r"kp mismatch.*kp 45 for joint 'FR_hip_joint'"):
        evaluate_onnx(path, episodes=1)
    # make_env_for, the other way in, refuses it too
    with pytest.raises(Sim2SimError, match=r"kp mismatch.*the robot of task 'quadruped' has 30"):
        make_env_for(read_metadata(path), None, 1, seed=0, randomize=False)


@pytest.mark.parametrize(
    "field,value",
    [
        ("action_offset", 0.0),
        ("default_joint_pos", 0.5),
        ("kd", 0.81),  # 1% off
        ("kp", 30.0 * (1 + 1e-5)),  # beyond the 1e-6 relative tolerance
    ],
)
def test_sim2sim_refuses_every_robot_field_that_differs(quadruped, tmp_path, field, value):
    _, onnx_path = quadruped
    n = read_metadata(onnx_path).num_joints
    path = _edited(onnx_path, tmp_path / f"{field}.onnx", **{field: [value] * n})
    with pytest.raises(Sim2SimError, match=rf"{field} mismatch: the policy file has {field} "):
        evaluate_onnx(path, episodes=1)


def test_sim2sim_refuses_a_torque_task_file_with_a_scale(cartpole, tmp_path):
    _, onnx_path = cartpole
    path = _edited(onnx_path, tmp_path / "scale.onnx", action_scale=[0.5])
    with pytest.raises(Sim2SimError, match=r"action_scale mismatch.*0\.5.*'cartpole' has 1"):
        evaluate_onnx(path, episodes=1)


def test_sim2sim_accepts_the_unedited_file_and_its_rewritten_metadata(quadruped, tmp_path):
    _, onnx_path = quadruped
    meta = read_metadata(onnx_path)
    assert evaluate_onnx(onnx_path, episodes=1, seed=0)["episodes"] == 1
    # the same values written again, and a change within the tolerance, still evaluate
    same = _edited(onnx_path, tmp_path / "same.onnx")
    a = evaluate_onnx(onnx_path, episodes=2, seed=1)
    assert evaluate_onnx(same, episodes=2, seed=1) == {**a, "source": str(same)}
    close = _edited(onnx_path, tmp_path / "close.onnx", kp=[k * (1 + 1e-8) for k in meta.kp])
    assert evaluate_onnx(close, episodes=1, seed=0)["episodes"] == 1
