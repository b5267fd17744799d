"""A decoder-free latent world model with a policy prior (TD-MPC2's family of models).

An encoder maps an observation to a latent state on a product of simplices (SimNorm:
the latent is split into groups of ``simnorm_dim`` and each group is a softmax), a
dynamics network predicts the next latent from latent and action, and heads on the
latent predict reward, termination, action values (an ensemble of Q networks) and the
action itself (a tanh-squashed Gaussian, the *policy prior* that seeds the planner).
Nothing decodes latents back into observations: the latent only has to predict
reward and value, which is what makes the model small enough for state-based
locomotion on a CPU.

Rewards and values come out as logits over bins (two-hot targets in symlog space;
training.core.twohot); this module only holds the networks. The planner and the
learner live in training/. What leaves for the robot is :class:`WorldModelActor`:
encoder and actor mean, a plain feed-forward graph with no recurrent state.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from policies.base import PolicyInfo

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": nn.SiLU,
    "mish": nn.Mish,
    "elu": nn.ELU,
    "relu": nn.ReLU,
}

__all__ = [
    "EnsembleMLP",
    "SimNorm",
    "WorldModel",
    "WorldModelActor",
    "WorldModelConfig",
]


@dataclass
class WorldModelConfig:
    """Sizes of the latent world model, its heads and its policy prior."""

    latent_dim: int = 64
    """Size of the latent state (a multiple of simnorm_dim)."""
    simnorm_dim: int = 8
    """Size of each softmax group of the latent (SimNorm)."""
    encoder_hidden: tuple[int, ...] = (128,)
    """Hidden layer sizes of the observation encoder."""
    hidden: int = 128
    """Width of the two hidden layers of dynamics, reward, Q and actor networks
    (TD-MPC2's smallest model has 512 on a GPU; 128 keeps a 300k-step run on two CPU
    cores within hours, docs/world_model.md)."""
    num_q: int = 2
    """Q networks in the ensemble; TD targets take the min of two drawn at random, the
    policy prior their average. TD-MPC2 has 5; 2 (the min of both: clipped double Q)
    halves the cost of an update on a CPU."""
    q_dropout: float = 0.01
    """Dropout after the first layer of each Q network (regularizes the ensemble)."""
    num_bins: int = 101
    """Bins of the two-hot reward and value distributions (odd: one bin sits on 0)."""
    vmin: float = -10.0
    """Lowest bin, in symlog space (symlog(-22025) = -10)."""
    vmax: float = 10.0
    """Highest bin, in symlog space."""
    log_std_min: float = -10.0
    """Lower bound of the policy prior's log standard deviation (before tanh)."""
    log_std_max: float = 2.0
    """Upper bound of the policy prior's log standard deviation (before tanh)."""
    activation: str = "silu"
    """Activation of every hidden layer: silu, mish (TD-MPC2's; its forward and backward
    measured 4x slower than silu's on this project's CPU), elu or relu."""

    def __post_init__(self) -> None:
        self.encoder_hidden = tuple(self.encoder_hidden)
        for name in ("latent_dim", "simnorm_dim", "hidden", "num_q", "num_bins"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"WorldModelConfig.{name} must be an integer >= 1, got {v!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.encoder_hidden):
            raise ValueError(
                f"WorldModelConfig.encoder_hidden must be positive ints, got {self.encoder_hidden}"
            )
        if self.latent_dim % self.simnorm_dim:
            raise ValueError(
                f"WorldModelConfig.latent_dim ({self.latent_dim}) must be a multiple of "
                f"simnorm_dim ({self.simnorm_dim})"
            )
        if self.num_q < 2:
            raise ValueError(f"WorldModelConfig.num_q must be >= 2 (min of two), got {self.num_q}")
        if self.num_bins < 2:
            raise ValueError(f"WorldModelConfig.num_bins must be >= 2, got {self.num_bins}")
        if not (math.isfinite(self.vmin) and math.isfinite(self.vmax) and self.vmin < self.vmax):
            raise ValueError(
                f"WorldModelConfig.vmin < vmax must hold (finite), got {self.vmin}, {self.vmax}"
            )
        if not 0 <= self.q_dropout < 1:
            raise ValueError(f"WorldModelConfig.q_dropout must be in [0, 1), got {self.q_dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"WorldModelConfig.activation must be one of {sorted(ACTIVATIONS)}, got "
                f"{self.activation!r}"
            )
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"WorldModelConfig.log_std_min must be < log_std_max, got "
                f"{self.log_std_min}, {self.log_std_max}"
            )


class SimNorm(nn.Module):
    """Softmax over consecutive groups of ``dim`` features: the latent lives on a
    product of simplices, which bounds it without a decoder to anchor it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return F.softmax(x.reshape(*shape[:-1], -1, self.dim), dim=-1).reshape(shape)


def _mlp(
    sizes: list[int],
    out: int,
    act: type[nn.Module],
    last: nn.Module | None = None,
    dropout: float = 0.0,
) -> nn.Sequential:
    """Linear -> LayerNorm -> activation per hidden layer (LayerNorm keeps the many heads'
    inputs at one scale whatever the observation units), then a plain Linear."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [nn.Linear(a, b), nn.LayerNorm(b), act()]
        if i == 0 and dropout > 0:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(sizes[-1], out))
    if last is not None:
        layers.append(last)
    return nn.Sequential(*layers)


class EnsembleMLP(nn.Module):
    """``k`` MLPs of the same shape evaluated in one batched matmul per layer.

    forward(x [..., in]) -> [k, ..., out]: every member sees the same input. The last
    layer starts at zero, so every reward and value starts as the bin of 0."""

    def __init__(
        self,
        k: int,
        inp: int,
        hidden: int,
        out: int,
        act: type[nn.Module],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.k = k
        sizes = [inp, hidden, hidden, out]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            w = torch.empty(k, a, b)
            for i in range(k):  # nn.Linear's own initialization, member by member
                lin = nn.Linear(a, b)
                w[i] = lin.weight.detach().T
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(k, 1, b)))
        self.norm_weights = nn.ParameterList(
            [nn.Parameter(torch.ones(k, 1, hidden)) for _ in range(2)]
        )
        self.norm_biases = nn.ParameterList(
            [nn.Parameter(torch.zeros(k, 1, hidden)) for _ in range(2)]
        )
        with torch.no_grad():
            self.weights[-1].zero_()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        h = x.reshape(1, -1, x.shape[-1]).expand(self.k, -1, -1)
        for i in range(3):
            h = torch.baddbmm(self.biases[i], h, self.weights[i])
            if i < 2:
                h = F.layer_norm(h, h.shape[-1:]) * self.norm_weights[i] + self.norm_biases[i]
                h = self.act(h)
                if i == 0:
                    h = self.dropout(h)
        return h.reshape(self.k, *lead, h.shape[-1])


class WorldModel(nn.Module):
    """Encoder, latent dynamics, reward / termination / Q heads and the policy prior.

    Actions inside the model are in [-1, 1]; ``to_env`` / ``from_env`` map them to and
    from the task's action bounds, which the module keeps as buffers (so the exported
    actor outputs actions in the task's units)."""

    action_low: torch.Tensor
    action_high: torch.Tensor

    def __init__(
        self, obs_size: int, action_size: int, cfg: WorldModelConfig, action_low, action_high
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_size = obs_size
        self.action_size = action_size
        z, h, a = cfg.latent_dim, cfg.hidden, action_size
        act = ACTIVATIONS[cfg.activation]
        self.encoder = _mlp([obs_size, *cfg.encoder_hidden], z, act, SimNorm(cfg.simnorm_dim))
        self.dynamics = _mlp([z + a, h, h], z, act, SimNorm(cfg.simnorm_dim))
        self.reward = _mlp([z + a, h, h], cfg.num_bins, act)
        self.termination = _mlp([z, h], 1, act)
        self.actor = _mlp([z, h, h], 2 * a, act)
        self.q = EnsembleMLP(cfg.num_q, z + a, h, cfg.num_bins, act, cfg.q_dropout)
        with torch.no_grad():  # reward starts as the bin of 0, like the Q heads
            self.reward[-1].weight.zero_()
            self.reward[-1].bias.zero_()
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))

    @property
    def info(self) -> PolicyInfo:
        return PolicyInfo("gaussian_mlp", self.obs_size, self.action_size)

    # ------------------------------------------------------------------ pieces
    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(obs)

    def next(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self.dynamics(torch.cat([z, a], -1))

    def reward_logits(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self.reward(torch.cat([z, a], -1))

    def termination_logit(self, z_next: torch.Tensor) -> torch.Tensor:
        """Logit that the transition into ``z_next`` ended the episode (a termination,
        not a time-out), [...]."""
        return self.termination(z_next).squeeze(-1)

    def q_logits(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """[num_q, ..., num_bins]."""
        return self.q(torch.cat([z, a], -1))

    def pi(
        self, z: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action, its log-probability with the tanh correction, mean action);
        actions in [-1, 1]."""
        mu, log_std = self.actor(z).chunk(2, -1)
        lo, hi = self.cfg.log_std_min, self.cfg.log_std_max
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1)
        eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
        u = mu + eps * log_std.exp()
        log_prob = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        a = torch.tanh(u)
        # change of variables through tanh: log|d tanh(u)/du| = log(1 - tanh(u)^2)
        log_prob = log_prob - torch.log(F.relu(1 - a.square()) + 1e-6).sum(-1)
        return a, log_prob, torch.tanh(mu)

    def to_env(self, a: torch.Tensor) -> torch.Tensor:
        return self.action_low + (a + 1) * 0.5 * (self.action_high - self.action_low)

    def from_env(self, a: torch.Tensor) -> torch.Tensor:
        span = (self.action_high - self.action_low).clamp_min(1e-8)
        return ((a - self.action_low) / span * 2 - 1).clamp(-1, 1)

    def model_parameters(self) -> list[nn.Parameter]:
        """Everything the world-model loss trains (all but the actor)."""
        actor = {id(p) for p in self.actor.parameters()}
        return [p for p in self.parameters() if id(p) not in actor]

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(
        self, obs: Mapping[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Actions of the policy prior, sampled, in the task's units."""
        a, _, _ = self.pi(self.encode(obs["policy"].float()), generator)
        return self.to_env(a)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The deterministic action of the policy prior (what export writes)."""
        return self.to_env(self.pi(self.encode(obs["policy"].float()))[2])

    def inference_module(self) -> WorldModelActor:
        return WorldModelActor(self)


class WorldModelActor(nn.Module):
    """The deployable policy prior: encoder, actor mean, tanh, the task's action bounds.
    forward(obs [B, obs]) -> actions [B, A]; no planning, no state, no noise."""

    def __init__(self, model: WorldModel) -> None:
        super().__init__()
        self.encoder = copy.deepcopy(model.encoder)
        self.actor = copy.deepcopy(model.actor)
        self.register_buffer("action_low", model.action_low.clone())
        self.register_buffer("action_high", model.action_high.clone())
        self.action_size = model.action_size
        self.info = model.info
        self.policy_family = self.info.policy_family
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    def initial_state(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        return ()  # feed-forward: no recurrent state

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mu = self.actor(self.encoder(obs))[..., : self.action_size]
        return self.action_low + (torch.tanh(mu) + 1) * 0.5 * (self.action_high - self.action_low)
