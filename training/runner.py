"""The on-policy runner: one loop for every on-policy learner (PPO, DPPO, and those to come).

The runner owns the env, the rollout, logging and episode statistics (training.logger),
the progress bar, interrupt handling and checkpoint cadence (training.run_control),
checkpoints with exact resume, and evaluation during training; the algorithm only
learns, through the protocol of :class:`training.learners.OnPolicyAlgorithm`. Which
algorithm runs is ``cfg.algo``, looked up in :data:`training.learners.LEARNERS`.

One loop serves a single process and `torchrun` data-parallel training: each rank
steps its own envs (seeded apart), the core's guarded step averages gradients, and rank
0 alone writes the run directory.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from deploy.files import atomic_write
from training.adversary import Adversary
from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from training.config import ConfigError, config_hash, to_dict
from training.constraints import ConstraintsConfig, ConstraintTerminations
from training.learners import LEARNERS, OnPolicyLearner
from training.logger import RunLogger
from training.policy_kinds import (
    CHECKPOINT_KINDS,
    architecture,
    check_architecture,
    evaluate_policy,
    make_env,
)
from training.run_control import StallWatch, checkpoint_before, code_version, train_loop
from training.run_dir import prepare_run_dir

__all__ = ["OnPolicyRunner", "parameters_vector", "run_payload"]


def run_payload(run_dir: Path, cfg: Any, env, arch: dict[str, Any]) -> dict[str, Any]:
    """What every checkpoint carries besides weights: config, provenance, and the robot
    and observation description that export turns into deployment metadata."""
    return {
        "config": to_dict(cfg),
        "config_hash": config_hash(cfg),
        "code_version": code_version(),
        "run_id": run_dir.name,
        "architecture": arch,
        "robot": env.robot.to_dict(),
        "obs_terms": {
            g: [(t.name, t.size) for t in s.terms] for g, s in env.observation_spec.groups.items()
        },
        "obs_history": env.observation_spec.policy.history,
        "action_low": np.asarray(env.action_spec.low, dtype=np.float64),
        "action_high": np.asarray(env.action_spec.high, dtype=np.float64),
    }


def write_config(run_dir: Path, cfg: Any) -> None:
    atomic_write(run_dir / "config.json", json.dumps(to_dict(cfg), indent=2))


class OnPolicyRunner:
    """Train ``cfg.algo`` (a key of LEARNERS) into ``run_dir``; ``resume``: a run
    directory or checkpoint to continue exactly where it stopped."""

    def __init__(
        self,
        cfg: Any,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        if cfg.algo not in LEARNERS:
            raise ConfigError(f"no on-policy learner {cfg.algo!r}; known: {sorted(LEARNERS)}")
        self.learner: OnPolicyLearner = LEARNERS[cfg.algo]
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.distributed = dist.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        if self.distributed and not dist.is_initialized():
            backend = "nccl" if cfg.run.device.startswith("cuda") else "gloo"
            dist.init_process_group(backend)
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        self.device = torch.device(cfg.run.device)
        if self.device.type == "cuda" and self.distributed:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        self.is_main = self.rank == 0
        if self.device.type == "cpu" and cfg.run.torch_threads:
            torch.set_num_threads(cfg.run.torch_threads)
        self.family = family = self.learner.kind.family
        seed = cfg.run.seed + 1000 * self.rank
        torch.manual_seed(seed)
        self.env = make_env(cfg, seed=seed, obs_history=family.obs_history(cfg))
        self.policy = family.build_policy(cfg, self.env).to(self.device)
        self.arch = architecture(cfg, self.env, family)
        init = getattr(cfg, self.learner.init_field) if self.learner.init_field else ""
        if resume is None and (init or self.learner.init_required and self.learner.init_field):
            self._load_pretrained(init)
        self.alg = self.learner.build(cfg, self.policy, self.env, self.device, self.world)
        if self.distributed:  # every rank starts from rank 0's weights and statistics
            with torch.no_grad():
                for t in self.policy.state_dict().values():
                    dist.broadcast(t, src=0)
        self.policy.train()
        self.section = getattr(cfg, self.learner.section)
        self.stall = StallWatch(
            cfg.run.max_stalled_updates, self.learner.name, cfg.run.max_update_kl
        )
        # constraints as terminations: on with constraints.enabled; the violations of a task
        # that declares constraints are logged either way
        constraints = getattr(cfg, "constraints", None) or ConstraintsConfig()
        names = tuple(getattr(self.env, "constraint_names", ()))
        self.constraints = (
            ConstraintTerminations(constraints, names, cfg.env.task)
            if names or constraints.enabled
            else None
        )
        # adversarial disturbances (RARL, training.adversary): on with adversary.enabled
        adversary = getattr(cfg, "adversary", None)
        self.adversary = (
            Adversary(adversary, self.section, self.env, self.device)
            if adversary is not None and adversary.enabled
            else None
        )
        if self.adversary is not None and self.distributed:
            with torch.no_grad():
                for t in self.adversary.policy.state_dict().values():
                    dist.broadcast(t, src=0)
        self._low = torch.as_tensor(self.env.action_spec.low, dtype=torch.float32).to(self.device)
        self._high = torch.as_tensor(self.env.action_spec.high, dtype=torch.float32).to(self.device)
        self.iteration = 0
        self.env_steps = 0
        self.eval_history: list[dict[str, float]] = []
        # the first reset before anything is written: a task that cannot start leaves no
        # run directory behind
        self.obs: dict[str, torch.Tensor] = self.env.reset() if resume is None else {}
        if self.is_main:  # one run per directory (training.run_dir)
            prepare_run_dir(self.run_dir, resume)
        self.logger = RunLogger(
            self.run_dir,
            enabled=self.is_main,
            tensorboard=cfg.run.tensorboard,
            progress=cfg.run.progress,
            config=cfg,
        )
        if resume is not None:
            self._load(resume)
        if self.is_main:
            write_config(self.run_dir, cfg)

    # ------------------------------------------------------------------ checkpoints
    @property
    def steps_per_iteration(self) -> int:
        return self.env.num_envs * self.section.num_steps * self.world

    @property
    def _rank_suffix(self) -> str:
        return "" if self.rank == 0 else f".rank{self.rank}"

    def _rank_path(self, name: str) -> Path:
        return self.run_dir / "checkpoints" / f"{name}{self._rank_suffix}.pt"

    def checkpoint_payload(self) -> dict[str, Any]:
        get_hidden = getattr(self.policy, "get_hidden", None)
        hidden = (get_hidden() if get_hidden is not None else None) or ()
        return {
            "kind": self.learner.kind.name,
            **run_payload(self.run_dir, self.cfg, self.env, self.arch),
            "policy": self.policy.state_dict(),
            "algorithm": self.alg.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.cpu() for k, v in self.obs.items()},
            "hidden": [h.cpu() for h in hidden],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            **self.logger.state_dict(),
            "eval_history": list(self.eval_history),
            "constraints": None if self.constraints is None else self.constraints.state_dict(),
            "adversary": None if self.adversary is None else self.adversary.state_dict(),
            "world_size": self.world,
            "rank": self.rank,
        }

    def save(self) -> Path:
        # every rank keeps its own env state; rank 0's file is the run's checkpoint
        payload = self.checkpoint_payload()
        path = save_checkpoint(self._rank_path("latest"), payload)
        if self.is_main and self.iteration % (self.cfg.run.checkpoint_every * 4) == 0:
            save_checkpoint(self._rank_path(f"iter_{self.iteration:06d}"), payload)
        return path

    def _load_pretrained(self, source: str) -> None:
        """Start from a pretrained run of the same policy family (e.g. DPPO from BC)."""
        if not source:
            raise ConfigError(
                f"{self.learner.name} needs a pretrained run (--{self.learner.init_field})"
            )
        path = find_checkpoint(source)
        ck = load_checkpoint(path)
        kind = CHECKPOINT_KINDS.get(ck.get("kind"))
        if kind is None or kind.family is not self.learner.kind.family:
            raise CheckpointError(
                f"{path} is a {ck.get('kind')!r} checkpoint, not a "
                f"{self.learner.kind.family.name} policy that {self.learner.name} can start from"
            )
        check_architecture(ck["architecture"], self.arch, str(path))
        self.policy.load_state_dict(kind.weights(ck))

    def _load(self, source: str | os.PathLike) -> None:
        src = find_checkpoint(source)
        if self.rank:
            src = src.with_name(src.stem + f".rank{self.rank}.pt")
        ck = load_checkpoint(src)
        if ck.get("kind") != self.learner.kind.name:
            raise CheckpointError(
                f"{src} is a {ck.get('kind')!r} checkpoint, not a {self.learner.kind.name} one"
            )
        check_architecture(ck["architecture"], self.arch, str(src))
        if ck.get("world_size", 1) != self.world:
            raise CheckpointError(
                f"{src} was written by {ck['world_size']} processes; this run has {self.world}"
            )
        self.policy.load_state_dict(ck["policy"])
        self.alg.load_state_dict(ck["algorithm"])
        self.env.load_state_dict(ck["env"])
        if getattr(self.env, "restarts_on_resume", False):
            # another framework's simulator cannot be restored (sim.external): its
            # episodes start anew, from observations of its own
            self.obs = self.env.reset()
        else:
            self.obs = {k: v.to(self.device) for k, v in ck["obs"].items()}
        if ck.get("hidden"):
            self.policy.set_hidden(tuple(h.to(self.device) for h in ck["hidden"]))
        torch.set_rng_state(ck["torch_rng"])
        if ck.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["cuda_rng"])
        self.iteration = int(ck["iteration"])
        self.env_steps = int(ck["env_steps"])
        self.logger.load_state_dict(ck)
        self.eval_history = list(ck.get("eval_history", []))
        if self.constraints is not None and ck.get("constraints"):
            self.constraints.load_state_dict(ck["constraints"], self.device)
        if self.adversary is not None:
            if not ck.get("adversary"):
                raise CheckpointError(
                    f"{src} was trained without an adversary; resume with adversary.enabled=false"
                )
            self.adversary.load_state_dict(ck["adversary"])
        self.logger.truncate_after(self.env_steps)

    # ------------------------------------------------------------------ training
    def _rollout(self) -> dict[str, float]:
        obs = self.obs
        with torch.no_grad():
            for _ in range(self.section.num_steps):
                actions = self.alg.act(obs)
                if self.adversary is not None:
                    self.adversary.act(obs)
                obs, reward, terminated, truncated, info = self.env.step(
                    torch.clamp(actions, self._low, self._high)
                )
                if self.constraints is not None:
                    reward = self.constraints.step(reward, info)
                self.alg.process_env_step(obs, reward, terminated, truncated, info)
                if self.adversary is not None:
                    self.adversary.process_env_step(obs, reward, terminated, truncated, info)
                self.logger.record_env_step(info)
        self.obs = obs
        return self.logger.end_rollout()

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Deterministic episodes of the current policy (seed run.seed + 12345)."""
        return evaluate_policy(
            self.policy,
            self.cfg,
            self.learner.kind.family,
            episodes or self.cfg.run.eval_episodes,
            seed=self.cfg.run.seed + 12345,
        )

    def _iteration(self, total_iters: int) -> int:
        t0 = time.perf_counter()
        env_terms = self._rollout()
        t1 = time.perf_counter()
        adversary_learns = self.adversary is not None and self.adversary.cfg.adversary_learns(
            self.iteration
        )
        if adversary_learns:  # the protagonist is frozen: its rollout is dropped
            self.alg.storage.clear()
            stats: dict[str, float] = {}
        else:
            stats = self.alg.update()
        if self.adversary is not None:
            env_terms.update(self.adversary.end_rollout(adversary_learns))
        t2 = time.perf_counter()
        self.iteration += 1
        self.env_steps += self.steps_per_iteration
        self.stall.observe(stats, self.iteration, self.env_steps)  # as the log counts them
        ret = self.logger.mean_return
        fps = self.steps_per_iteration / (t2 - t0)
        row: dict[str, Any] = {
            "train/return": ret,
            "train/episode_length": self.logger.mean_length,
            "perf/steps_per_second": fps,
            "perf/rollout_seconds": t1 - t0,
            "perf/update_seconds": t2 - t1,
            "iteration": self.iteration,
            **{f"{self.learner.section}/{k}": float(v) for k, v in stats.items()},
            **env_terms,
        }
        every = self.cfg.run.eval_every
        if self.is_main and every and self.iteration % every == 0 and self.iteration < total_iters:
            ev = self.evaluate()
            row["eval/return"] = ev["return_mean"]
            # a longer episode is the first sign of a legged policy that stopped falling
            row["eval/episode_length"] = ev["length_mean"]
            self.eval_history.append({"env_steps": self.env_steps, "return": ev["return_mean"]})
        self.logger.log(self.env_steps, row)
        self.logger.advance(self.steps_per_iteration, ret=f"{ret:.1f}", sps=f"{fps:,.0f}")
        if self.stall.diverged:
            self.logger.close()
            first = (self.stall.first or (0, 0))[0]
            earlier = checkpoint_before(self.run_dir / "checkpoints", first, self._rank_suffix)
            raise self.stall.error(self.save(), earlier)
        return self.iteration

    def train(self) -> dict[str, Any]:
        """Train up to run.total_steps; the summary (``return``: mean of the last 100
        training episodes, stochastic policy)."""
        total_iters = math.ceil(self.cfg.run.total_steps / self.steps_per_iteration)
        self.logger.start_progress(
            total_iters * self.steps_per_iteration,
            self.env_steps,
            "step",
            f"{self.learner.name} {self.cfg.env.task}",
        )
        stopped = train_loop(
            self.iteration,
            total_iters,
            lambda: self._iteration(total_iters),
            self.save,
            self.cfg.run.checkpoint_every,
        )
        self.logger.close()
        return {
            "iterations": self.iteration,
            "env_steps": self.env_steps,
            "return": self.logger.mean_return,
            "stopped_early": stopped,
            "eval_history": list(self.eval_history),
        }

    def close(self) -> None:
        self.env.close()


def parameters_vector(policy: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in policy.parameters()])
