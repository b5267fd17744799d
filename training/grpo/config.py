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
    """Completions sampled per prompt (G), the group whose rewards form the baseline;
    >= 2."""
    prompts_per_step: int = 8
    """Prompts (groups) trained on per step."""
    max_new_tokens: int = 64
    """Longest completion in tokens; a longer one is truncated (no EOS)."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the learner scores log-probabilities under the same
    temperature."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p,
    in (0, 1] (1: all tokens)."""
    top_k: int = 0
    """Sample among the top_k most probable tokens only (0: no limit)."""

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

    eps_low, eps_high, aggregation, kl_coef: None keeps the preset's value. Each step
    makes num_iterations passes over its batch, each of num_minibatches optimizer steps.
    """

    loss: str = "grpo"
    """grpo | dapo | dr_grpo | gspo, the core's presets (training.core.POLICY_LOSS_PRESETS)."""
    advantage: str | None = None
    """group_relative ((R - mean) / (std + adv_eps)), dr_grpo (R - mean) or rloo; None:
    dr_grpo with loss=dr_grpo, else group_relative."""
    adv_eps: float = 1e-4
    """The eps of the group_relative advantage, added to the group's reward std (>= 0)."""
    eps_low: float | None = None
    """Lower clip range of the ratio, [1 - eps_low, ...]; None keeps the preset's value."""
    eps_high: float | None = None
    """Upper clip range of the ratio, [..., 1 + eps_high]; None keeps the preset's value."""
    aggregation: str | None = None
    """How the per-token losses are reduced: token_mean, seq_mean_token_mean or
    seq_mean_token_sum_norm; None keeps the preset's value."""
    norm_constant: float | None = None
    """Dr. GRPO's divisor (seq_mean_token_sum_norm); None means sampling.max_new_tokens."""
    kl_coef: float | None = None
    """Weight of the KL term to the reference policy (> 0 needs one, see model.reference);
    None keeps the preset's value."""
    kl_estimator: str = "k3"
    """Estimator of the KL to the reference: k1, k2 or k3."""
    entropy_coef: float = 0.0
    """Entropy bonus subtracted from the loss (0: none)."""
    num_iterations: int = 1
    """Passes over each batch (against stored old log-probabilities)."""
    num_minibatches: int = 1
    """Optimizer steps per pass (the batch is shuffled and split into this many)."""
    micro_batch_size: int = 0
    """Completions per forward/backward within a minibatch (gradients accumulate; each
    micro-batch's loss is weighted so that their sum is exactly the minibatch's loss);
    rows are sorted by length first, so a micro-batch pads only to its own longest
    completion. Set it to bound memory; 0 (auto) splits into 1-8 passes, whichever
    computes least padding."""
    lr: float = 1e-5
    """Learning rate of AdamW (the peak of the schedule)."""
    lr_schedule: str = "constant"
    """constant, linear or cosine: linear and cosine decay from lr to lr * min_lr_ratio
    over the steps after warmup_steps, up to run.steps."""
    warmup_steps: int = 0
    """Steps of linear warm-up towards lr before the schedule starts."""
    min_lr_ratio: float = 0.0
    """Final learning rate of the linear/cosine schedule as a fraction of lr, in [0, 1]."""
    weight_decay: float = 0.0
    """AdamW's (decoupled) weight decay."""
    adam_beta1: float = 0.9
    """AdamW's beta1, in [0, 1)."""
    adam_beta2: float = 0.999
    """AdamW's beta2, in [0, 1)."""
    max_grad_norm: float = 1.0
    """Clip the gradient's global norm to this (0: no clipping)."""

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
    """DAPO: drop groups whose rewards are all equal and sample more prompts to refill."""

    enabled: bool | None = None
    """None turns it on for algo.loss=dapo only."""
    max_rounds: int = 4
    """Sampling rounds per step at most; the step trains on what it has after that."""
    atol: float = 0.0
    """A group whose rewards spread (max - min) by no more than this counts as all equal."""

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")
        if self.atol < 0:
            raise ValueError(f"dynamic_sampling.atol must be >= 0, got {self.atol}")


@dataclass
class CurriculumConfig:
    """Variance curriculum (VCRL): prefer prompts whose recent rewards vary most.

    Off, prompts come in epochs of a seeded permutation. On, each step draws its prompts
    with probabilities (1 - floor) * softmax(v / temperature) + floor / P, v the variance
    of a prompt's recent rewards over the largest such variance
    (training.core.variance_curriculum_weights).
    """

    enabled: bool = False
    """Draw prompts by the variance of their recent rewards instead of in epochs."""
    history: int = 16
    """Recent rewards kept per prompt (>= 2); a prompt with fewer than two counts as the
    most varied."""
    temperature: float = 1.0
    """Softmax temperature over the normalized variances (> 0); lower concentrates on the
    most uncertain prompts."""
    floor: float = 0.1
    """Share of probability spread evenly over all prompts, in (0, 1]: every prompt keeps
    at least floor / P."""

    def __post_init__(self) -> None:
        if self.history < 2:
            raise ValueError(f"curriculum.history must be >= 2, got {self.history}")
        _positive("curriculum.temperature", self.temperature)
        if not 0.0 < self.floor <= 1.0:
            raise ValueError(f"curriculum.floor must be in (0, 1], got {self.floor}")


@dataclass
class RewardConfig:
    """Reward functions, their weights, and what to do with a sample whose reward fails.

    A sample's reward is the weighted sum of the functions' values; it is invalid when a
    function raised or returned a number that is not finite.
    """

    functions: tuple[str, ...] = ("exact_match",)
    """Reward functions: library names (exact_match, numeric, format) or
    package.module:function."""
    weights: tuple[float, ...] = ()
    """One weight per function; empty: all 1."""
    numeric_tolerance: float = 1e-6
    """Absolute tolerance of the numeric reward's comparison with the answer."""
    format_pattern: str = r".+"
    """Regular expression the whole (stripped) completion must match for the format
    reward."""
    on_error: str = "skip_group"
    """What to do with a sample whose reward raised or is not a finite number: skip_group
    (drop its group from the update, count it), zero (use 0, count it), raise."""
    max_invalid_fraction: float = 0.5
    """A step with more invalid samples than this raises, whatever on_error says: a reward
    that mostly fails is a bug, not noise."""

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
    """Seed, length, device and outputs of a run."""

    seed: int = 0
    """Seed of torch, numpy and Python's random, the prompt order, sampling and minibatch
    shuffling (--seed)."""
    steps: int = 100
    """Total training steps of the run (--steps); a resumed run continues up to it."""
    checkpoint_every: int = 50
    """Save checkpoints/latest.pt every this many steps (and at the last step or on an
    interrupt)."""
    device: str = "cpu"
    """Torch device of the policy (cpu, cuda, cuda:1, ...)."""
    threads: int = 0
    """Torch CPU threads (0: torch's default)."""
    tensorboard: bool = True
    """Also write the metrics as TensorBoard events (run_dir/tensorboard)."""
    progress: bool = True
    """Show a progress bar."""
    save_final_model: bool = True
    """Save the trained model (save_pretrained) to run_dir/final when the run completes."""
    log_samples: int = 2
    """Completions per step written to samples.jsonl with their prompts and rewards (0:
    none)."""

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
    """The whole configuration of a GRPO-family run; every field is a command-line override."""

    data: str = ""
    """Prompts file (--data, required): JSON lines with 'prompt' and 'answer'; other
    columns are passed on to the reward functions."""
    model: LanguageModelConfig = field(default_factory=LanguageModelConfig)
    """The language model and its adapter (--model sets model.path)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Completions sampled per step."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The loss and the optimizer."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """DAPO's dynamic sampling."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Variance curriculum over the prompts."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions and the handling of failing rewards."""
    run: RunConfig = field(default_factory=RunConfig)
    """Seed, length, device and outputs."""

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
