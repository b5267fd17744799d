"""The on-policy training runner: rollouts, updates, logging, checkpoints, artifacts.

One loop serves a single process and `torchrun` data-parallel training: each rank
steps its own envs (seeded apart), gradients are averaged inside the algorithm, and
rank 0 alone writes the run directory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from policies.gaussian import ActorCritic, ActorCriticConfig
from sim.randomization import SimToRealConfig
from sim.registry import make, task_options
from training.algorithms.ppo import PPO, PPOConfig
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.config import ConfigError, apply_overrides, config_hash, from_dict, to_dict
from training.metrics import MetricsLogger
from training.presets import PPO_PRESETS
from training.run_control import Interrupt, code_version


@dataclass
class EnvConfig:
    task: str = "cartpole"
    num_envs: int = 64
    randomize: bool = True  # the task's sim-to-real defaults; false: nominal model, no noise
    max_episode_steps: int | None = None
    threads: int = 0  # simulator threads; 0: all usable cores
    # the task's own constructor options, e.g. {"command_vx": [0, 1]} for quadruped
    task_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"env.num_envs must be >= 1, got {self.num_envs}")
        known = task_options(self.task)  # unknown task: a clear error now, not later
        clash = sorted(set(self.task_args) & {"num_threads", "max_episode_steps"})
        if clash:
            raise ValueError(f"env.task_args: set {clash} with env.threads / env.max_episode_steps")
        unknown = sorted(set(self.task_args) - known)
        if unknown:
            raise ValueError(
                f"env.task_args: {self.task!r} has no option(s) {unknown}; known: {sorted(known)}"
            )


@dataclass
class RunConfig:
    seed: int = 0
    device: str = "cpu"
    total_steps: int = 1_000_000
    checkpoint_every: int = 25  # iterations
    eval_episodes: int = 10
    video: bool = True
    video_seconds: float = 8.0
    tensorboard: bool = True
    progress: bool = True
    # torch threads on the CPU: the simulator runs its own thread pool, and small
    # networks gain nothing from more threads but lose a lot when cores are contended
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.torch_threads < 0:
            raise ValueError(
                f"run.torch_threads must be >= 0 (0: torch's default), got {self.torch_threads}"
            )
        if self.total_steps < 1:
            raise ValueError(f"run.total_steps must be >= 1, got {self.total_steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"run.checkpoint_every must be >= 1, got {self.checkpoint_every}")


@dataclass
class PPOTrainConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    run: RunConfig = field(default_factory=RunConfig)
    algo: str = "ppo"


def build_config(task: str, overrides: list[str] | dict[str, Any] | None = None) -> PPOTrainConfig:
    """Defaults, then the task's preset, then the user's overrides."""
    cfg = PPOTrainConfig(env=EnvConfig(task=task))
    cfg = apply_overrides(cfg, PPO_PRESETS.get(task, {}))
    return apply_overrides(cfg, overrides or [])


def make_env(
    cfg: PPOTrainConfig, num_envs: int | None = None, seed: int | None = None, randomize=None
):
    randomize = cfg.env.randomize if randomize is None else randomize
    return make(
        cfg.env.task,
        num_envs or cfg.env.num_envs,
        seed=cfg.run.seed if seed is None else seed,
        device=cfg.run.device,
        s2r=None if randomize else SimToRealConfig(),
        num_threads=cfg.env.threads,
        max_episode_steps=cfg.env.max_episode_steps,
        **cfg.env.task_args,
    )


def make_policy(cfg: PPOTrainConfig, env) -> ActorCritic:
    groups = env.observation_spec.groups
    critic = groups["critic"].size if "critic" in groups else None
    return ActorCritic(groups["policy"].size, critic, env.action_spec.size, cfg.policy)


def architecture(cfg: PPOTrainConfig, env) -> dict[str, Any]:
    """What a checkpoint must match to be loaded into this run."""
    return {
        "task": cfg.env.task,
        "obs": {g: s.size for g, s in env.observation_spec.groups.items()},
        "actions": env.action_spec.size,
        "policy": to_dict(cfg.policy),
    }


def check_architecture(saved: dict[str, Any], here: dict[str, Any], source: str) -> None:
    for key in ("task", "obs", "actions", "policy"):
        if saved.get(key) != here.get(key):
            raise CheckpointError(
                f"checkpoint {source} was trained with {key}={saved.get(key)!r}, "
                f"but this run has {key}={here.get(key)!r}"
            )


class PPORunner:
    def __init__(
        self,
        cfg: PPOTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ):
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
        seed = cfg.run.seed + 1000 * self.rank
        torch.manual_seed(seed)
        self.env = make_env(cfg, seed=seed)
        self.policy = make_policy(cfg, self.env).to(self.device)
        groups = self.env.observation_spec.groups
        self.ppo = PPO(
            self.policy,
            self._ppo_config(),
            num_envs=self.env.num_envs,
            obs_sizes={g: s.size for g, s in groups.items()},
            action_size=self.env.action_spec.size,
            device=self.device,
        )  # PPO broadcasts rank 0's weights when distributed
        self.policy.train()
        self.iteration = 0
        self.env_steps = 0
        self.env_terms: dict[str, float] = {}  # the last rollout's task terms, for the log
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.recent_lengths: deque[float] = deque(maxlen=100)
        self.obs: dict[str, torch.Tensor] | None = None
        self.arch = architecture(cfg, self.env)
        if resume is None and (self.run_dir / "checkpoints" / "latest.pt").exists():
            # never mix two runs' metrics and checkpoints in one directory
            raise ValueError(
                f"run directory {self.run_dir} already holds a run; resume it or choose another"
            )
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        self.logger = MetricsLogger(
            self.run_dir, enabled=self.is_main, tensorboard=cfg.run.tensorboard
        )
        if resume is not None:
            self._load(resume)
        else:
            self.obs = self.env.reset()
        if self.is_main:
            import json

            (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    # ------------------------------------------------------------------ checkpoints
    @property
    def steps_per_iteration(self) -> int:
        return self.env.num_envs * self.cfg.ppo.num_steps * self.world

    def _rank_path(self, name: str) -> Path:
        suffix = "" if self.rank == 0 else f".rank{self.rank}"
        return self.run_dir / "checkpoints" / f"{name}{suffix}.pt"

    def checkpoint_payload(self) -> dict[str, Any]:
        return {
            "kind": "ppo",
            "config": to_dict(self.cfg),
            "config_hash": config_hash(self.cfg),
            "code_version": code_version(),
            "run_id": self.run_dir.name,
            "architecture": self.arch,
            "robot": self.env.robot.to_dict(),
            "obs_terms": {
                g: [(t.name, t.size) for t in s.terms]
                for g, s in self.env.observation_spec.groups.items()
            },
            "obs_history": self.env.observation_spec.policy.history,
            "policy": self.policy.state_dict(),
            "algorithm": self.ppo.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.cpu() for k, v in self.obs.items()},
            "hidden": [h.cpu() for h in (self.policy.get_hidden() or ())],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "world_size": self.world,
            "rank": self.rank,
        }

    def save(self) -> Path:
        # every rank keeps its own env state; rank 0's file is the run's checkpoint
        self.run_dir.joinpath("checkpoints").mkdir(parents=True, exist_ok=True)
        payload = self.checkpoint_payload()
        path = save_checkpoint(self._rank_path("latest"), payload)
        if self.is_main and self.iteration % (self.cfg.run.checkpoint_every * 4) == 0:
            save_checkpoint(self._rank_path(f"iter_{self.iteration:06d}"), payload)
        return path

    def _load(self, source: str | os.PathLike) -> None:
        src = Path(source)
        if src.is_dir():
            src = src / "checkpoints" / "latest.pt"
        if self.rank:
            src = src.with_name(src.stem + f".rank{self.rank}.pt")
        ck = load_checkpoint(src)
        if ck.get("kind") != "ppo":
            raise CheckpointError(f"{src} is a {ck.get('kind')!r} checkpoint, not a PPO one")
        check_architecture(ck["architecture"], self.arch, str(src))
        if ck.get("world_size", 1) != self.world:
            raise CheckpointError(
                f"{src} was written by {ck['world_size']} processes; this run has {self.world}"
            )
        self.policy.load_state_dict(ck["policy"])
        self.ppo.load_state_dict(ck["algorithm"])
        if self.cfg.ppo.total_updates is None and self.ppo.cfg.total_updates is not None:
            # a derived schedule length follows this run's budget, which a resume may extend
            self.ppo.set_schedule_length(self.ppo.cfg.total_updates)
        self.env.load_state_dict(ck["env"])
        self.obs = {k: v.to(self.device) for k, v in ck["obs"].items()}
        if ck["hidden"]:
            self.policy.set_hidden(tuple(h.to(self.device) for h in ck["hidden"]))
        torch.set_rng_state(ck["torch_rng"])
        if ck["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["cuda_rng"])
        self.iteration = ck["iteration"]
        self.env_steps = ck["env_steps"]
        self.recent_returns.extend(ck["recent_returns"])
        self.recent_lengths.extend(ck["recent_lengths"])
        self.logger.truncate_after(self.env_steps)

    # ------------------------------------------------------------------ training
    def _ppo_config(self) -> PPOConfig:
        """cfg.ppo, with a decaying schedule's length derived from the step budget."""
        ppo = self.cfg.ppo
        if ppo.schedule in ("linear", "cosine") and ppo.total_updates is None:
            per_update = self.env.num_envs * ppo.num_steps * self.world
            total = max(1, math.ceil(self.cfg.run.total_steps / per_update))
            ppo = dataclasses.replace(ppo, total_updates=max(total, ppo.warmup_updates + 1))
        return ppo

    def _rollout(self) -> None:
        lo = torch.as_tensor(self.env.action_spec.low, dtype=torch.float32, device=self.device)
        hi = torch.as_tensor(self.env.action_spec.high, dtype=torch.float32, device=self.device)
        finished: list[tuple[torch.Tensor, torch.Tensor]] = []
        # the task's per-step terms (reward components, tracking errors), averaged over
        # the rollout: what a user reads to see which term the policy is trading off
        terms: dict[str, torch.Tensor] = {}
        obs = self.obs
        with torch.no_grad():
            for _ in range(self.cfg.ppo.num_steps):
                actions = self.ppo.act(obs)
                obs, reward, terminated, truncated, info = self.env.step(
                    torch.clamp(actions, lo, hi)
                )
                self.ppo.process_env_step(obs, reward, terminated, truncated, info)
                for k, v in info.items():
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim == 1:
                        if k in terms:
                            terms[k].add_(v)
                        else:
                            terms[k] = v.clone()
                if "episode" in info:
                    ep = info["episode"]
                    finished.append((ep["return"][ep["done"]], ep["length"][ep["done"]]))
        self.obs = obs
        n = self.cfg.ppo.num_steps
        self.env_terms = {f"env/{k}": float(v.mean()) / n for k, v in terms.items()}
        for r, n in finished:
            self.recent_returns.extend(r.cpu().tolist())
            self.recent_lengths.extend(n.cpu().tolist())

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        total_iters = math.ceil(cfg.run.total_steps / self.steps_per_iteration)
        bar = None
        if self.is_main and cfg.run.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=total_iters * self.steps_per_iteration,
                initial=self.env_steps,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                desc=cfg.env.task,
            )
        stopped_early = False
        with Interrupt() as interrupt:
            while self.iteration < total_iters:
                t0 = time.perf_counter()
                self._rollout()
                t1 = time.perf_counter()
                stats = self.ppo.update()
                t2 = time.perf_counter()
                self.iteration += 1
                self.env_steps += self.steps_per_iteration
                ret = float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")
                length = (
                    float(np.mean(self.recent_lengths)) if self.recent_lengths else float("nan")
                )
                fps = self.steps_per_iteration / (t2 - t0)
                row = {
                    "train/return": ret,
                    "train/episode_length": length,
                    "perf/steps_per_second": fps,
                    "perf/rollout_seconds": t1 - t0,
                    "perf/update_seconds": t2 - t1,
                    "iteration": self.iteration,
                    **{f"ppo/{k}": float(v) for k, v in stats.items()},
                    **self.env_terms,
                }
                self.logger.log(self.env_steps, row)
                if bar is not None:
                    bar.update(self.steps_per_iteration)
                    bar.set_postfix(ret=f"{ret:.1f}", sps=f"{fps:,.0f}")
                stop = interrupt.requested
                if self.distributed:
                    flag = torch.tensor([1.0 if stop else 0.0])
                    dist.all_reduce(flag)
                    stop = bool(flag.item() > 0)
                last = self.iteration == total_iters
                if self.iteration % cfg.run.checkpoint_every == 0 or last or stop:
                    self.save()
                if stop and not last:
                    stopped_early = True
                    break
        if bar is not None:
            bar.close()
        self.logger.close()
        return {
            "iterations": self.iteration,
            "env_steps": self.env_steps,
            "return": float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            "stopped_early": stopped_early,
        }


def parameters_vector(policy: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in policy.parameters()])


def config_from_checkpoint(ck: dict[str, Any]) -> PPOTrainConfig:
    try:
        return from_dict(PPOTrainConfig, ck["config"])
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"checkpoint config does not fit this version: {e}") from e


__all__ = [
    "EnvConfig",
    "PPORunner",
    "PPOTrainConfig",
    "RunConfig",
    "build_config",
    "config_from_checkpoint",
]
