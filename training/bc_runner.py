"""Behaviour cloning of a generative policy (diffusion, flow) from demonstrations, with
exact resume.

The run's pieces are the on-policy runner's (train config sections, checkpoint payload,
logger, loop, evaluation); only the data source differs: windows of an HDF5
demonstration file instead of rollouts. Checkpoint kinds ``diffusion_bc`` and
``flow_bc`` (by the config's policy): ``policy``
holds the raw weights for resuming, the algorithm state the averaged (EMA) weights,
and the two together are the trained policy that evaluation, export and DPPO use.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.algorithms.bc import BC
from training.checkpoint import save_checkpoint
from training.config import ConfigError
from training.demos import DatasetError, DemoDataset, load_demos
from training.logger import RunLogger
from training.policy_kinds import (
    CHECKPOINT_KINDS,
    architecture,
    evaluate_policy,
    load_run_checkpoint,
    make_env,
)
from training.run_control import train_loop
from training.run_dir import prepare_run_dir
from training.runner import run_payload, write_config
from training.train_configs import BCTrainConfig, FlowBCTrainConfig

__all__ = ["BCRunner", "check_dataset"]


def check_dataset(data: DemoDataset, env, source: str) -> None:
    """The demonstrations must describe the task the policy will run on."""
    group = env.observation_spec.policy
    env_terms = [(t.name, t.size) for t in group.terms]
    if [tuple(t) for t in data.obs_terms] != env_terms:
        raise DatasetError(
            f"{source}: observation terms {data.obs_terms} differ from task "
            f"{env.name!r}'s {env_terms}"
        )
    if list(data.action_joint_names) != list(env.action_spec.joint_names):
        raise DatasetError(
            f"{source}: action joints {data.action_joint_names} differ from task "
            f"{env.name!r}'s {list(env.action_spec.joint_names)}"
        )
    if not (
        np.allclose(data.action_low, env.action_spec.low)
        and np.allclose(data.action_high, env.action_spec.high)
    ):
        raise DatasetError(f"{source}: action bounds differ from task {env.name!r}'s")


class BCRunner:
    """Pretrain a diffusion or flow policy on a demonstration file; exact resume."""

    def __init__(
        self,
        cfg: BCTrainConfig | FlowBCTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        if not cfg.data:
            raise ConfigError("behaviour cloning needs a demonstration file (--data / data=...)")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = torch.device(cfg.run.device)
        torch.manual_seed(cfg.run.seed)
        self.data = load_demos(cfg.data, task=cfg.env.task)
        self.kind = CHECKPOINT_KINDS[cfg.KIND]  # diffusion_bc or flow_bc
        self.family = family = self.kind.family
        self.env = make_env(cfg, num_envs=1, randomize=False, obs_history=family.obs_history(cfg))
        check_dataset(self.data, self.env, cfg.data)
        obs, actions = self.data.windows(cfg.policy.obs_history, cfg.policy.horizon)
        self.policy = family.build_policy(cfg, self.env).to(self.device)
        self.bc = BC(self.policy, cfg.bc, obs.to(self.device), actions.to(self.device))
        self.arch = architecture(cfg, self.env, family)
        prepare_run_dir(self.run_dir, resume)  # one run per directory
        self.logger = RunLogger(
            self.run_dir, tensorboard=cfg.run.tensorboard, progress=cfg.run.progress, config=cfg
        )
        if resume is not None:
            self._load(resume)
        write_config(self.run_dir, cfg)

    def save(self) -> Path:
        payload = {
            "kind": self.kind.name,
            **run_payload(self.run_dir, self.cfg, self.env, self.arch),
            "policy": self.policy.state_dict(),
            "algorithm": self.bc.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "iteration": self.bc.num_updates,
            "dataset": {"path": str(self.cfg.data), **self.data.summary()},
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, source: str | os.PathLike) -> None:
        _, ck = load_run_checkpoint(source, self.kind.name, self.arch)
        self.policy.load_state_dict(ck["policy"])
        self.bc.load_state_dict(ck["algorithm"])
        torch.set_rng_state(ck["torch_rng"])
        self.logger.truncate_after(self.bc.num_updates)

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Deterministic episodes of the averaged weights (seed run.seed + 12345)."""
        with self.bc.averaged():
            return evaluate_policy(
                self.policy,
                self.cfg,
                self.family,
                episodes or self.cfg.run.eval_episodes,
                seed=self.cfg.run.seed + 12345,
            )

    def train(self) -> dict[str, Any]:
        """Train up to bc.num_updates; when done the policy holds the averaged weights."""
        cfg = self.cfg
        total = cfg.bc.num_updates
        self.logger.start_progress(total, self.bc.num_updates, "update", "bc")
        losses: deque[float] = deque(maxlen=cfg.run.log_every)
        clock = [time.perf_counter()]

        def step() -> int:
            s = self.bc.update()
            losses.append(s["loss"])
            u = self.bc.num_updates
            self.logger.advance(1)
            if u % cfg.run.log_every == 0 or u == total:
                row = {
                    "bc/loss": float(np.mean(losses)),
                    "bc/lr": s["lr"],
                    "bc/grad_norm": s["grad_norm"],
                    "bc/nonfinite_steps": s["nonfinite_steps"],
                    "perf/updates_per_second": cfg.run.log_every
                    / max(time.perf_counter() - clock[0], 1e-9),
                }
                clock[0] = time.perf_counter()
                if cfg.run.eval_every and u % cfg.run.eval_every == 0 and u < total:
                    row["eval/return"] = self.evaluate()["return_mean"]
                self.logger.log(u, row)
            return u

        stopped = train_loop(self.bc.num_updates, total, step, self.save, cfg.run.checkpoint_every)
        self.logger.close()
        out: dict[str, Any] = {"updates": self.bc.num_updates, "stopped_early": stopped}
        if not stopped:
            self.bc.finalize()
            out["dataset"] = self.data.summary()
        return out

    def close(self) -> None:
        self.env.close()
