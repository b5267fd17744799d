"""Diffusion policies: a noise predictor over action chunks, DDPM training, DDPM/DDIM sampling.

The policy maps an observation (the last ``obs_history`` frames, stacked oldest first as
the simulator and the robot runtime stack them) to a *chunk* of ``horizon`` actions, of
which the first ``act_steps`` are executed before the policy is asked again. Actions are
denoised in a normalized space, ``[-1, 1]`` per joint over the task's action bounds.

Noise schedule. ``num_train_steps`` (T) diffusion steps with a cosine (or linear) beta
schedule; ``abar[t]`` is the cumulative product of ``1 - beta``. Training is DDPM's
epsilon regression: ``x_t = sqrt(abar[t]) x0 + sqrt(1 - abar[t]) eps`` and the network
predicts ``eps`` (:meth:`DiffusionPolicy.bc_loss`).

Sampling chain. A sampler visits N timesteps ``tau_0 > ... > tau_{N-1}`` (evenly spaced
over T; ``tau_{N-1} = 0``) and each *denoising step* k maps ``x_k`` to
``x_{k+1} ~ N(mu_k(x_k), sigma_k^2)``::

    eps  = net(x_k, tau_k, obs)
    x0   = clip((x_k - sqrt(1 - a) eps) / sqrt(a), -c, c)        a = abar[tau_k]
    eps' = (x_k - sqrt(a) x0) / sqrt(1 - a)                       (consistent with x0)
    mu_k = sqrt(a') x0 + sqrt(1 - a' - sigma_k^2) eps'            a' = abar[tau_{k+1}] (1 at the end)
    sigma_k = eta * sqrt((1 - a') / (1 - a) * (1 - a / a'))

``eta = 0`` is DDIM (deterministic given x_0 ~ N(0, I)); ``eta = 1`` is DDPM's ancestral
sampler (exactly DDPM when N = T). The ``ddpm`` sampler is eta = 1, ``ddim`` takes eta.

Fine-tuning (DPPO). Every step of the chain is a Gaussian policy of the inner
"denoising MDP"; with a std floor ``min_std`` (sampling and log-probability use
``max(sigma_k, min_std)``) the log-likelihood of a stored chain is exact and finite.
:meth:`DiffusionPolicy.enable_finetuning` makes a trainable copy ``actor_ft`` of the
noise predictor that runs the last K' steps of the chain; the pretrained ``actor`` is
frozen and runs the earlier steps (and serves as the behaviour-cloning reference).

Deployment. :meth:`DiffusionPolicy.inference_module` unrolls the DDIM sampler (eta 0)
for ``sample_steps`` steps into a plain module with observation normalization inside:
``forward(obs, noise[, action_chunk, chunk_step]) -> (actions[, next_action_chunk,
next_chunk_step])``; ``noise`` is x_0 of the chain, ``[B, horizon, A]``; sampling it
from N(0, I) (the runtime's default, seeded) is how the policy is meant to run. All-zero
noise (what the runtime feeds in its deterministic mode) selects the policy's
``canonical_noise``, one fixed draw of N(0, I) saved with the weights: the prior's mean
x_0 = 0 is nothing the denoiser was trained on (a typical x_0 has norm
sqrt(horizon * A)). Either way a deterministic diffusion policy repeats one fixed draw
at every decision, which can be much worse than sampling (docs/benchmarks_dppo.md:
HalfCheetah BC about 490 sampled, -30 from zeros, -520 from the canonical draw). With ``act_steps > 1`` the chunk being executed and the position in
it travel as recurrent state, so a stateless graph executes chunks exactly as training
did: a new chunk is sampled whenever ``chunk_step`` is 0 (the runtime's initial state).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from policies.chunked import ACTIVATIONS as ACTIVATIONS  # its old home
from policies.chunked import (
    ChunkConfig,
    ChunkInference,
    ChunkInfo,
    ChunkNet,
    ChunkPolicy,
    gaussian_log_prob_per_dim,
    sinusoid,
)

BETA_SCHEDULES = ("cosine", "linear")
SAMPLERS = ("ddim", "ddpm")

__all__ = [
    "Chain",
    "DiffusionConfig",
    "DiffusionInference",
    "DiffusionInfo",
    "DiffusionPolicy",
    "DiffusionSample",
    "NoisePredictor",
    "diffusion_exporter",
    "gaussian_log_prob_per_dim",
    "make_betas",
]


@dataclass
class DiffusionConfig(ChunkConfig):
    """Shapes of the chunk, the noise schedule, the sampler and the networks.

    The policy predicts chunks of horizon (Tp) actions and executes act_steps (Ta) of
    them (:class:`policies.chunked.ChunkConfig`); its sampler runs sample_steps (N) of
    the num_train_steps (T) diffusion steps.
    """

    num_train_steps: int = 20
    """Diffusion steps T of the training schedule."""
    beta_schedule: str = "cosine"
    """Beta schedule of the forward process over the T steps: "cosine" (Nichol & Dhariwal
    2021) or "linear" (see make_betas)."""
    sampler: str = "ddim"
    """The chain used for deployment, evaluation and DPPO: "ddpm" means eta = 1, "ddim"
    uses eta. Export always unrolls DDIM with eta = 0 (only x_0 is noise)."""
    sample_steps: int = 5
    """Timesteps N of the sampling chain, out of the T of the training schedule (N <= T)."""
    eta: float = 0.0
    """Noise of the "ddim" sampler, in [0, 1]: 0 is deterministic DDIM given x_0, 1 is
    DDPM's ancestral sampler (the "ddpm" sampler ignores it and uses 1)."""
    clip_sample: float = 1.0
    """The x0 prediction is clipped to [-c, c] in normalized action space (0 disables)."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden layer sizes of the MLP noise predictor (non-empty, positive ints)."""
    time_dim: int = 16
    """Size of the diffusion-time embedding of the noise predictor (sinusoid -> MLP; even,
    >= 2)."""
    activation: str = "mish"
    """Activation of the noise predictor and the value network: mish, silu, relu or elu."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the value network (used by DPPO; BC leaves it untrained)."""
    normalize_obs: bool = True
    """Running mean/std normalization of observations inside the module (saved with the
    weights and exported with them)."""

    def __post_init__(self) -> None:
        self.hidden = tuple(self.hidden)
        self.critic_hidden = tuple(self.critic_hidden)
        bad = self._bad
        self._check_chunk("num_train_steps", "sample_steps")
        if self.sample_steps > self.num_train_steps:
            raise bad("sample_steps", f"must be <= num_train_steps ({self.num_train_steps})")
        self._check_networks("hidden", "critic_hidden")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise bad("beta_schedule", f"must be one of {list(BETA_SCHEDULES)}")
        if self.sampler not in SAMPLERS:
            raise bad("sampler", f"must be one of {list(SAMPLERS)}")
        if not (math.isfinite(self.eta) and 0.0 <= self.eta <= 1.0):
            raise bad("eta", "must be in [0, 1]")
        if not (math.isfinite(self.clip_sample) and self.clip_sample >= 0.0):
            raise bad("clip_sample", "must be >= 0 (0 disables clipping)")


def make_betas(num_steps: int, schedule: str = "cosine") -> torch.Tensor:
    """Betas of the forward process, float64 [T].

    cosine (Nichol & Dhariwal 2021): abar(t) = cos^2(pi/2 (t/T + s)/(1 + s)), s = 0.008,
    beta_t = 1 - abar(t+1)/abar(t) clipped to 0.999; linear: 1e-4 ... 0.02 scaled to T.
    """
    if schedule == "cosine":
        s = 0.008
        t = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
        f = torch.cos((t + s) / (1 + s) * math.pi / 2).square()
        return (1.0 - f[1:] / f[:-1]).clamp(max=0.999)
    if schedule == "linear":
        scale = 1000.0 / num_steps
        return torch.linspace(
            scale * 1e-4, min(scale * 0.02, 0.999), num_steps, dtype=torch.float64
        )
    raise ValueError(f"unknown beta schedule {schedule!r}; choose one of {list(BETA_SCHEDULES)}")


@dataclass(frozen=True)
class Chain:
    """The per-step constants of a sampling chain (Python floats: constants in a graph).

    timesteps[k] is tau_k; for step k: sqrt_ab = sqrt(abar[tau_k]), sqrt_1m_ab =
    sqrt(1 - abar[tau_k]), sqrt_ab_prev = sqrt(abar[tau_{k+1}]) (1 after the last step),
    dir_coef = sqrt(1 - abar' - sigma^2), sigma = the sampler's own std.
    """

    timesteps: tuple[int, ...]
    eta: float
    sqrt_ab: tuple[float, ...]
    sqrt_1m_ab: tuple[float, ...]
    sqrt_ab_prev: tuple[float, ...]
    dir_coef: tuple[float, ...]
    sigma: tuple[float, ...]

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    def stds(self, min_std: float) -> tuple[float, ...]:
        """Per-step std with the floor applied: max(sigma_k, min_std)."""
        return tuple(max(s, min_std) for s in self.sigma)

    def tensor(self, name: str, start: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
        return torch.tensor(getattr(self, name)[start:], device=device, dtype=dtype)


def make_chain(abar: torch.Tensor, steps: int, eta: float) -> Chain:
    """Evenly spaced timesteps tau_k = floor((N-1-k) * T / N), k = 0..N-1 (last tau is 0)."""
    total = int(abar.shape[0])
    if not 1 <= steps <= total:
        raise ValueError(f"a chain needs 1 <= steps <= {total}, got {steps}")
    taus = [int((steps - 1 - k) * total // steps) for k in range(steps)]
    a = abar.to(torch.float64).tolist()
    sab, s1m, sprev, dcoef, sig = [], [], [], [], []
    for k, tau in enumerate(taus):
        at = a[tau]
        ap = a[taus[k + 1]] if k + 1 < steps else 1.0
        sigma = eta * math.sqrt(max((1.0 - ap) / (1.0 - at) * (1.0 - at / ap), 0.0))
        sab.append(math.sqrt(at))
        s1m.append(math.sqrt(1.0 - at))
        sprev.append(math.sqrt(ap))
        dcoef.append(math.sqrt(max(1.0 - ap - sigma * sigma, 0.0)))
        sig.append(sigma)
    return Chain(tuple(taus), float(eta), *(tuple(v) for v in (sab, s1m, sprev, dcoef, sig)))


class NoisePredictor(ChunkNet):
    """eps(x_t, t, obs): an MLP over [x_t flattened, time embedding, obs features].

    The time embedding (sinusoid -> MLP) is a separate method so that a sampler with
    fixed timesteps can compute it once (export keeps it as a constant).
    """

    def __init__(
        self, obs_dim: int, chunk_dim: int, hidden: tuple[int, ...], time_dim: int, activation: str
    ) -> None:
        super().__init__(obs_dim, chunk_dim, hidden, time_dim, activation, time_in=time_dim)

    def embed_time(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(sinusoid(t, self.time_dim))


class DiffusionSample(NamedTuple):
    """actions: [B, horizon, A] in env units (the normalized chain end, clipped to
    [-1, 1], mapped onto the action bounds); chain: [B, N + 1, horizon, A] in normalized
    space (x_0 = the initial noise ... x_N = the unclipped end), or None."""

    actions: torch.Tensor
    chain: torch.Tensor | None


@dataclass(frozen=True)
class DiffusionInfo(ChunkInfo):
    """The interface of a diffusion inference module (what export checks): obs_size,
    action_size, horizon, act_steps (:class:`policies.chunked.ChunkInfo`), sample_steps."""

    sample_steps: int
    policy_family: str = "diffusion"

    @property
    def noise_shape(self) -> tuple[int, int]:
        return (self.horizon, self.action_size)

    @property
    def noise_layout(self) -> str:
        return "[horizon, actions]"


class DiffusionPolicy(ChunkPolicy):
    """Diffusion actor over action chunks, with a value critic for fine-tuning.

    Built as :class:`policies.chunked.ChunkPolicy` (observation and action sizes, action
    bounds, critic observations, a :class:`DiffusionConfig`).
    """

    cfg: DiffusionConfig
    config_type = DiffusionConfig

    def _build_actor(self) -> None:
        cfg = self.cfg
        betas = make_betas(cfg.num_train_steps, cfg.beta_schedule)
        abar = torch.cumprod(1.0 - betas, dim=0)
        self.register_buffer("alphas_cumprod", abar.to(torch.float32))
        self._abar64 = abar
        self.actor = NoisePredictor(
            self.policy_obs_size, self.chunk_dim, cfg.hidden, cfg.time_dim, cfg.activation
        )
        self.actor_ft: NoisePredictor | None = None
        self.register_buffer("ft_steps", torch.zeros((), dtype=torch.int64))
        # the deterministic mode's starting point: one fixed draw of x_0 ~ N(0, I).
        # x_0 = 0 (the prior's mean) is far from every x_0 the denoiser was trained on
        # (their norm is about sqrt(horizon * A)), and sampling from it can fail badly.
        gen = torch.Generator().manual_seed(0)
        self.register_buffer(
            "canonical_noise", torch.randn(cfg.horizon, self.action_size, generator=gen)
        )

    # ------------------------------------------------------------------ description
    @property
    def info(self) -> DiffusionInfo:
        c = self.cfg
        return DiffusionInfo(
            self.policy_obs_size, self.action_size, c.horizon, c.act_steps, c.sample_steps
        )

    @property
    def policy_family(self) -> str:
        return "diffusion"

    @property
    def num_ft_steps(self) -> int:
        """K': the chain's last K' steps run the fine-tuned copy (0: not fine-tuning)."""
        return int(self.ft_steps.item())

    def chain(
        self, steps: int | None = None, eta: float | None = None, sampler: str | None = None
    ) -> Chain:
        """The sampling chain: cfg.sampler/sample_steps/eta unless overridden."""
        sampler = sampler or self.cfg.sampler
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; choose one of {list(SAMPLERS)}")
        steps = self.cfg.sample_steps if steps is None else int(steps)
        if sampler == "ddpm":
            eta = 1.0
        eta = self.cfg.eta if eta is None else float(eta)
        return make_chain(self._abar64, steps, eta)

    # ------------------------------------------------------------------ networks
    def net_for_step(self, k: int, num_steps: int) -> NoisePredictor:
        """The network that runs chain step k of num_steps (fine-tuned copy for the last K')."""
        if self.actor_ft is not None and k >= num_steps - self.num_ft_steps:
            return self.actor_ft
        return self.actor

    def enable_finetuning(self, ft_steps: int) -> None:
        """Run the chain's last ft_steps steps with a trainable copy; freeze the rest.

        The pretrained ``actor`` keeps requires_grad False from now on (it runs the
        earlier steps and is the behaviour-cloning reference); only ``actor_ft`` and the
        critic are trainable. Calling it again with another K' keeps the current copy.
        """
        n = self.cfg.sample_steps
        if not 1 <= ft_steps <= n:
            raise ValueError(f"ft_steps must be in [1, sample_steps={n}], got {ft_steps}")
        if self.actor_ft is None:
            self.actor_ft = copy.deepcopy(self.actor)
        self.ft_steps.fill_(int(ft_steps))
        for p in self.actor.parameters():
            p.requires_grad_(False)
        for p in self.actor_ft.parameters():
            p.requires_grad_(True)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ):
        # a fine-tuned policy's state has the copy: build it before loading into it
        if self.actor_ft is None and any(k.startswith("actor_ft.") for k in state_dict):
            self.enable_finetuning(int(state_dict["ft_steps"]))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The trainable actor parameters: actor_ft when fine-tuning, else actor."""
        return list((self.actor_ft if self.actor_ft is not None else self.actor).parameters())

    def _eps(
        self, net: NoisePredictor, x: torch.Tensor, t: torch.Tensor, feat: torch.Tensor
    ) -> torch.Tensor:
        """x [B, Tp, A], t [B] (timesteps), feat [B, O] -> eps [B, Tp, A]."""
        b = x.shape[0]
        return net(x.reshape(b, -1), net.embed_time(t), feat).view_as(x)

    def _mean(
        self,
        x: torch.Tensor,
        eps: torch.Tensor,
        sab: torch.Tensor | float,
        s1m: torch.Tensor | float,
        sprev: torch.Tensor | float,
        dcoef: torch.Tensor | float,
    ) -> torch.Tensor:
        x0 = (x - s1m * eps) / sab
        c = self.cfg.clip_sample
        if c > 0:
            x0 = x0.clamp(-c, c)
        eps = (x - sab * x0) / s1m
        return sprev * x0 + dcoef * eps

    # ------------------------------------------------------------------ training
    def _bc_loss(
        self, feat: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """DDPM epsilon-regression loss of the (pretraining) actor on demonstration chunks
        (:meth:`bc_loss`)."""
        b = x0.shape[0]
        t = torch.randint(0, self.cfg.num_train_steps, (b,), generator=generator).to(x0.device)
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        abar = self.alphas_cumprod[t].view(b, 1, 1)
        xt = abar.sqrt() * x0 + (1.0 - abar).sqrt() * noise
        pred = self._eps(self.actor, xt, t, feat)
        return (pred - noise).square().mean()

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        *,
        chain: Chain | None = None,
        noise: torch.Tensor | None = None,
        min_std: float = 0.0,
        return_chain: bool = False,
        reference: bool = False,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> DiffusionSample:
        """Run the chain (default: cfg's sampler) for a batch of observations.

        noise: x_0 [B, horizon, A] (default: standard normal). deterministic: start every
        row from the policy's ``canonical_noise`` (the export's deterministic mode).
        min_std: std floor of every step, max(sigma_k, min_std) (DPPO's exploration);
        with 0 and eta 0 the chain is deterministic given x_0. reference: use the frozen
        pretrained actor at every step (the BC reference), not the fine-tuned copy.
        """
        chain = chain or self.chain()
        feat = self.obs_features(obs)
        b = feat.shape[0]
        shape = (b, self.cfg.horizon, self.action_size)
        if deterministic:
            x = self.canonical_noise.to(feat.dtype).expand(shape).clone()
        elif noise is None:
            x = torch.randn(shape, generator=generator).to(feat.device)
        else:
            if tuple(noise.shape) != shape:
                raise ValueError(f"noise must have shape {shape}, got {tuple(noise.shape)}")
            x = noise.to(feat.device, feat.dtype)
        xs = [x] if return_chain else None
        stds = chain.stds(min_std)
        n = chain.num_steps
        for k in range(n):
            net = self.actor if reference else self.net_for_step(k, n)
            t = torch.full((b,), chain.timesteps[k], device=feat.device, dtype=torch.long)
            eps = self._eps(net, x, t, feat)
            x = self._mean(
                x,
                eps,
                chain.sqrt_ab[k],
                chain.sqrt_1m_ab[k],
                chain.sqrt_ab_prev[k],
                chain.dir_coef[k],
            )
            if stds[k] > 0:
                x = x + stds[k] * torch.randn(shape, generator=generator).to(x.device)
            if xs is not None:
                xs.append(x)
        actions = self.denormalize_actions(x.clamp(-1.0, 1.0))
        return DiffusionSample(actions, torch.stack(xs, dim=1) if xs is not None else None)

    def chain_log_prob(
        self,
        obs: Mapping[str, torch.Tensor] | torch.Tensor,
        chain_x: torch.Tensor,
        *,
        chain: Chain | None = None,
        start: int = 0,
        min_std: float = 0.1,
        reference: bool = False,
    ) -> torch.Tensor:
        """Per-dimension log-probabilities of stored chain transitions, with gradient.

        chain_x: [B, N + 1 - start, horizon, A], the states x_start ... x_N (normalized
        space). Returns [B, N - start, horizon, A]: entry [:, i] is
        log N(x_{start+i+1}; mu_{start+i}(x_{start+i}), max(sigma, min_std)^2) per
        dimension. The log-probability of the stored chain is the sum of all entries.
        All steps are evaluated in one batched network call per network.
        """
        chain = chain or self.chain()
        n = chain.num_steps
        if not 0 <= start < n:
            raise ValueError(f"start must be in [0, {n}), got {start}")
        k_steps = n - start
        feat = self.obs_features(obs)
        b = feat.shape[0]
        want = (b, k_steps + 1, self.cfg.horizon, self.action_size)
        if tuple(chain_x.shape) != want:
            raise ValueError(f"chain_x must have shape {want}, got {tuple(chain_x.shape)}")
        dev, dt = chain_x.device, chain_x.dtype
        x_in = chain_x[:, :-1]
        x_out = chain_x[:, 1:]
        means = torch.empty_like(x_in)
        # group the steps by the network that runs them (frozen actor / fine-tuned copy)
        groups: dict[int, list[int]] = {}
        nets: dict[int, NoisePredictor] = {}
        for i in range(k_steps):
            net = self.actor if reference else self.net_for_step(start + i, n)
            groups.setdefault(id(net), []).append(i)
            nets[id(net)] = net
        for key, idx in groups.items():
            net = nets[key]
            m = len(idx)
            ks = [start + i for i in idx]
            xi = x_in[:, idx].reshape(b * m, self.cfg.horizon, self.action_size)
            t = torch.tensor([chain.timesteps[k] for k in ks], device=dev).repeat(b)
            f = feat.unsqueeze(1).expand(b, m, feat.shape[-1]).reshape(b * m, -1)
            eps = self._eps(net, xi, t, f)

            def coef(name: str, ks=ks) -> torch.Tensor:
                vals = getattr(chain, name)
                return (
                    torch.tensor([vals[k] for k in ks], device=dev, dtype=dt)
                    .repeat(b)
                    .view(-1, 1, 1)
                )

            mu = self._mean(
                xi, eps, coef("sqrt_ab"), coef("sqrt_1m_ab"), coef("sqrt_ab_prev"), coef("dir_coef")
            )
            means[:, idx] = mu.view(b, m, self.cfg.horizon, self.action_size)
        std = torch.tensor(chain.stds(min_std)[start:], device=dev, dtype=dt).view(1, -1, 1, 1)
        return gaussian_log_prob_per_dim(x_out, means, std)

    # ------------------------------------------------------------------ export
    def inference_module(self, steps: int | None = None) -> DiffusionInference:
        """A frozen, deterministic-given-noise module: DDIM (eta 0) unrolled for ``steps``
        (default cfg.sample_steps), chunk execution as state when act_steps > 1."""
        steps = self.cfg.sample_steps if steps is None else int(steps)
        if self.actor_ft is not None and steps != self.cfg.sample_steps:
            raise ValueError(
                f"a fine-tuned policy runs the chain it was fine-tuned on: steps must be "
                f"{self.cfg.sample_steps}, got {steps}"
            )
        chain = make_chain(self._abar64, steps, 0.0)
        module = DiffusionInference(self, chain)
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)
        return module

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The first action of a deterministic chunk (canonical noise); for quick checks."""
        return self.sample(obs, deterministic=True, chain=self.chain(eta=0.0)).actions[:, 0]


class DiffusionInference(ChunkInference):
    """The deployable diffusion policy: normalizer, the unrolled DDIM sampler, chunk state.

    forward(obs [B, O], noise [B, Tp, A]) -> actions [B, A] when act_steps == 1;
    forward(obs, noise, action_chunk [B, Ta, A], chunk_step [B, 1]) ->
    (actions, next_action_chunk, next_chunk_step) otherwise
    (:class:`policies.chunked.ChunkInference`).
    """

    def __init__(self, policy: DiffusionPolicy, chain: Chain) -> None:
        super().__init__()
        self.info = policy.info
        self.normalizer = copy.deepcopy(policy.obs_normalizer)
        self.actor = copy.deepcopy(policy.actor)
        self.actor_ft = copy.deepcopy(policy.actor_ft) if policy.actor_ft is not None else None
        n = chain.num_steps
        self.chain = chain
        self.clip_sample = policy.cfg.clip_sample
        use_ft = [policy.net_for_step(k, n) is policy.actor_ft for k in range(n)]
        self.use_ft = use_ft
        with torch.no_grad():
            temb = []
            for k in range(n):
                temb.append(self._net(k).embed_time(torch.tensor([chain.timesteps[k]])).squeeze(0))
        self.register_buffer("temb", torch.stack(temb))
        self.denoise: nn.ModuleList | None = None  # the folded steps (export)
        self._init_chunk_execution(policy)
        self.register_buffer("canonical_noise", policy.canonical_noise.reshape(1, -1).clone())

    def _net(self, k: int) -> nn.Module:
        return self.actor_ft if self.use_ft[k] and self.actor_ft is not None else self.actor

    def _fold(self) -> None:
        self.denoise = nn.ModuleList(
            self._net(k).at_time(self.temb[k]) for k in range(self.chain.num_steps)
        )

    def sample_chunk(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The whole chunk [B, Tp, A] in env units, from x_0 = noise."""
        feat = self.normalizer(obs)
        b = obs.shape[0]
        x = noise.flatten(1)
        # all-zero noise (the runtime's deterministic mode) selects the canonical draw
        zero = x.abs().amax(dim=-1, keepdim=True) == 0.0
        x = torch.where(zero, self.canonical_noise, x)
        c = self.chain
        for k in range(c.num_steps):
            if self.denoise is not None:
                eps = self.denoise[k](x, feat)
            else:
                eps = self._net(k)(x, self.temb[k].unsqueeze(0).expand(b, -1), feat)
            x0 = (x - c.sqrt_1m_ab[k] * eps) / c.sqrt_ab[k]
            if self.clip_sample > 0:
                x0 = x0.clamp(-self.clip_sample, self.clip_sample)
            eps = (x - c.sqrt_ab[k] * x0) / c.sqrt_1m_ab[k]
            x = c.sqrt_ab_prev[k] * x0 + c.dir_coef[k] * eps
        return self._to_env_units(x)


def diffusion_exporter(module: nn.Module, meta: Any) -> nn.Module:
    """deploy.export's exporter for the "diffusion" family: the inference module already
    follows the graph layout; check that the metadata describes it and export its
    folded copy (:meth:`policies.chunked.ChunkInference.folded`), fewer nodes per step."""
    DiffusionInfo.of(module).check_metadata(meta)
    return module.folded()
