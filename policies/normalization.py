"""Running mean/std normalizers as torch modules.

The statistics are buffers, so they travel in ``state_dict`` (checkpoints) and into an
exported graph as constants; ``forward`` only normalizes, with pure tensor ops, so the
same module can sit inside a policy's inference module and be turned into ONNX.
Updating is explicit (``update``), never a side effect of a forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Mean and (population) variance of everything seen, merged batch by batch.

    Batches are merged with the parallel update of Chan et al., so the result equals
    the mean and variance of all samples concatenated, whatever the batch sizes. The
    merge is done in float64; mean and var are stored in ``dtype``, count as int64 so
    that casting the module to another float type cannot round it.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(
        self,
        shape: int | Sequence[int] = (),
        epsilon: float = 1e-8,
        clip: float | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}")
        self.epsilon = float(epsilon)
        self.clip = None if clip is None else float(clip)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=dtype))
        self.register_buffer("var", torch.ones(self.shape, dtype=dtype))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def _batch(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.shape)
        if x.dim() < n or tuple(x.shape[x.dim() - n :]) != self.shape:
            raise ValueError(
                f"expected a tensor ending in shape {self.shape}, got {tuple(x.shape)}"
            )
        return x.detach().reshape(-1, *self.shape).to(torch.float64)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch (any leading dims, trailing dims equal to ``shape``) into the stats."""
        batch = self._batch(x)
        b_count = batch.shape[0]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # data-parallel ranks fold the moments of all ranks' batches, so every rank
            # keeps the same statistics (they are part of the policy)
            b = batch.to(torch.float64)
            moments = torch.cat(
                [b.new_tensor([float(b_count)]), b.sum(0).flatten(), b.square().sum(0).flatten()]
            )
            torch.distributed.all_reduce(moments)
            b_count = int(moments[0].item())
            if b_count == 0:
                return
            k = (moments.numel() - 1) // 2
            b_mean = (moments[1 : 1 + k] / b_count).view(batch.shape[1:])
            b_var = (moments[1 + k :] / b_count).view(batch.shape[1:]) - b_mean.square()
            b_var = b_var.clamp_min(0.0)
        else:
            if b_count == 0:
                return
            b_mean = batch.mean(dim=0)
            b_var = batch.var(dim=0, unbiased=False)
        n = self.count.to(torch.float64)
        total = n + b_count
        mean = self.mean.to(torch.float64)
        delta = b_mean - mean
        new_mean = mean + delta * (b_count / total)
        m2 = (
            self.var.to(torch.float64) * n
            + b_var * b_count
            + delta.square() * (n * b_count / total)
        )
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.add_(b_count)

    @property
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + self.epsilon)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / sqrt(var + epsilon), clipped to [-clip, clip] if set."""
        y = (x - self.mean) / torch.sqrt(self.var + self.epsilon)
        if self.clip is not None:
            y = torch.clamp(y, -self.clip, self.clip)
        return y

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        """Inverse of ``normalize`` (without the clip)."""
        return y * torch.sqrt(self.var + self.epsilon) + self.mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, epsilon={self.epsilon}, clip={self.clip}"


class ValueNormalizer(RunningMeanStd):
    """Running statistics of scalar returns for value normalization.

    The critic then regresses ``normalize(returns)`` and its outputs are turned back
    with ``denormalize`` before GAE, so the value head sees targets of unit scale
    whatever the reward scale.
    """

    def __init__(self, epsilon: float = 1e-8, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(shape=(), epsilon=epsilon, clip=None, dtype=dtype)
