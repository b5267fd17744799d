"""Fault injection: a training process killed with SIGKILL anywhere (inside a checkpoint
write, inside a metrics write, before its first checkpoint, at a random moment) and then
resumed ends exactly where an uninterrupted run ends: same final weights, same metrics.

Every case is a real `sim2real train` child process (tests/fault_support.py) for PPO,
DPPO and GRPO. benchmarks/fault_injection.py runs more random kills and writes the table
of docs/reliability.md.
"""

from __future__ import annotations

import random

import pytest
from fault_support import run_child, same_result, train_until_done

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]
PPO = ["train", "ppo", "--task", "cartpole", "--steps", "256", "--no-artifacts", *QUIET]
PPO += ["env.num_envs=4", "ppo.num_steps=16", "run.checkpoint_every=1"]


@pytest.fixture(scope="module")
def ppo_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo")
    assert run_child("none", [*PPO, "--run-dir", str(root / "ref")], root) == 0
    return root / "ref"


@pytest.mark.parametrize(
    "fault",
    ["checkpoint:1", "checkpoint:3", "metrics:2", f"after:{random.Random(7).uniform(3, 6):.2f}"],
    ids=["before-first-checkpoint", "during-checkpoint-write", "during-metrics-write", "random"],
)
def test_ppo_killed_then_resumed_equals_an_uninterrupted_run(tmp_path, ppo_reference, fault):
    kills = train_until_done(fault, PPO, tmp_path / "run", tmp_path)
    if not fault.startswith("after"):
        assert kills == 1  # the fault did fire
    same, why = same_result(tmp_path / "run", ppo_reference)
    assert same, why


def test_dppo_killed_during_writes_then_resumed_equals_an_uninterrupted_run(tmp_path):
    from demo_support import random_demos

    from training.bc_runner import BCRunner
    from training.train_configs import build_bc_config

    demos = random_demos(tmp_path / "demos.hdf5")
    bc_over = ["run.progress=false", "run.tensorboard=false", "bc.num_updates=10"]
    bc_over += ["bc.batch_size=8", "policy.hidden=8,8", "policy.critic_hidden=8"]
    bc_over += ["policy.sample_steps=3", "policy.horizon=4", "policy.act_steps=2"]
    BCRunner(build_bc_config("hopper", str(demos), bc_over), tmp_path / "bc").train()
    args = ["train", "dppo", "--init", str(tmp_path / "bc"), "--steps", "64", "--no-artifacts"]
    args += [*QUIET, "env.num_envs=2", "dppo.num_steps=8", "dppo.num_epochs=1"]
    args += ["dppo.ft_steps=2", "run.checkpoint_every=1", "env.max_episode_steps=30"]
    assert run_child("none", [*args, "--run-dir", str(tmp_path / "ref")], tmp_path) == 0
    for fault in ("checkpoint:2", "metrics:3"):
        run = tmp_path / fault.replace(":", "-")
        assert train_until_done(fault, args, run, tmp_path) == 1
        same, why = same_result(run, tmp_path / "ref")
        assert same, f"{fault}: {why}"


def test_grpo_killed_during_writes_then_resumed_equals_an_uninterrupted_run(tmp_path):
    pytest.importorskip("transformers")
    from training.grpo.tiny import addition_rows, build_tiny_model, write_jsonl

    model = build_tiny_model(tmp_path / "model", chars="0123456789+=", seed=0)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows(9))
    args = ["train", "grpo", "--model", str(model), "--data", str(data), "--steps", "4"]
    args += ["run.progress=false", "run.tensorboard=false", "run.checkpoint_every=1"]
    args += ["sampling.prompts_per_step=2", "sampling.group_size=4", "sampling.max_new_tokens=3"]
    args += ["run.threads=1", "run.save_final_model=false"]
    assert run_child("none", [*args, "--run-dir", str(tmp_path / "ref")], tmp_path) == 0
    for fault in ("checkpoint:2", "metrics:3"):
        run = tmp_path / fault.replace(":", "-")
        assert train_until_done(fault, args, run, tmp_path) == 1
        same, why = same_result(run, tmp_path / "ref", weights="trainable")
        assert same, f"{fault}: {why}"


def test_ctrl_c_saves_and_exits_130_then_the_run_resumes(tmp_path, ppo_reference):
    import os
    import signal
    import subprocess
    import sys
    import time

    from fault_support import ROOT

    run = tmp_path / "run"
    env = {**os.environ, "MUJOCO_GL": "egl", "PYTHONPATH": str(ROOT)}
    args = [*PPO[:5], "1000000", *PPO[6:], "--run-dir", str(run)]  # far more than it gets
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not (run / "checkpoints" / "latest.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert f"resume with: sim2real train ppo --resume {run}" in out.decode()
    assert run_child("none", ["train", "ppo", "--resume", str(run), "--steps", "256"], tmp_path) == 0
