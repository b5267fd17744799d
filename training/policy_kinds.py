"""One registry from a checkpoint's kind to everything that uses the policy in it.

A *policy family* (Gaussian actor-critic, diffusion, and the families that come next)
says how to build its policy for an env, which policy fields fix the networks, how to
act with its inference module in the simulator, and its deployment metadata. A
*checkpoint kind* (``ppo``, ``diffusion_bc``, ``dppo``, ...) names the family, the train
config its payload holds, and which weights are the trained policy. Loading, evaluating,
exporting, collecting demonstrations and resuming all go through here, so a new learner
adds one entry and every command knows its checkpoints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.metadata import PolicyMetadata
from policies.diffusion import DiffusionPolicy
from policies.flow import FlowPolicy
from policies.gaussian import ActorCritic
from policies.world_model import WorldModel
from sim.evaluation import ActFn, evaluate
from sim.randomization import SimToRealConfig
from sim.registry import make
from training.actors import ChunkActor, TorchActor
from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
from training.config import ConfigError, from_dict, to_dict
from training.metadata import diffusion_metadata, flow_metadata, metadata_from_checkpoint
from training.train_configs import (
    FLOW_SAMPLER_FIELDS,
    SAMPLER_FIELDS,
    BCTrainConfig,
    DPPOTrainConfig,
    FlowBCTrainConfig,
    FPOTrainConfig,
    PPOTrainConfig,
    ReinFlowTrainConfig,
    WorldModelTrainConfig,
    build_finetune_config,
)

__all__ = [
    "CHECKPOINT_KINDS",
    "CheckpointKind",
    "LoadedPolicy",
    "PolicyFamily",
    "architecture",
    "check_architecture",
    "load_run_checkpoint",
    "finetune_config_from",
    "evaluate_policy",
    "load_policy",
    "make_env",
    "read_kind",
    "with_env_options",
]


def make_env(
    cfg: Any,
    num_envs: int | None = None,
    seed: int | None = None,
    randomize: bool | None = None,
    obs_history: int | None = None,
):
    """The task's batched env for a train config (its env and run sections).

    randomize: the config's sim-to-real settings (``cfg.env.sim_to_real()``: the task's
    defaults with env.s2r over them) or the nominal model; None: as env.randomize says,
    refusing env.s2r with env.randomize false (a run would not train on the settings its
    config names). obs_history: policy frames the simulator stacks (generative policies);
    None: the task's own sim-to-real defaults decide.
    """
    if randomize is None:
        if cfg.env.s2r and not cfg.env.randomize:
            raise ConfigError(
                f"env.s2r sets sim-to-real settings {sorted(cfg.env.s2r)}, but env.randomize is "
                "false (the nominal model: nothing randomized, no noise, no latency); set "
                "env.randomize=true to train with them, or leave env.s2r empty"
            )
        randomize = cfg.env.randomize
    s2r = (
        cfg.env.sim_to_real(obs_history)
        if randomize
        else SimToRealConfig(obs_history=1 if obs_history is None else obs_history)
    )
    return make(
        cfg.env.task,
        num_envs or cfg.env.num_envs,
        seed=cfg.run.seed if seed is None else seed,
        device=cfg.run.device,
        s2r=s2r,
        num_threads=cfg.env.threads,
        max_episode_steps=cfg.env.max_episode_steps,
        backend=cfg.env.backend,
        hooks=cfg.env.hooks,
        **cfg.env.task_args,
    )


# ---------------------------------------------------------------------- families
def _critic_size(env) -> int | None:
    groups = env.observation_spec.groups
    return groups["critic"].size if "critic" in groups else None


def _gaussian_policy(cfg: Any, env) -> ActorCritic:
    groups = env.observation_spec.groups
    return ActorCritic(groups["policy"].size, _critic_size(env), env.action_spec.size, cfg.policy)


def _chunk_policy(cls: type) -> Callable[[Any, Any], torch.nn.Module]:
    """The builder of a chunked generative policy (diffusion, flow): same constructor."""

    def build(cfg: Any, env) -> torch.nn.Module:
        low, high = env.action_spec.low, env.action_spec.high
        r = cfg.policy.action_range
        if r is not None:
            low, high = np.full(env.action_spec.size, -r), np.full(env.action_spec.size, r)
        return cls(
            env.observation_spec.groups["policy"].size,
            env.action_spec.size,
            cfg.policy,
            low,
            high,
            critic_obs_size=_critic_size(env),
        )

    return build


def _gaussian_actor(policy: Any, num_envs: int, deterministic: bool, seed: int) -> ActFn:
    return TorchActor(policy, num_envs, policy_device(policy))


def _chunk_actor(policy: Any, num_envs: int, deterministic: bool, seed: int) -> ActFn:
    return ChunkActor(policy, num_envs, deterministic, seed)


def policy_device(policy: torch.nn.Module) -> torch.device:
    return next(iter(policy.parameters())).device


@dataclass(frozen=True)
class PolicyFamily:
    """How a family of policies is built, evaluated and described for deployment."""

    name: str
    build_policy: Callable[[Any, Any], torch.nn.Module]
    """(train config, env) -> the policy, untrained."""
    obs_history: Callable[[Any], int | None]
    """The policy frames the simulator must stack for it (None: the task's own)."""
    sampler_fields: tuple[str, ...]
    """Policy config fields that do not change the networks (not part of the architecture)."""
    actor: Callable[[Any, int, bool, int], ActFn]
    """(policy, num_envs, deterministic, seed) -> act(obs, reset_mask) for evaluation."""
    metadata: Callable[[Mapping[str, Any], Any], PolicyMetadata]
    """(checkpoint payload, policy) -> deployment metadata."""


def _gaussian_metadata(ck: Mapping[str, Any], policy: Any) -> PolicyMetadata:
    if "action_low" not in ck:  # checkpoints written before the payload carried them
        cfg = config_from_checkpoint(ck)
        env = make_env(cfg, num_envs=1, randomize=False)
        try:
            bounds = (env.action_spec.low.copy(), env.action_spec.high.copy())
        finally:
            env.close()
    else:
        bounds = (np.asarray(ck["action_low"]), np.asarray(ck["action_high"]))
    return metadata_from_checkpoint(ck, action_bounds=bounds)


GAUSSIAN = PolicyFamily(
    "gaussian", _gaussian_policy, lambda cfg: None, (), _gaussian_actor, _gaussian_metadata
)
DIFFUSION = PolicyFamily(
    "diffusion",
    _chunk_policy(DiffusionPolicy),
    lambda cfg: cfg.policy.obs_history,
    SAMPLER_FIELDS,
    _chunk_actor,
    diffusion_metadata,
)
FLOW = PolicyFamily(
    "flow",
    _chunk_policy(FlowPolicy),
    lambda cfg: cfg.policy.obs_history,
    FLOW_SAMPLER_FIELDS,
    _chunk_actor,
    flow_metadata,
)


def _world_model(cfg: Any, env) -> WorldModel:
    spec = env.action_spec
    obs = env.observation_spec.groups["policy"].size
    return WorldModel(obs, spec.size, cfg.policy, spec.low, spec.high)


def _world_model_metadata(ck: Mapping[str, Any], policy: Any) -> PolicyMetadata:
    """A feed-forward actor (the policy prior without planning): the Gaussian contract."""
    meta = _gaussian_metadata(ck, policy)
    return dataclasses.replace(meta, extra={**meta.extra, "checkpoint_kind": str(ck["kind"])})


# the exported actor is the policy prior: obs -> actions, nothing recurrent, no noise
WORLD_MODEL = PolicyFamily(
    "world_model", _world_model, lambda cfg: None, (), _gaussian_actor, _world_model_metadata
)


# ---------------------------------------------------------------------- checkpoint kinds
def _weights(ck: Mapping[str, Any]) -> dict[str, Any]:
    return ck["policy"]


def _bc_weights(ck: Mapping[str, Any]) -> dict[str, Any]:
    """The trained BC policy: the raw weights with the EMA ones in their place."""
    if "policy_final" in ck:  # checkpoints written before the EMA was stored once
        return ck["policy_final"]
    return {**ck["policy"], **(ck["algorithm"].get("ema") or {})}


@dataclass(frozen=True)
class CheckpointKind:
    """What a checkpoint of one kind holds."""

    name: str
    family: PolicyFamily
    config_cls: type
    """The train config saved in the payload's "config"."""
    weights: Callable[[Mapping[str, Any]], dict[str, Any]] = _weights
    """The trained policy's state dict in a payload."""


CHECKPOINT_KINDS: dict[str, CheckpointKind] = {
    "ppo": CheckpointKind("ppo", GAUSSIAN, PPOTrainConfig),
    "diffusion_bc": CheckpointKind("diffusion_bc", DIFFUSION, BCTrainConfig, _bc_weights),
    "dppo": CheckpointKind("dppo", DIFFUSION, DPPOTrainConfig),
    "flow_bc": CheckpointKind("flow_bc", FLOW, FlowBCTrainConfig, _bc_weights),
    "reinflow": CheckpointKind("reinflow", FLOW, ReinFlowTrainConfig),
    "fpo": CheckpointKind("fpo", FLOW, FPOTrainConfig),
    "world_model": CheckpointKind("world_model", WORLD_MODEL, WorldModelTrainConfig),
}


def kind_of(ck: Mapping[str, Any], source: Any) -> CheckpointKind:
    name = ck.get("kind")
    if name not in CHECKPOINT_KINDS:
        raise CheckpointError(
            f"{source} is a {name!r} checkpoint; the known kinds are {sorted(CHECKPOINT_KINDS)}"
        )
    return CHECKPOINT_KINDS[name]


def read_kind(source: str | os.PathLike) -> str | None:
    """The `kind` a run directory's or checkpoint file's checkpoint declares."""
    return load_checkpoint(find_checkpoint(source)).get("kind")


def config_from_checkpoint(ck: Mapping[str, Any]) -> Any:
    """The train config saved in a checkpoint, as this version's dataclass."""
    kind = kind_of(ck, "checkpoint")
    try:
        return from_dict(kind.config_cls, ck["config"])
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"checkpoint config does not fit this version: {e}") from e


def finetune_config_from(
    cls: type,
    init: str | os.PathLike,
    task: str | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> Any:
    """The config (of class ``cls``: DPPO, ReinFlow, FPO) of a run that starts from the
    pretrained run or checkpoint ``init``, which must hold a policy of the learner's own
    family (training.train_configs.build_finetune_config: its task and networks, the
    learner's defaults, the task's preset, then ``overrides``)."""
    path = find_checkpoint(init)
    ck = load_checkpoint(path)
    kind = kind_of(ck, path)
    family = CHECKPOINT_KINDS[cls.KIND].family
    if kind.family is not family:
        starts = sorted(k for k, v in CHECKPOINT_KINDS.items() if v.family is family)
        raise ConfigError(
            f"--init {init} is a {kind.name!r} run (a {kind.family.name} policy); "
            f"{cls.KIND} starts from a {family.name} policy ({', '.join(starts)} runs)"
        )
    return build_finetune_config(cls, config_from_checkpoint(ck), str(init), task, overrides)


def architecture(cfg: Any, env, family: PolicyFamily) -> dict[str, Any]:
    """What a checkpoint must match to be loaded into a run of this config."""
    return {
        "task": cfg.env.task,
        "obs": {g: s.size for g, s in env.observation_spec.groups.items()},
        "actions": env.action_spec.size,
        "policy": {k: v for k, v in to_dict(cfg.policy).items() if k not in family.sampler_fields},
    }


def check_architecture(saved: Mapping[str, Any], here: Mapping[str, Any], source: str) -> None:
    for key in ("task", "obs", "actions", "policy"):
        mine = here.get(key)
        if key == "policy" and isinstance(mine, Mapping) and isinstance(saved.get(key), Mapping):
            # a policy field added after the checkpoint was written defaults to the old
            # behaviour, so only the fields the checkpoint knows can disagree
            mine = {k: v for k, v in mine.items() if k in saved[key]}
        if saved.get(key) != mine:
            raise CheckpointError(
                f"checkpoint {source} was trained with {key}={saved.get(key)!r}, "
                f"but this run has {key}={here.get(key)!r}"
            )


def load_run_checkpoint(
    source: str | os.PathLike, kind: str, arch: Mapping[str, Any]
) -> tuple[Path, dict[str, Any]]:
    """(path, payload) of the checkpoint a run of checkpoint kind ``kind`` and
    architecture ``arch`` resumes from; CheckpointError if it is of another kind or
    does not fit."""
    src = find_checkpoint(source)
    ck = load_checkpoint(src)
    if ck.get("kind") != kind:
        raise CheckpointError(f"{src} is a {ck.get('kind')!r} checkpoint, not a {kind} one")
    check_architecture(ck["architecture"], arch, str(src))
    return src, ck


# ---------------------------------------------------------------------- using a checkpoint
@dataclass
class LoadedPolicy:
    """A trained policy with the config and payload it came from."""

    policy: torch.nn.Module
    cfg: Any
    ck: dict[str, Any]
    kind: CheckpointKind
    path: Path

    def make_env(self, num_envs: int, seed: int, randomize: bool = False):
        return make_env(
            self.cfg, num_envs, seed, randomize, obs_history=self.kind.family.obs_history(self.cfg)
        )

    def actor(self, num_envs: int, deterministic: bool = True, seed: int = 0) -> ActFn:
        return self.kind.family.actor(self.policy, num_envs, deterministic, seed)

    def evaluate(
        self,
        episodes: int,
        seed: int = 0,
        randomize: bool = False,
        deterministic: bool = True,
        wrap: Callable[[ActFn, Any], ActFn] | None = None,
        max_steps: int | None = None,
    ) -> dict[str, Any]:
        return evaluate_policy(
            self.policy,
            self.cfg,
            self.kind.family,
            episodes,
            seed,
            randomize,
            deterministic,
            wrap,
            max_steps,
        )

    def with_env_options(
        self, task_args: Mapping[str, Any] | None = None, s2r: Mapping[str, Any] | None = None
    ) -> LoadedPolicy:
        """This policy with its env's task options and sim-to-real settings overridden
        (see :func:`with_env_options`)."""
        return dataclasses.replace(self, cfg=with_env_options(self.cfg, task_args, s2r))

    def metadata(self) -> PolicyMetadata:
        return self.kind.family.metadata(self.ck, self.policy)


def load_policy(
    source: str | os.PathLike, device: str = "cpu", task: str | None = None
) -> LoadedPolicy:
    """The trained policy of a run directory or checkpoint file, in eval mode.

    task: if given, the policy must have been trained on it.
    """
    path = find_checkpoint(source)
    ck = load_checkpoint(path)
    kind = kind_of(ck, path)
    cfg = config_from_checkpoint(ck)
    if task is not None and task != cfg.env.task:
        raise CheckpointError(f"{source} holds a policy for task {cfg.env.task!r}, not {task!r}")
    env = make_env(cfg, num_envs=1, obs_history=kind.family.obs_history(cfg))
    try:
        policy = kind.family.build_policy(cfg, env)
    finally:
        env.close()
    policy.load_state_dict(kind.weights(ck))
    policy.to(device).eval()
    return LoadedPolicy(policy, cfg, ck, kind, path)


def with_env_options(
    cfg: Any, task_args: Mapping[str, Any] | None = None, s2r: Mapping[str, Any] | None = None
) -> Any:
    """A train config whose env has ``task_args`` merged over its task options and ``s2r``
    over its sim-to-real settings (``sim2real eval/play --task-args/--s2r``): what is not
    named stays as the policy trained. ValueError naming an unknown option or field."""
    env = cfg.env
    if task_args:
        try:
            env = dataclasses.replace(env, task_args={**env.task_args, **task_args})
        except ValueError as e:
            raise ValueError(f"--task-args: {e}") from None
    if s2r:
        try:
            env = dataclasses.replace(env, s2r={**env.s2r, **s2r})
        except ValueError as e:
            raise ValueError(f"--s2r: {e}") from None
    return dataclasses.replace(cfg, env=env)


def evaluate_policy(
    policy: torch.nn.Module,
    cfg: Any,
    family: PolicyFamily,
    episodes: int,
    seed: int = 0,
    randomize: bool = False,
    deterministic: bool = True,
    wrap: Callable[[ActFn, Any], ActFn] | None = None,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Episode statistics of a policy's inference module in its task's env (one episode
    per env, see sim.evaluation). ``wrap(act, env)``: an act function around the
    policy's, e.g. one that records a video. ``max_steps``: stop the episodes after this
    many control steps (None: run them to their end)."""
    env = make_env(cfg, episodes, seed, randomize, obs_history=family.obs_history(cfg))
    try:
        was_training = policy.training
        policy.eval()
        act = family.actor(policy, env.num_envs, deterministic, seed)
        stats = evaluate(wrap(act, env) if wrap is not None else act, env, episodes, max_steps)
        policy.train(was_training)
    finally:
        env.close()
    return stats
