"""rsl_rl 5.x trains on our simulator, and its checkpoint leaves as our ONNX file.

rsl_rl's OWN OnPolicyRunner trains cartpole through sim.rsl_rl_env.RslRlVecEnv; the
model_<N>.pt it saves is exported by training.rsl_rl_import (and `sim2real export
--rsl-rl`) with full deployment metadata, equals the rsl_rl actor on random observations,
and scores in sim2sim what the rsl_rl policy scores in the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner
from tensordict import TensorDict

import sim
from deploy.metadata import read_metadata
from sim.evaluation import evaluate
from sim.randomization import SimToRealConfig
from sim.rsl_rl_env import RslRlVecEnv
from training.artifacts import evaluate_source
from training.cli import main
from training.rsl_rl_import import RslRlImportError, export_rsl_rl, import_rsl_rl

ITERATIONS = 30  # 32 envs x 32 steps each: ~30k steps, 10-15 s on one core
EVAL_EPISODES, EVAL_SEED = 8, 100


def _train_cfg() -> dict:
    """An rsl_rl 5.x train cfg: MLP actor (Gaussian) and critic, PPO, obs_groups."""
    mlp = {"class_name": "MLPModel", "hidden_dims": [64, 64], "activation": "elu"}
    return {
        "num_steps_per_env": 32,
        "save_interval": 1000,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {
            **mlp,
            "obs_normalization": True,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0},
        },
        "critic": {**mlp, "obs_normalization": True},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": 5,
            "num_mini_batches": 4,
            "learning_rate": 1e-3,
            "schedule": "adaptive",
            "desired_kl": 0.01,
            "gamma": 0.99,
            "lam": 0.95,
            "entropy_coef": 0.0,
        },
        "logger": "tensorboard",
    }


def _evaluate(policy: torch.nn.Module) -> dict:
    """The deterministic rsl_rl policy in the nominal env sim2sim builds, same seeds."""
    env = sim.make("cartpole", EVAL_EPISODES, seed=EVAL_SEED, s2r=SimToRealConfig())

    def act(obs, reset):
        return policy(TensorDict(dict(obs), batch_size=[EVAL_EPISODES]))

    return evaluate(act, env, EVAL_EPISODES)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """rsl_rl's runner trains cartpole; the returns before and after, the checkpoint."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    log_dir = tmp_path_factory.mktemp("rsl") / "cartpole_run"
    env = RslRlVecEnv("cartpole", 32, seed=0)
    runner = OnPolicyRunner(env, _train_cfg(), log_dir=str(log_dir), device="cpu")
    # rsl_rl would run `git status` / `git diff` on the repository around its installation
    # (this checkout, whose .venv holds it): nothing for a test to touch
    runner.logger.git_status_repos = []
    before = _evaluate(runner.get_inference_policy())
    runner.learn(ITERATIONS)
    after = _evaluate(runner.get_inference_policy())
    yield {
        "runner": runner,
        "env": env,
        "before": before,
        "after": after,
        "log_dir": log_dir,
        "checkpoint": log_dir / f"model_{ITERATIONS - 1}.pt",
    }
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------- the VecEnv wrapper
def test_wrapper_is_an_rsl_rl_vecenv_over_one_batched_env():
    env = RslRlVecEnv("quadruped", 2, seed=0)  # a task with a privileged critic group
    assert isinstance(env, VecEnv)
    assert env.num_envs == 2 and env.num_actions == env.env.action_spec.size == 12
    assert env.max_episode_length == env.env.max_episode_steps
    assert env.device == torch.device("cpu") and env.cfg["task"] == "quadruped"
    obs = env.get_observations()
    assert isinstance(obs, TensorDict) and obs.batch_size == torch.Size([2])
    assert set(obs.keys()) == {"policy", "critic"}
    for group in ("policy", "critic"):
        assert obs[group].shape == (2, env.env.observation_spec[group].size)
        assert obs[group].dtype == torch.float32


def test_step_clips_actions_and_matches_the_simulator():
    n = 3
    env = RslRlVecEnv("halfcheetah", n, seed=5)
    ref = sim.make("halfcheetah", n, seed=5)
    np.testing.assert_array_equal(env.get_observations()["policy"], ref.reset()["policy"])
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = torch.as_tensor(rng.uniform(-4, 4, size=(n, 6)), dtype=torch.float32)
        obs, rew, dones, extras = env.step(a)
        r_obs, r_rew, r_term, r_trunc, _ = ref.step(a.clamp(-1.0, 1.0))
        np.testing.assert_array_equal(obs["policy"], r_obs["policy"])
        np.testing.assert_array_equal(rew, r_rew)
        assert rew.dtype == torch.float32 and dones.dtype == torch.int64
        np.testing.assert_array_equal(dones, (r_term | r_trunc).long())
        assert not extras["time_outs"].any()
        assert "Step/x_velocity" in extras["log"] and "Episode/return" not in extras["log"]
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        env.step(torch.zeros(3, 5))


def test_time_outs_episode_statistics_and_episode_length_buf():
    env = RslRlVecEnv("halfcheetah", 2, seed=0, max_episode_steps=4)
    assert env.max_episode_length == 4
    # rsl_rl's init_at_random_ep_len assigns the buffer: the simulator's counters follow
    env.episode_length_buf = torch.tensor([2, 0])
    assert env.env.episode_length.tolist() == [2, 0]
    returns = torch.zeros(2)
    zeros = torch.zeros(2, 6)
    for t in range(1, 5):
        _, rew, dones, extras = env.step(zeros)
        returns += rew
        log = extras["log"]
        if t == 2:  # env 0 started at step 2 of 4
            assert dones.tolist() == [1, 0] and extras["time_outs"].tolist() == [True, False]
            assert log["Episode/length"].tolist() == [4.0]
            assert log["Episode/time_out"].tolist() == [1.0]
            assert log["Episode/return"].item() == pytest.approx(returns[0].item(), rel=1e-5)
        elif t == 4:
            assert dones.tolist() == [0, 1] and extras["time_outs"].tolist() == [False, True]
            assert log["Episode/length"].tolist() == [4.0]
        else:
            assert not dones.any() and "Episode/return" not in log
    # a view on the CPU: in-place writes reach the simulator as well
    env.episode_length_buf[1] = 3
    assert env.env.episode_length[1] == 3
    # a termination is not a time-out
    pole = RslRlVecEnv("cartpole", 2, seed=0)
    for _ in range(100):
        _, _, dones, extras = pole.step(torch.full((2, 1), 3.0))
        if dones.any():
            break
    assert dones.all() and not extras["time_outs"].any()
    assert extras["log"]["Episode/time_out"].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------- training with rsl_rl
def test_rsl_rl_runner_learns_cartpole(trained):
    before, after = trained["before"], trained["after"]
    # the untrained deterministic policy drops the pole within ~25 steps; max return 1000
    assert before["return_mean"] < 100
    assert after["return_mean"] > 500 and after["return_mean"] > 10 * before["return_mean"]
    assert trained["checkpoint"].is_file()


def test_rsl_rl_logger_reads_our_episode_statistics(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained["log_dir"]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"Episode/return", "Episode/length", "Step/reward_survive"} <= tags
    assert len(events.Scalars("Step/reward_survive")) == ITERATIONS  # every iteration
    # only iterations in which some episode ended log one: none do once the pole stays up
    returns = [e.value for e in events.Scalars("Episode/return")]
    assert 10 <= len(returns) <= ITERATIONS and max(returns) > 5 * returns[0]


# ---------------------------------------------------------------------- export
@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("rsl-export") / "policy.onnx"
    return export_rsl_rl(trained["checkpoint"], "cartpole", out)


def test_onnx_equals_the_rsl_rl_actor(trained, exported):
    actor = trained["runner"].get_inference_policy()
    gen = torch.Generator().manual_seed(0)
    obs = torch.randn(256, 4, generator=gen) * torch.tensor([0.5, 0.2, 2.0, 2.0])
    with torch.no_grad():
        want = actor(TensorDict({"policy": obs}, batch_size=[256])).numpy()
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    (got,) = session.run(["actions"], {"obs": obs.numpy()})
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(want).max() > 0.1  # a trained actor, not zeros compared with zeros


def test_metadata_describes_the_task_and_the_checkpoint(trained, exported):
    meta = read_metadata(exported)
    env = sim.make("cartpole", 1)
    assert meta.task == "cartpole" and meta.policy_family == "gaussian_mlp"
    assert meta.obs_terms == [(t.name, t.size) for t in env.observation_spec.policy.terms]
    assert meta.action_joint_names == list(env.action_spec.joint_names)
    assert meta.control_period_s == pytest.approx(env.dt)
    assert meta.run_id == "cartpole_run"
    assert meta.extra["checkpoint_kind"] == "rsl_rl"
    assert meta.extra["rsl_rl_checkpoint"] == trained["checkpoint"].name
    assert meta.extra["iteration"] == str(ITERATIONS - 1)
    assert meta.extra["rsl_rl_obs_normalization"] == "true"
    assert json.loads(meta.extra["action_low"]) == env.action_spec.low.tolist()


def test_sim2sim_return_of_the_file_matches_the_rsl_rl_policy(trained, exported):
    stats = evaluate_source(exported, episodes=EVAL_EPISODES, seed=EVAL_SEED)
    assert stats["returns"] == pytest.approx(trained["after"]["returns"], rel=1e-3)
    assert stats["safety"]["nonfinite_action"] == 0


# ---------------------------------------------------------------------- bad input
def test_a_file_that_is_not_an_rsl_rl_checkpoint_is_refused(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(RslRlImportError, match="not an rsl_rl checkpoint"):
        import_rsl_rl(text, "cartpole")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(RslRlImportError, match="no 'actor_state_dict'"):
        import_rsl_rl(other, "cartpole")
    ours = tmp_path / "ours.pt"
    torch.save({"format": 1, "kind": "ppo"}, ours)
    with pytest.raises(RslRlImportError, match="sim2real checkpoint"):
        import_rsl_rl(ours, "cartpole")
    recurrent = tmp_path / "rnn.pt"
    torch.save({"actor_state_dict": {"rnn.rnn.weight_ih_l0": torch.zeros(8, 4)}}, recurrent)
    with pytest.raises(RslRlImportError, match="recurrent"):
        import_rsl_rl(recurrent, "cartpole")
    with pytest.raises(FileNotFoundError):
        import_rsl_rl(tmp_path / "missing.pt", "cartpole")


def test_observation_size_of_another_task_is_refused(trained):
    with pytest.raises(RslRlImportError, match=r"observation size mismatch.*takes 4.*gives .* 11"):
        import_rsl_rl(trained["checkpoint"], "hopper")


# ---------------------------------------------------------------------- the CLI
def test_cli_exports_an_rsl_rl_checkpoint(trained, tmp_path, capsys):
    out = tmp_path / "cli.onnx"
    ck = str(trained["checkpoint"])
    assert main(["export", "--rsl-rl", ck, "--task", "cartpole", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(out) and lines[1].startswith("parity: max |onnx - torch| = ")
    assert read_metadata(out).extra["checkpoint_kind"] == "rsl_rl"

    assert main(["export", "--rsl-rl", ck]) == 2
    assert "--rsl-rl needs --task" in capsys.readouterr().err
    assert main(["export", "--rsl-rl", ck, "--task", "hopper", "--out", str(out)]) == 2
    assert "observation size mismatch" in capsys.readouterr().err
    assert main(["export", "runs/x", "--rsl-rl", ck, "--task", "cartpole"]) == 2
    assert "not both" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 64)
    assert main(["export", "--rsl-rl", str(bad), "--task", "cartpole"]) == 2
    assert "not an rsl_rl checkpoint" in capsys.readouterr().err
    assert not Path(bad.with_suffix(".onnx")).exists()


def test_cli_help_documents_rsl_rl(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = capsys.readouterr().out
    assert "--rsl-rl" in text and "--task" in text and "--activation" in text
