"""The world-model learner (TD-MPC2 style): its losses learn, its latent rollout and
planner respect episode ends, its actor exports to ONNX exactly, a run resumes bit for
bit with its replay buffer, it learns cartpole, and bad configs name their field."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from policies.world_model import WorldModel, WorldModelConfig
from training.algorithms.mppi import MPPIPlanner, PlannerConfig
from training.algorithms.tdmpc import TDMPC, TDMPCConfig
from training.cli import main
from training.config import ConfigError
from training.core import two_hot_decode
from training.core.twohot import symexp, two_hot
from training.off_policy_runner import OffPolicyRunner
from training.replay import SequenceReplay
from training.train_configs import build_world_model_config

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]
TINY = [
    "env.num_envs=2",
    "policy.hidden=32",
    "policy.latent_dim=16",
    "policy.encoder_hidden=32",
    "policy.num_q=2",
    "policy.num_bins=21",
    "tdmpc.batch_size=16",
    "tdmpc.seed_steps=16",
    "tdmpc.utd_ratio=0.5",
    "planner.iterations=2",
    "planner.num_samples=16",
    "planner.num_elites=4",
    "planner.num_pi_trajs=2",
    "run.eval_episodes=2",
    "run.log_every=5",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(seed: int = 0, **over) -> WorldModel:
    torch.manual_seed(seed)
    cfg = WorldModelConfig(hidden=32, latent_dim=16, encoder_hidden=(32,), num_q=2, **over)
    return WorldModel(4, 1, cfg, np.array([-3.0]), np.array([3.0]))


def _cartpole_replay(steps: int = 150, horizon: int = 3) -> SequenceReplay:
    """Random-action cartpole transitions (episodes of a few steps: many ends)."""
    from sim.registry import make

    env = make("cartpole", 4, seed=0)
    buf = SequenceReplay(10_000, 4, 4, 1, horizon, seed=0)
    gen = torch.Generator().manual_seed(0)
    obs = env.reset()["policy"]
    for _ in range(steps):
        a = torch.rand(4, 1, generator=gen) * 2 - 1
        nxt, r, term, trunc, info = env.step(a * 3)
        buf.add(obs, a, r, info["final_obs"]["policy"], term, trunc)
        obs = nxt["policy"]
    env.close()
    return buf


# ---------------------------------------------------------------------- losses, rollout
def test_world_model_losses_fall_on_a_fixed_replay_batch():
    buf = _cartpole_replay()
    batch = buf.sample(64)
    assert batch["terminated"].sum() > 0  # the batch holds episode ends
    learner = TDMPC(_model(), TDMPCConfig(batch_size=64, lr=1e-3))
    with torch.no_grad():
        _, before, _ = learner.losses(batch)
    for _ in range(500):  # termination, to be told from the state, takes ~300
        stats = learner.update(batch)
    with torch.no_grad():
        _, after, _ = learner.losses(batch)
    for name in ("consistency", "reward", "value", "termination"):
        # reward and value cross-entropies cannot reach 0: a two-hot target has entropy
        assert after[name] < 0.4 * before[name], (name, before[name], after[name])
    assert stats["nonfinite_steps"] == 0 and np.isfinite(stats["pi_loss"])


def test_latent_rollout_shapes_and_td_targets_at_episode_ends():
    buf = _cartpole_replay()
    batch = buf.sample(32)
    h, b = batch["action"].shape[:2]
    model = _model()
    learner = TDMPC(model, TDMPCConfig(batch_size=32))
    total, parts, latents = learner.losses(batch)
    assert latents.shape == (h + 1, b, 16) and total.shape == ()
    # SimNorm: every group of 8 latent features is a distribution
    groups = latents.detach().reshape(h + 1, b, -1, 8)
    torch.testing.assert_close(groups.sum(-1), torch.ones(h + 1, b, 2))
    assert model.q_logits(latents[:-1], batch["action"]).shape == (2, h, b, 101)
    # a termination ends the return; a time-out (truncation) bootstraps from the
    # true last observation like any other step
    ones = torch.ones(h, b)
    for flag, bootstraps in (("terminated", False), ("truncated", True)):
        edited = dict(batch, terminated=torch.zeros(h, b), truncated=torch.zeros(h, b))
        edited[flag] = ones
        with torch.no_grad():  # Q heads start at the bin of 0: give them a value first
            model.q.biases[-1][:, :, -1] = 5.0
            learner.target_q.load_state_dict(model.q.state_dict())
            td = learner.td_target(edited)
        if bootstraps:
            assert (td > edited["reward"] + 1).all()
        else:
            torch.testing.assert_close(td, edited["reward"])


def test_q_learns_that_an_episode_ends_at_the_encoded_state_before_a_termination():
    """Every TD target bootstraps from Q at an *encoded* next state, so Q must learn
    the end of an episode there, not only on latents rolled through the dynamics.
    With sequences kept inside one episode (the replay before 2026-12-05) an episode's
    last transition only ever sat last in a sequence, and Q there stayed at half the
    value of other states instead of near the terminal reward (2.4 against 4.6 after
    1 200 updates on this data; hopper's Q sat near reward / (1 - gamma) everywhere)."""
    buf = _cartpole_replay(200)
    learner = TDMPC(_model(), TDMPCConfig(batch_size=64, lr=1e-3, gamma=0.9))
    for _ in range(1200):
        learner.update(buf.sample(64))
    n, m = buf.size, learner.model
    obs, act = buf.obs[:n].reshape(-1, 4), buf.action[:n].reshape(-1, 1)
    term = buf.terminated[:n].reshape(-1)
    with torch.no_grad():
        logits = m.q_logits(m.encode(obs), act)
    q = two_hot_decode(logits, m.cfg.vmin, m.cfg.vmax).mean(0)
    terminal_reward = buf.reward[:n].reshape(-1)[term].mean()
    assert term.float().mean() > 0.1  # short random episodes: many ends
    assert (q[term].mean() - terminal_reward).abs() < 0.5, (q[term].mean(), terminal_reward)
    assert q[term].mean() < 0.25 * q[~term].mean(), (q[term].mean(), q[~term].mean())


def test_the_planner_masks_everything_after_a_predicted_termination():
    model = _model()
    model.eval()
    planner = MPPIPlanner(model, PlannerConfig(), horizon=3, gamma=0.9, num_envs=1)
    z = model.encode(torch.zeros(4, 4))
    actions = torch.zeros(4, 3, 1)
    with torch.no_grad():
        model.reward[-1].bias.zero_()
        model.reward[-1].bias[-1] = 20.0  # reward ~ symexp(10): huge, and equal every step
        model.q.biases[-1].zero_()
        model.q.biases[-1][:, :, -1] = 20.0
        model.termination[-1].bias.fill_(-30.0)  # never ends
        alive = planner._value(z, actions)
        model.termination[-1].bias.fill_(30.0)  # ends at the first transition
        ended = planner._value(z, actions)
    first = ended[0]  # only the first reward counts
    assert first > 1e3 and torch.allclose(ended, first.expand(4))
    assert (alive > 2.5 * first).all()  # three rewards and the bootstrap
    # plans come out in the action range, one per env, and warm-start the next call
    out = planner.plan(torch.zeros(1, 4))
    assert out.shape == (1, 1) and out.abs().max() <= 1 and planner.warm.all()
    planner.reset(torch.tensor([True]))
    assert not planner.warm.any()


# ---------------------------------------------------------------------- runs
def _cfg(steps: int, *extra: str):
    return build_world_model_config("cartpole", QUIET + TINY + [f"run.total_steps={steps}", *extra])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_torch_thread):
    run = tmp_path_factory.mktemp("wm") / "run"
    runner = OffPolicyRunner(_cfg(60, "planner.act=true", "run.checkpoint_every=10"), run)
    summary = runner.train()
    runner.close()
    return run, summary


def test_a_run_logs_checkpoints_and_reports_planner_beside_actor(tiny_run):
    run, summary = tiny_run
    assert summary["env_steps"] == 60 and not summary["stopped_early"]
    # utd 0.5 over 60 env steps, the seed steps (16) included once learning starts
    assert summary["updates"] == 30
    assert summary["eval_planner"]["episodes"] == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["tdmpc/updates"] == 30 and "perf/updates_per_second" in rows[-1]
    assert (run / "checkpoints" / "latest.pt").is_file()


def test_exported_actor_matches_torch_over_20_steps_and_runs_in_sim2sim(tiny_run, tmp_path):
    from deploy.metadata import read_metadata
    from deploy.runtime import OnnxPolicy
    from deploy.sim2sim import evaluate_onnx
    from sim.registry import make
    from training.export import export_run
    from training.policy_kinds import load_policy

    run, _ = tiny_run
    path = export_run(run, tmp_path / "policy.onnx")
    meta = read_metadata(path)
    assert meta.policy_family == "gaussian_mlp" and not meta.recurrent_state
    assert meta.extra["checkpoint_kind"] == "world_model" and meta.task == "cartpole"
    actor = load_policy(run).policy.inference_module()
    onnx = OnnxPolicy(path)
    env = make("cartpole", 1, seed=3)
    obs = env.reset()["policy"]
    worst = 0.0
    for _ in range(20):
        want = actor(obs.float())
        got, _ = onnx.act_batch(obs.numpy())
        worst = max(worst, float(np.abs(got - want.numpy()).max()))
        obs = env.step(want)[0]["policy"]
    env.close()
    assert worst < 1e-5
    stats = evaluate_onnx(path, episodes=2, seed=0, safety=False)
    assert stats["return_mean"] == pytest.approx(load_policy(run).evaluate(2)["return_mean"])


def test_resume_n_plus_n_equals_2n_with_the_replay_buffer(tmp_path):
    over = ("planner.act=true", "run.checkpoint_every=7")
    straight = OffPolicyRunner(_cfg(80, *over), tmp_path / "a")
    straight.train()
    first = OffPolicyRunner(_cfg(40, *over), tmp_path / "b")
    first.train()
    resumed = OffPolicyRunner(_cfg(80, *over), tmp_path / "b", resume=tmp_path / "b")
    assert resumed.env_steps == 40 and len(resumed.replay) == 40
    resumed.train()
    for (k, v), (_, w) in zip(
        straight.policy.state_dict().items(), resumed.policy.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)
    for k, v in straight.learner.target_q.state_dict().items():
        torch.testing.assert_close(v, resumed.learner.target_q.state_dict()[k], rtol=0, atol=0)
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
        assert torch.equal(getattr(straight.replay, name), getattr(resumed.replay, name)), name
    assert straight.learner.num_updates == resumed.learner.num_updates == 40
    # the two runs really differ from a third that saw other data
    other = OffPolicyRunner(_cfg(80, *over, "run.seed=1"), tmp_path / "c")
    other.train()
    assert not torch.equal(other.policy.actor[0].weight, straight.policy.actor[0].weight)


# ---------------------------------------------------------------------- learning
def test_learns_cartpole_far_beyond_a_random_policy(tmp_path):
    """Random actions keep the pole up for ~5 steps, and so does the untrained actor; the
    cartpole preset's 2000 env steps (25-210 s of CPU on the shared 2-core machines)
    must do clearly better with the exported actor. The bar, 5x random and 25 steps, is
    what the learner clears on both machine kinds it has run on: seed 0 gave 93 on an
    AMD EPYC (AVX2), 48 on an AVX-512 Xeon, where seeds 1 and 2 gave 76 and 55 (3000
    steps: 43 / 42 / 99: the return at this budget moves between seeds and machines, a
    policy that has not learned stays near 5)."""
    from sim.evaluation import evaluate
    from sim.registry import make

    env = make("cartpole", 10, seed=12345)  # the seed of the runner's evaluation
    gen = torch.Generator().manual_seed(0)
    random_return = evaluate(lambda o, r: torch.rand(10, 1, generator=gen) * 6 - 3, env, 10)
    env.close()
    cfg = build_world_model_config("cartpole", QUIET + ["run.eval_planner=false"])
    cpu = time.process_time()
    runner = OffPolicyRunner(cfg, tmp_path / "run")
    untrained = runner.evaluate()["return_mean"]
    runner.train()
    cpu = time.process_time() - cpu
    actor = runner.evaluate()["return_mean"]
    runner.close()
    assert untrained < 15, untrained  # the comparison has content: nothing balances yet
    bar = max(5 * random_return["return_mean"], 5 * untrained, 25)
    assert actor > bar, (actor, untrained, random_return, cpu)


# ---------------------------------------------------------------------- config, CLI
@pytest.mark.parametrize(
    "override, field",
    [
        ("tdmpc.horizon=0", "TDMPCConfig.horizon"),
        ("tdmpc.utd_ratio=0", "TDMPCConfig.utd_ratio"),
        ("tdmpc.utd_ratio=-1", "TDMPCConfig.utd_ratio"),
        ("tdmpc.batch_size=2000000", "TDMPCConfig.batch_size"),
        ("policy.latent_dim=20", "WorldModelConfig.latent_dim"),
        ("planner.num_elites=1000", "PlannerConfig.num_elites"),
    ],
)
def test_bad_configs_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        build_world_model_config("cartpole", [override])


def test_every_field_is_documented_and_shown_by_help(capsys):
    from training.config_docs import undocumented_fields
    from training.train_configs import WorldModelTrainConfig

    assert undocumented_fields(WorldModelTrainConfig()) == []
    with pytest.raises(SystemExit):
        main(["train", "world-model", "--help"])
    out = capsys.readouterr().out
    for line in ("  tdmpc.utd_ratio: float = ", "  planner.act: bool = ", "  policy.num_q: int = "):
        assert line in out


def test_cli_train_export_and_eval_both_ways(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "world-model", "--task", "cartpole", "--steps", "40", "--run-dir", str(run)]
    assert main(argv + ["--export", *QUIET, *TINY]) == 0
    out = capsys.readouterr().out
    assert "planner eval: return" in out and (run / "policy.onnx").is_file()
    # the run's artifacts as for every learner, with the planner beside the actor
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["episodes"] == summary["eval_planner"]["episodes"] == 2
    assert (run / "learning_curve.png").is_file()
    assert main(["eval", str(run), "--episodes", "2", "--json"]) == 0
    actor = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--episodes", "2", "--planner", "--json"]) == 0
    planner = json.loads(capsys.readouterr().out)
    assert planner["planner"] is True and planner["episodes"] == actor["episodes"] == 2
    assert main(["eval", str(run / "policy.onnx"), "--episodes", "2", "--json"]) == 0
    onnx = json.loads(capsys.readouterr().out)
    assert onnx["return_mean"] == pytest.approx(actor["return_mean"])
    # a world-model run resumes only as one; eval --planner only takes one
    ppo = ["train", "ppo", "--resume", str(run), "--steps", "80"]
    assert main(ppo) == 2 and "not a ppo run" in capsys.readouterr().err
    resume = ["train", "world-model", "--resume", str(run), "--steps", "60", "--no-artifacts"]
    assert main(resume + QUIET) == 0


def _nan_batches_from(runner, iteration: int) -> None:
    """From ``iteration`` on every replay batch the learner sees has NaN observations:
    both its steps (model and prior) are skipped as non-finite."""
    update = runner.learner.update

    def poisoned(batch):
        if runner.iteration >= iteration:
            batch = type(batch)({**batch, "obs": batch["obs"] * float("nan")})
        return update(batch)

    runner.learner.update = poisoned


def test_a_world_model_run_whose_updates_are_all_skipped_stops(tmp_path):
    from training.checkpoint import load_checkpoint
    from training.run_control import TrainingDiverged

    runner = OffPolicyRunner(_cfg(200, "run.max_stalled_updates=4"), tmp_path / "r")
    _nan_batches_from(runner, 30)
    with pytest.raises(TrainingDiverged, match=r"world-model: the last 4 updates took no step"):
        runner.train()
    # utd 0.5 with 2 envs: one update per iteration from iteration 30 on, 4 of them
    assert runner.iteration == 33
    assert runner.learner.num_updates == 33 and runner.learner.model_guard.nonfinite_steps == 4
    ck = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert ck["iteration"] == 33
    runner.close()
    # 0 trains on regardless, to the budget
    runner = OffPolicyRunner(_cfg(200, "run.max_stalled_updates=0"), tmp_path / "r0")
    _nan_batches_from(runner, 30)
    assert runner.train()["env_steps"] == 200
    runner.close()


def test_two_hot_splits_a_value_between_its_bins_and_turns_nan_into_a_nan_row():
    # 5 bins over [-2, 2] in symlog space: -2, -1, 0, 1, 2
    x = torch.tensor([symexp(torch.tensor(0.25)).item(), 0.0, float("nan"), 1e9, -float("inf")])
    out = two_hot(x, 5, -2.0, 2.0)
    torch.testing.assert_close(out[0], torch.tensor([0.0, 0.0, 0.75, 0.25, 0.0]))
    torch.testing.assert_close(out[1], torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]))
    assert torch.isnan(out[2]).all()  # a loss on it is NaN: the guarded step skips it
    torch.testing.assert_close(out[3], torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(out[4], torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))
    # the decoded expectation of the encoding is the value itself inside the range
    logits = torch.log(out[:2].clamp_min(1e-12))
    torch.testing.assert_close(two_hot_decode(logits, -2.0, 2.0), x[:2], rtol=1e-5, atol=1e-5)
