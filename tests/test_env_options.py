"""Task options and sim-to-real settings travel with the policy: set in the config
(env.task_args, env.s2r), stored in the checkpoint and the ONNX metadata, and applied by
`sim2real eval` by default, with --task-args / --s2r over them.

The envs are observed where they are built (a spy on the quadruped's close), so the
tests check the command ranges and randomization the evaluation actually ran with, not
a printed field.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from deploy.metadata import OPTIONAL_FIELDS, read_metadata
from sim.randomization import SimToRealConfig
from training.cli import main
from training.export import export_run
from training.runner import OnPolicyRunner
from training.train_configs import build_ppo_config

QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]
NARROW = {"command_vx": [0.5, 0.8]}
S2R = {"friction_scale": [0.9, 0.95], "action_latency": [1, 1]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A (barely) trained quadruped run on narrowed forward commands with its own
    randomization, and its exported file; the training env's settings as it ran."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("env-options")
    cfg = build_ppo_config(
        "quadruped",
        QUIET
        + [
            f"env.task_args={json.dumps(NARROW)}",
            f"env.s2r={json.dumps(S2R)}",
            "env.num_envs=4",
            "env.threads=1",
            "env.max_episode_steps=20",
            "ppo.num_steps=8",
            "run.total_steps=32",
            "policy.actor_hidden=16,16",
            "policy.critic_hidden=16,16",
        ],
    )
    runner = OnPolicyRunner(cfg, root / "run")
    trained_env = (runner.env.command_vx, runner.env.s2r)
    runner.train()
    runner.close()
    onnx_path = export_run(root / "run")
    yield root / "run", onnx_path, trained_env
    torch.set_num_threads(before)


@pytest.fixture
def built(monkeypatch):
    """What every quadruped env built during a test ran with, read when it closes."""
    from sim.tasks.quadruped import Quadruped

    seen: list[dict] = []
    close = Quadruped.close

    def spy(self):
        if self.num_envs == 1:  # the env a checkpoint's policy is built for, not evaluated in
            return close(self)
        seen.append(
            {
                "command_vx": self.command_vx,
                "commands": self.commands.copy(),
                "s2r": self.s2r,
                "friction": self.randomizer.friction.copy(),
                "latency": self._latency.delay.copy(),
            }
        )
        close(self)

    monkeypatch.setattr(Quadruped, "close", spy)
    return seen


def _eval(capsys, source, *extra: str) -> dict:
    rc = main(["eval", str(source), "--episodes", "6", "--json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


# ---------------------------------------------------------------------- the config
def test_env_s2r_is_a_config_field_checked_by_sim(capsys, tmp_path):
    ok = ["train", "ppo", "--task", "quadruped", "--print-config"]
    assert main([*ok, f"env.s2r={json.dumps(S2R)}"]) == 0
    assert "  s2r:\n    friction_scale:\n    - 0.9\n    - 0.95\n" in capsys.readouterr().out
    bad = {
        '{"friction": [0.5, 1]}': "env.s2r: unknown sim-to-real fields ['friction']",
        '{"friction_scale": [1.2, 0.8]}': "friction_scale must be a finite (low, high) pair "
        "with low <= high, got [1.2, 0.8]",
        '{"friction_scale": 1}': "friction_scale must be a (low, high) pair, got 1",
        '{"action_latency": [0, 1.5]}': "action_latency must be integers",
        '{"obs_history": 3}': "obs_history is the policy's frame stacking",
    }
    for value, message in bad.items():
        assert main([*ok, f"env.s2r={value}"]) == 2
        assert message in capsys.readouterr().err, value
    # a YAML config file takes it as a mapping
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  task: quadruped\n  s2r:\n    push_interval_s: null\n")
    assert main(["train", "ppo", "--config", str(path), "--print-config"]) == 0
    assert "  s2r:\n    push_interval_s: null\n" in capsys.readouterr().out


def test_the_help_documents_env_s2r(capsys):
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    out = capsys.readouterr().out
    assert "env.s2r: dict[str, Any] = {}" in out and "friction_scale" in out


def test_s2r_with_randomize_false_is_refused_before_a_run_starts(capsys, tmp_path):
    run = tmp_path / "r"
    argv = ["train", "ppo", "--run-dir", str(run), "env.randomize=false"]
    assert main([*argv, 'env.s2r={"action_latency": [0, 2]}']) == 2
    err = capsys.readouterr().err
    assert "env.s2r sets sim-to-real settings ['action_latency'], but env.randomize is false" in err
    assert not run.exists()


# ---------------------------------------------------------------------- stored
def test_the_training_env_is_stored_with_the_policy(trained):
    run, onnx_path, (trained_vx, trained_s2r) = trained
    assert trained_vx == (0.5, 0.8)  # what training itself ran with
    assert trained_s2r.friction_scale == (0.9, 0.95) and trained_s2r.action_latency == (1, 1)
    meta = read_metadata(onnx_path)
    assert meta.task_args == NARROW and meta.trained_randomized is True
    assert meta.sim_to_real == json.loads(json.dumps(trained_s2r.__dict__))
    assert meta.sim_to_real["mass_scale"] == [0.9, 1.1]  # the task's default, kept


# ---------------------------------------------------------------------- eval
@pytest.mark.parametrize("which", ["checkpoint", "onnx"])
def test_eval_runs_on_the_trained_commands_and_randomization(trained, built, capsys, which):
    run, onnx_path, _ = trained
    source = run if which == "checkpoint" else onnx_path
    _eval(capsys, source)
    (env,) = built
    assert env["command_vx"] == (0.5, 0.8)
    assert ((env["commands"][:, 0] >= 0.5) & (env["commands"][:, 0] <= 0.8)).all()
    assert env["s2r"] == SimToRealConfig()  # by default the nominal model
    _eval(capsys, source, "--randomize")
    env = built[-1]
    assert env["s2r"].friction_scale == (0.9, 0.95) and env["s2r"].action_latency == (1, 1)
    assert ((env["friction"] >= 0.9) & (env["friction"] <= 0.95)).all()
    assert (env["latency"] == 1).all()


@pytest.mark.parametrize("which", ["checkpoint", "onnx"])
def test_overrides_win(trained, built, capsys, which):
    run, onnx_path, _ = trained
    source = run if which == "checkpoint" else onnx_path
    _eval(
        capsys,
        source,
        "--task-args",
        '{"command_vx": [-0.8, -0.5]}',
        "--randomize",
        "--s2r",
        '{"friction_scale": [1.2, 1.3]}',
    )
    (env,) = built
    assert env["command_vx"] == (-0.8, -0.5) and (env["commands"][:, 0] <= -0.5).all()
    assert env["s2r"].friction_scale == (1.2, 1.3)
    assert ((env["friction"] >= 1.2) & (env["friction"] <= 1.3)).all()
    assert env["s2r"].action_latency == (1, 1)  # what is not named stays as trained


@pytest.mark.parametrize("which", ["checkpoint", "onnx"])
def test_bad_overrides_are_clear_errors(trained, capsys, which):
    run, onnx_path, _ = trained
    source = str(run if which == "checkpoint" else onnx_path)
    base = ["eval", source, "--episodes", "1"]
    with pytest.raises(SystemExit):
        main([*base, "--task-args", "{command_vx: 1}"])
    assert "--task-args: expected a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--s2r", "[1, 2]"])
    assert "--s2r: expected a JSON object" in capsys.readouterr().err
    cases = {
        ("--task-args", '{"speed": 1}'): "no option(s) ['speed']",
        ("--s2r", '{"friction": [1, 2]}', "--randomize"): "unknown sim-to-real fields ['friction']",
        ("--s2r", '{"friction_scale": [0, 1]}', "--randomize"): "friction_scale must be positive",
        ("--s2r", '{"friction_scale": [1, 2]}'): "add --randomize",
    }
    for extra, message in cases.items():
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)


def test_a_file_without_the_recorded_env_evaluates_on_the_task_defaults(
    trained, built, capsys, tmp_path
):
    _, onnx_path, _ = trained
    model = onnx.load(onnx_path)
    kept = [
        (p.key, p.value)
        for p in model.metadata_props
        if p.key not in {"sim2real." + name for name in OPTIONAL_FIELDS}
    ]
    assert len(kept) == len(model.metadata_props) - len(OPTIONAL_FIELDS)
    del model.metadata_props[:]
    for key, value in kept:
        model.metadata_props.add(key=key, value=value)
    old = tmp_path / "old.onnx"
    onnx.save(model, old)
    assert read_metadata(old).sim_to_real is None
    stats = _eval(capsys, old, "--randomize")
    assert stats["episodes"] == 6 and stats["safety"]["nonfinite_action"] == 0
    (env,) = built
    assert env["command_vx"] == (-1.0, 1.0)  # the task's own range and randomization
    assert env["s2r"].friction_scale == (0.5, 1.25) and env["s2r"].action_latency == (0, 1)
    # and the file's overrides still apply
    _eval(capsys, old, "--task-args", json.dumps(NARROW))
    assert built[-1]["command_vx"] == (0.5, 0.8)


def test_randomize_on_a_task_without_randomization_takes_s2r(capsys, tmp_path):
    """--randomize still refuses a nominal cartpole, but not once --s2r names a setting."""
    cfg = build_ppo_config(
        "cartpole",
        QUIET
        + ["env.num_envs=2", "ppo.num_steps=8", "run.total_steps=16"]
        + ["env.max_episode_steps=30"],
    )
    OnPolicyRunner(cfg, tmp_path / "cp").train()
    assert main(["eval", str(tmp_path / "cp"), "--episodes", "1", "--randomize"]) == 2
    assert "task 'cartpole' has no default randomization" in capsys.readouterr().err
    stats = _eval(capsys, tmp_path / "cp", "--randomize", "--s2r", '{"obs_noise": {"qpos": 0.1}}')
    assert stats["randomize"] is True
    assert np.isfinite(stats["return_mean"])
