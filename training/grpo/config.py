"""Typed configuration of GRPO-family training; every field is a command-line override.

    sim2real train grpo --model M --data D algo.loss=dapo sampling.group_size=16 \
        algo.lr=1e-5 reward.functions=numeric,format

Sections: model (policies.language_model.LanguageModelConfig), sampling, algo,
dynamic_sampling, curriculum, reward, run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from policies.language_model import LanguageModelConfig
from training.core.losses import AGGREGATIONS, KL_ESTIMATORS

LOSSES = ("grpo", "dapo", "dr_grpo", "gspo")
ADVANTAGES = ("group_relative", "dr_grpo", "rloo")
ON_ERROR = ("skip_group", "zero", "raise")
LR_SCHEDULES = ("constant", "linear", "cosine")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass
class SamplingConfig:
    """G completions for each of prompts_per_step prompts per training step."""

    group_size: int = 8
    prompts_per_step: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"sampling.group_size must be >= 2 (a group baseline needs two samples), "
                f"got {self.group_size}"
            )
        if self.prompts_per_step < 1:
            raise ValueError(f"sampling.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _positive("sampling.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")


@dataclass
class AlgoConfig:
    """The loss (a preset of the shared core, with overrides) and the optimizer.

    loss: grpo | dapo | dr_grpo | gspo, the core's presets. eps_low, eps_high,
        aggregation, kl_coef: None keeps the preset's value. norm_constant: Dr. GRPO's
        divisor; None means sampling.max_new_tokens.
    advantage: group_relative ((R - mean) / (std + adv_eps)), dr_grpo (R - mean), rloo.
    num_iterations: passes over each batch (against stored old log-probabilities);
    num_minibatches: optimizer steps per pass. micro_batch_size: completions per
    forward/backward within a minibatch (gradients accumulate; each micro-batch's loss
    is weighted so that their sum is exactly the minibatch's loss); rows are sorted by
    length first, so a micro-batch pads only to its own longest completion. Set it to
    bound memory; 0 (auto) splits into 1-8 passes, whichever computes least padding.
    """

    loss: str = "grpo"
    advantage: str | None = None
    adv_eps: float = 1e-4
    eps_low: float | None = None
    eps_high: float | None = None
    aggregation: str | None = None
    norm_constant: float | None = None
    kl_coef: float | None = None
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    num_iterations: int = 1
    num_minibatches: int = 1
    micro_batch_size: int = 0
    lr: float = 1e-5
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"algo.loss={self.loss!r} is unknown; choose one of {list(LOSSES)}")
        if self.advantage is not None and self.advantage not in ADVANTAGES:
            raise ValueError(
                f"algo.advantage={self.advantage!r} is unknown; choose one of {list(ADVANTAGES)}"
            )
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"algo.aggregation={self.aggregation!r} is unknown; choose one of {list(AGGREGATIONS)}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"algo.kl_estimator={self.kl_estimator!r} is unknown; choose one of {list(KL_ESTIMATORS)}"
            )
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"algo.lr_schedule={self.lr_schedule!r} is unknown; choose one of {list(LR_SCHEDULES)}"
            )
        if self.adv_eps < 0:
            raise ValueError(f"algo.adv_eps must be >= 0, got {self.adv_eps}")
        if self.num_iterations < 1:
            raise ValueError(f"algo.num_iterations must be >= 1, got {self.num_iterations}")
        if self.num_minibatches < 1:
            raise ValueError(f"algo.num_minibatches must be >= 1, got {self.num_minibatches}")
        if self.micro_batch_size < 0:
            raise ValueError(
                f"algo.micro_batch_size must be >= 0 (0: auto), got {self.micro_batch_size}"
            )
        _positive("algo.lr", self.lr)
        if self.warmup_steps < 0:
            raise ValueError(f"algo.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"algo.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"algo.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm < 0:
            raise ValueError(
                f"algo.max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}"
            )
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"algo.{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def advantage_estimator(self) -> str:
        """Dr. GRPO's loss pairs with its own advantage (no std division) unless told otherwise."""
        if self.advantage is not None:
            return self.advantage
        return "dr_grpo" if self.loss == "dr_grpo" else "group_relative"


@dataclass
class DynamicSamplingConfig:
    """DAPO: drop groups whose rewards are all equal and sample more prompts to refill.

    enabled: None turns it on for algo.loss=dapo only. max_rounds: sampling rounds per
    step at most; the step trains on what it has after that.
    """

    enabled: bool | None = None
    max_rounds: int = 4
    atol: float = 0.0

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")
        if self.atol < 0:
            raise ValueError(f"dynamic_sampling.atol must be >= 0, got {self.atol}")


@dataclass
class CurriculumConfig:
    """Variance curriculum (VCRL): prefer prompts whose recent rewards vary most."""

    enabled: bool = False
    history: int = 16
    temperature: float = 1.0
    floor: float = 0.1

    def __post_init__(self) -> None:
        if self.history < 2:
            raise ValueError(f"curriculum.history must be >= 2, got {self.history}")
        _positive("curriculum.temperature", self.temperature)
        if not 0.0 < self.floor <= 1.0:
            raise ValueError(f"curriculum.floor must be in (0, 1], got {self.floor}")


@dataclass
class RewardConfig:
    """Reward functions (library names or package.module:function), their weights, and
    what to do with a sample whose reward raised or is not a finite number:
    skip_group (drop its group from the update, count it), zero (use 0, count it),
    raise. max_invalid_fraction: a step with more invalid samples than this raises,
    whatever on_error says: a reward that mostly fails is a bug, not noise.
    """

    functions: tuple[str, ...] = ("exact_match",)
    weights: tuple[float, ...] = ()
    numeric_tolerance: float = 1e-6
    format_pattern: str = r".+"
    on_error: str = "skip_group"
    max_invalid_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not self.functions:
            raise ValueError("reward.functions must name at least one function")
        if self.weights and len(self.weights) != len(self.functions):
            raise ValueError(
                f"reward.weights has {len(self.weights)} values for {len(self.functions)} functions"
            )
        if self.on_error not in ON_ERROR:
            raise ValueError(
                f"reward.on_error={self.on_error!r} is unknown; choose one of {list(ON_ERROR)}"
            )
        if not 0.0 <= self.max_invalid_fraction <= 1.0:
            raise ValueError(
                f"reward.max_invalid_fraction must be in [0, 1], got {self.max_invalid_fraction}"
            )


@dataclass
class RunConfig:
    seed: int = 0
    steps: int = 100
    checkpoint_every: int = 50
    device: str = "cpu"
    threads: int = 0
    tensorboard: bool = True
    progress: bool = True
    save_final_model: bool = True
    log_samples: int = 2

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"run.steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"run.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.threads < 0:
            raise ValueError(f"run.threads must be >= 0, got {self.threads}")
        if self.log_samples < 0:
            raise ValueError(f"run.log_samples must be >= 0, got {self.log_samples}")


@dataclass
class GRPOTrainConfig:
    data: str = ""
    model: LanguageModelConfig = field(default_factory=LanguageModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def dynamic_sampling_enabled(self) -> bool:
        ds = self.dynamic_sampling.enabled
        return self.algo.loss == "dapo" if ds is None else ds


__all__ = [
    "ADVANTAGES",
    "LOSSES",
    "AlgoConfig",
    "CurriculumConfig",
    "DynamicSamplingConfig",
    "GRPOTrainConfig",
    "RewardConfig",
    "RunConfig",
    "SamplingConfig",
]
