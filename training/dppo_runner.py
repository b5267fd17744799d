"""Runners for diffusion policies: behaviour cloning from demonstrations, DPPO fine-tuning
in simulation, evaluation and ONNX export.

Composition, not inheritance: the env, run and metric conventions are those of
:mod:`training.runner` (its EnvConfig, ``section.field=value`` overrides, atomic
weights-only checkpoints with exact resume, metrics.jsonl + TensorBoard, graceful
interrupt), reused here without touching it.

Checkpoint kinds: ``"diffusion_bc"`` (``policy`` holds the raw weights for resuming and
``policy_final`` the EMA weights that evaluation, export and DPPO use) and ``"dppo"``.
Both carry the robot description, observation terms and history, so that
:func:`export_diffusion` builds the same deployment metadata as a PPO export.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies.diffusion import DiffusionConfig, DiffusionPolicy, diffusion_exporter
from sim.randomization import SimToRealConfig
from sim.registry import make
from training.algorithms.bc import BC, BCConfig
from training.algorithms.dppo import DPPO, DPPOConfig
from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from training.config import ConfigError, apply_overrides, config_hash, from_dict, to_dict
from training.demos import DatasetError, DemoDataset, load_demos
from training.evaluate import evaluate
from training.metrics import MetricsLogger
from training.presets import DPPO_PRESETS
from training.run_control import Interrupt, code_version
from training.runner import EnvConfig

__all__ = [
    "BCRunConfig",
    "BCRunner",
    "BCTrainConfig",
    "DPPORunConfig",
    "DPPORunner",
    "DPPOTrainConfig",
    "DiffusionActor",
    "build_bc_config",
    "build_dppo_config",
    "diffusion_metadata",
    "evaluate_diffusion",
    "export_diffusion",
    "load_diffusion_checkpoint",
    "make_diffusion_env",
    "train_bc_cli",
    "train_dppo_cli",
]

DIFFUSION_KINDS = ("diffusion_bc", "dppo")


@dataclass
class BCRunConfig:
    seed: int = 0
    device: str = "cpu"
    log_every: int = 100  # updates
    checkpoint_every: int = 1000  # updates
    eval_every: int = 0  # updates; 0: only at the end
    eval_episodes: int = 10
    final_eval: bool = True  # evaluate (and write summary.json) when training ends
    tensorboard: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("log_every", "checkpoint_every", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValueError(f"run.eval_every must be >= 0, got {self.eval_every}")


@dataclass
class BCTrainConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(randomize=False))
    policy: DiffusionConfig = field(default_factory=DiffusionConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    run: BCRunConfig = field(default_factory=BCRunConfig)
    data: str = ""
    algo: str = "bc"


@dataclass
class DPPORunConfig:
    seed: int = 0
    device: str = "cpu"
    total_steps: int = 200_000  # env steps
    checkpoint_every: int = 10  # iterations
    eval_every: int = 0  # iterations; 0: only at the end
    eval_episodes: int = 10
    final_eval: bool = True  # evaluate (and write summary.json) when training ends
    tensorboard: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"run.total_steps must be >= 1, got {self.total_steps}")
        for name in ("checkpoint_every", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValueError(f"run.eval_every must be >= 0, got {self.eval_every}")


@dataclass
class DPPOTrainConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=16, randomize=False))
    policy: DiffusionConfig = field(default_factory=DiffusionConfig)
    dppo: DPPOConfig = field(default_factory=DPPOConfig)
    run: DPPORunConfig = field(default_factory=DPPORunConfig)
    init: str = ""
    algo: str = "dppo"


# Policy fields a DPPO run may change after pretraining (the sampler, not the networks).
_SAMPLER_FIELDS = ("sampler", "sample_steps", "eta")


# ---------------------------------------------------------------------- building blocks
def make_diffusion_env(
    cfg: BCTrainConfig | DPPOTrainConfig,
    pcfg: DiffusionConfig,
    num_envs: int | None = None,
    seed: int | None = None,
    randomize: bool | None = None,
):
    """The task's env with the policy's observation history stacked by the simulator."""
    randomize = cfg.env.randomize if randomize is None else randomize
    s2r: SimToRealConfig | dict = (
        {"obs_history": pcfg.obs_history}
        if randomize
        else SimToRealConfig(obs_history=pcfg.obs_history)
    )
    return make(
        cfg.env.task,
        num_envs or cfg.env.num_envs,
        seed=cfg.run.seed if seed is None else seed,
        device=cfg.run.device,
        s2r=s2r,
        num_threads=cfg.env.threads,
        max_episode_steps=cfg.env.max_episode_steps,
    )


def make_diffusion_policy(pcfg: DiffusionConfig, env) -> DiffusionPolicy:
    groups = env.observation_spec.groups
    critic = groups["critic"].size if "critic" in groups else None
    return DiffusionPolicy(
        groups["policy"].size,
        env.action_spec.size,
        pcfg,
        env.action_spec.low,
        env.action_spec.high,
        critic_obs_size=critic,
    )


def _architecture(task: str, pcfg: DiffusionConfig, env) -> dict[str, Any]:
    arch_policy = {k: v for k, v in to_dict(pcfg).items() if k not in _SAMPLER_FIELDS}
    return {
        "task": task,
        "obs": {g: s.size for g, s in env.observation_spec.groups.items()},
        "actions": env.action_spec.size,
        "policy": arch_policy,
    }


def _check_architecture(saved: dict[str, Any], here: dict[str, Any], source: str) -> None:
    for key in ("task", "obs", "actions", "policy"):
        if saved.get(key) != here.get(key):
            raise CheckpointError(
                f"checkpoint {source} was trained with {key}={saved.get(key)!r}, "
                f"but this run has {key}={here.get(key)!r}"
            )


def _common_payload(run_dir: Path, cfg: Any, env, pcfg: DiffusionConfig) -> dict[str, Any]:
    return {
        "config": to_dict(cfg),
        "config_hash": config_hash(cfg),
        "code_version": code_version(),
        "run_id": run_dir.name,
        "architecture": _architecture(cfg.env.task, pcfg, env),
        "robot": env.robot.to_dict(),
        "obs_terms": {
            g: [(t.name, t.size) for t in s.terms] for g, s in env.observation_spec.groups.items()
        },
        "obs_history": env.observation_spec.policy.history,
        "action_low": np.asarray(env.action_spec.low, dtype=np.float64),
        "action_high": np.asarray(env.action_spec.high, dtype=np.float64),
    }


class DiffusionActor:
    """``act(obs, reset_mask) -> actions`` for :func:`training.evaluate.evaluate`.

    Runs the policy's inference module (the graph that export turns into ONNX) with its
    chunk state; reset envs start a new chunk. deterministic: zero noise, which the
    graph maps to the policy's canonical noise draw (the export's deterministic mode);
    else standard normal noise from a seeded generator (the runtime's sampling mode).
    """

    def __init__(
        self,
        policy: DiffusionPolicy,
        num_envs: int,
        deterministic: bool = True,
        seed: int = 0,
        steps: int | None = None,
    ) -> None:
        device = policy.action_low.device
        self.module = policy.inference_module(steps).to(device)
        self.state = list(self.module.initial_state(num_envs))
        self.state = [s.to(device) for s in self.state]
        self.deterministic = deterministic
        self.generator = torch.Generator().manual_seed(seed)
        self.noise_shape = (num_envs, self.module.horizon, self.module.action_size)
        self.device = device

    @torch.no_grad()
    def __call__(self, obs: dict[str, torch.Tensor], reset: torch.Tensor) -> torch.Tensor:
        x = obs["policy"].float().to(self.device)
        if self.deterministic:
            noise = torch.zeros(self.noise_shape, device=self.device)
        else:
            noise = torch.randn(self.noise_shape, generator=self.generator).to(self.device)
        if not self.state:
            return self.module(x, noise)
        keep = (~reset.to(torch.bool)).to(self.device).float().view(-1, 1)
        self.state[1] = self.state[1] * keep
        action, chunk, step = self.module(x, noise, *self.state)
        self.state = [chunk, step]
        return action


def evaluate_diffusion(
    policy: DiffusionPolicy,
    cfg: BCTrainConfig | DPPOTrainConfig,
    episodes: int,
    seed: int = 12345,
    deterministic: bool = True,
    steps: int | None = None,
) -> dict[str, Any]:
    """Episode statistics of the policy's inference module in the task's env."""
    env = make_diffusion_env(cfg, policy.cfg, num_envs=episodes, seed=seed, randomize=False)
    try:
        was_training = policy.training
        policy.eval()
        stats = evaluate(
            DiffusionActor(policy, env.num_envs, deterministic, seed, steps), env, episodes
        )
        policy.train(was_training)
    finally:
        env.close()
    return stats


def _config_from_ck(ck: dict[str, Any]) -> BCTrainConfig | DPPOTrainConfig:
    cls = BCTrainConfig if ck.get("kind") == "diffusion_bc" else DPPOTrainConfig
    try:
        return from_dict(cls, ck["config"])
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"checkpoint config does not fit this version: {e}") from e


def load_diffusion_checkpoint(path: str | os.PathLike, device: str = "cpu"):
    """(policy, config, checkpoint) of a diffusion BC or DPPO run directory / checkpoint.

    A BC checkpoint yields its EMA ("final") weights.
    """
    ck_path = find_checkpoint(path)
    ck = load_checkpoint(ck_path)
    kind = ck.get("kind")
    if kind not in DIFFUSION_KINDS:
        raise CheckpointError(
            f"{ck_path} is a {kind!r} checkpoint; expected a diffusion one {DIFFUSION_KINDS}"
        )
    cfg = _config_from_ck(ck)
    env = make_diffusion_env(cfg, cfg.policy, num_envs=1, randomize=False)
    try:
        policy = make_diffusion_policy(cfg.policy, env)
    finally:
        env.close()
    policy.load_state_dict(ck["policy_final"] if kind == "diffusion_bc" else ck["policy"])
    policy.to(device).eval()
    return policy, cfg, ck


# ---------------------------------------------------------------------- behaviour cloning
def build_bc_config(
    task: str, data: str, overrides: list[str] | dict[str, Any] | None = None
) -> BCTrainConfig:
    cfg = BCTrainConfig(env=EnvConfig(task=task, randomize=False), data=str(data))
    return apply_overrides(cfg, overrides or [])


def _check_dataset(data: DemoDataset, env, source: str) -> None:
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
    """Pretrain a diffusion policy on a demonstration file; exact resume."""

    def __init__(
        self,
        cfg: BCTrainConfig,
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
        self.env = make_diffusion_env(cfg, cfg.policy, num_envs=1, randomize=False)
        _check_dataset(self.data, self.env, cfg.data)
        obs, actions = self.data.windows(cfg.policy.obs_history, cfg.policy.horizon)
        self.policy = make_diffusion_policy(cfg.policy, self.env).to(self.device)
        self.bc = BC(self.policy, cfg.bc, obs.to(self.device), actions.to(self.device))
        self.arch = _architecture(cfg.env.task, cfg.policy, self.env)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.run.tensorboard)
        if resume is not None:
            self._load(resume)
        (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    def _final_state(self) -> dict[str, Any]:
        with self.bc.averaged():
            return {k: v.clone() for k, v in self.policy.state_dict().items()}

    def save(self) -> Path:
        payload = {
            "kind": "diffusion_bc",
            **_common_payload(self.run_dir, self.cfg, self.env, self.cfg.policy),
            "policy": self.policy.state_dict(),
            "policy_final": self._final_state(),
            "algorithm": self.bc.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "iteration": self.bc.num_updates,
            "dataset": {"path": str(self.cfg.data), **self.data.summary()},
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, source: str | os.PathLike) -> None:
        src = find_checkpoint(source)
        ck = load_checkpoint(src)
        if ck.get("kind") != "diffusion_bc":
            raise CheckpointError(
                f"{src} is a {ck.get('kind')!r} checkpoint, not a diffusion BC one"
            )
        _check_architecture(ck["architecture"], self.arch, str(src))
        self.policy.load_state_dict(ck["policy"])
        self.bc.load_state_dict(ck["algorithm"])
        torch.set_rng_state(ck["torch_rng"])
        self.logger.truncate_after(self.bc.num_updates)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        total = cfg.bc.num_updates
        bar = None
        if cfg.run.progress:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=self.bc.num_updates, unit="update", desc="bc")
        losses: deque[float] = deque(maxlen=cfg.run.log_every)
        stopped = False
        t0 = time.perf_counter()
        with Interrupt() as interrupt:
            while self.bc.num_updates < total:
                s = self.bc.update()
                losses.append(s["loss"])
                u = self.bc.num_updates
                if bar is not None:
                    bar.update(1)
                if u % cfg.run.log_every == 0 or u == total:
                    row = {
                        "bc/loss": float(np.mean(losses)),
                        "bc/lr": s["lr"],
                        "bc/grad_norm": s["grad_norm"],
                        "perf/updates_per_second": cfg.run.log_every
                        / max(time.perf_counter() - t0, 1e-9),
                    }
                    t0 = time.perf_counter()
                    if cfg.run.eval_every and u % cfg.run.eval_every == 0 and u < total:
                        with self.bc.averaged():
                            ev = evaluate_diffusion(self.policy, cfg, cfg.run.eval_episodes)
                        row["eval/return"] = ev["return_mean"]
                    self.logger.log(u, row)
                if u % cfg.run.checkpoint_every == 0 or u == total or interrupt.requested:
                    self.save()
                if interrupt.requested and u < total:
                    stopped = True
                    break
        if bar is not None:
            bar.close()
        out: dict[str, Any] = {"updates": self.bc.num_updates, "stopped_early": stopped}
        if not stopped:
            self.bc.finalize()
            out["dataset"] = self.data.summary()
            if cfg.run.final_eval:
                out["eval"] = evaluate_diffusion(self.policy, cfg, cfg.run.eval_episodes)
                self.logger.log(self.bc.num_updates, {"eval/return": out["eval"]["return_mean"]})
                (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        self.logger.close()
        self.env.close()
        return out


# ---------------------------------------------------------------------- DPPO
def build_dppo_config(
    task: str | None, init: str, overrides: list[str] | dict[str, Any] | None = None
) -> DPPOTrainConfig:
    """The pretrained run's task and policy, DPPO defaults, the task's preset, then the
    overrides.

    Only the sampler fields of ``policy`` (sampler, sample_steps, eta) may be overridden:
    the networks are the pretrained ones.
    """
    ck = load_checkpoint(find_checkpoint(init))
    if ck.get("kind") not in DIFFUSION_KINDS:
        raise CheckpointError(
            f"--init {init} is a {ck.get('kind')!r} checkpoint; expected a diffusion BC (or "
            f"DPPO) run"
        )
    init_cfg = _config_from_ck(ck)
    if task is not None and task != init_cfg.env.task:
        raise CheckpointError(
            f"--init {init} was trained on task {init_cfg.env.task!r}, not {task!r}"
        )
    env = EnvConfig(
        task=init_cfg.env.task,
        num_envs=16,
        randomize=False,
        task_args=dict(init_cfg.env.task_args),
    )
    cfg = DPPOTrainConfig(env=env, policy=init_cfg.policy, init=str(init))
    items = (
        overrides.items()
        if isinstance(overrides, dict)
        else [o.split("=", 1) for o in (overrides or [])]
    )
    for key, _ in items:
        k = key.strip().lstrip("-")
        if k.startswith("policy.") and k.split(".", 1)[1] not in _SAMPLER_FIELDS:
            raise ConfigError(
                f"{k}: a DPPO run keeps the pretrained networks; only policy."
                f"{{{','.join(_SAMPLER_FIELDS)}}} may change"
            )
    cfg = apply_overrides(cfg, DPPO_PRESETS.get(cfg.env.task, {}))
    return apply_overrides(cfg, overrides or [])


class DPPORunner:
    """Fine-tune a pretrained diffusion policy with DPPO; exact resume."""

    def __init__(
        self,
        cfg: DPPOTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = torch.device(cfg.run.device)
        torch.manual_seed(cfg.run.seed)
        self.env = make_diffusion_env(cfg, cfg.policy)
        self.policy = make_diffusion_policy(cfg.policy, self.env).to(self.device)
        self.arch = _architecture(cfg.env.task, cfg.policy, self.env)
        if resume is None:
            if not cfg.init:
                raise ConfigError("DPPO needs a pretrained diffusion run (--init)")
            init_path = find_checkpoint(cfg.init)
            ck = load_checkpoint(init_path)
            if ck.get("kind") not in DIFFUSION_KINDS:
                raise CheckpointError(f"{init_path} is not a diffusion checkpoint")
            _check_architecture(ck["architecture"], self.arch, str(init_path))
            key = "policy_final" if ck["kind"] == "diffusion_bc" else "policy"
            self.policy.load_state_dict(ck[key])
        groups = self.env.observation_spec.groups
        self.dppo = DPPO(
            self.policy,
            cfg.dppo,
            num_envs=self.env.num_envs,
            obs_sizes={g: s.size for g, s in groups.items()},
            device=self.device,
        )
        self.policy.train()
        self.iteration = 0
        self.env_steps = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.recent_lengths: deque[float] = deque(maxlen=100)
        self.eval_history: list[dict[str, float]] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.run.tensorboard)
        if resume is not None:
            self._load(resume)
        else:
            self.obs = self.env.reset()
        (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    @property
    def steps_per_iteration(self) -> int:
        return self.env.num_envs * self.cfg.dppo.num_steps

    def save(self) -> Path:
        payload = {
            "kind": "dppo",
            **_common_payload(self.run_dir, self.cfg, self.env, self.cfg.policy),
            "policy": self.policy.state_dict(),
            "algorithm": self.dppo.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.cpu() for k, v in self.obs.items()},
            "torch_rng": torch.get_rng_state(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "eval_history": list(self.eval_history),
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, source: str | os.PathLike) -> None:
        src = find_checkpoint(source)
        ck = load_checkpoint(src)
        if ck.get("kind") != "dppo":
            raise CheckpointError(f"{src} is a {ck.get('kind')!r} checkpoint, not a DPPO one")
        _check_architecture(ck["architecture"], self.arch, str(src))
        self.dppo.load_state_dict(ck["algorithm"])
        self.env.load_state_dict(ck["env"])
        self.obs = {k: v.to(self.device) for k, v in ck["obs"].items()}
        torch.set_rng_state(ck["torch_rng"])
        self.iteration = int(ck["iteration"])
        self.env_steps = int(ck["env_steps"])
        self.recent_returns.extend(ck["recent_returns"])
        self.recent_lengths.extend(ck["recent_lengths"])
        self.eval_history = list(ck.get("eval_history", []))
        self.logger.truncate_after(self.env_steps)

    def _rollout(self) -> None:
        finished = []
        obs = self.obs
        with torch.no_grad():
            for _ in range(self.cfg.dppo.num_steps):
                actions = self.dppo.act(obs)
                obs, reward, terminated, truncated, info = self.env.step(actions)
                self.dppo.process_env_step(obs, reward, terminated, truncated, info)
                if "episode" in info:
                    ep = info["episode"]
                    finished.append((ep["return"][ep["done"]], ep["length"][ep["done"]]))
        self.obs = obs
        for r, n in finished:
            self.recent_returns.extend(r.cpu().tolist())
            self.recent_lengths.extend(n.cpu().tolist())

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        return evaluate_diffusion(
            self.policy,
            self.cfg,
            episodes or self.cfg.run.eval_episodes,
            seed=self.cfg.run.seed + 12345,
        )

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        total_iters = math.ceil(cfg.run.total_steps / self.steps_per_iteration)
        bar = None
        if cfg.run.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=total_iters * self.steps_per_iteration,
                initial=self.env_steps,
                unit="step",
                unit_scale=True,
                desc=f"dppo {cfg.env.task}",
            )
        stopped = False
        with Interrupt() as interrupt:
            while self.iteration < total_iters:
                t0 = time.perf_counter()
                self._rollout()
                t1 = time.perf_counter()
                stats = self.dppo.update()
                t2 = time.perf_counter()
                self.iteration += 1
                self.env_steps += self.steps_per_iteration
                ret = float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")
                row = {
                    "train/return": ret,
                    "train/episode_length": float(np.mean(self.recent_lengths))
                    if self.recent_lengths
                    else float("nan"),
                    "perf/steps_per_second": self.steps_per_iteration / (t2 - t0),
                    "perf/rollout_seconds": t1 - t0,
                    "perf/update_seconds": t2 - t1,
                    "iteration": self.iteration,
                    **{f"dppo/{k}": float(v) for k, v in stats.items()},
                }
                last = self.iteration == total_iters
                if cfg.run.eval_every and self.iteration % cfg.run.eval_every == 0 and not last:
                    ev = self.evaluate()
                    row["eval/return"] = ev["return_mean"]
                    self.eval_history.append(
                        {"env_steps": self.env_steps, "return": ev["return_mean"]}
                    )
                self.logger.log(self.env_steps, row)
                if bar is not None:
                    bar.update(self.steps_per_iteration)
                    bar.set_postfix(ret=f"{ret:.1f}")
                stop = interrupt.requested
                if self.iteration % cfg.run.checkpoint_every == 0 or last or stop:
                    self.save()
                if stop and not last:
                    stopped = True
                    break
        if bar is not None:
            bar.close()
        out: dict[str, Any] = {
            "iterations": self.iteration,
            "env_steps": self.env_steps,
            "return": float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            "stopped_early": stopped,
        }
        if not stopped and cfg.run.final_eval:
            ev = self.evaluate()
            self.eval_history.append({"env_steps": self.env_steps, "return": ev["return_mean"]})
            self.logger.log(self.env_steps, {"eval/return": ev["return_mean"]})
            out["eval"] = ev
            out["eval_history"] = self.eval_history
            (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        self.logger.close()
        return out

    def close(self) -> None:
        self.env.close()


# ---------------------------------------------------------------------- export
def _ensure_exporter() -> None:
    from deploy.export import register_exporter, registered_families

    if "diffusion" not in registered_families():
        register_exporter("diffusion", diffusion_exporter)


def diffusion_metadata(ck: dict[str, Any], policy: DiffusionPolicy):
    """Deployment metadata of a diffusion checkpoint: the PPO contract (robot, terms,
    history, run id, hashes) with family "diffusion", the noise input [horizon, A] and the
    chunk-execution state."""
    from deploy.export import metadata_from_checkpoint

    info = policy.info
    low = np.asarray(ck["action_low"], dtype=np.float64)
    high = np.asarray(ck["action_high"], dtype=np.float64)
    meta = metadata_from_checkpoint(ck, action_bounds=(low, high))
    extra = dict(meta.extra)
    extra.update(
        diffusion_sampler="ddim",
        diffusion_steps=str(policy.cfg.sample_steps),
        diffusion_horizon=str(info.horizon),
        diffusion_act_steps=str(info.act_steps),
        diffusion_ft_steps=str(policy.num_ft_steps),
        checkpoint_kind=str(ck.get("kind")),
    )
    return dataclasses.replace(
        meta,
        policy_family="diffusion",
        recurrent_state=info.recurrent_state,
        noise_shape=list(info.noise_shape),
        extra=extra,
    )


def export_diffusion(
    run_or_ckpt: str | os.PathLike, out: str | os.PathLike | None = None, *, opset: int = 17
) -> Path:
    """Export a diffusion BC or DPPO run to ONNX through ``deploy.export.export_policy``
    (tracing, checker, parity against torch, metadata, runtime load, atomic write)."""
    from deploy.export import export_policy

    _ensure_exporter()
    ck_path = find_checkpoint(run_or_ckpt)
    policy, _, ck = load_diffusion_checkpoint(ck_path)
    meta = diffusion_metadata(ck, policy)
    if out is None:
        src = Path(run_or_ckpt)
        out = (src if src.is_dir() else ck_path.parent.parent) / "policy.onnx"
    return export_policy(policy.inference_module().cpu(), meta, out, opset=opset)


# ---------------------------------------------------------------------- command line
def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu or cuda[:i]")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--resume", default=None, help="run directory or checkpoint to continue")
    p.add_argument("--export", action="store_true", help="export policy.onnx when done")
    p.add_argument("overrides", nargs="*", help="section.field=value")


def _default_run_dir(task: str, algo: str) -> Path:
    return Path("runs") / f"{algo}-{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def _flag_overrides(a: argparse.Namespace, steps_key: str) -> list[str]:
    out = list(a.overrides)
    for flag, key in ((a.seed, "run.seed"), (a.device, "run.device"), (a.steps, steps_key)):
        if flag is not None:
            out.append(f"{key}={flag}")
    return out


def _resumed(a: argparse.Namespace, kind: str, what: str, overrides: list[str]) -> tuple[Any, Path]:
    """The config and run directory of `--resume`, refusing a run of another kind."""
    ck = load_checkpoint(find_checkpoint(a.resume))
    if ck.get("kind") != kind:
        raise CheckpointError(f"{a.resume} is not {what}")
    cfg = apply_overrides(_config_from_ck(ck), overrides)
    return cfg, Path(a.run_dir) if a.run_dir else find_checkpoint(a.resume).parent.parent


def _report(a: argparse.Namespace, algo: str, out: dict, done: str, run_dir: Path) -> int:
    if out["stopped_early"]:
        print(f"stopped; resume with: sim2real train {algo} --resume {run_dir}")
        return 0
    ev = out.get("eval")
    figure = (
        f"eval return {ev['return_mean']:.2f} ± {ev['return_std']:.2f} over {ev['episodes']} episodes"
        if ev
        else "no final evaluation"
    )
    print(f"{algo}: {done}; {figure}; run dir {run_dir}")
    if a.export:
        print(f"exported: {export_diffusion(run_dir)}")
    return 0


def train_bc_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sim2real train bc",
        description="Pretrain a diffusion policy by behaviour cloning on demonstrations. "
        "Sections: env, policy, bc, run (e.g. policy.horizon=8 bc.lr=3e-4).",
    )
    p.add_argument("--task", default=None, help="task (default: the dataset's)")
    p.add_argument("--data", default=None, help="demonstration file (sim2real collect)")
    p.add_argument("--steps", type=int, default=None, help="gradient updates (bc.num_updates)")
    _common_args(p)
    a = p.parse_args(argv)
    overrides = _flag_overrides(a, "bc.num_updates")
    if a.resume:
        cfg, run_dir = _resumed(a, "diffusion_bc", "a diffusion BC run", overrides)
    else:
        if not a.data:
            raise ConfigError("sim2real train bc needs --data <demonstrations.hdf5>")
        task = a.task or load_demos(a.data).task
        cfg = build_bc_config(task, a.data, overrides)
        run_dir = Path(a.run_dir) if a.run_dir else _default_run_dir(task, "bc")
    runner = BCRunner(cfg, run_dir, resume=a.resume)
    out = runner.train()
    return _report(a, "bc", out, f"{out['updates']} updates", run_dir)


def train_dppo_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sim2real train dppo",
        description="Fine-tune a pretrained diffusion policy with DPPO. Sections: env, "
        "dppo, run, and policy.{sampler,sample_steps,eta} (e.g. dppo.ft_steps=3).",
    )
    p.add_argument("--task", default=None, help="task (default: the pretrained run's)")
    p.add_argument("--init", default=None, help="pretrained diffusion run (train bc)")
    p.add_argument("--steps", type=int, default=None, help="env steps (run.total_steps)")
    _common_args(p)
    a = p.parse_args(argv)
    overrides = _flag_overrides(a, "run.total_steps")
    if a.resume:
        cfg, run_dir = _resumed(a, "dppo", "a DPPO run", overrides)
    else:
        if not a.init:
            raise ConfigError("sim2real train dppo needs --init <pretrained diffusion run>")
        cfg = build_dppo_config(a.task, a.init, overrides)
        run_dir = Path(a.run_dir) if a.run_dir else _default_run_dir(cfg.env.task, "dppo")
    runner = DPPORunner(cfg, run_dir, resume=a.resume)
    out = runner.train()
    runner.close()
    return _report(a, "dppo", out, f"{out['env_steps']:,} env steps", run_dir)
