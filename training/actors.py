"""Actors for evaluation in the simulator: ``act(obs, reset_mask) -> actions``.

Each runs a policy's inference module (the graph that export turns into ONNX) with its
state, so evaluating a checkpoint measures exactly what the exported file will do.
"""

from __future__ import annotations

import torch

__all__ = ["ChunkActor", "TorchActor"]


class TorchActor:
    """Deterministic actor from a Gaussian policy's inference module (the mean action),
    with recurrent state.

    The module's state tensors are [layers, envs, hidden]; envs that start a new
    episode get their slice zeroed.
    """

    def __init__(self, policy, num_envs: int, device: torch.device):
        self.module = policy.inference_module().to(device).eval()
        self.state = [s.to(device) for s in self.module.initial_state(num_envs)]

    def __call__(self, obs: dict[str, torch.Tensor], reset: torch.Tensor) -> torch.Tensor:
        x = obs["policy"].float()
        if not self.state:
            return self.module(x)
        keep = (~reset).to(x.dtype).view(1, -1, 1)
        out = self.module(x, *(s * keep for s in self.state))
        self.state = list(out[1:])
        return out[0]


class ChunkActor:
    """A generative policy's (diffusion, flow) inference module with its chunk state;
    reset envs start a new chunk.

    deterministic: zero noise, which the graph maps to the policy's canonical noise draw
    (the export's deterministic mode); else standard normal noise from a Generator
    seeded by ``seed`` (the runtime's sampling mode). steps: sampler steps (None: the
    policy's).
    """

    def __init__(
        self,
        policy,
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
        self.noise_shape = (num_envs, *self.module.info.noise_shape)
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
