"""Nothing lost, nothing silently wrong, on the training side: run directories belong to
one run, metrics survive a torn write, bad demonstrations and NaN weights are refused,
and bad settings fail before anything runs, naming the setting."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from demo_support import random_demos

from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.cli import main
from training.demos import DatasetError, load_demos
from training.metrics import MetricsError, read_metrics

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]
TINY = ["env.num_envs=4", "ppo.num_steps=8", "run.checkpoint_every=1"]


def _train(run_dir: Path, steps: int, *extra: str) -> int:
    return main(
        ["train", "ppo", "--run-dir", str(run_dir), "--steps", str(steps), "--no-artifacts"]
        + QUIET
        + TINY
        + list(extra)
    )


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------- run directories
def test_resume_into_another_runs_directory_is_refused_and_leaves_it_alone(tmp_path, capsys):
    assert _train(tmp_path / "x", 64) == 0
    assert _train(tmp_path / "y", 32, "run.seed=1") == 0
    before = _tree(tmp_path / "y")
    rc = main(["train", "ppo", "--resume", str(tmp_path / "x"), "--run-dir", str(tmp_path / "y")])
    assert rc == 2
    assert "is not empty" in capsys.readouterr().err
    assert _tree(tmp_path / "y") == before


def test_resume_into_a_new_directory_continues_there_with_the_whole_curve(tmp_path):
    assert _train(tmp_path / "x", 64) == 0
    x_before = _tree(tmp_path / "x")
    rc = main(
        ["train", "ppo", "--resume", str(tmp_path / "x"), "--run-dir", str(tmp_path / "z")]
        + ["--steps", "96", "--no-artifacts"]
    )
    assert rc == 0
    assert _tree(tmp_path / "x") == x_before  # the resumed run is not touched
    steps = [r["step"] for r in read_metrics(tmp_path / "z" / "metrics.jsonl")]
    assert steps == [32, 64, 96]
    # the same as one uninterrupted run of 96 steps
    assert _train(tmp_path / "w", 96) == 0
    a = load_checkpoint(tmp_path / "z" / "checkpoints" / "latest.pt")["policy"]
    b = load_checkpoint(tmp_path / "w" / "checkpoints" / "latest.pt")["policy"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fresh_run_refuses_a_directory_left_before_its_first_checkpoint(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 32, "train/return": 1.0}\n')
    assert _train(run, 64) == 2
    err = capsys.readouterr().err
    assert "no checkpoint" in err and f"rm -r {run}" in err
    assert (run / "metrics.jsonl").read_text() == '{"step": 32, "train/return": 1.0}\n'


def test_torn_last_metrics_line_is_dropped_on_resume_with_a_warning(tmp_path):
    run = tmp_path / "r"
    assert _train(run, 64) == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 96, "train/ret')  # what a kill -9 inside a write leaves
    with pytest.warns(UserWarning, match="metrics.jsonl: dropped a torn last line"):
        rc = main(["train", "ppo", "--resume", str(run), "--steps", "96", "--no-artifacts"])
    assert rc == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [32, 64, 96]


def test_a_damaged_metrics_line_in_the_middle_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(MetricsError, match=r"metrics.jsonl, line 2"):
        read_metrics(path)


# ---------------------------------------------------------------------- numbers
def test_demonstrations_with_actions_outside_the_bounds_are_refused(tmp_path):
    path = random_demos(tmp_path / "d.hdf5")
    with h5py.File(path, "r+") as f:
        f["data/demo_1/actions"][3, 2] = 1e30
    with pytest.raises(DatasetError, match=r"demo_1/actions: step 3, joint .* is 1e\+30, outside"):
        load_demos(path)


def test_non_finite_weights_are_never_saved(tmp_path):
    good = save_checkpoint(tmp_path / "c.pt", {"policy": {"w": torch.ones(2)}})
    before = good.read_bytes()
    with pytest.raises(CheckpointError, match=r"policy\.w is not finite"):
        save_checkpoint(good, {"policy": {"w": torch.tensor([1.0, float("nan")])}})
    assert good.read_bytes() == before  # the last good checkpoint stays
    assert not list(tmp_path.glob(".*.tmp"))


def test_bc_skips_a_nan_step_and_keeps_finite_weights():
    from policies.diffusion import DiffusionConfig, DiffusionPolicy
    from training.algorithms.bc import BC, BCConfig

    torch.manual_seed(0)
    policy = DiffusionPolicy(4, 2, DiffusionConfig(hidden=(8,), critic_hidden=(8,), horizon=2, act_steps=2))
    obs, actions = torch.randn(16, 4), torch.rand(16, 2, 2) * 2 - 1
    bc = BC(policy, BCConfig(num_updates=4, batch_size=8, warmup=0), obs, actions)
    bc.update()
    real = policy.bc_loss
    policy.bc_loss = lambda *a, **k: real(*a, **k) * float("nan")
    stats = bc.update()
    policy.bc_loss = real
    assert stats["nonfinite_steps"] == 1 and np.isnan(stats["loss"])
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert bc.update()["nonfinite_steps"] == 1


# ---------------------------------------------------------------------- bad settings
@pytest.mark.parametrize(
    "setting, message",
    [
        ("run.device=banana", "run.device must be cpu, cuda or cuda:<index>, got 'banana'"),
        ("env.threads=-2", "EnvConfig.threads must be an integer >= 0"),
        ("run.eval_episodes=0", "eval_episodes must be an integer >= 1"),
        ('env.task_args={"dtype": "float64"}', "['dtype'] are not task options"),
        ("env.num_envs=abc", "env.num_envs expects an integer, got 'abc'"),
    ],
)
def test_bad_settings_fail_before_anything_runs(tmp_path, capsys, setting, message):
    assert _train(tmp_path / "r", 64, setting) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_export_refuses_an_unsupported_opset(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path), "--opset", "3"])
    assert "opset 3 is not supported" in capsys.readouterr().err


def test_a_binary_prompts_file_is_named(tmp_path):
    from training.grpo.data import PromptDataError, load_prompts

    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n\xff\xfe\x00binary')
    with pytest.raises(PromptDataError, match=r"p.jsonl: line 2: not UTF-8"):
        load_prompts(path)


def test_a_batch_that_cannot_fit_in_memory_is_refused_at_once():
    import sim

    with pytest.raises(ValueError, match=r"num_envs=10000000 .* needs at least .* GiB"):
        sim.make("quadruped", 10_000_000)


def test_metrics_rows_are_appended_in_one_write(tmp_path, monkeypatch):
    from training import metrics

    calls = []
    real = os.write

    def spy(fd, data):
        calls.append(data)
        return real(fd, data)

    monkeypatch.setattr(metrics.os, "write", spy)
    logger = metrics.MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"a": 1.0, "b": "x"})
    assert len(calls) == 1 and calls[0].endswith(b"\n")
    assert json.loads(calls[0]) == {"step": 1, "a": 1.0, "b": "x"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0, "b": "x"}]


# ---------------------------------------------------------------------- corrupted files
class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/sim2real_pwned",))


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("good") / "run"
    assert _train(run, 64) == 0
    return run


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "pickle that runs code", "empty"])
@pytest.mark.parametrize("command", ["resume", "eval", "export", "collect", "dppo --init"])
def test_a_damaged_checkpoint_is_an_error_naming_it_in_every_command(
    tmp_path, capsys, good_run, damage, command
):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    ck = run / "checkpoints" / "latest.pt"
    data = ck.read_bytes()
    if damage == "truncated":
        ck.write_bytes(data[: len(data) // 2])
    elif damage == "random bytes":
        ck.write_bytes(np.random.default_rng(0).bytes(4096))
    elif damage == "empty":
        ck.write_bytes(b"")
    else:
        torch.save({"format": 1, "kind": "ppo", "x": _Evil()}, ck)
    argv = {
        "resume": ["train", "ppo", "--resume", str(run)],
        "eval": ["eval", str(run), "--episodes", "1"],
        "export": ["export", str(run)],
        "collect": ["collect", str(run), "--episodes", "1", "--out", str(tmp_path / "d.hdf5")],
        "dppo --init": ["train", "dppo", "--init", str(run), "--run-dir", str(tmp_path / "d")],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(ck) in err and "Traceback" not in err
    assert not Path("/tmp/sim2real_pwned").exists()
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.hdf5").exists()


def test_randomize_on_a_task_without_randomization_says_so(tmp_path, capsys, good_run):
    assert main(["eval", str(good_run), "--episodes", "1", "--randomize"]) == 2
    assert "task 'cartpole' has no default randomization" in capsys.readouterr().err


def test_the_python_api_renders_offscreen_without_being_told(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
    code = "import os, sim; print(os.environ['MUJOCO_GL'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "egl", out.stderr[-500:]


# ---------------------------------------------------------------------- diverged runs
def _nan_rewards_from(runner, iteration: int) -> None:
    """From ``iteration`` on, every reward the learner sees is NaN (a diverged task)."""
    step = runner.env.step

    def poisoned(actions):
        obs, r, te, tr, info = step(actions)
        if runner.iteration >= iteration:
            r = r * float("nan")
        return obs, r, te, tr, info

    runner.env.step = poisoned


def test_a_run_whose_updates_are_all_skipped_stops_naming_where_it_began(tmp_path, capsys):
    from training.run_control import TrainingDiverged
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = QUIET + TINY + ["run.total_steps=640", "run.max_stalled_updates=3", "run.seed=0"]
    runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp_path / "r")
    _nan_rewards_from(runner, 2)
    with pytest.raises(TrainingDiverged, match=r"last 3 updates took no step.*since iteration 3 "):
        runner.train()
    # stopped after 2 good and 3 skipped updates of 20, its last good weights saved
    assert runner.iteration == 5
    ck = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert ck["iteration"] == 5
    saved = ck["policy"]
    for k, v in runner.policy.state_dict().items():
        assert torch.equal(saved[k], v)

    # 0 trains on regardless, to the budget
    over[-2] = "run.max_stalled_updates=0"
    runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp_path / "r0")
    _nan_rewards_from(runner, 2)
    assert runner.train()["iterations"] == 20


def _blow_up_from(runner, iteration: int) -> None:
    """From ``iteration`` on, every update ends by scrambling the policy's weights and
    reports the KL such an update has: finite steps that leave nothing of the policy."""
    update = runner.alg.update

    def blown():
        stats = update()
        if runner.iteration >= iteration:
            with torch.no_grad():
                for p in runner.policy.parameters():
                    p.add_(0.5)
            stats = {**stats, "approx_kl": 18.4}
        return stats

    runner.alg.update = blown


def test_a_run_whose_finite_updates_blow_the_policy_up_stops_naming_the_checkpoint_before(
    tmp_path,
):
    """Finite steps that each move the policy by a KL of 18 count as failed updates: the
    run stops after max_stalled_updates of them and names the newest iter_N.pt from
    before the first one, since latest.pt now holds the blown-up weights."""
    from training.run_control import TrainingDiverged
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    tmp = tmp_path
    over = QUIET + TINY + ["run.total_steps=800", "run.max_stalled_updates=3", "run.seed=0"]
    runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp / "r")
    _blow_up_from(runner, 10)  # updates 11, 12, 13 fail; iter_8.pt is every 4th
    with pytest.raises(TrainingDiverged) as e:
        runner.train()
    msg = str(e.value)
    assert "approximate KL above run.max_update_kl=5" in msg and "since iteration 11 " in msg
    good = tmp / "r" / "checkpoints" / "iter_000008.pt"
    assert f"the newest checkpoint from before it is {good}" in msg
    assert runner.iteration == 13
    assert load_checkpoint(good)["iteration"] == 8
    # one normal update resets the count: the same blow-ups every other update never stop it
    over[-2] = "run.max_stalled_updates=2"
    runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp / "r2")
    update = runner.alg.update

    def every_other():
        stats = update()
        return {**stats, "approx_kl": 18.4} if runner.iteration % 2 else stats

    runner.alg.update = every_other
    assert runner.train()["iterations"] == 25
    # 0 turns the KL watch off
    over[-2] = "run.max_stalled_updates=3"
    cfg = build_ppo_config("cartpole", over + ["run.max_update_kl=0"])
    runner = OnPolicyRunner(cfg, tmp / "r0")
    _blow_up_from(runner, 10)
    assert runner.train()["iterations"] == 25


def test_max_update_kl_must_be_a_nonnegative_number():
    from training.config import ConfigError
    from training.train_configs import build_ppo_config

    for bad in ("-1", "nan"):
        with pytest.raises(ConfigError, match="max_update_kl"):
            build_ppo_config("cartpole", [f"run.max_update_kl={bad}"])


def test_the_cli_reports_a_diverged_run_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    import training.runner as runner_module

    real = runner_module.OnPolicyRunner.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        _nan_rewards_from(self, 0)

    monkeypatch.setattr(runner_module.OnPolicyRunner, "__init__", init)
    rc = _train(tmp_path / "d", 640, "run.max_stalled_updates=2")
    assert rc == 3
    err = capsys.readouterr().err
    assert "diverged and stopped" in err and "max_stalled_updates=0" in err
