"""The contract every policy family offers to learners and to export.

A policy is a torch module that (1) samples actions together with what its learner
needs (log-probabilities, values, distribution parameters), (2) re-evaluates the
log-probabilities of stored samples under its current parameters, and (3) hands out an
*inference module*: a plain, deterministic torch module with observation normalization
inside, which `deploy.export` turns into ONNX. Observations arrive as a dict of named
groups ("policy", optionally a privileged "critic"), as the VecEnv produces them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

POLICY_FAMILIES = ("gaussian_mlp", "recurrent")


class ActionOutput(NamedTuple):
    """One sampling step for a batch of envs.

    actions [B, A], log_prob [B] (summed over action dims), value [B], mean and std
    [B, A] (kept by the learner to measure the KL between old and new policies).
    """

    actions: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


class Evaluation(NamedTuple):
    """Stored samples re-scored under the current parameters.

    log_prob, entropy and value are per element ([B] flat, or [T, B] for sequences);
    mean and std have a trailing action dimension.
    """

    log_prob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


@dataclass(frozen=True)
class PolicyInfo:
    """What export and deployment need to know about a policy's interface.

    policy_family: "gaussian_mlp" or "recurrent" (the ONNX metadata field).
    state_names: names of the recurrent state tensors the inference module takes and
        returns after obs, e.g. ("h",) for a GRU, ("h", "c") for an LSTM; () if none.
    state_shape: (num_layers, hidden_size) of each state tensor; the batch goes in the
        middle, as torch RNNs lay it out: [num_layers, batch, hidden_size].
    """

    policy_family: str
    obs_size: int
    action_size: int
    state_names: tuple[str, ...] = ()
    state_shape: tuple[int, ...] = ()
    rnn_type: str | None = None

    def __post_init__(self) -> None:
        if self.policy_family not in POLICY_FAMILIES:
            raise ValueError(
                f"policy_family={self.policy_family!r} is unknown; choose one of "
                f"{list(POLICY_FAMILIES)}"
            )

    @property
    def is_recurrent(self) -> bool:
        return bool(self.state_names)

    @property
    def input_names(self) -> tuple[str, ...]:
        """ONNX input names in the order the inference module's forward takes them."""
        return ("obs", *(f"{n}_in" for n in self.state_names))

    @property
    def output_names(self) -> tuple[str, ...]:
        """ONNX output names in the order the inference module's forward returns them."""
        return ("actions", *(f"{n}_out" for n in self.state_names))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state_names"] = list(self.state_names)
        d["state_shape"] = list(self.state_shape)
        return d


@runtime_checkable
class Policy(Protocol):
    """What a learner may rely on. Implementations are ``nn.Module`` subclasses.

    Recurrent policies keep one hidden state per env between ``act`` calls; the learner
    calls ``reset_hidden(dones)`` after every env step and stores ``get_hidden()`` at
    the start of a rollout so that ``evaluate`` can re-run the sequence from there.
    Feed-forward policies return None / do nothing for the hidden-state methods.
    """

    is_recurrent: bool

    @property
    def info(self) -> PolicyInfo: ...

    def act(self, obs: Mapping[str, torch.Tensor]) -> ActionOutput:
        """Sample actions (no gradient); in training mode also update obs normalizers."""
        ...

    def evaluate(
        self,
        obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        hidden: tuple[torch.Tensor, ...] | None = None,
        dones: torch.Tensor | None = None,
    ) -> Evaluation:
        """Log-probs, entropy and values of stored samples, with gradient."""
        ...

    def value(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Critic value [B] without advancing any recurrent state."""
        ...

    def init_hidden(self, num_envs: int, device: torch.device | str | None = None) -> None:
        """Zero per-env recurrent state for num_envs envs (no-op without memory)."""
        ...

    def get_hidden(self) -> tuple[torch.Tensor, ...] | None: ...

    def reset_hidden(self, dones: torch.Tensor) -> None: ...

    def inference_module(self) -> nn.Module:
        """Plain deterministic module: obs [B, obs] (+ state) -> actions (+ next state)."""
        ...

    # the nn.Module surface learners use
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...
