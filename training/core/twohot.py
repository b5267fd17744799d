"""Distributional regression of returns and rewards: symlog squashing and two-hot bins.

A scalar target y is squashed with symlog, so rewards of 0.1 and returns of 5000 share
one set of bins, and written as a *two-hot* vector: the probability mass sits on the
two bins around symlog(y), split by distance. The network outputs logits over the bins
and is trained with cross-entropy against that vector; its prediction is the symexp of
the expected bin. Cross-entropy over fixed bins keeps the gradient scale independent of
the return scale, which is why world-model learners (TD-MPC2, DreamerV3) use it for
both reward and value heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["symexp", "symlog", "two_hot", "two_hot_decode", "two_hot_loss"]


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


def _bins(num_bins: int, vmin: float, vmax: float, like: torch.Tensor) -> torch.Tensor:
    return torch.linspace(vmin, vmax, num_bins, device=like.device, dtype=like.dtype)


def two_hot(x: torch.Tensor, num_bins: int, vmin: float, vmax: float) -> torch.Tensor:
    """[..., num_bins] two-hot encoding of symlog(x) over bins spaced evenly in
    [vmin, vmax] (symlog space); values outside are clamped to the end bins. A NaN gives
    a row of NaN, so that a loss on it is NaN and the guarded step skips it (its bin
    index would otherwise be INT_MIN and fail inside scatter_add_)."""
    y = symlog(x).clamp(vmin, vmax)
    nan = torch.isnan(y)
    y = y.masked_fill(nan, vmin)
    width = (vmax - vmin) / (num_bins - 1)
    pos = (y - vmin) / width
    low = pos.floor().clamp(0, num_bins - 1)
    frac = (pos - low).unsqueeze(-1)
    low = low.long().unsqueeze(-1)
    high = (low + 1).clamp(max=num_bins - 1)
    out = torch.zeros(*x.shape, num_bins, device=x.device, dtype=x.dtype)
    out.scatter_add_(-1, low, 1 - frac)
    out.scatter_add_(-1, high, frac)
    return out.masked_fill(nan.unsqueeze(-1), float("nan"))


def two_hot_decode(logits: torch.Tensor, vmin: float, vmax: float) -> torch.Tensor:
    """The scalar a two-hot head predicts: symexp of the expected bin, [...]."""
    bins = _bins(logits.shape[-1], vmin, vmax, logits)
    return symexp((F.softmax(logits, -1) * bins).sum(-1))


def two_hot_loss(
    logits: torch.Tensor, target: torch.Tensor, vmin: float, vmax: float
) -> torch.Tensor:
    """Cross-entropy of ``logits`` [..., bins] against the two-hot ``target`` [...];
    per element (the caller weights and averages)."""
    probs = two_hot(target, logits.shape[-1], vmin, vmax)
    return -(F.log_softmax(logits, -1) * probs).sum(-1)
