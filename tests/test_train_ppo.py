"""PPO runner: learning, exact resume, checkpoints, bad configs, data-parallel parity."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from training.artifacts import evaluate_source
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.cli import main as cli_main
from training.config import ConfigError
from training.policy_kinds import make_env
from training.presets import PPO_PRESETS
from training.runner import OnPolicyRunner, parameters_vector
from training.train_configs import build_ppo_config

QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]


def _train(tmp_path, name, task, overrides, resume=None):
    cfg = build_ppo_config(task, QUIET + overrides)
    runner = OnPolicyRunner(cfg, tmp_path / name, resume=resume)
    runner.train()
    return runner


def test_ppo_solves_cartpole(tmp_path):
    runner = _train(tmp_path, "run", "cartpole", ["run.total_steps=60000", "run.seed=1"])
    stats = evaluate_source(tmp_path / "run", episodes=8, seed=3)
    # InvertedPendulum-v5's maximum: 1000 steps of reward 1
    assert stats["return_mean"] == pytest.approx(1000.0), stats
    assert runner.env_steps >= 60000
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == runner.iteration


@pytest.mark.parametrize(
    "task,extra",
    [
        ("cartpole", ["env.num_envs=4", "ppo.num_steps=16"]),
        # randomization, latency, noise, pushes and commands: the env state must resume too
        (
            "quadruped",
            [
                "env.num_envs=6",
                "ppo.num_steps=8",
                "policy.actor_hidden=32,32",
                "policy.critic_hidden=32,32",
            ],
        ),
        (
            "cartpole",
            ["env.num_envs=4", "ppo.num_steps=16", "policy.rnn_type=gru", "policy.rnn_hidden=16"],
        ),
    ],
)
def test_exact_resume(tmp_path, task, extra):
    per_iter = int(extra[0].split("=")[1]) * int(extra[1].split("=")[1])
    n = 3 * per_iter
    whole = _train(tmp_path, "whole", task, extra + [f"run.total_steps={2 * n}"])
    _train(tmp_path, "split", task, extra + [f"run.total_steps={n}"])
    resumed = _train(
        tmp_path, "split", task, extra + [f"run.total_steps={2 * n}"], resume=tmp_path / "split"
    )
    assert resumed.env_steps == whole.env_steps == 2 * n
    assert torch.equal(parameters_vector(resumed.policy), parameters_vector(whole.policy))
    a = load_checkpoint(tmp_path / "whole" / "checkpoints" / "latest.pt")
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "latest.pt")
    for k in a["policy"]:
        assert torch.equal(a["policy"][k], b["policy"][k]), k
    # the metrics file of the resumed run has one line per iteration, no duplicates
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == resumed.iteration
    if task == "quadruped":  # the task's reward terms are logged, one mean per rollout
        row = json.loads(lines[-1])
        terms = [k for k in row if k.startswith("env/rew_")]
        assert "env/rew_tracking_lin_vel" in terms and "env/lin_vel_error" in row
        assert all(math.isfinite(row[k]) for k in terms)


def test_resume_other_architecture_or_task_is_refused(tmp_path):
    _train(tmp_path, "run", "cartpole", ["env.num_envs=4", "ppo.num_steps=8", "run.total_steps=32"])
    cfg = build_ppo_config(
        "cartpole", QUIET + ["env.num_envs=4", "ppo.num_steps=8", "policy.actor_hidden=16,16"]
    )
    with pytest.raises(CheckpointError, match="policy"):
        OnPolicyRunner(cfg, tmp_path / "other", resume=tmp_path / "run")
    cfg = build_ppo_config("hopper", QUIET + ["env.num_envs=4", "ppo.num_steps=8"])
    with pytest.raises(CheckpointError, match="task"):
        OnPolicyRunner(cfg, tmp_path / "other2", resume=tmp_path / "run")
    rc = cli_main(["eval", str(tmp_path / "run"), "--task", "hopper", "--episodes", "1"])
    assert rc == 2


def test_checkpoint_is_atomic_and_weights_only(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"kind": "ppo", "x": torch.ones(3)})
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temp file left behind
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(path)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": 1, "evil": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "evil.pt")


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--task", "cartpole", "ppo.lrr=1e-3"],
            "unknown config field 'ppo.lrr'; did you mean 'ppo.lr'",
        ),
        (["--task", "cartpole", "ppo.lr=-1"], "lr"),
        (["--task", "cartpol"], "unknown task 'cartpol'"),
        (["--task", "cartpole", "env.num_envs=abc"], "expects an integer"),
        (["--task", "cartpole", "ppo=3"], "section"),
        (
            ["--task", "quadruped", 'env.task_args={"comand_vx": [0, 1]}'],
            "'quadruped' has no option(s) ['comand_vx']",
        ),
        (["--task", "quadruped", 'env.task_args={"num_threads": 1}'], "env.threads"),
        (["--task", "quadruped", "env.task_args=[1]"], "expects a JSON object"),
    ],
)
def test_bad_configs_give_clear_errors(tmp_path, capsys, args, message):
    rc = cli_main(["train", "ppo", "--run-dir", str(tmp_path / "r")] + args + QUIET)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_config_overrides_parse_types():
    cfg = build_ppo_config(
        "cartpole", ["policy.actor_hidden=8,8", "env.max_episode_steps=none", "run.video=false"]
    )
    assert cfg.policy.actor_hidden == (8, 8)
    assert cfg.env.max_episode_steps is None
    assert cfg.run.video is False
    with pytest.raises(ConfigError):
        build_ppo_config("cartpole", ["run.video=maybe"])


def test_overrides_that_are_valid_only_together_apply_in_any_order():
    from training.config import apply_overrides
    from training.train_configs import FPOTrainConfig

    base = FPOTrainConfig()
    assert (base.policy.horizon, base.policy.act_steps) == (4, 4)
    # horizon=1 alone breaks act_steps <= horizon; it waits for act_steps=1
    cfg = apply_overrides(base, ["policy.horizon=1", "policy.act_steps=1"])
    assert (cfg.policy.horizon, cfg.policy.act_steps) == (1, 1)
    # the last value of a field wins, whatever waited
    cfg = apply_overrides(base, ["policy.horizon=1", "policy.act_steps=1", "policy.horizon=8"])
    assert (cfg.policy.horizon, cfg.policy.act_steps) == (8, 1)
    # no order makes it valid: the field's own error
    with pytest.raises(ConfigError, match="act_steps must be <= horizon"):
        apply_overrides(base, ["policy.horizon=1", "fpo.clip=0.1"])


def test_task_args_reach_the_environment():
    cfg = build_ppo_config(
        "quadruped", ['env.task_args={"fixed_command": [0.5, 0, 0], "command_resample_s": 4}']
    )
    env = make_env(cfg, num_envs=2)
    try:
        assert env.command_resample_s == 4.0
        env.reset()
        assert env.commands.tolist() == [[0.5, 0.0, 0.0]] * 2
    finally:
        env.close()


def test_ddp_two_processes_keep_identical_parameters(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "training.cli", "train", "ppo", "--task", "cartpole", "--run-dir", str(tmp_path / "ddp"),
        "--steps", "512", "--no-artifacts", "env.num_envs=8", "ppo.num_steps=16", "env.threads=1",
        *QUIET,
    ]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r0 = load_checkpoint(tmp_path / "ddp" / "checkpoints" / "latest.pt")
    r1 = load_checkpoint(tmp_path / "ddp" / "checkpoints" / "latest.rank1.pt")
    assert r0["world_size"] == 2 and r0["env_steps"] == 512
    for k in r0["policy"]:
        assert torch.equal(r0["policy"][k], r1["policy"][k]), k
    # the ranks saw different experience (seeded apart), yet hold one model
    assert not torch.equal(r0["obs"]["policy"], r1["obs"]["policy"])


def test_recurrent_checkpoint_evaluates(tmp_path):
    _train(
        tmp_path,
        "lstm",
        "cartpole",
        [
            "env.num_envs=4",
            "ppo.num_steps=8",
            "run.total_steps=64",
            "policy.rnn_type=lstm",
            "policy.rnn_hidden=8",
        ],
    )
    stats = evaluate_source(tmp_path / "lstm", episodes=3)
    assert stats["completed"] == 3 and stats["length_mean"] >= 1


def test_a_run_directory_is_never_reused_without_resume(tmp_path):
    _train(tmp_path, "run", "cartpole", ["env.num_envs=4", "ppo.num_steps=8", "run.total_steps=32"])
    with pytest.raises(ValueError, match="already holds a run"):
        _train(
            tmp_path, "run", "cartpole", ["env.num_envs=4", "ppo.num_steps=8", "run.total_steps=32"]
        )


def test_linear_schedule_length_follows_the_step_budget(tmp_path):
    extra = ["env.num_envs=4", "ppo.num_steps=16", "ppo.schedule=linear", "ppo.lr=1e-3"]
    run = _train(tmp_path, "lin", "cartpole", extra + ["run.total_steps=320"])
    # 320 steps / 64 per update = 5 updates: the rate has decayed to lr_final = 0 at the end
    assert run.alg.cfg.total_updates == 5
    assert run.alg.learning_rate == pytest.approx(0.0)
    lrs = [json.loads(x)["ppo/lr"] for x in (tmp_path / "lin" / "metrics.jsonl").open()]
    assert lrs == pytest.approx([8e-4, 6e-4, 4e-4, 2e-4, 0.0])
    # a resume with twice the budget stretches the schedule: halfway through, half the rate
    resumed = _train(
        tmp_path, "lin", "cartpole", extra + ["run.total_steps=640"], resume=tmp_path / "lin"
    )
    assert resumed.alg.cfg.total_updates == 10
    assert resumed.alg.learning_rate == pytest.approx(0.0)
    lrs = [json.loads(x)["ppo/lr"] for x in (tmp_path / "lin" / "metrics.jsonl").open()]
    assert lrs[5:] == pytest.approx([4e-4, 3e-4, 2e-4, 1e-4, 0.0])


@pytest.mark.parametrize("task", sorted(PPO_PRESETS))
def test_every_preset_builds_a_valid_config(task):
    cfg = build_ppo_config(task)
    per_update = cfg.env.num_envs * cfg.ppo.num_steps
    # a minibatch must hold at least one sample, and the budget at least one update
    assert per_update >= cfg.ppo.num_minibatches
    assert cfg.run.total_steps >= per_update


def _sb3_benchmark():
    """benchmarks/ppo_vs_sb3.py as a module (benchmarks/ is scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "ppo_vs_sb3.py"
    spec = importlib.util.spec_from_file_location("bench_ppo_vs_sb3", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_sb3_comparison_keeps_sb3_side_and_reruns_only_ours(tmp_path, monkeypatch, capsys):
    """(b) of benchmarks/ppo_vs_sb3.py: SB3's long run is cached per (budget, seed) and
    rerun only when its settings changed."""
    bench = _sb3_benchmark()
    sb3_calls: list[int] = []

    def fake_sb3(steps, seed):
        sb3_calls.append(steps)
        # (wall s, steps, training return): first reaches its final 900 at 40 s
        curve = [[20.0, 500, 300.0], [40.0, 1000, 950.0], [60.0, 1500, 900.0]]
        return {"curve": curve, "final_train_return": 900.0, "eval_return": 1.0, "wall_s": 60.0}

    def fake_ours(steps, seed, out, compile_=False):
        return {
            "curve": [(1.0, 100, float("nan")), (5.0, 200, 800.0), (8.0, 300, 901.0)],
            "wall_s": 9,
        }

    monkeypatch.setattr(bench, "sb3_zoo", fake_sb3)
    monkeypatch.setattr(bench, "ours_preset", fake_ours)
    argv = ["ppo_vs_sb3.py", "--parts", "b", "--steps-b", "1500", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--sb3-only"])
    bench.main()
    assert sb3_calls == [1500] and (tmp_path / "sb3_zoo_s0_1500.json").exists()
    assert "never" not in capsys.readouterr().out  # --sb3-only stops before our side
    monkeypatch.setattr(sys, "argv", [*argv, "--json", str(tmp_path / "r.json")])
    bench.main()
    assert sb3_calls == [1500]  # read back, not rerun
    res = json.loads((tmp_path / "r.json").read_text())["b"]
    assert res["target"] == 900.0 and res["sb3"]["t"] == 40.0 and res["ours"]["t"] == 8.0
    assert "speedup 5.0x" in capsys.readouterr().out
    monkeypatch.setitem(bench.ZOO, "n_epochs", 10)  # another setting: the cache is stale
    bench.main()
    assert sb3_calls == [1500, 1500]
    assert "other settings" in capsys.readouterr().out


def test_sb3_comparison_reads_our_return_over_the_last_20_episodes(tmp_path):
    """(b) reads our training return as SB3's: last 20 episodes, each one recorded."""
    import time

    import numpy as np

    bench = _sb3_benchmark()
    cfg = build_ppo_config(
        "cartpole",
        ["run.total_steps=3072", "run.video=false", "run.progress=false", "run.tensorboard=false"],
    )
    runner = OnPolicyRunner(cfg, tmp_path / "run")
    runner.logger.recent_returns = log = bench._EpisodeLog(runner, time.perf_counter())
    summary = runner.train()
    assert len(log.returns) > 100 and len(log.points) > 1
    steps = [s for _, s, _ in log.points]
    assert steps == sorted(steps) and steps[-1] == runner.env_steps
    assert log.points[-1][2] == pytest.approx(np.mean(log.returns[-20:]))
    # the runner's own log still sees its last 100 episodes
    assert summary["return"] == pytest.approx(np.mean(log.returns[-100:]))


def test_sb3_comparison_reruns_our_side_from_scratch(tmp_path, capsys):
    """A second (b) run of ours replaces the first: a resumed timing would mean nothing."""
    bench = _sb3_benchmark()
    first = bench.ours_preset(2048, 0, tmp_path)  # one iteration of the halfcheetah preset
    assert first["curve"] == [] and (tmp_path / "preset_2048" / "checkpoints").is_dir()
    bench.ours_preset(2048, 0, tmp_path)
    assert "removing the earlier run" in capsys.readouterr().out


def _quality_benchmark():
    """benchmarks/ppo_quality.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "ppo_quality.py"
    spec = importlib.util.spec_from_file_location("bench_ppo_quality", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_rsl_rl_peer_resumes_an_interrupted_run_and_refuses_another(tmp_path, monkeypatch):
    """Interrupted mid-iteration, the peer continues from its last checkpoint (the
    iterations already saved are not trained again), ends at the budget's iteration, and
    a call with another budget into the same folder is refused rather than mixed in."""
    _quality_benchmark()
    peer = sys.modules["rsl_rl_peer"]
    from sim.rsl_rl_env import RslRlVecEnv

    calls = {"n": 0, "fail_at": 80}
    real_step = RslRlVecEnv.step

    def step(self, actions):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise KeyboardInterrupt("killed during iteration 2")
        return real_step(self, actions)

    monkeypatch.setattr(RslRlVecEnv, "step", step)
    # the cartpole preset: 16 envs x 32 steps, so 2048 steps are 4 iterations of 32 calls
    with pytest.raises(KeyboardInterrupt):
        peer.train("cartpole", 2048, 0, tmp_path, save_every=1)
    run = tmp_path / "rsl_rl-cartpole-s0"
    assert sorted(p.name for p in run.glob("model_*.pt")) == ["model_0.pt", "model_1.pt"]

    calls.update(n=0, fail_at=-1)
    res = peer.train("cartpole", 2048, 0, tmp_path, save_every=1)
    assert calls["n"] == 2 * 32  # iterations 2 and 3 only
    assert res["steps"] == 2048 and res["segments"] == 1 and res["wall_s"] > 0
    from deploy.metadata import read_metadata

    assert int(read_metadata(res["onnx"]).extra["iteration"]) == 3
    assert sorted(p.name for p in run.glob("model_*.pt"))[-1] == "model_3.pt"

    # finished: a third call trains nothing and scores the same checkpoint
    calls["n"] = 0
    again = peer.train("cartpole", 2048, 0, tmp_path, save_every=1)
    assert calls["n"] == 0 and again["return_mean"] == res["return_mean"]

    with pytest.raises(FileExistsError, match="another rsl_rl run"):
        peer.train("cartpole", 4096, 0, tmp_path)
    (tmp_path / "rsl_rl-cartpole-s1").mkdir()
    (tmp_path / "rsl_rl-cartpole-s1" / "notes.txt").write_text("someone else's")
    with pytest.raises(FileExistsError, match="not written by"):
        peer.train("cartpole", 2048, 1, tmp_path)
    with pytest.raises(ValueError, match="save_every"):
        peer.train("cartpole", 2048, 2, tmp_path, save_every=0)


def test_quality_benchmark_trains_the_sb3_peer_once_and_compares(tmp_path, monkeypatch, capsys):
    """ppo_quality.py's SB3 peer: a real SB3 run on Gymnasium's own env, cached per
    (env, budget, seed) and read back; the table divides our median by the peer's."""
    bench = _quality_benchmark()
    peer = sys.modules["sb3_peer"]
    argv = ["ppo_quality.py", "--tasks", "cartpole", "--sb3", "cartpole", "--seeds", "0",
            "--steps", "2048", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")]  # fmt: skip
    monkeypatch.setattr(sys, "argv", [*argv, "--sb3-only"])
    bench.main()
    cached = json.loads((tmp_path / "sb3_default_InvertedPendulum-v5_2048_s0.json").read_text())
    assert cached["env_id"] == "InvertedPendulum-v5" and cached["steps"] == 2048
    # v5 pays +1 per step but nothing on the step that tips over
    assert 1 <= cached["length_mean"] <= 1000
    assert cached["return_mean"] == pytest.approx(cached["length_mean"] - 1)
    capsys.readouterr()

    def not_again(*args):
        raise AssertionError("the cached SB3 run was trained again")

    monkeypatch.setattr(peer, "train_default", not_again)
    monkeypatch.setattr(sys, "argv", [*argv, "run.video=false"])
    bench.main()
    res = json.loads((tmp_path / "r.json").read_text())
    ours = res["ours"][0]["return_mean"]
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cartpole  "))
    assert f"{ours / cached['return_mean']:.2f}x" in line and "SB3" in line

    monkeypatch.setattr(sys, "argv", [*argv[:2], "quadruped", "--sb3", "quadruped", *argv[5:]])
    with pytest.raises(SystemExit):
        bench.main()
    assert "no Gymnasium env reproduces it" in capsys.readouterr().err


def test_quality_benchmark_trains_rsl_rl_on_our_task_with_the_preset(tmp_path, monkeypatch, capsys):
    """ppo_quality.py's rsl_rl peer: rsl_rl's own runner on our env with the preset's
    settings, its checkpoint exported and scored by our evaluation; settings rsl_rl
    cannot run are refused rather than silently dropped."""
    bench = _quality_benchmark()
    peer = sys.modules["rsl_rl_peer"]
    cfg = build_ppo_config("quadruped")
    tc = peer.train_cfg(cfg)
    alg = tc["algorithm"]
    assert tc["num_steps_per_env"] == 24 and tc["obs_groups"]["critic"] == ["critic"]
    assert (alg["learning_rate"], alg["schedule"], alg["num_mini_batches"]) == (1e-3, "adaptive", 4)
    assert tc["actor"]["hidden_dims"] == [256, 128, 64]
    assert tc["actor"]["distribution_cfg"]["init_std"] == cfg.policy.init_std
    with pytest.raises(ValueError, match="value normalization"):
        peer.train_cfg(build_ppo_config("humanoid"))

    argv = ["ppo_quality.py", "--tasks", "cartpole", "--sb3", "--rsl-rl", "cartpole",
            "--seeds", "0", "--steps", "2048", "--out", str(tmp_path), "--peers-only"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    res = json.loads((tmp_path / "rsl_rl_cartpole_2048_s0.json").read_text())
    assert res["steps"] == 2048 and 1 <= res["length_mean"] <= 1000
    from deploy.metadata import read_metadata

    meta = read_metadata(res["onnx"])
    assert meta.extra["checkpoint_kind"] == "rsl_rl" and int(meta.extra["iteration"]) == 3
    out = capsys.readouterr().out
    assert f"rsl_rl PPO: return {res['return_mean']:.1f}" in out
