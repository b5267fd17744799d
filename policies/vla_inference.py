"""The deployable VLA policy (:class:`policies.vla.VLAPolicy.inference_module`).

``forward(image uint8 [B, H, W, 3], instruction_ids int64 [B, L], proprio float32
[B, P], noise float32 [B, horizon, A]) -> actions [B, horizon, A]`` in env units: the
backbone (image scaling and normalization, proprio normalization, LoRA merged) and the
flow family's unrolled Euler sampler (:class:`policies.flow_inference.FlowInference`,
action de-normalization and clipping inside), deterministic given noise. The stochastic
graph takes noise [B, K + 1, horizon, A] as FlowInference's.

It returns the whole chunk, not one action with chunk state as
:class:`policies.chunked.ChunkInference` does: a backbone pass costs far more than a
control period, so the runtime calls it at the chunk rate and executes the chunk itself
(or overlaps the next call with execution).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from policies.flow import check_steps
from policies.flow_inference import FlowInference

__all__ = ["VLAInference"]


class VLAInference(nn.Module):
    """Frozen backbone copy + FlowInference of the head; see the module docstring."""

    input_names = ("image", "instruction_ids", "proprio", "noise")
    output_names = ("actions",)
    policy_family = "vla_flow"  # deploy.export checks it against the metadata's family

    def __init__(self, policy: Any, steps: int | None, stochastic: bool) -> None:
        """policy: the VLAPolicy to deploy (its current weights are copied)."""
        super().__init__()
        k = check_steps(policy.head.steps if steps is None else steps)
        self.backbone = policy.backbone.merged()
        self.sampler = FlowInference(policy.head, k, bool(stochastic))
        self.steps = k
        self.stochastic = bool(stochastic)
        self.noise_shape = tuple(self.sampler.noise_shape)
        self.image_size = policy.cfg.image_size
        self.max_instruction_tokens = policy.cfg.max_instruction_tokens
        self.pad_token_id = policy.cfg.pad_token_id
        self.proprio_size = policy.proprio_size
        self.horizon = policy.cfg.head.horizon
        self.act_steps = policy.cfg.head.act_steps
        self.action_size = policy.action_size
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Inputs of the graph's shapes and types (a blank image, a one-word
        instruction, zero proprio and noise), e.g. for tracing."""
        s = self.image_size
        image = torch.zeros(batch, s, s, 3, dtype=torch.uint8)
        ids = torch.full((batch, self.max_instruction_tokens), self.pad_token_id, dtype=torch.long)
        ids[:, 0] = (self.pad_token_id + 1) % self.backbone.vocab_size
        proprio = torch.zeros(batch, self.proprio_size)
        noise = torch.zeros(batch, *self.noise_shape)
        return image, ids, proprio, noise

    def forward(
        self,
        image: torch.Tensor,
        instruction_ids: torch.Tensor,
        proprio: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        feat = self.backbone(image, instruction_ids, proprio)
        return self.sampler.sample_chunk(feat, noise)
