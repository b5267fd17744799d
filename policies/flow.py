"""Flow policies: a velocity field over action chunks, shortcut flow matching, Euler sampling.

The observation/chunk interface is the diffusion policy's (:mod:`policies.diffusion`):
the policy maps an observation (the last ``obs_history`` frames, stacked oldest first)
to a *chunk* of ``horizon`` actions in a normalized space, ``[-1, 1]`` per joint over the
task's action bounds, and ``act_steps`` of them are executed before it is asked again.

Time convention (rectified flow). t runs from 0 (noise) to 1 (data)::

    x_t = (1 - t) x0 + t x1,   x0 ~ N(0, I),   x1 = a normalized demonstration chunk

and the velocity network regresses the straight-line velocity ``x1 - x0``. Sampling
integrates dx/dt = v from t = 0 to 1 with K Euler steps of size 1/K (``sample_steps``,
1 to 10): ``x_{k+1} = x_k + v(x_k, k/K, d) / K``.

One-step sampling: a shortcut model (Frans et al. 2024). The network also takes the
step size d it is asked to jump (d = 0: the instantaneous velocity that flow matching
learns). :meth:`FlowPolicy.bc_loss` mixes two targets in every batch: flow matching at
d = 0 on ``1 - consistency_fraction`` of the rows, and on the rest the
self-consistency target ``v(x_t, t, 2h) = (v(x_t, t, h) + v(x_t + h v(x_t, t, h), t + h,
h)) / 2`` (detached), for step sizes 2h = 1/K with K drawn from 1..shortcut_max_steps
(probability proportional to 1/K, so the few-step sizes get most of the samples) and t
on the grid of that step size; half steps finer than 1/shortcut_max_steps query the
instantaneous velocity. Why a shortcut model and not distillation: it is trained in one
stage from the demonstrations alone, with no teacher to train first and no ODE to
integrate for targets, and one network serves every step count from 1 to 10 (the
sampler asks for d = 1/K). Flow matching alone cannot do one step on multimodal data:
a single Euler step from x0 lands on the *mean* of the chunks that could follow,
between the modes. Measured on the bimodal toy of tests/test_flow.py (a 2-D action,
base(obs) +- 0.5 along a line; 64x64 network, 5000 BC steps), the fraction of samples
in the empty gap between the modes at 1 / 4 / 10 Euler steps: plain flow matching
(``shortcut=False``) 0.99 / 0.23 / 0.05, the shortcut model 0.23 / 0.13 / 0.05 (one
shortcut step is as good as four flow-matching steps; a BC step costs about 1.5x more).

Deterministic mode: zero noise means x0 = 0. The exported graph takes x0 as ``noise``
and the runtime's deterministic mode feeds zeros; unlike a diffusion policy (whose
denoiser never sees x_T = 0, hence its canonical draw), the flow at t = 0 is trained on
all of N(0, I), the origin (its densest point) included, and the path from x0 = 0 ends
at the middle of what the policy would sample: the analogue of a Gaussian policy's
mean. Measured against one fixed random draw (the diffusion family's choice) on the
toys above, mean error at 1 / 4 steps: unimodal data (spread 0.1) 0.027 / 0.014 from
zeros vs 0.12 / 0.13 from the draw (0.04-0.19 over 8 draws); bimodal data 0.48 / 0.31
from zeros (the origin sits on the boundary between the two modes: 100% / 65% of the
samples in the gap) vs 0.14 / 0.09 from the draw (7 of 8 draws commit to a mode, one
sits in the gap). Zeros are kept: policies fine-tuned by RL and policies cloned from
one expert are unimodal per state, where zeros are 4-9x closer than a fixed draw; and
on the diffusion policy's HalfCheetah benchmark a fixed draw (-520) was far worse than
zeros (-30). A policy cloned from multimodal demonstrations should run sampled (the
runtime's default, seeded noise), not in deterministic mode. So
``sample(obs, noise=zeros, stochastic=False)`` is what the deterministic runtime
computes, and the stochastic graph with all-zero noise is the same deterministic chain.

ReinFlow (Zhang et al. 2025). A noise network ``sigma_phi(x_k, t_k, obs)``, bounded in
``[noise_min, noise_max]`` (``noise_min + (noise_max - noise_min) * sigmoid(raw)``), adds
Gaussian noise after every Euler step::

    x_{k+1} ~ N(x_k + v(x_k, t_k, d) / K, sigma_phi(x_k, t_k, obs)^2)

so every step is a Gaussian transition and a stored chain has an exact log-probability
(:meth:`FlowPolicy.chain_log_prob`). The noise network is part of the policy from the
start (its last layer starts at zero: sigma is the middle of the bounds) and is only
trained by ReinFlow. :meth:`FlowPolicy.enable_finetuning` says which networks train.

FPO (McAllister et al. 2025). :meth:`FlowPolicy.cfm_loss` evaluates the conditional
flow-matching loss of given (tau, eps) draws, with no randomness inside, so a learner can
compare it under old and new parameters with the same draws.

Deployment. :meth:`FlowPolicy.inference_module` unrolls K Euler steps into a plain
module (:mod:`policies.flow_inference`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from policies.chunked import (
    REDUCTIONS,
    ChunkConfig,
    ChunkNet,
    ChunkPolicy,
    gaussian_log_prob_per_dim,
    reduce_last,
    sinusoid,
)
from policies.flow_inference import FlowInference, FlowInfo, flow_exporter

MAX_SAMPLE_STEPS = 10
"""The Euler sampler runs 1 to this many steps."""
TIME_SCALE = 100.0
"""t and d in [0, 1] are scaled by this before the sinusoidal embedding."""
_LOG_2PI_E = math.log(2.0 * math.pi * math.e)

__all__ = [
    "MAX_SAMPLE_STEPS",
    "ChainTerms",
    "FlowConfig",
    "FlowInference",
    "FlowInfo",
    "FlowPolicy",
    "FlowSample",
    "NoiseNet",
    "VelocityNet",
    "check_steps",
    "flow_exporter",
]


def check_steps(steps: Any, name: str = "steps") -> int:
    """An Euler step count in [1, MAX_SAMPLE_STEPS], or a ValueError naming ``name``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_SAMPLE_STEPS:
        raise ValueError(
            f"{name} must be an integer in [1, {MAX_SAMPLE_STEPS}] (Euler steps), got {steps!r}"
        )
    return steps


@dataclass
class FlowConfig(ChunkConfig):
    """Shapes of the chunk, the Euler sampler, the shortcut training and the networks.

    The policy predicts chunks of horizon (Tp) actions and executes act_steps (Ta) of
    them (:class:`policies.chunked.ChunkConfig`); its sampler runs sample_steps (K)
    Euler steps from t = 0 (noise) to t = 1.
    """

    sample_steps: int = 4
    """Euler steps K of the sampler used for evaluation and export, 1 to 10."""
    shortcut: bool = True
    """Train a shortcut model (the network takes the step size; one-step sampling works);
    False: plain flow matching, and the sampler always asks for the instantaneous
    velocity."""
    shortcut_max_steps: int = 16
    """Self-consistency trains the step sizes 1/K for K = 1..this; finer half steps use
    the instantaneous velocity (and so does a sampler with more steps than this). 4
    puts half the consistency rows on the one-step size, for a policy deployed at one
    step: on the flow benchmark's halfcheetah (3 seeds) one step then returned 1 036
    against four steps' 987, where 16 gives 883 against 1 055; but RL fine-tuning from
    it did worse (seed 0: ReinFlow 1 825 against 2 136, FPO 1 064 against 1 678; hopper
    FPO 317 against 685), so 16 stays the default (docs/benchmarks_flow.md)."""
    consistency_fraction: float = 0.25
    """Fraction of each behaviour-cloning batch trained on the self-consistency target
    (the rest on flow matching); ignored without shortcut."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden layer sizes of the MLP velocity network (non-empty, positive ints)."""
    time_dim: int = 16
    """Size of the embedding of (t, step size) of the velocity network (even, >= 2)."""
    activation: str = "mish"
    """Activation of every network of the policy: mish, silu, relu or elu."""
    noise_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of ReinFlow's noise network (unused until ReinFlow trains it)."""
    noise_min: float = 0.05
    """Lower bound of the noise network's std (normalized action units, > 0)."""
    noise_max: float = 0.2
    """Upper bound of the noise network's std (>= noise_min)."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the value network (used by RL fine-tuning; BC leaves it)."""
    normalize_obs: bool = True
    """Running mean/std normalization of observations inside the module (saved with the
    weights and exported with them)."""

    def __post_init__(self) -> None:
        self.hidden = tuple(self.hidden)
        self.noise_hidden = tuple(self.noise_hidden)
        self.critic_hidden = tuple(self.critic_hidden)
        bad = self._bad
        self._check_chunk("shortcut_max_steps")
        v = self.sample_steps
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SAMPLE_STEPS:
            raise bad("sample_steps", f"must be an integer in [1, {MAX_SAMPLE_STEPS}]")
        if not isinstance(self.shortcut, bool):
            raise bad("shortcut", "must be a bool")
        f = self.consistency_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f < 1.0:
            raise bad("consistency_fraction", "must be in [0, 1)")
        self._check_networks("hidden", "noise_hidden", "critic_hidden")
        for name in ("noise_min", "noise_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        if self.noise_min <= 0:
            raise bad("noise_min", "must be > 0 (the chain's log-probability needs a std floor)")
        if self.noise_max < self.noise_min:
            raise bad("noise_max", f"must be >= noise_min ({self.noise_min})")


def _toward_box(
    v: torch.Tensor,
    x: torch.Tensor,
    t: torch.Tensor,
    lo: torch.Tensor | float,
    hi: torch.Tensor | float,
) -> torch.Tensor:
    """Velocity v at (x, t) clipped to the range a flow ending in [lo, hi] allows over the
    rest of the path: (lo - x) / (1 - t) .. (hi - x) / (1 - t)."""
    rest = 1.0 - t
    return torch.minimum(torch.maximum(v, (lo - x) / rest), (hi - x) / rest)


class VelocityNet(ChunkNet):
    """v(x_t, t, d, obs): an MLP over [x_t flattened, embedding of (t, d), obs features].

    d is the step size the shortcut model is asked to jump (0: the instantaneous
    velocity). The embedding (two sinusoids -> MLP) is a separate method so that a
    sampler with fixed steps can compute it once (export keeps it as a constant).
    """

    def __init__(
        self, obs_dim: int, chunk_dim: int, hidden: tuple[int, ...], time_dim: int, activation: str
    ) -> None:
        super().__init__(obs_dim, chunk_dim, hidden, time_dim, activation, time_in=2 * time_dim)

    def embed(self, t: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """t, d [B] in [0, 1] -> [B, time_dim]."""
        s = torch.cat(
            [sinusoid(t * TIME_SCALE, self.time_dim), sinusoid(d * TIME_SCALE, self.time_dim)],
            dim=-1,
        )
        return self.time_mlp(s)


class NoiseNet(ChunkNet):
    """ReinFlow's noise network: the unbounded pre-activation of sigma(x_k, t_k, obs).

    The policy maps it into its bounds with a sigmoid. The last layer starts at zero, so
    an untrained network gives the middle of the bounds for every input.
    """

    def __init__(
        self, obs_dim: int, chunk_dim: int, hidden: tuple[int, ...], time_dim: int, activation: str
    ) -> None:
        super().__init__(obs_dim, chunk_dim, hidden, time_dim, activation, out_gain=0.0)

    def embed(self, t: torch.Tensor) -> torch.Tensor:
        return sinusoid(t * TIME_SCALE, self.time_dim)


class ChainTerms(NamedTuple):
    """Per-transition terms of stored chains (see :meth:`FlowPolicy.chain_terms`)."""

    log_prob: torch.Tensor
    entropy: torch.Tensor
    std: torch.Tensor


class FlowSample(NamedTuple):
    """actions: [B, horizon, A] in env units (the chain's end clipped to [-1, 1] and
    mapped onto the action bounds); chain: [B, K + 1, horizon, A] in normalized space
    (x_0 = the initial noise ... x_K = the unclipped end), or None."""

    actions: torch.Tensor
    chain: torch.Tensor | None


class FlowPolicy(ChunkPolicy):
    """Flow actor over action chunks (velocity and noise networks) with a value critic.

    Built as :class:`policies.chunked.ChunkPolicy` (observation and action sizes, action
    bounds, critic observations, a :class:`FlowConfig`).
    """

    cfg: FlowConfig
    config_type = FlowConfig

    def _build_actor(self) -> None:
        cfg = self.cfg
        self.actor = VelocityNet(
            self.policy_obs_size, self.chunk_dim, cfg.hidden, cfg.time_dim, cfg.activation
        )
        self.noise_net = NoiseNet(
            self.policy_obs_size, self.chunk_dim, cfg.noise_hidden, cfg.time_dim, cfg.activation
        )
        # ReinFlow's std bounds (buffers: a fine-tuned policy keeps the bounds it trained
        # with) and the Euler steps fine-tuning fixed (0: cfg.sample_steps)
        self.register_buffer("noise_bounds", torch.tensor([cfg.noise_min, cfg.noise_max]))
        self.register_buffer("ft_steps", torch.zeros((), dtype=torch.int64))

    # ------------------------------------------------------------------ description
    @property
    def steps(self) -> int:
        """The Euler steps the policy runs: those fine-tuning fixed, else cfg.sample_steps."""
        k = int(self.ft_steps.item())
        return k if k > 0 else self.cfg.sample_steps

    @property
    def info(self) -> FlowInfo:
        c = self.cfg
        return FlowInfo(self.policy_obs_size, self.action_size, c.horizon, c.act_steps, self.steps)

    @property
    def policy_family(self) -> str:
        return "flow"

    def step_size_input(self, steps: int) -> float:
        """The step size d the velocity network is asked for when the sampler runs
        ``steps`` Euler steps: 1/steps for a shortcut model (within the trained range),
        else 0 (the instantaneous velocity)."""
        if self.cfg.shortcut and steps <= self.cfg.shortcut_max_steps:
            return 1.0 / steps
        return 0.0

    # ------------------------------------------------------------------ networks
    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, d: torch.Tensor, feat: torch.Tensor
    ) -> torch.Tensor:
        """x [B, Tp, A], t and d [B], feat [B, O] (normalized obs) -> v [B, Tp, A]."""
        b = x.shape[0]
        return self.actor(x.reshape(b, -1), self.actor.embed(t, d), feat).view_as(x)

    def noise_std(self, x: torch.Tensor, t: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """ReinFlow's sigma(x_k, t_k, obs) [B, Tp, A], inside [noise_min, noise_max]."""
        b = x.shape[0]
        raw = self.noise_net(x.reshape(b, -1), self.noise_net.embed(t), feat).view_as(x)
        lo, hi = self.noise_bounds[0], self.noise_bounds[1]
        return lo + (hi - lo) * torch.sigmoid(raw)

    @torch.no_grad()
    def set_noise_bounds(self, noise_min: float, noise_max: float) -> None:
        """Change ReinFlow's std bounds (kept in the state dict with the weights)."""
        if not (math.isfinite(noise_min) and math.isfinite(noise_max)):
            raise ValueError(f"noise bounds must be finite, got {noise_min}, {noise_max}")
        if not 0.0 < noise_min <= noise_max:
            raise ValueError(
                f"noise bounds must satisfy 0 < noise_min <= noise_max, got "
                f"{noise_min}, {noise_max}"
            )
        self.noise_bounds.copy_(torch.tensor([float(noise_min), float(noise_max)]))

    def enable_finetuning(
        self, steps: int | None = None, *, velocity: bool = True, noise: bool = True
    ) -> list[nn.Parameter]:
        """Fix the Euler steps of the chain and choose which actor networks train.

        steps: the chain's Euler steps from now on (None: cfg.sample_steps); the policy
        keeps it (``steps``, ``info``, the default of ``inference_module``), since the
        fine-tuned networks are tuned to that chain. velocity / noise: whether the
        velocity network / the noise network train (requires_grad); the other is
        frozen. Returns the trainable actor parameters (the critic is the learner's to
        add). The observation normalizer is a buffer and never trains here. Other step
        counts stay possible afterwards, but a shortcut model's other step sizes are not
        what ReinFlow tuned.
        """
        k = check_steps(self.cfg.sample_steps if steps is None else steps)
        self.ft_steps.fill_(k)
        for net, on in ((self.actor, velocity), (self.noise_net, noise)):
            for p in net.parameters():
                p.requires_grad_(on)
        return [
            p
            for net, on in ((self.actor, velocity), (self.noise_net, noise))
            if on
            for p in net.parameters()
        ]

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor parameters that currently train (requires_grad)."""
        nets = (self.actor, self.noise_net)
        return [p for net in nets for p in net.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ training
    def _randn(self, shape: tuple[int, ...], generator, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(like.device, like.dtype)

    def _rand(self, shape: tuple[int, ...], generator, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(shape, generator=generator).to(like.device, like.dtype)

    def _consistency_draws(
        self, n: int, generator, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step counts K (as step sizes 1/K) and grid times t = j/K for n rows."""
        m = self.cfg.shortcut_max_steps
        ks = torch.arange(1, m + 1, dtype=torch.float64)
        probs = 1.0 / ks
        k = torch.multinomial(probs / probs.sum(), n, replacement=True, generator=generator) + 1
        j = torch.floor(torch.rand(n, generator=generator, dtype=torch.float64) * k)
        k = k.to(torch.float64)
        return (1.0 / k).to(like.device, like.dtype), (j / k).to(like.device, like.dtype)

    def consistency_target(
        self,
        feat: torch.Tensor,
        xt: torch.Tensor,
        t: torch.Tensor,
        big: torch.Tensor,
        box: tuple[torch.Tensor | float, torch.Tensor | float] | None = None,
        teacher: FlowPolicy | None = None,
    ) -> torch.Tensor:
        """The shortcut target for v(x_t, t, 2h) [n, Tp, A]: the mean of two half steps
        of ``teacher``'s velocity network (default this one's), without gradient.

        ``box`` (lo, hi): each half step's velocity is held inside what a flow onto
        chunks within [lo, hi] can have: from x at time s no average velocity leaves
        (lo - x) / (1 - s) .. (hi - x) / (1 - s) (the marginal velocity points at
        E[x1 | x], which lies in the box, and that keeps the path's end in it), so a
        correct teacher is never clipped and the mean of the two half steps obeys the
        same bound at (x_t, t). A wrong teacher can no longer feed its own outputs back
        through x_mid: FPO from flow BC on halfcheetah (clipped chunks, seed 0) diverged
        at 790k steps that way, the consistency loss 0.03 -> 1e6 in 10 updates
        (docs/benchmarks_flow.md)."""
        n = xt.shape[0]
        tt = t.view(n, 1, 1)
        half = 0.5 * big
        hh = half.view(n, 1, 1)
        # half steps finer than the trained range ask for the instantaneous velocity
        fine = half < (1.0 / self.cfg.shortcut_max_steps) - 1e-9
        dq = torch.where(fine, torch.zeros_like(half), half)
        net = self if teacher is None else teacher

        def bound(v: torch.Tensor, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            return v if box is None else _toward_box(v, x, s, box[0], box[1])

        with torch.no_grad():
            v1 = bound(net.velocity(xt, t, dq, feat), xt, tt)
            x_mid = xt + hh * v1
            v2 = bound(net.velocity(x_mid, t + half, dq, feat), x_mid, tt + hh)
            return 0.5 * (v1 + v2)

    def _consistency_error(
        self,
        feat: torch.Tensor,
        x1: torch.Tensor,
        x0: torch.Tensor,
        big: torch.Tensor,
        t: torch.Tensor,
        teacher: FlowPolicy | None = None,
        box: tuple[torch.Tensor | float, torch.Tensor | float] | None = None,
    ) -> torch.Tensor:
        """Squared error [n, Tp, A] of v(x_t, t, 2h) against :meth:`consistency_target`."""
        tt = t.view(-1, 1, 1)
        xt = (1.0 - tt) * x0 + tt * x1
        target = self.consistency_target(feat, xt, t, big, box, teacher)
        return (self.velocity(xt, t, big, feat) - target).square()

    def _bc_loss(
        self, feat: torch.Tensor, x1: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Shortcut flow-matching loss of the velocity network on demonstration chunks
        (:meth:`bc_loss`).

        The first rows (1 - consistency_fraction of B) regress x1 - x0 at d = 0; the
        rest the self-consistency target (module docstring). Mean over every element.
        """
        b = x1.shape[0]
        x0 = self._randn(tuple(x1.shape), generator, x1)
        n_sc = int(b * self.cfg.consistency_fraction) if self.cfg.shortcut else 0
        n_fm = b - n_sc
        t = self._rand((n_fm,), generator, x1)
        tt = t.view(-1, 1, 1)
        xt = (1.0 - tt) * x0[:n_fm] + tt * x1[:n_fm]
        pred = self.velocity(xt, t, torch.zeros_like(t), feat[:n_fm])
        err = (pred - (x1[:n_fm] - x0[:n_fm])).square()
        if n_sc == 0:
            return err.mean()
        big, t_sc = self._consistency_draws(n_sc, generator, x1)
        err_sc = self._consistency_error(feat[n_fm:], x1[n_fm:], x0[n_fm:], big, t_sc)
        return (err.sum() + err_sc.sum()) / (b * self.chunk_dim)

    def consistency_loss(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        x1: torch.Tensor,
        generator: torch.Generator | None = None,
        target: FlowPolicy | None = None,
    ) -> torch.Tensor:
        """The self-consistency term alone, on normalized chunks x1 [B, horizon, A] (e.g.
        a learner's own samples): keeps the few-step shortcut in step with the
        instantaneous velocity that flow-matching fine-tuning (FPO) changes.

        ``target``: a frozen copy whose velocities make the two-half-step targets. Without
        the flow-matching regression that anchors them in behaviour cloning, targets taken
        from the network being trained chase its own outputs: FPO from scratch on hopper
        diverged so (consistency loss 3e-4 -> 0.1 -> 1.5e6 over two updates, then every
        step non-finite) until the targets came from the rollout's parameters. Over many
        updates a frozen copy still feeds on the network of the update before, so the
        targets are bounded too (:meth:`consistency_target`); behaviour cloning, whose
        flow-matching rows anchor every step to the data, never ran away and trains
        without the bound, bit for bit as before it."""
        self._check_chunks(x1, "consistency_loss: x1")
        if not self.cfg.shortcut:
            return x1.new_zeros(())
        feat = self.obs_features(obs)
        x0 = self._randn(tuple(x1.shape), generator, x1)
        big, t = self._consistency_draws(x1.shape[0], generator, x1)
        # the box of the chunks widened by twice its width on each side: the bound only
        # has to be finite to break the feedback, and it should not touch a healthy run.
        # A fitted teacher errs across the data's edge (60% of halfcheetah's demonstration
        # entries lie on the action bounds; the exact box clipped 25% of a trained flow
        # BC policy's velocities there, one way only, and flow BC trained with it lost 8%
        # on hopper, 3 of 3 seeds), and from scratch x0's tails lie beyond a box widened
        # once ([-3, 3] for chunks in [-1, 1]: clipped from the first update on, and runs
        # from scratch changed); at [-5, 5] hopper from scratch runs as unbounded, bit for
        # bit, and the runaway of halfcheetah at 790k still stops (consistency loss under
        # 0.07 to 860k, where it reached 1e20 unbounded)
        lo, hi = x1.detach().min(), x1.detach().max()
        box = (lo - 2 * (hi - lo), hi + 2 * (hi - lo))
        return self._consistency_error(feat, x1, x0, big, t, target, box).mean()

    def cfm_loss(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        x1: torch.Tensor,
        tau: torch.Tensor,
        eps: torch.Tensor,
        reduce: str = "mean",
    ) -> torch.Tensor:
        """Conditional flow-matching losses of given draws, [B, N], with gradient.

        x1: normalized chunks [B, horizon, A]; tau [B, N] in [0, 1]; eps [B, N, horizon,
        A] (the x0 of each draw). Entry [b, i] is the ``reduce`` ("mean" or "sum") over
        the chunk of (v(x_tau, tau, 0) - (x1 - eps))^2 with x_tau = (1 - tau) eps +
        tau x1. No randomness inside: the same draws give the same losses under the
        same parameters, which is what FPO's ratio needs.
        """
        self._check_chunks(x1, "cfm_loss: x1")
        b, n = tau.shape[0], tau.shape[-1]
        if tau.shape != (b, n) or b != x1.shape[0] or tuple(eps.shape) != (b, n, *x1.shape[1:]):
            raise ValueError(
                f"cfm_loss: tau must be [B, N] and eps [B, N, {self.cfg.horizon}, "
                f"{self.action_size}] with B = {x1.shape[0]}, got {tuple(tau.shape)} and "
                f"{tuple(eps.shape)}"
            )
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {list(REDUCTIONS)}, got {reduce!r}")
        feat = self.obs_features(obs)
        tt = tau.reshape(b * n, 1, 1)
        e = eps.reshape(b * n, *x1.shape[1:])
        xs = x1.unsqueeze(1).expand(b, n, *x1.shape[1:]).reshape(b * n, *x1.shape[1:])
        xt = (1.0 - tt) * e + tt * xs
        f = feat.unsqueeze(1).expand(b, n, feat.shape[-1]).reshape(b * n, -1)
        t = tau.reshape(-1)
        v = self.velocity(xt, t, torch.zeros_like(t), f)
        err = (v - (xs - e)).square().reshape(b, n, -1)
        return reduce_last(err, reduce)

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = True,
        return_chain: bool = False,
        *,
        noise: torch.Tensor | None = None,
    ) -> FlowSample:
        """Run the Euler chain for a batch of observations.

        steps: Euler steps (default: ``self.steps``). stochastic: ReinFlow's chain, with
        the noise network's Gaussian noise after every step; False: deterministic given
        x0. noise: the draws instead of the generator's, as the exported graph takes
        them: x0 [B, horizon, A], or with stochastic [B, K + 1, horizon, A] (x0, then
        the K standard-normal draws the noise network scales).
        """
        k_steps = check_steps(self.steps if steps is None else steps)
        feat = self.obs_features(obs)
        b = feat.shape[0]
        shape = (b, self.cfg.horizon, self.action_size)
        z: torch.Tensor | None = None
        if noise is None:
            x = self._randn(shape, generator, feat)
        else:
            want = (b, k_steps + 1, *shape[1:]) if stochastic else shape
            if tuple(noise.shape) != want:
                raise ValueError(f"noise must have shape {want}, got {tuple(noise.shape)}")
            noise = noise.to(feat.device, feat.dtype)
            x = noise[:, 0] if stochastic else noise
            z = noise[:, 1:] if stochastic else None
        xs = [x] if return_chain else None
        d = torch.full((b,), self.step_size_input(k_steps), device=feat.device, dtype=feat.dtype)
        for k in range(k_steps):
            t = torch.full((b,), k / k_steps, device=feat.device, dtype=feat.dtype)
            v = self.velocity(x, t, d, feat)
            x_next = x + v / k_steps
            if stochastic:
                draw = self._randn(shape, generator, feat) if z is None else z[:, k]
                x_next = x_next + self.noise_std(x, t, feat) * draw
            x = x_next
            if xs is not None:
                xs.append(x)
        actions = self.denormalize_actions(x.clamp(-1.0, 1.0))
        return FlowSample(actions, torch.stack(xs, dim=1) if xs is not None else None)

    def chain_moments(
        self, obs: Mapping[str, torch.Tensor] | torch.Tensor, chain: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Means and stds [B, K, horizon, A] of the K Gaussian transitions of stored
        chains [B, K + 1, horizon, A], with gradient; every step in one batched call per
        network."""
        feat = self.obs_features(obs)
        b = feat.shape[0]
        if (
            chain.dim() != 4
            or chain.shape[0] != b
            or chain.shape[2:]
            != (
                self.cfg.horizon,
                self.action_size,
            )
        ):
            raise ValueError(
                f"chain must be [B={b}, K + 1, {self.cfg.horizon}, {self.action_size}], "
                f"got {tuple(chain.shape)}"
            )
        k_steps = check_steps(chain.shape[1] - 1, "the chain's steps (chain.shape[1] - 1)")
        x_in = chain[:, :-1].reshape(b * k_steps, self.cfg.horizon, self.action_size)
        t = (torch.arange(k_steps, device=chain.device, dtype=chain.dtype) / k_steps).repeat(b)
        d = torch.full_like(t, self.step_size_input(k_steps))
        f = feat.unsqueeze(1).expand(b, k_steps, feat.shape[-1]).reshape(b * k_steps, -1)
        mean = x_in + self.velocity(x_in, t, d, f) / k_steps
        std = self.noise_std(x_in, t, f)
        shape = (b, k_steps, self.cfg.horizon, self.action_size)
        return mean.view(shape), std.view(shape)

    def chain_terms(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        chain: torch.Tensor,
        reduce: str = "sum",
    ) -> ChainTerms:
        """Log-probabilities, entropies and stds of stored chains' transitions (one pass).

        log_prob [B, K, horizon]: entry [:, k, j] is log N(x_{k+1}; x_k + v/K, sigma_k^2)
        of chunk position j, reduced over the action dimensions by ``reduce`` ("sum": the
        exact log-density; "mean": the per-dimension average, as DPPO's logprob_reduce);
        entropy [B, K, horizon]: each transition's Gaussian entropy, reduced the same
        way; std [B, K, horizon, A]: the noise network's sigma. With gradient to the
        velocity and the noise network.
        """
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {list(REDUCTIONS)}, got {reduce!r}")
        mean, std = self.chain_moments(obs, chain)
        lp = gaussian_log_prob_per_dim(chain[:, 1:], mean, std)
        ent = torch.log(std) + 0.5 * _LOG_2PI_E
        return ChainTerms(reduce_last(lp, reduce), reduce_last(ent, reduce), std)

    def chain_log_prob(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        chain: torch.Tensor,
        reduce: str = "sum",
    ) -> torch.Tensor:
        """Log-probabilities [B, K, horizon] of stored chains [B, K + 1, horizon, A], per
        Euler step and chunk position (see :meth:`chain_terms`); with "sum", the chain's
        log-probability is the sum of all entries."""
        return self.chain_terms(obs, chain, reduce).log_prob

    # ------------------------------------------------------------------ export
    def inference_module(self, steps: int | None = None, stochastic: bool = False) -> FlowInference:
        """A frozen module, deterministic given its noise input: observation
        normalization, ``steps`` Euler steps unrolled (default ``self.steps``), chunk
        execution as state when act_steps > 1; with ``stochastic`` the noise network's
        noise after every step (ReinFlow's exploration), from the noise input."""
        k_steps = check_steps(self.steps if steps is None else steps)
        module = FlowInference(self, k_steps, bool(stochastic))
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)
        return module

    def forward(self, obs: Mapping[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The first action of the deterministic chunk from x0 = 0 (the runtime's
        deterministic mode); for quick checks."""
        feat = self.obs_features(obs)
        zeros = feat.new_zeros(feat.shape[0], self.cfg.horizon, self.action_size)
        return self.sample(obs, stochastic=False, noise=zeros).actions[:, 0]
