"""The optimizer core: one policy loss, advantage estimators, schedules, normalizers,
two-hot value regression and return scaling."""

from policies.normalization import (  # lives with the policies that embed it
    RunningMeanStd,
    ValueNormalizer,
)
from training.core.advantages import (
    anchor_state_groups,
    dr_grpo,
    dynamic_sampling_mask,
    gae,
    gigpo_advantages,
    group_relative,
    prune_advantages,
    rloo,
    variance_curriculum_weights,
    zero_variance_fraction,
)
from training.core.guard import UpdateGuard
from training.core.losses import (
    POLICY_LOSS_PRESETS,
    PolicyLossConfig,
    aggregate,
    get_loss_config,
    kl_estimate,
    kl_reward_penalty,
    policy_loss,
    value_loss,
)
from training.core.return_scale import PercentileScale
from training.core.schedules import (
    AdaptiveKL,
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    Warmup,
    constant,
    cosine,
    kl_early_stop,
    linear,
)
from training.core.twohot import symexp, symlog, two_hot, two_hot_decode, two_hot_loss

__all__ = [
    "POLICY_LOSS_PRESETS",
    "AdaptiveKL",
    "ConstantSchedule",
    "CosineSchedule",
    "LinearSchedule",
    "PercentileScale",
    "UpdateGuard",
    "Warmup",
    "PolicyLossConfig",
    "RunningMeanStd",
    "ValueNormalizer",
    "aggregate",
    "anchor_state_groups",
    "constant",
    "cosine",
    "dr_grpo",
    "dynamic_sampling_mask",
    "gae",
    "get_loss_config",
    "gigpo_advantages",
    "group_relative",
    "kl_early_stop",
    "kl_estimate",
    "kl_reward_penalty",
    "linear",
    "policy_loss",
    "prune_advantages",
    "rloo",
    "symexp",
    "symlog",
    "two_hot",
    "two_hot_decode",
    "two_hot_loss",
    "value_loss",
    "variance_curriculum_weights",
    "zero_variance_fraction",
]
