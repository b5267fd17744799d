"""Checkpoints written before the learners shared one runner still load, export, evaluate
and resume.

tests/data/checkpoints_v0 holds tiny runs made with commit 53739a1 (PPO on cartpole,
diffusion BC on hopper, DPPO from that BC), whose payloads stored the weights twice
(runner and algorithm state), kept BC's averaged weights as ``policy_final``, and named
counters and fields the old way (``nan_rollbacks``, ``skipped_steps``, ``ppo.max_kl``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from deploy.metadata import read_metadata
from training.checkpoint import load_checkpoint
from training.export import export_run
from training.policy_kinds import finetune_config_from, load_policy
from training.runner import OnPolicyRunner
from training.train_configs import DPPOTrainConfig

OLD = Path(__file__).parent / "data" / "checkpoints_v0"
QUIET = ["run.progress=false", "run.tensorboard=false"]


@pytest.fixture
def old_runs(tmp_path):
    shutil.copytree(OLD, tmp_path / "v0")
    return tmp_path / "v0"


@pytest.mark.parametrize("run, kind", [("ppo", "ppo"), ("bc", "diffusion_bc"), ("dppo", "dppo")])
def test_old_checkpoint_loads_exports_and_evaluates(old_runs, run, kind):
    ck = load_checkpoint(old_runs / run / "checkpoints" / "latest.pt")
    assert ck["kind"] == kind
    loaded = load_policy(old_runs / run)
    expected = ck["policy_final"] if kind == "diffusion_bc" else ck["policy"]
    for k, v in loaded.policy.state_dict().items():
        assert torch.equal(v, expected[k]), k
    path = export_run(old_runs / run)
    assert read_metadata(path).task == loaded.cfg.env.task
    stats = loaded.evaluate(episodes=2, seed=1)
    assert stats["episodes"] == 2 and stats["length_mean"] > 0


def test_old_ppo_run_resumes(old_runs):
    from training.config import apply_overrides
    from training.policy_kinds import config_from_checkpoint

    ck = load_checkpoint(old_runs / "ppo" / "checkpoints" / "latest.pt")
    cfg = apply_overrides(config_from_checkpoint(ck), QUIET + ["run.total_steps=128"])
    runner = OnPolicyRunner(cfg, old_runs / "ppo", resume=old_runs / "ppo")
    assert runner.env_steps == 64
    for k, v in runner.policy.state_dict().items():
        assert torch.equal(v, ck["policy"][k]), k
    out = runner.train()
    assert out["env_steps"] == 128 and not out["stopped_early"]
    assert runner.alg.guard.nonfinite_steps == 0


def test_old_bc_run_starts_dppo_and_old_dppo_run_resumes(old_runs, tmp_path):
    cfg = finetune_config_from(
        DPPOTrainConfig,
        old_runs / "bc",
        overrides=QUIET
        + ["env.num_envs=2", "dppo.num_steps=4", "dppo.ft_steps=2", "run.total_steps=8"],
    )
    fresh = OnPolicyRunner(cfg, tmp_path / "from_old_bc")
    assert fresh.train()["env_steps"] == 8
    from training.config import apply_overrides
    from training.policy_kinds import config_from_checkpoint

    ck = load_checkpoint(old_runs / "dppo" / "checkpoints" / "latest.pt")
    cfg = apply_overrides(config_from_checkpoint(ck), QUIET + ["run.total_steps=24"])
    resumed = OnPolicyRunner(cfg, old_runs / "dppo", resume=old_runs / "dppo")
    assert resumed.train()["env_steps"] == 24
