"""The command line explains itself: every train command lists its config fields with
types, defaults and a line of help; every subcommand answers --help."""

from __future__ import annotations

import pytest

from training.cli import main
from training.config_docs import undocumented_fields


def _help(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_train_help_lists_the_algorithms(capsys):
    out = _help(capsys, ["train", "--help"])
    for algo in ("ppo", "bc", "dppo", "grpo"):
        assert f"    {algo} " in out


@pytest.mark.parametrize(
    "algo, field",
    [
        ("ppo", "  ppo.target_kl: float | None = None"),
        ("bc", "  bc.num_updates: int = 5000"),
        ("dppo", "  dppo.ft_steps: int = 5"),
        ("grpo", "  algo.loss: str = 'grpo'"),
    ],
)
def test_train_help_lists_every_config_field(capsys, algo, field):
    out = _help(capsys, ["train", algo, "--help"])
    assert "config fields:" in out and field in out
    assert "run.seed: int = 0" in out


def test_train_help_shows_the_task_preset(capsys):
    out = _help(capsys, ["train", "ppo", "--task", "halfcheetah", "--help"])
    assert "  ppo.gamma: float = 0.98" in out  # halfcheetah's preset, not the default 0.99
    assert "  env.task: str = 'halfcheetah'" in out


def test_every_train_config_field_is_documented():
    from training.grpo.config import GRPOTrainConfig
    from training.train_configs import BCTrainConfig, DPPOTrainConfig, PPOTrainConfig

    for cfg in (PPOTrainConfig(), DPPOTrainConfig(), BCTrainConfig(), GRPOTrainConfig()):
        assert undocumented_fields(cfg) == [], type(cfg).__name__


@pytest.mark.parametrize(
    "argv", [["--help"], ["bench", "--help"], ["bench", "sim", "--help"], ["eval", "--help"]]
)
def test_subcommands_answer_help(capsys, argv):
    assert "usage: sim2real" in _help(capsys, argv)


def test_step_counts_accept_scientific_notation_and_refuse_fractions(capsys, tmp_path):
    from training.cli import _count

    assert _count("5e6") == 5_000_000 and _count("1_000") == 1000
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--steps", "1.5", "--run-dir", str(tmp_path / "r")])
    assert "expected a whole number" in capsys.readouterr().err


def test_a_renamed_field_says_its_new_name(capsys, tmp_path):
    rc = main(["train", "ppo", "--run-dir", str(tmp_path / "r"), "ppo.max_kl=0.01"])
    assert rc == 2
    assert "'ppo.max_kl' is now called 'ppo.target_kl'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_config_file_round_trip_and_order(tmp_path, capsys):
    assert main(["train", "ppo", "--task", "hopper", "ppo.lr=2e-4", "--print-config"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "c.yaml"
    path.write_text(printed)
    # the file names the task (its preset applies), the command line wins over the file
    assert main(["train", "ppo", "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert main(["train", "ppo", "--config", str(path), "ppo.lr=1e-4", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "  lr: 0.0001\n" in out and "  task: hopper\n" in out


def test_config_file_lists_and_mistakes(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  actor_hidden: [32, 32]\n")
    assert main(["train", "ppo", "--config", str(path), "--print-config"]) == 0
    assert "actor_hidden:\n  - 32\n  - 32\n" in capsys.readouterr().out
    path.write_text("ppo:\n  learning_rate: 0.1\n")
    assert main(["train", "ppo", "--config", str(path), "--print-config"]) == 2
    assert f"{path}: unknown config field 'ppo.learning_rate'; did you mean 'ppo.lr'?" in (
        capsys.readouterr().err
    )
    path.write_text("policy:\n  actor_hidden: 32\n")
    assert main(["train", "ppo", "--config", str(path)]) == 2
    assert "policy.actor_hidden expects a list, got 32" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, parsed", [("[32, 32]", (32, 32)), ("(64,64)", (64, 64)), ("16,8", (16, 8))]
)
def test_list_values_in_every_notation(value, parsed):
    from training.train_configs import build_ppo_config

    assert (
        build_ppo_config("cartpole", [f"policy.actor_hidden={value}"]).policy.actor_hidden == parsed
    )


@pytest.mark.parametrize(
    "name, ours",
    [("learning_rate", "lr"), ("n_epochs", "num_epochs"), ("ent_coef", "entropy_coef")],
)
def test_other_libraries_names_point_to_ours(capsys, tmp_path, name, ours):
    assert main(["train", "ppo", "--run-dir", str(tmp_path / "r"), f"ppo.{name}=1"]) == 2
    assert f"did you mean 'ppo.{ours}'?" in capsys.readouterr().err
