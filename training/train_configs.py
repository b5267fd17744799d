"""The configs of every `sim2real train` command, and how each is built.

A train config is a dataclass of sections: ``env`` and ``run`` are shared by every
learner that steps the simulator; ``policy`` and the algorithm's own section (``ppo``,
``dppo``, ``bc``) come from the learner. Each field is documented where it is declared
(the line under it), which is what ``sim2real train <algo> --help`` prints.

Building a config is always: the dataclass defaults, then the task's preset
(training.presets), then the user's overrides, so the user always has the last word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from policies.diffusion import DiffusionConfig
from policies.flow import FlowConfig
from policies.gaussian import ActorCriticConfig
from policies.world_model import WorldModelConfig
from sim.engine import BACKENDS
from sim.randomization import SimToRealConfig
from sim.registry import HOOKS, sim_to_real_config, task_options
from training.adversary import AdversaryConfig
from training.algorithms.bc import BCConfig
from training.algorithms.dppo import DPPOConfig
from training.algorithms.fpo import FPOConfig
from training.algorithms.mppi import PlannerConfig
from training.algorithms.ppo import PPOConfig
from training.algorithms.reinflow import ReinFlowConfig
from training.algorithms.tdmpc import TDMPCConfig
from training.config import ConfigError, FieldChecks, apply_overrides
from training.constraints import ConstraintsConfig
from training.presets import DPPO_PRESETS, FPO_SCRATCH_PRESET, PPO_PRESETS, WORLD_MODEL_PRESETS

__all__ = [
    "BCRunConfig",
    "BCTrainConfig",
    "DPPOTrainConfig",
    "FPOTrainConfig",
    "FlowBCTrainConfig",
    "ReinFlowTrainConfig",
    "EnvConfig",
    "PPOTrainConfig",
    "OffPolicyRunConfig",
    "RunConfig",
    "SAMPLER_FIELDS",
    "WorldModelTrainConfig",
    "build_bc_config",
    "build_finetune_config",
    "build_fpo_config",
    "build_ppo_config",
    "build_world_model_config",
]


@dataclass
class EnvConfig:
    """The simulated task the policy trains on."""

    # configs saved before env.hooks existed ran the numpy hooks on every device
    ADDED: ClassVar[dict[str, str]] = {"hooks": "numpy"}

    task: str = "cartpole"
    """Task name (see `sim2real tasks`)."""
    num_envs: int = 64
    """Environments stepped in one batch."""
    randomize: bool = True
    """Train with the task's sim-to-real defaults (randomization, noise, latency, pushes),
    with env.s2r over them; false: the nominal model, no noise."""
    max_episode_steps: int | None = None
    """Episode length limit; None: the task's own."""
    threads: int = 0
    """Simulator threads; 0: all usable cores."""
    backend: str = "c"
    """Physics engine: "c" (C MuJoCo on CPU threads) or "warp" (MuJoCo Warp on
    run.device: Warp's CPU device on a machine without a GPU; sim/warp_engine.py)."""
    hooks: str = "auto"
    """Where the task's observation, reward and reset code runs with backend "warp":
    "torch" on the device with the physics (no host round trip per step; the tasks
    sim.registry.torch_hook_tasks() lists), "numpy" on the host, "auto" torch on CUDA
    where the task has torch hooks, numpy elsewhere (sim/device_step.py)."""
    task_args: dict[str, Any] = field(default_factory=dict)
    """The task constructor's own options, e.g. {"command_vx": [0, 1]} for quadruped."""
    s2r: dict[str, Any] = field(default_factory=dict)
    """Sim-to-real settings over the task's defaults, SimToRealConfig field -> value, e.g.
    {"friction_scale": [0.5, 1.25], "action_latency": [0, 2]} (null turns a range off).
    They apply with randomize=true; with randomize=false (the nominal model) a non-empty
    s2r is an error, not silently dropped. obs_history is the policy's, not set here."""

    def __post_init__(self) -> None:
        check = FieldChecks(self)
        check.ints("num_envs")
        check.ints("threads", low=0)
        if self.max_episode_steps is not None:
            check.ints("max_episode_steps")
        known = task_options(self.task)  # unknown task: a clear error now, not later
        if self.backend not in BACKENDS:
            raise ValueError(f"env.backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.hooks not in HOOKS:
            raise ValueError(f"env.hooks must be one of {list(HOOKS)}, got {self.hooks!r}")
        clash = sorted(
            set(self.task_args) & {"num_threads", "max_episode_steps", "backend", "hooks"}
        )
        if clash:
            raise ValueError(
                f"env.task_args: set {clash} with env.threads / env.max_episode_steps / "
                "env.backend / env.hooks"
            )
        # the simulator's own settings, not options of the task
        reserved = sorted(set(self.task_args) & {"dtype", "nan_action"})
        if reserved:
            raise ValueError(f"env.task_args: {reserved} are not task options")
        unknown = [] if known is None else sorted(set(self.task_args) - known)
        if unknown:
            raise ValueError(
                f"env.task_args: {self.task!r} has no option(s) {unknown}; known: {sorted(known)}"
            )
        self.sim_to_real()  # unknown fields and bad ranges: an error now, not at the first env

    def sim_to_real(self, obs_history: int | None = None) -> SimToRealConfig:
        """The task's sim-to-real defaults with ``s2r`` over them (checked by sim itself):
        the settings a randomized env of this config runs with. ``obs_history``: the
        policy frames to stack (generative policies); None: the task's own."""
        if not isinstance(self.s2r, dict):
            raise ValueError(f"env.s2r must be a mapping of sim-to-real fields, got {self.s2r!r}")
        if "obs_history" in self.s2r:
            raise ValueError(
                "env.s2r: obs_history is the policy's frame stacking (policy.obs_history of "
                "the generative policies), not a sim-to-real setting"
            )
        overrides = dict(self.s2r)
        if obs_history is not None:
            overrides["obs_history"] = obs_history
        try:
            return sim_to_real_config(self.task, overrides)
        except ValueError as e:
            raise ValueError(f"env.s2r: {e}") from None


@dataclass
class RunOutputConfig:
    """What every run shares: seed, device, evaluation and what it writes."""

    seed: int = 0
    """Seed of everything random in the run (envs, weights, sampling, shuffling)."""
    device: str = "cpu"
    """Torch device of the learner: cpu or cuda[:i]."""
    eval_episodes: int = 10
    """Episodes of each evaluation (deterministic policy)."""
    video: bool = True
    """Render an MP4 of the final policy (offscreen) when the run ends."""
    video_seconds: float = 8.0
    """Length of that video."""
    tensorboard: bool = True
    """Write TensorBoard logs beside metrics.jsonl."""
    progress: bool = True
    """Show a progress bar."""
    wandb: bool = False
    """Also log the metrics, the resolved config and the final evaluation to Weights &
    Biases (needs the wandb package: pip install 'sim2real[wandb]'). A resumed run
    continues the same W&B run (its id is kept in the run directory, wandb_run_id)."""
    wandb_project: str = "sim2real"
    """W&B project of the run (the entity comes from WANDB_ENTITY or the login's
    default). The W&B run is named after the run directory."""
    wandb_mode: str = ""
    """W&B mode: online, offline (written to disk; `wandb sync` uploads it later), or ""
    for W&B's own default (the WANDB_MODE environment variable, else online). W&B's files
    go into the run directory (wandb/), or into WANDB_DIR when that is set."""

    def __post_init__(self) -> None:
        try:
            kind = torch.device(self.device).type
        except (RuntimeError, TypeError):
            kind = None
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"run.device must be cpu, cuda or cuda:<index>, got {self.device!r}")
        FieldChecks(self).ints("eval_episodes").one_of("wandb_mode", ("", "online", "offline"))


@dataclass
class RunConfig(RunOutputConfig):
    """The run: seed, device, budget, checkpoints, evaluation, logging."""

    total_steps: int = 1_000_000
    """Env steps of the whole run, over all processes."""
    checkpoint_every: int = 25
    """Iterations between checkpoints (latest.pt; every 4th also kept as iter_N.pt)."""
    eval_every: int = 0
    """Iterations between deterministic evaluations during training; 0: only at the end."""
    torch_threads: int = 1
    """Torch threads on the CPU (0: torch's default). The simulator runs its own thread
    pool, and small networks gain nothing from more threads but lose a lot when cores
    are contended."""
    max_stalled_updates: int = 20
    """Stop the run (checkpoint saved, error naming where it began) after this many
    consecutive updates in which every optimizer step was skipped as non-finite: a
    diverged run learns nothing more. 0: train on regardless."""
    max_update_kl: float = 5.0
    """An update whose approximate KL from the rollout's policy exceeds this counts toward
    max_stalled_updates like a skipped one: its steps were finite but the policy it
    leaves has nothing left of the one before (healthy runs here stay under 0.3; FPO's
    runaway of 2026-12-05 reported 18 for 52 updates in a row). 0: not watched. On-policy
    learners only: the world model's updates report no KL."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check = FieldChecks(self)
        check.ints("torch_threads", "eval_every", "max_stalled_updates", low=0)
        check.finite("max_update_kl")
        check.nonnegative("max_update_kl")
        check.ints("total_steps", "checkpoint_every")


@dataclass
class PPOTrainConfig:
    """`sim2real train ppo`: a Gaussian actor-critic trained with PPO."""

    KIND: ClassVar[str] = "ppo"  # the checkpoint kind its runs write

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    constraints: ConstraintsConfig = field(default_factory=ConstraintsConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    run: RunConfig = field(default_factory=RunConfig)
    algo: str = "ppo"
    """The learner (fixed by the command)."""


@dataclass
class DPPOTrainConfig:
    """`sim2real train dppo`: a pretrained diffusion policy fine-tuned with DPPO."""

    KIND: ClassVar[str] = "dppo"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=16, randomize=False))
    policy: DiffusionConfig = field(default_factory=DiffusionConfig)
    dppo: DPPOConfig = field(default_factory=DPPOConfig)
    constraints: ConstraintsConfig = field(default_factory=ConstraintsConfig)
    run: RunConfig = field(
        default_factory=lambda: RunConfig(total_steps=200_000, checkpoint_every=10)
    )
    init: str = ""
    """The pretrained diffusion run (train bc) or checkpoint to start from."""
    algo: str = "dppo"
    """The learner (fixed by the command)."""


@dataclass
class BCRunConfig(RunOutputConfig):
    """The behaviour-cloning run: seed, device, logging, checkpoints, evaluation."""

    log_every: int = 100
    """Updates between metric rows."""
    checkpoint_every: int = 1000
    """Updates between checkpoints."""
    eval_every: int = 0
    """Updates between evaluations in the simulator; 0: only at the end."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check = FieldChecks(self)
        check.ints("log_every", "checkpoint_every")
        check.ints("eval_every", low=0)


@dataclass
class BCTrainConfig:
    """`sim2real train bc`: a diffusion policy pretrained on demonstrations."""

    KIND: ClassVar[str] = "diffusion_bc"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(randomize=False))
    policy: DiffusionConfig = field(default_factory=DiffusionConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    run: BCRunConfig = field(default_factory=BCRunConfig)
    data: str = ""
    """The demonstration file (HDF5, `sim2real collect`)."""
    algo: str = "bc"
    """The learner (fixed by the command)."""


@dataclass
class FlowBCTrainConfig:
    """`sim2real train bc --policy flow`: a flow policy pretrained on demonstrations."""

    KIND: ClassVar[str] = "flow_bc"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(randomize=False))
    policy: FlowConfig = field(default_factory=FlowConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    run: BCRunConfig = field(default_factory=BCRunConfig)
    data: str = ""
    """The demonstration file (HDF5, `sim2real collect`)."""
    algo: str = "bc"
    """The learner (fixed by the command)."""


@dataclass
class ReinFlowTrainConfig:
    """`sim2real train reinflow`: a pretrained flow policy fine-tuned with ReinFlow."""

    KIND: ClassVar[str] = "reinflow"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=16, randomize=False))
    policy: FlowConfig = field(default_factory=FlowConfig)
    reinflow: ReinFlowConfig = field(default_factory=ReinFlowConfig)
    constraints: ConstraintsConfig = field(default_factory=ConstraintsConfig)
    run: RunConfig = field(
        default_factory=lambda: RunConfig(total_steps=200_000, checkpoint_every=10)
    )
    init: str = ""
    """The pretrained flow run (train bc --policy flow) or checkpoint to start from."""
    algo: str = "reinflow"
    """The learner (fixed by the command)."""


@dataclass
class FPOTrainConfig:
    """`sim2real train fpo`: a flow policy trained with flow policy optimization (FPO),
    from scratch or from a pretrained flow run."""

    KIND: ClassVar[str] = "fpo"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=16, randomize=False))
    policy: FlowConfig = field(default_factory=FlowConfig)
    fpo: FPOConfig = field(default_factory=FPOConfig)
    constraints: ConstraintsConfig = field(default_factory=ConstraintsConfig)
    run: RunConfig = field(
        default_factory=lambda: RunConfig(total_steps=200_000, checkpoint_every=10)
    )
    init: str = ""
    """A pretrained flow run or checkpoint to start from; empty: from scratch."""
    algo: str = "fpo"
    """The learner (fixed by the command)."""


@dataclass
class OffPolicyRunConfig(RunConfig):
    """The off-policy run: budget, checkpoints, evaluation, logging. An iteration is one
    env step of every env with the updates it brings."""

    total_steps: int = 100_000
    """Env steps of the whole run (all envs together)."""
    checkpoint_every: int = 2500
    """Iterations between checkpoints (latest.pt only: it holds the replay buffer)."""
    eval_every: int = 0
    """Iterations between deterministic evaluations of the actor and of the planner
    during training; 0: only at the end."""
    log_every: int = 250
    """Iterations between metric rows."""
    eval_planner: bool = True
    """At the end of the run also evaluate the planner (summary.json's eval_planner),
    beside the actor that export writes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        FieldChecks(self).ints("log_every")


@dataclass
class WorldModelTrainConfig:
    """`sim2real train world-model`: a TD-MPC2-style latent world model with MPPI
    planning, learned off-policy from replay; its policy prior is what exports."""

    KIND: ClassVar[str] = "world_model"

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=4, randomize=False))
    policy: WorldModelConfig = field(default_factory=WorldModelConfig)
    tdmpc: TDMPCConfig = field(default_factory=TDMPCConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    run: OffPolicyRunConfig = field(default_factory=OffPolicyRunConfig)
    algo: str = "world-model"
    """The learner (fixed by the command)."""


# Policy fields a fine-tuning run may change after pretraining (the sampler, not the
# networks), by policy config.
SAMPLER_FIELDS = ("sampler", "sample_steps", "eta")
FLOW_SAMPLER_FIELDS = ("sample_steps", "noise_min", "noise_max")


def build_ppo_config(
    task: str, overrides: list[str] | dict[str, Any] | None = None
) -> PPOTrainConfig:
    """Defaults, then the task's preset, then the user's overrides."""
    cfg = PPOTrainConfig(env=EnvConfig(task=task))
    cfg = apply_overrides(cfg, PPO_PRESETS.get(task, {}))
    return apply_overrides(cfg, overrides or [])


def build_bc_config(
    task: str,
    data: str,
    overrides: list[str] | dict[str, Any] | None = None,
    policy: str = "diffusion",
) -> BCTrainConfig | FlowBCTrainConfig:
    """Behaviour cloning of a ``policy`` ("diffusion" or "flow") on ``data``."""
    if policy not in BC_CONFIGS:
        raise ConfigError(f"--policy must be one of {sorted(BC_CONFIGS)}, got {policy!r}")
    cfg = BC_CONFIGS[policy](env=EnvConfig(task=task, randomize=False), data=str(data))
    return apply_overrides(cfg, overrides or [])


def build_finetune_config(
    cls: type,
    init_cfg: Any,
    init: str,
    task: str | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> Any:
    """A fine-tuning run of config class ``cls`` (DPPO, ReinFlow, FPO) from the pretrained
    run ``init`` whose config is ``init_cfg``: its task and policy, the learner's defaults,
    the task's preset, then the overrides.

    Only the sampler fields of ``policy`` may be overridden: the networks are the
    pretrained ones.
    """
    if task is not None and task != init_cfg.env.task:
        raise ConfigError(f"--init {init} was trained on task {init_cfg.env.task!r}, not {task!r}")
    env = EnvConfig(
        task=init_cfg.env.task,
        num_envs=16,
        randomize=False,
        task_args=dict(init_cfg.env.task_args),
    )
    cfg = cls(env=env, policy=init_cfg.policy, init=str(init))
    sampler = FLOW_SAMPLER_FIELDS if isinstance(cfg.policy, FlowConfig) else SAMPLER_FIELDS
    items = (
        overrides.items()
        if isinstance(overrides, dict)
        else [o.split("=", 1) for o in (overrides or [])]
    )
    for key, _ in items:
        k = key.strip().lstrip("-")
        if k.startswith("policy.") and k.split(".", 1)[1] not in sampler:
            raise ConfigError(
                f"{k}: a fine-tuning run keeps the pretrained networks; only policy."
                f"{{{','.join(sampler)}}} may change"
            )
    cfg = apply_overrides(cfg, FINETUNE_PRESETS.get(cls, {}).get(cfg.env.task, {}))
    return apply_overrides(cfg, overrides or [])


def build_fpo_config(
    task: str, overrides: list[str] | dict[str, Any] | None = None
) -> FPOTrainConfig:
    """FPO from scratch: defaults, then FPO_SCRATCH_PRESET (one action per chunk), then
    the overrides."""
    cfg = FPOTrainConfig(env=EnvConfig(task=task, num_envs=16, randomize=False))
    return apply_overrides(apply_overrides(cfg, FPO_SCRATCH_PRESET), overrides or [])


def build_world_model_config(
    task: str, overrides: list[str] | dict[str, Any] | None = None
) -> WorldModelTrainConfig:
    """Defaults, then the task's preset, then the user's overrides."""
    cfg = WorldModelTrainConfig(env=EnvConfig(task=task, num_envs=4, randomize=False))
    cfg = apply_overrides(cfg, WORLD_MODEL_PRESETS.get(task, {}))
    return apply_overrides(cfg, overrides or [])


BC_CONFIGS: dict[str, type] = {"diffusion": BCTrainConfig, "flow": FlowBCTrainConfig}
"""`train bc --policy <name>` -> its train config."""

FINETUNE_PRESETS: dict[type, dict[str, dict[str, Any]]] = {DPPOTrainConfig: DPPO_PRESETS}
"""Per-task presets of the fine-tuning learners (training.presets)."""
