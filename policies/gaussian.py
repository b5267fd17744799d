"""Gaussian actor-critic policies: an MLP, or an MLP on top of a GRU/LSTM memory.

The actor outputs the mean of a diagonal Gaussian whose log standard deviation is a
free parameter (state-independent, as in rsl_rl). The critic is a separate network; it
reads the privileged "critic" observation group when one is given (asymmetric
actor-critic), else the policy group.

Observation normalization lives inside the module (running mean/std buffers), so it is
saved with the weights and travels into the exported inference module; the statistics
change only in ``act`` while the module is in training mode.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from policies.base import ActionOutput, Evaluation, PolicyInfo
from policies.normalization import RunningMeanStd

ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": nn.ELU, "tanh": nn.Tanh, "relu": nn.ReLU}
RNN_TYPES = (None, "gru", "lstm")
INITS = ("orthogonal", "torch")
_LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class ActorCriticConfig:
    """Network shapes and the action distribution.

    The actor (mean of a diagonal Gaussian with a state-independent std) and the critic
    are separate MLPs; with rnn_type set, each reads its input through its own
    recurrent memory.
    """

    actor_hidden: tuple[int, ...] = (256, 256, 128)
    """Hidden layer sizes of the actor MLP (positive ints)."""
    critic_hidden: tuple[int, ...] = (256, 256, 128)
    """Hidden layer sizes of the critic MLP (positive ints)."""
    activation: str = "elu"
    """Activation of the hidden layers of both MLPs: elu, tanh or relu."""
    init_std: float = 1.0
    """Initial standard deviation of the actions (``log_std`` starts at its log); finite
    and >= min_std."""
    min_std: float = 1e-3
    """Floor of the action standard deviation. The parameter is ``log_std``; the std used
    everywhere is ``exp(max(log_std, log(min_std)))``, so it can neither collapse to 0
    (log-probs would blow up) nor go negative, whatever the optimizer does to the
    parameter. Below the floor the clamp passes no gradient, which is the point: the
    distribution stops narrowing there."""
    init: str = "orthogonal"
    """Initialization of both MLPs' linear layers. "orthogonal": hidden layers orthogonal
    with gain sqrt(2), the actor's output layer with gain 0.01 (the mean starts near 0),
    the critic's with gain 1, zero biases (stable-baselines3, CleanRL; the MuJoCo presets
    were tuned with it). "torch": torch.nn.Linear's own default, as rsl_rl's MLPs. On the
    Go1 the orthogonal start held the action std near 1 for 10M steps, where rsl_rl's
    fell to 0.33; with "torch" it fell to 0.56 and the return rose from 0.66x to 0.94x
    rsl_rl's (docs/benchmarks_ppo.md)."""
    rnn_type: str | None = None
    """None (MLP policy) or "gru"/"lstm": a recurrent memory of rnn_layers x rnn_hidden
    in front of each MLP (separate memories for actor and critic)."""
    rnn_hidden: int = 256
    """Hidden size of each recurrent layer (with rnn_type set)."""
    rnn_layers: int = 1
    """Number of stacked recurrent layers (with rnn_type set)."""
    normalize_obs: bool = True
    """Running mean/std normalization of observations inside the module (saved with the
    weights and exported with them)."""
    obs_clip: float | None = None
    """Clip normalized observations to [-obs_clip, obs_clip] (None: no clip). An
    observation term that stayed constant while the statistics accumulated has a std
    near 0, so its first change becomes a huge input: Humanoid's contact forces did
    this, and the policy moved by whole stds per update (docs/benchmarks_ppo.md).
    stable-baselines3's VecNormalize clips at 10."""

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(self.actor_hidden)
        self.critic_hidden = tuple(self.critic_hidden)
        for name in ("actor_hidden", "critic_hidden"):
            sizes = getattr(self, name)
            if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError(f"ActorCriticConfig.{name} must be positive ints, got {sizes}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"ActorCriticConfig.activation={self.activation!r} is unknown; choose one of "
                f"{sorted(ACTIVATIONS)}"
            )
        if self.init not in INITS:
            raise ValueError(
                f"ActorCriticConfig.init={self.init!r} is unknown; choose one of {list(INITS)}"
            )
        if not (math.isfinite(self.min_std) and self.min_std > 0):
            raise ValueError(f"ActorCriticConfig.min_std must be > 0, got {self.min_std}")
        if not (math.isfinite(self.init_std) and self.init_std >= self.min_std):
            raise ValueError(
                f"ActorCriticConfig.init_std must be finite and >= min_std ({self.min_std}), "
                f"got {self.init_std}"
            )
        if self.obs_clip is not None and not (math.isfinite(self.obs_clip) and self.obs_clip > 0):
            raise ValueError(f"ActorCriticConfig.obs_clip must be > 0 or None, got {self.obs_clip}")
        if self.rnn_type not in RNN_TYPES:
            raise ValueError(
                f"ActorCriticConfig.rnn_type={self.rnn_type!r} is unknown; choose one of "
                f"{list(RNN_TYPES)}"
            )
        if self.rnn_hidden < 1:
            raise ValueError(f"ActorCriticConfig.rnn_hidden must be >= 1, got {self.rnn_hidden}")
        if self.rnn_layers < 1:
            raise ValueError(f"ActorCriticConfig.rnn_layers must be >= 1, got {self.rnn_layers}")


def _mlp(
    in_size: int,
    hidden: tuple[int, ...],
    out_size: int,
    activation: str,
    out_gain: float,
    init: str = "orthogonal",
) -> nn.Sequential:
    """An MLP; with init "orthogonal" its hidden layers get gain sqrt(2) and its output
    layer ``out_gain`` (see ActorCriticConfig.init), with "torch" nn.Linear's default."""
    layers: list[nn.Module] = []
    size = in_size
    for h in hidden:
        lin = nn.Linear(size, h)
        if init == "orthogonal":
            # the ReLU-family gain keeps activations at unit scale
            nn.init.orthogonal_(lin.weight, math.sqrt(2.0))
            nn.init.zeros_(lin.bias)
        layers += [lin, ACTIVATIONS[activation]()]
        size = h
    out = nn.Linear(size, out_size)
    if init == "orthogonal":
        nn.init.orthogonal_(out.weight, out_gain)
        nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


def _rnn(rnn_type: str, in_size: int, hidden: int, layers: int) -> nn.RNNBase:
    cls = nn.GRU if rnn_type == "gru" else nn.LSTM
    return cls(in_size, hidden, num_layers=layers)


def _rnn_step(
    rnn: nn.RNNBase, x: torch.Tensor, state: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One time step: x [B, D], state tensors [L, B, H] -> (out [B, H], next state)."""
    if isinstance(rnn, nn.LSTM):
        out, (h, c) = rnn(x.unsqueeze(0), (state[0], state[1]))
        return out.squeeze(0), (h, c)
    out, h = rnn(x.unsqueeze(0), state[0])
    return out.squeeze(0), (h,)


def _keep_mask(dones: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # multiply rather than index: no host sync, and the very same op in act and evaluate
    return (~dones.to(torch.bool)).to(like.dtype).view(1, -1, 1)


def _rnn_sequence(
    rnn: nn.RNNBase,
    x: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    dones: torch.Tensor | None,
) -> torch.Tensor:
    """Run x [T, B, D] from ``state``; dones[t] resets the state before step t + 1.

    Stepping one time step at a time (instead of cuDNN over padded episodes) makes the
    computation the same, op for op, as the one ``act`` did, so stored log-probs are
    reproduced; for rollouts of a few dozen steps the loop costs little.
    """
    outs = []
    for t in range(x.shape[0]):
        if t > 0 and dones is not None:
            keep = _keep_mask(dones[t - 1], state[0])
            state = tuple(s * keep for s in state)
        out, state = _rnn_step(rnn, x[t], state)
        outs.append(out)
    return torch.stack(outs)


def gaussian_log_prob(
    actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """log N(actions; mean, exp(log_std)^2), summed over the last (action) dimension."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last dimension."""
    return (0.5 + 0.5 * _LOG_2PI + log_std).sum(-1)


def gaussian_kl(
    mean_old: torch.Tensor, std_old: torch.Tensor, mean_new: torch.Tensor, std_new: torch.Tensor
) -> torch.Tensor:
    """KL(old || new) of diagonal Gaussians, summed over the last dimension."""
    return (
        torch.log(std_new / std_old)
        + (std_old.square() + (mean_old - mean_new).square()) / (2.0 * std_new.square())
        - 0.5
    ).sum(-1)


class GaussianInference(nn.Module):
    """The deployable part of an ActorCritic: normalizer, actor memory, actor mean head.

    forward(obs) -> actions for an MLP policy; forward(obs, h) -> (actions, h_next) for
    a GRU and forward(obs, h, c) -> (actions, h_next, c_next) for an LSTM, states shaped
    [num_layers, batch, hidden]. Deterministic (the mean action), no Python-side state,
    only tensor ops: torch.jit.trace and torch.onnx.export take it as it is.
    """

    def __init__(
        self,
        normalizer: nn.Module,
        rnn: nn.RNNBase | None,
        head: nn.Sequential,
        info: PolicyInfo,
    ) -> None:
        super().__init__()
        self.normalizer = normalizer
        self.rnn = rnn
        self.head = head
        self.info = info
        self.policy_family = info.policy_family
        self.input_names = info.input_names
        self.output_names = info.output_names

    def initial_state(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Zero recurrent state for ``batch`` envs (empty for an MLP policy)."""
        ref = next(self.head.parameters())
        return tuple(
            torch.zeros(self.info.state_shape[0], batch, self.info.state_shape[1], dtype=ref.dtype)
            for _ in self.info.state_names
        )

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        ref = next(self.head.parameters())
        obs = torch.zeros(batch, self.info.obs_size, dtype=ref.dtype)
        return (obs, *self.initial_state(batch))

    def forward(self, obs: torch.Tensor, *state: torch.Tensor):
        x = self.normalizer(obs)
        if self.rnn is None:
            return self.head(x)
        x, next_state = _rnn_step(self.rnn, x, tuple(state))
        return (self.head(x), *next_state)


class ActorCritic(nn.Module):
    """Gaussian actor and value critic, MLP or recurrent; see ActorCriticConfig.

    policy_obs_size: size of obs["policy"]; critic_obs_size: size of obs["critic"] for
    an asymmetric critic, or None for a critic that reads obs["policy"].
    """

    def __init__(
        self,
        policy_obs_size: int,
        critic_obs_size: int | None,
        action_size: int,
        cfg: ActorCriticConfig | None = None,
    ) -> None:
        super().__init__()
        cfg = cfg if cfg is not None else ActorCriticConfig()
        for name, v in (("policy_obs_size", policy_obs_size), ("action_size", action_size)):
            if v < 1:
                raise ValueError(f"ActorCritic: {name} must be >= 1, got {v}")
        if critic_obs_size is not None and critic_obs_size < 1:
            raise ValueError(f"ActorCritic: critic_obs_size must be >= 1, got {critic_obs_size}")
        self.cfg = cfg
        self.policy_obs_size = int(policy_obs_size)
        self.asymmetric = critic_obs_size is not None
        self.critic_obs_size = int(critic_obs_size) if self.asymmetric else self.policy_obs_size
        self.action_size = int(action_size)
        self.is_recurrent = cfg.rnn_type is not None
        self._log_min_std = math.log(cfg.min_std)

        if cfg.normalize_obs:
            self.actor_obs_normalizer: nn.Module = RunningMeanStd(
                self.policy_obs_size, clip=cfg.obs_clip
            )
        else:
            self.actor_obs_normalizer = nn.Identity()
        # a symmetric critic reads the policy group and shares its statistics
        self.critic_obs_normalizer: nn.Module | None = (
            RunningMeanStd(self.critic_obs_size, clip=cfg.obs_clip)
            if self.asymmetric and cfg.normalize_obs
            else None
        )

        a_in, c_in = self.policy_obs_size, self.critic_obs_size
        self.actor_rnn: nn.RNNBase | None = None
        self.critic_rnn: nn.RNNBase | None = None
        if cfg.rnn_type is not None:
            self.actor_rnn = _rnn(cfg.rnn_type, a_in, cfg.rnn_hidden, cfg.rnn_layers)
            self.critic_rnn = _rnn(cfg.rnn_type, c_in, cfg.rnn_hidden, cfg.rnn_layers)
            a_in = c_in = cfg.rnn_hidden
        # a small last layer starts the mean near 0, so exploration comes from the std
        self.actor = _mlp(a_in, cfg.actor_hidden, self.action_size, cfg.activation, 0.01, cfg.init)
        self.critic = _mlp(c_in, cfg.critic_hidden, 1, cfg.activation, 1.0, cfg.init)
        self.log_std = nn.Parameter(torch.full((self.action_size,), math.log(cfg.init_std)))
        self._n_state = 0 if cfg.rnn_type is None else (2 if cfg.rnn_type == "lstm" else 1)
        # per-env recurrent state for acting: actor tensors first, then critic tensors
        self._hidden: tuple[torch.Tensor, ...] | None = None

    # ------------------------------------------------------------------ description
    @property
    def info(self) -> PolicyInfo:
        if self.cfg.rnn_type is None:
            return PolicyInfo("gaussian_mlp", self.policy_obs_size, self.action_size)
        names = ("h", "c") if self.cfg.rnn_type == "lstm" else ("h",)
        return PolicyInfo(
            "recurrent",
            self.policy_obs_size,
            self.action_size,
            state_names=names,
            state_shape=(self.cfg.rnn_layers, self.cfg.rnn_hidden),
            rnn_type=self.cfg.rnn_type,
        )

    @property
    def policy_family(self) -> str:
        return self.info.policy_family

    def clamped_log_std(self) -> torch.Tensor:
        """log_std with the floor applied; see ActorCriticConfig.min_std."""
        return self.log_std.clamp(min=self._log_min_std)

    @property
    def std(self) -> torch.Tensor:
        return torch.exp(self.clamped_log_std())

    # ------------------------------------------------------------------ observations
    def _group(self, obs: Mapping[str, torch.Tensor], name: str, size: int) -> torch.Tensor:
        if name not in obs:
            raise KeyError(
                f"ActorCritic needs observation group {name!r}; got groups {sorted(obs)}"
            )
        x = obs[name]
        if x.shape[-1] != size:
            raise ValueError(
                f"observation group {name!r} has size {x.shape[-1]}, the policy expects {size}"
            )
        return x

    def _normalize_critic(
        self, xc: torch.Tensor, x_normalized: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The critic's input; x_normalized: the actor's already normalized input, which
        a symmetric critic shares (normalizing the same observation twice costs a few of
        the many small ops that bound a small-network update on the CPU)."""
        if self.critic_obs_normalizer is not None:
            return self.critic_obs_normalizer(xc)
        if self.asymmetric:
            return xc
        return x_normalized if x_normalized is not None else self.actor_obs_normalizer(xc)

    def _obs(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._group(obs, "policy", self.policy_obs_size)
        xc = self._group(obs, "critic", self.critic_obs_size) if self.asymmetric else x
        return x, xc

    @torch.no_grad()
    def update_normalizers(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Fold a batch of observations into the running statistics."""
        if not self.cfg.normalize_obs:
            return
        x, xc = self._obs(obs)
        self.actor_obs_normalizer.update(x)
        if self.critic_obs_normalizer is not None:
            self.critic_obs_normalizer.update(xc)

    # ------------------------------------------------------------------ hidden state
    def init_hidden(self, num_envs: int, device: torch.device | str | None = None) -> None:
        """Zero recurrent state for num_envs envs (no-op for an MLP policy)."""
        if not self.is_recurrent:
            return
        ref = self.log_std
        shape = (self.cfg.rnn_layers, num_envs, self.cfg.rnn_hidden)
        dev = ref.device if device is None else device
        self._hidden = tuple(
            torch.zeros(shape, dtype=ref.dtype, device=dev) for _ in range(2 * self._n_state)
        )

    def get_hidden(self) -> tuple[torch.Tensor, ...] | None:
        """A copy of the per-env state (actor tensors, then critic), or None."""
        if self._hidden is None:
            return None
        return tuple(h.clone() for h in self._hidden)

    def set_hidden(self, hidden: tuple[torch.Tensor, ...] | None) -> None:
        if hidden is not None and len(hidden) != 2 * self._n_state:
            raise ValueError(f"expected {2 * self._n_state} hidden tensors, got {len(hidden)}")
        self._hidden = None if hidden is None else tuple(h.clone() for h in hidden)

    def reset_hidden(self, dones: torch.Tensor) -> None:
        """Zero the state of envs whose episode just ended (dones: bool [num_envs])."""
        if self._hidden is None:
            return
        keep = _keep_mask(dones, self._hidden[0])
        self._hidden = tuple(h * keep for h in self._hidden)

    def _split(self, hidden: tuple[torch.Tensor, ...]):
        return hidden[: self._n_state], hidden[self._n_state :]

    # ------------------------------------------------------------------ forward passes
    def _heads_step(
        self, x: torch.Tensor, xc: torch.Tensor, hidden: tuple[torch.Tensor, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """One step for a batch [B, D]: (mean, value, next hidden)."""
        x = self.actor_obs_normalizer(x)
        xc = self._normalize_critic(xc, x)
        if self.actor_rnn is None or self.critic_rnn is None or hidden is None:
            return self.actor(x), self.critic(xc).squeeze(-1), None
        a_state, c_state = self._split(hidden)
        x, a_state = _rnn_step(self.actor_rnn, x, a_state)
        xc, c_state = _rnn_step(self.critic_rnn, xc, c_state)
        return self.actor(x), self.critic(xc).squeeze(-1), (*a_state, *c_state)

    def _acting_hidden(self, batch: int, device: torch.device) -> tuple[torch.Tensor, ...] | None:
        if not self.is_recurrent:
            return None
        if self._hidden is None or self._hidden[0].shape[1] != batch:
            self.init_hidden(batch, device)
        return self._hidden

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> ActionOutput:
        """Sample actions for a batch of envs; advances the recurrent state.

        The observation statistics stay fixed while acting: the learner folds in a whole
        rollout after its update (`update_normalizers`), so stored log-probabilities are
        exact at the start of every update.
        """
        x, xc = self._obs(obs)
        hidden = self._acting_hidden(x.shape[0], x.device)
        mean, value, hidden = self._heads_step(x, xc, hidden)
        if hidden is not None:
            self._hidden = hidden
        log_std = self.clamped_log_std().expand_as(mean)
        std = torch.exp(log_std)
        actions = mean + std * torch.randn_like(mean)
        return ActionOutput(actions, gaussian_log_prob(actions, mean, log_std), value, mean, std)

    @torch.no_grad()
    def act_inference(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The mean action (advances the recurrent state; never updates statistics)."""
        x, xc = self._obs(obs)
        hidden = self._acting_hidden(x.shape[0], x.device)
        mean, _, hidden = self._heads_step(x, xc, hidden)
        if hidden is not None:
            self._hidden = hidden
        return mean

    def value(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """V(obs) [B] from the current per-env state, which is left unchanged.

        This is what bootstrapping needs: after an env step and before reset_hidden,
        the critic state is the one that belongs to the next (or final) observation.
        """
        _, xc = self._obs(obs)
        xc = self._normalize_critic(xc)
        if self.critic_rnn is not None:
            hidden = self._acting_hidden(xc.shape[0], xc.device)
            assert hidden is not None
            xc, _ = _rnn_step(self.critic_rnn, xc, self._split(hidden)[1])
        return self.critic(xc).squeeze(-1)

    def evaluate(
        self,
        obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        hidden: tuple[torch.Tensor, ...] | None = None,
        dones: torch.Tensor | None = None,
    ) -> Evaluation:
        """Re-score stored actions under the current parameters (with gradient).

        MLP: obs groups [..., D], actions [..., A] -> per-element [...] outputs.
        Recurrent: obs [T, B, D] and actions [T, B, A] of whole rollouts, ``hidden`` the
        state at the rollout's first step (None: zeros) and dones [T, B] the episode
        ends (the state is reset after step t where dones[t]); outputs are [T, B].
        """
        x, xc = self._obs(obs)
        x = self.actor_obs_normalizer(x)
        xc = self._normalize_critic(xc, x)
        if self.actor_rnn is not None and self.critic_rnn is not None:
            if x.dim() != 3:
                raise ValueError(
                    f"recurrent evaluate needs obs shaped [T, B, D], got {tuple(x.shape)}"
                )
            if hidden is None:
                ref = self.log_std
                shape = (self.cfg.rnn_layers, x.shape[1], self.cfg.rnn_hidden)
                hidden = tuple(
                    torch.zeros(shape, dtype=ref.dtype, device=ref.device)
                    for _ in range(2 * self._n_state)
                )
            a_state, c_state = self._split(hidden)
            x = _rnn_sequence(self.actor_rnn, x, a_state, dones)
            xc = _rnn_sequence(self.critic_rnn, xc, c_state, dones)
        mean = self.actor(x)
        value = self.critic(xc).squeeze(-1)
        log_std = self.clamped_log_std().expand_as(mean)
        return Evaluation(
            gaussian_log_prob(actions, mean, log_std),
            gaussian_entropy(log_std),
            value,
            mean,
            torch.exp(log_std),
        )

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The deterministic (mean) action; see act_inference."""
        return self.act_inference(obs)

    # ------------------------------------------------------------------ export
    def inference_module(self) -> GaussianInference:
        """A frozen copy of the actor path (normalizer, memory, mean head) for export."""
        module = GaussianInference(
            copy.deepcopy(self.actor_obs_normalizer),
            copy.deepcopy(self.actor_rnn),
            copy.deepcopy(self.actor),
            self.info,
        )
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)
        return module
