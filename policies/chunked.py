"""What the chunked generative policies share: diffusion (:mod:`policies.diffusion`) and
flow (:mod:`policies.flow`).

Both map an observation (the last ``obs_history`` frames, stacked oldest first) to a
*chunk* of ``horizon`` actions generated in a normalized space, ``[-1, 1]`` per joint
over the task's action bounds, and execute ``act_steps`` of them before asking again.
What differs is only how a chunk is generated (a denoising chain, an Euler chain).
Here:

- :class:`ChunkConfig`: the chunk's shapes and the checks both configs make;
- the building blocks of their networks (:class:`ChunkNet`, :func:`mlp`,
  :func:`sinusoid`, ``ACTIVATIONS``) and the per-dimension Gaussian log-density of their
  chains' transitions, reduced over the action dimensions by one of ``REDUCTIONS``
  (:func:`reduce_last`);
- :class:`ChunkPolicy`: the observation and action interface (sizes, action bounds,
  observation normalizers, the value critic, the behaviour-cloning entry point) that
  both policies build the same way;
- :class:`ChunkInfo` and :class:`ChunkInference`: the exported graph's interface and its
  chunk execution, where the chunk being executed and the position in it travel as
  recurrent state (``action_chunk``, ``chunk_step``), so a stateless graph executes
  chunks exactly as training did.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from policies.normalization import RunningMeanStd

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "mish": nn.Mish,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "elu": nn.ELU,
}
REDUCTIONS = ("mean", "sum")
"""How a chunk position's log-probability (or loss) comes from its action dimensions:
"sum" (the exact log-density) or "mean" (the per-dimension average)."""
_LOG_2PI = math.log(2.0 * math.pi)

__all__ = [
    "ACTIVATIONS",
    "REDUCTIONS",
    "ChunkConfig",
    "ChunkInference",
    "ChunkInfo",
    "ChunkNet",
    "ChunkPolicy",
    "FixedTimeNet",
    "gaussian_log_prob_per_dim",
    "mlp",
    "reduce_last",
    "sinusoid",
]


@dataclass
class ChunkConfig:
    """The chunk's shapes; a chunked policy's config adds its chain and its networks
    (``hidden`` and the other layer sizes, ``time_dim``, ``activation``, ...)."""

    horizon: int = 4
    """Actions predicted per chunk (Tp)."""
    act_steps: int = 4
    """How many actions of each chunk are executed before sampling again (Ta <= Tp)."""
    obs_history: int = 1
    """Observation frames the policy is conditioned on (the env stacks them; the exported
    metadata carries the length)."""
    action_range: float | None = None
    """Where a policy built on a task (from scratch) maps its normalized actions [-1, 1]:
    [-action_range, action_range] in the task's action units; None: the task's action
    bounds. Wide bounds make a first policy flail: the quadruped's (+-3.8 to 8.8, joint
    offsets of 1-2 rad) spread its first samples over all of them and every episode ended
    within ~20 steps (FPO from scratch, 600k steps without learning); 1 starts it where a
    Gaussian policy of std 1 starts. Behaviour cloning normalizes its demonstrations over
    the same range."""

    def _bad(self, name: str, why: str) -> ValueError:
        """The error for field ``name``: "<Config>.<name> <why>, got <value>"."""
        return ValueError(f"{type(self).__name__}.{name} {why}, got {getattr(self, name)!r}")

    def _check_chunk(self, *ints: str) -> None:
        """horizon, act_steps, obs_history and the fields ``ints`` are integers >= 1;
        act_steps <= horizon."""
        for name in ("horizon", "act_steps", "obs_history", *ints):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise self._bad(name, "must be an integer >= 1")
        if self.act_steps > self.horizon:
            raise self._bad("act_steps", f"must be <= horizon ({self.horizon})")
        r = self.action_range
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r < math.inf
        ):
            raise self._bad("action_range", "must be a positive number or None")

    def _check_networks(self, *sizes: str) -> None:
        """The networks' fields the subclass declares: ``time_dim`` even and >= 2, each of
        ``sizes`` a non-empty list of positive ints, ``activation`` one of ACTIVATIONS."""
        if isinstance(self.time_dim, bool) or self.time_dim < 2 or self.time_dim % 2:
            raise self._bad("time_dim", "must be an even integer >= 2")
        for name in sizes:
            layers = getattr(self, name)
            if not layers or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in layers
            ):
                raise self._bad(name, "must be a non-empty list of positive ints")
        if self.activation not in ACTIVATIONS:
            raise self._bad("activation", f"must be one of {sorted(ACTIVATIONS)}")


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding [..., dim] of times t [...] (sines, then cosines)."""
    half = dim // 2
    scale = math.log(10000.0) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -scale)
    arg = t.to(torch.float32).unsqueeze(-1) * freqs
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1)


def mlp(sizes: list[int], activation: str, out_gain: float | None = None) -> nn.Sequential:
    """Linear layers through ``sizes`` with ``activation`` between them; with
    ``out_gain`` the last layer is orthogonal with that gain and a zero bias (else
    PyTorch's default initialization)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
        elif out_gain is not None:
            nn.init.orthogonal_(lin.weight, out_gain)
            nn.init.zeros_(lin.bias)
    return nn.Sequential(*layers)


class ChunkNet(nn.Module):
    """f(x, emb, obs): an MLP over [x flattened, a time embedding, obs features] ->
    [chunk_dim] (a noise predictor, a velocity, a noise scale).

    time_in: the size of the sinusoidal features that ``time_mlp`` maps to the time_dim
    embedding (None: the sinusoids are the embedding). out_gain: see :func:`mlp`. The
    embedding is the subclass's method, so that a sampler with fixed times computes it
    once (export keeps it as a constant).
    """

    def __init__(
        self,
        obs_dim: int,
        chunk_dim: int,
        hidden: tuple[int, ...],
        time_dim: int,
        activation: str,
        time_in: int | None = None,
        out_gain: float | None = None,
    ) -> None:
        super().__init__()
        self.time_dim = int(time_dim)
        self.chunk_dim = int(chunk_dim)
        if time_in is not None:
            self.time_mlp = mlp([time_in, 2 * time_dim, time_dim], activation)
        self.net = mlp([chunk_dim + time_dim + obs_dim, *hidden, chunk_dim], activation, out_gain)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """x [B, chunk_dim], emb [B, time_dim], obs [B, obs_dim] -> [B, chunk_dim]."""
        return self.net(torch.cat([x, emb, obs], dim=-1))

    def at_time(self, emb: torch.Tensor) -> FixedTimeNet:
        """This network at one fixed embedding ``emb`` [time_dim] (a sampler step of the
        deployed graph); its layers after the first are shared, not copied."""
        return FixedTimeNet(self, emb)


class FixedTimeNet(nn.Module):
    """f(x, obs) = net(x, emb, obs) at a fixed embedding, for the deployed samplers.

    The embedding's share of the first layer, W_emb @ emb, is a constant: it is folded
    into that layer's bias (in float64, then rounded once). In the exported graph this
    removes what the embedding cost at every sampling step (a constant broadcast over the
    batch: shape, expand and concat nodes, ~6 of them), which at batch 1 costs about as
    much as a 256-wide layer. The result equals the unfolded network's to float32
    rounding (the sum runs in another order).
    """

    def __init__(self, net: ChunkNet, emb: torch.Tensor) -> None:
        super().__init__()
        first = net.net[0]
        if not isinstance(first, nn.Linear):
            raise TypeError(
                f"FixedTimeNet needs a ChunkNet whose first layer is linear, got {first}"
            )
        c, t = net.chunk_dim, net.time_dim
        if tuple(emb.shape) != (t,):
            raise ValueError(f"embedding of shape {tuple(emb.shape)}, the network takes ({t},)")
        with torch.no_grad():
            w = first.weight.detach()
            self.first = nn.Linear(w.shape[1] - t, w.shape[0]).to(w.device, w.dtype)
            self.first.weight.copy_(torch.cat([w[:, :c], w[:, c + t :]], dim=1))
            bias = first.bias.double() + w[:, c : c + t].double() @ emb.double()
            self.first.bias.copy_(bias.to(w.dtype))
        self.rest = net.net[1:]

    def forward(self, x: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """x [B, chunk_dim], obs [B, obs_dim] -> [B, chunk_dim]."""
        return self.rest(self.first(torch.cat([x, obs], dim=-1)))


def gaussian_log_prob_per_dim(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor
) -> torch.Tensor:
    """log N(x; mean, std^2) elementwise (no reduction)."""
    z = (x - mean) / std
    return -0.5 * z.square() - torch.log(std) - 0.5 * _LOG_2PI


def reduce_last(x: torch.Tensor, reduce: str) -> torch.Tensor:
    """[..., D] -> [...]: the "mean" or the "sum" over the last dimension (one of
    ``REDUCTIONS``; e.g. a chunk position's log-probability from its action dimensions)."""
    return x.mean(-1) if reduce == "mean" else x.sum(-1)


class ChunkPolicy(nn.Module):
    """The observation and action interface of a chunked generative policy.

    policy_obs_size: size of obs["policy"] (frames x obs_history); critic_obs_size: size
    of obs["critic"] for an asymmetric critic, None for a critic on obs["policy"].
    action_low / action_high: the task's action bounds (the normalization range; default
    [-1, 1]). cfg: the family's config (default: ``config_type()``), a ChunkConfig with
    ``normalize_obs``, ``critic_hidden`` and ``activation``.

    The constructor sets the sizes, the action bounds (buffers), the observation
    normalizers and ``chunk_dim``, then the subclass's :meth:`_build_actor` (its
    networks and buffers), then the critic: in this order the networks draw their
    initial weights from the global generator.
    """

    is_recurrent = False
    config_type: ClassVar[type]

    def __init__(
        self,
        policy_obs_size: int,
        action_size: int,
        cfg: Any = None,
        action_low: Any = None,
        action_high: Any = None,
        critic_obs_size: int | None = None,
    ) -> None:
        super().__init__()
        cfg = cfg if cfg is not None else self.config_type()
        name = type(self).__name__
        if policy_obs_size < 1 or action_size < 1:
            raise ValueError(
                f"{name}: obs and action sizes must be >= 1, got {policy_obs_size}, {action_size}"
            )
        self.cfg = cfg
        self.policy_obs_size = int(policy_obs_size)
        self.action_size = int(action_size)
        self.asymmetric = critic_obs_size is not None
        self.critic_obs_size = int(critic_obs_size) if self.asymmetric else self.policy_obs_size
        low = (
            torch.full((action_size,), -1.0)
            if action_low is None
            else torch.as_tensor(action_low, dtype=torch.float32).reshape(-1)
        )
        high = (
            torch.full((action_size,), 1.0)
            if action_high is None
            else torch.as_tensor(action_high, dtype=torch.float32).reshape(-1)
        )
        if low.shape != (action_size,) or high.shape != (action_size,):
            raise ValueError(
                f"{name}: action bounds must have {action_size} entries, got "
                f"{tuple(low.shape)} and {tuple(high.shape)}"
            )
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
            raise ValueError(f"{name}: action bounds must be finite with high > low")
        self.register_buffer("action_low", low.clone())
        self.register_buffer("action_high", high.clone())
        self.obs_normalizer: nn.Module = (
            RunningMeanStd(self.policy_obs_size) if cfg.normalize_obs else nn.Identity()
        )
        self.critic_obs_normalizer: nn.Module | None = (
            RunningMeanStd(self.critic_obs_size) if self.asymmetric and cfg.normalize_obs else None
        )
        self.chunk_dim = cfg.horizon * self.action_size
        self._build_actor()
        self.critic = mlp([self.critic_obs_size, *cfg.critic_hidden, 1], cfg.activation, 1.0)

    def _build_actor(self) -> None:
        """The actor's networks and buffers."""
        raise NotImplementedError

    # ------------------------------------------------------------------ normalization
    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return 2.0 * (actions - self.action_low) / (self.action_high - self.action_low) - 1.0

    def denormalize_actions(self, x: torch.Tensor) -> torch.Tensor:
        return self.action_low + 0.5 * (x + 1.0) * (self.action_high - self.action_low)

    def _policy_obs(self, obs: Mapping[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        x = obs if isinstance(obs, torch.Tensor) else obs.get("policy")
        if x is None:
            raise KeyError(
                f"{type(self).__name__} needs observation group 'policy'; got {sorted(obs)}"
            )
        if x.shape[-1] != self.policy_obs_size:
            raise ValueError(
                f"observation group 'policy' has size {x.shape[-1]}, the policy expects "
                f"{self.policy_obs_size} (frame x obs_history {self.cfg.obs_history})"
            )
        return x

    def obs_features(self, obs: Mapping[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        return self.obs_normalizer(self._policy_obs(obs))

    @torch.no_grad()
    def update_obs_normalizer(self, obs: torch.Tensor) -> None:
        """Fold policy observations [..., obs_size] into the actor's statistics (BC, or
        a learner that trains from scratch)."""
        if isinstance(self.obs_normalizer, RunningMeanStd):
            self.obs_normalizer.update(obs)

    @torch.no_grad()
    def update_critic_normalizer(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Fold critic observations into the asymmetric critic's statistics (no-op else)."""
        if self.critic_obs_normalizer is not None:
            self.critic_obs_normalizer.update(obs["critic"])

    def _check_chunks(self, x: torch.Tensor, what: str) -> None:
        want = (self.cfg.horizon, self.action_size)
        if x.dim() != 3 or tuple(x.shape[1:]) != want:
            raise ValueError(
                f"{what} must be [B, {want[0]}, {want[1]}] action chunks, got {tuple(x.shape)}"
            )

    # ------------------------------------------------------------------ training
    def bc_loss(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Behaviour-cloning loss of the actor on demonstration chunks (:meth:`_bc_loss`).

        obs: policy observations [B, obs_size]; actions: [B, horizon, A] in env units.
        """
        self._check_chunks(actions, "bc_loss: actions")
        return self._bc_loss(self.obs_features(obs), self.normalize_actions(actions), generator)

    def _bc_loss(
        self, feat: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The family's loss on normalized observations and normalized chunks."""
        raise NotImplementedError

    # ------------------------------------------------------------------ critic
    def value(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """V(obs) [B]. A symmetric critic reads the actor's normalized policy observation."""
        if self.asymmetric:
            if "critic" not in obs:
                raise KeyError(f"the asymmetric critic needs group 'critic'; got {sorted(obs)}")
            xc = obs["critic"]
            if self.critic_obs_normalizer is not None:
                xc = self.critic_obs_normalizer(xc)
        else:
            xc = self.obs_features(obs)
        return self.critic(xc).squeeze(-1)


@dataclass(frozen=True)
class ChunkInfo:
    """The interface of a chunked policy's inference module (what export checks).

    A family's subclass adds its own fields (the chain's steps, ``policy_family``) and
    ``noise_shape`` / ``noise_layout``, the shape of the noise input and its meaning.
    """

    obs_size: int
    action_size: int
    horizon: int
    act_steps: int

    @property
    def noise_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def noise_layout(self) -> str:
        """What the entries of ``noise_shape`` are, for error messages."""
        raise NotImplementedError

    @property
    def recurrent_state(self) -> list[tuple[str, list[int]]]:
        """Chunk execution state: the chunk being executed and the position in it."""
        if self.act_steps == 1:
            return []
        return [("action_chunk", [self.act_steps, self.action_size]), ("chunk_step", [1])]

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.recurrent_state)

    @property
    def input_names(self) -> tuple[str, ...]:
        return ("obs", "noise", *self.state_names)

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("actions", *(f"next_{n}" for n in self.state_names))

    @classmethod
    def of(cls, module: nn.Module) -> ChunkInfo:
        """The ``info`` of one of this family's inference modules, or a ValueError."""
        info = getattr(module, "info", None)
        if not isinstance(info, cls):
            raise ValueError(
                f"the {cls.policy_family} exporter needs the family's inference module (whose "
                f"info is a {cls.__name__}), got {type(module).__name__}"
            )
        return info

    def check_metadata(self, meta: Any) -> None:
        """A ValueError unless the deployment metadata's noise input and recurrent state
        are this module's."""
        if meta.noise_shape is None or tuple(meta.noise_shape) != self.noise_shape:
            raise ValueError(
                f"metadata noise_shape {meta.noise_shape} differs from the policy's "
                f"{list(self.noise_shape)} ({self.noise_layout})"
            )
        want = [(n, list(s)) for n, s in self.recurrent_state]
        got = [(n, list(s)) for n, s in meta.recurrent_state]
        if got != want:
            raise ValueError(f"metadata recurrent_state {got} differs from the policy's {want}")


class ChunkInference(nn.Module):
    """Chunk execution of a deployable chunked policy, with the chunk as recurrent state.

    forward(obs [B, O], noise) -> actions [B, A] when act_steps == 1; forward(obs, noise,
    action_chunk [B, Ta, A], chunk_step [B, 1]) -> (actions, next_action_chunk,
    next_chunk_step) otherwise. Where chunk_step (rounded, clamped to [0, Ta)) is 0 a new
    chunk is sampled from ``noise`` and its first action returned; elsewhere the stored
    chunk's action at that position is returned. The sampler runs on every call (a graph
    has no cheap branch); its cost is the latency.

    A subclass sets ``info`` (a :class:`ChunkInfo`), builds its sampler, calls
    :meth:`_init_chunk_execution` and provides :meth:`sample_chunk`.
    """

    info: ChunkInfo

    def _init_chunk_execution(self, policy: ChunkPolicy) -> None:
        """The graph's names and shapes; the action bounds and the chunk positions as
        buffers (constants of the graph)."""
        self.policy_family = self.info.policy_family
        self.input_names = self.info.input_names
        self.output_names = self.info.output_names
        self.horizon = policy.cfg.horizon
        self.act_steps = policy.cfg.act_steps
        self.action_size = policy.action_size
        self.register_buffer("action_low", policy.action_low.clone())
        self.register_buffer("action_high", policy.action_high.clone())
        # [1, Ta, 1]: compared with the position [B, 1, 1] it is the one-hot of the action
        # to execute, already shaped to weigh the chunk [B, Ta, A]
        positions = torch.arange(self.act_steps, dtype=torch.float32).view(1, -1, 1)
        self.register_buffer("positions", positions)

    def initial_state(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        if self.act_steps == 1:
            return ()
        return (torch.zeros(batch, self.act_steps, self.action_size), torch.zeros(batch, 1))

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        obs = torch.zeros(batch, self.info.obs_size)
        noise = torch.zeros(batch, *self.info.noise_shape)
        return (obs, noise, *self.initial_state(batch))

    def sample_chunk(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The whole chunk [B, Tp, A] in env units, from the noise input."""
        raise NotImplementedError

    def _to_env_units(self, x: torch.Tensor) -> torch.Tensor:
        """A normalized chunk [B, Tp * A], clipped to [-1, 1] -> [B, Tp, A] in env units."""
        # view(-1, ...) keeps the graph's reshape a constant (a batch read from a shape
        # would add four nodes)
        x = x.clamp(-1.0, 1.0).view(-1, self.horizon, self.action_size)
        return self.action_low + 0.5 * (x + 1.0) * (self.action_high - self.action_low)

    def folded(self) -> ChunkInference:
        """A copy for export whose sampler runs each step as a :class:`FixedTimeNet` (the
        step's time folded into its first layer): the same function to float32
        rounding, with fewer graph nodes. This module stays as it is, so an evaluation
        in torch gives the same numbers bit for bit whatever the export does."""
        out = copy.deepcopy(self)
        out._fold()
        return out

    def _fold(self) -> None:
        """Build the folded step networks in place (:meth:`folded`'s copy)."""
        raise NotImplementedError

    def forward(self, obs: torch.Tensor, noise: torch.Tensor, *state: torch.Tensor):
        chunk = self.sample_chunk(obs, noise)
        if self.act_steps == 1:
            return chunk[:, 0]
        stored, step = state
        idx = torch.clamp(torch.round(step), 0.0, float(self.act_steps - 1))  # [B, 1]
        at = idx.unsqueeze(-1)  # [B, 1, 1]
        head = chunk if self.act_steps == self.horizon else chunk[:, : self.act_steps]
        current = torch.where(at == 0.0, head, stored)
        action = (current * (self.positions == at).to(current.dtype)).sum(dim=1)
        # idx is a whole number below act_steps, so the remainder is exact
        next_step = torch.fmod(idx + 1.0, float(self.act_steps))
        return action, current, next_step
