"""The deployable flow policy: the Euler sampler unrolled into a plain module, its
interface, and deploy.export's exporter for the "flow" family.

:meth:`policies.flow.FlowPolicy.inference_module` builds :class:`FlowInference`:
``forward(obs, noise[, action_chunk, chunk_step]) -> (actions[, next_action_chunk,
next_chunk_step])`` with the chunk state of every chunked policy
(:class:`policies.chunked.ChunkInference`). ``noise`` is x0 ``[B, horizon, A]``; the
stochastic (ReinFlow) graph takes ``[B, K + 1, horizon, A]``: x0, then the
standard-normal draws the noise network scales after each step (all zeros: the
deterministic sampler from x0 = 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from policies.chunked import ChunkInference, ChunkInfo

__all__ = ["FlowInference", "FlowInfo", "flow_exporter"]


@dataclass(frozen=True)
class FlowInfo(ChunkInfo):
    """The interface of a flow inference module (what export checks): obs_size,
    action_size, horizon, act_steps (:class:`policies.chunked.ChunkInfo`), the Euler
    steps and whether the graph is stochastic."""

    steps: int
    stochastic: bool = False
    policy_family: str = "flow"

    @property
    def noise_shape(self) -> tuple[int, ...]:
        """x0 [horizon, A]; the stochastic graph adds one draw per Euler step."""
        if self.stochastic:
            return (self.steps + 1, self.horizon, self.action_size)
        return (self.horizon, self.action_size)

    @property
    def noise_layout(self) -> str:
        if self.stochastic:
            return "[steps + 1, horizon, actions], stochastic"
        return "[horizon, actions]"


class FlowInference(ChunkInference):
    """The deployable flow policy: normalizer, the unrolled Euler sampler, chunk state.

    forward(obs [B, O], noise) -> actions [B, A] when act_steps == 1; forward(obs, noise,
    action_chunk [B, Ta, A], chunk_step [B, 1]) -> (actions, next_action_chunk,
    next_chunk_step) otherwise, exactly as :class:`policies.diffusion.DiffusionInference`
    (:class:`policies.chunked.ChunkInference`). noise: x0 [B, Tp, A]; stochastic:
    [B, K + 1, Tp, A] (x0 and the per-step draws).
    """

    def __init__(self, policy: Any, steps: int, stochastic: bool) -> None:
        """policy: the FlowPolicy to deploy (its current networks are copied)."""
        super().__init__()
        cfg = policy.cfg
        self.info = FlowInfo(
            policy.policy_obs_size,
            policy.action_size,
            cfg.horizon,
            cfg.act_steps,
            steps,
            stochastic,
        )
        self.noise_shape = self.info.noise_shape
        self.steps = steps
        self.stochastic = stochastic
        self.chunk_dim = policy.chunk_dim
        self.normalizer = copy.deepcopy(policy.obs_normalizer)
        self.actor = copy.deepcopy(policy.actor)
        self.noise_net = copy.deepcopy(policy.noise_net) if stochastic else None
        with torch.no_grad():
            t = torch.arange(steps, dtype=torch.float32, device=policy.action_low.device) / steps
            d = torch.full_like(t, policy.step_size_input(steps))
            self.register_buffer("vemb", self.actor.embed(t, d))
            if self.noise_net is not None:
                self.register_buffer("nemb", self.noise_net.embed(t))
        self.velocity: nn.ModuleList | None = None  # the folded steps (export)
        self.noise_scale: nn.ModuleList | None = None
        lo, hi = (float(v) for v in policy.noise_bounds)
        self.noise_lo, self.noise_span = lo, hi - lo
        self._init_chunk_execution(policy)

    def _fold(self) -> None:
        actor = copy.deepcopy(self.actor)
        with torch.no_grad():
            # the Euler step's 1 / K folded into the velocity's last layer too: the graph
            # gets each step's displacement, one division per step fewer
            actor.net[-1].weight.div_(self.steps)
            actor.net[-1].bias.div_(self.steps)
        self.velocity = nn.ModuleList(actor.at_time(e) for e in self.vemb)
        if self.noise_net is not None:
            self.noise_scale = nn.ModuleList(self.noise_net.at_time(e) for e in self.nemb)

    def sample_chunk(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The whole chunk [B, Tp, A] in env units, from the noise input."""
        feat = self.normalizer(obs)
        b = obs.shape[0]
        if self.stochastic:
            noise = noise.flatten(2)  # [B, K + 1, chunk_dim]
            x = noise[:, 0]
        else:
            x = noise.flatten(1)
        for k in range(self.steps):
            if self.velocity is not None:
                x_next = x + self.velocity[k](x, feat)
            else:
                v = self.actor(x, self.vemb[k].unsqueeze(0).expand(b, -1), feat)
                x_next = x + v / self.steps
            if self.noise_net is not None:
                if self.noise_scale is not None:
                    raw = self.noise_scale[k](x, feat)
                else:
                    raw = self.noise_net(x, self.nemb[k].unsqueeze(0).expand(b, -1), feat)
                std = self.noise_lo + self.noise_span * torch.sigmoid(raw)
                x_next = x_next + std * noise[:, k + 1]
            x = x_next
        return self._to_env_units(x)


def flow_exporter(module: nn.Module, meta: Any) -> nn.Module:
    """deploy.export's exporter for the "flow" family: the inference module already
    follows the graph layout; check that the metadata describes it and export its
    folded copy (:meth:`policies.chunked.ChunkInference.folded`), fewer nodes per step."""
    FlowInfo.of(module).check_metadata(meta)
    return module.folded()
