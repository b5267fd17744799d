"""GRPO-family fine-tuning of language models on verifiable rewards (GRPO, DAPO,
Dr. GRPO, GSPO), every loss computed by the shared optimizer core.

    from training.grpo import GRPOTrainConfig, GRPOTrainer
    cfg = GRPOTrainConfig(data="prompts.jsonl")
    cfg.model.path = "my-model-dir"
    GRPOTrainer(cfg, run_dir="runs/grpo").train()

Needs the ``llm`` extra (transformers, peft, tokenizers).
"""

from training.grpo.config import (
    AlgoConfig,
    CurriculumConfig,
    DynamicSamplingConfig,
    GRPOTrainConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
)
from training.grpo.data import PromptDataError, PromptSampler, load_prompts, validate_rows
from training.grpo.loss import advantages, grpo_loss, loss_config
from training.grpo.trainer import GRPOTrainer

__all__ = [
    "AlgoConfig",
    "CurriculumConfig",
    "DynamicSamplingConfig",
    "GRPOTrainConfig",
    "GRPOTrainer",
    "PromptDataError",
    "PromptSampler",
    "RewardConfig",
    "RunConfig",
    "SamplingConfig",
    "advantages",
    "grpo_loss",
    "load_prompts",
    "loss_config",
    "validate_rows",
]
