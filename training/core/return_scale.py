"""Return normalization by a running percentile range.

An actor that maximizes Q needs a loss scale that does not depend on the task's reward
units, or its entropy term weighs differently on every task. Dividing by the standard
deviation of Q would let one outlier return shrink the gradient; the spread between
the 5th and 95th percentiles of a batch, smoothed over batches, is robust to it, and a
floor of 1 keeps small returns from being blown up into noise (DreamerV3's return
normalization; TD-MPC2 scales its policy loss the same way).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PercentileScale"]


class PercentileScale:
    """Exponential moving average of the (high - low) percentile range of what it sees;
    ``value`` is that average with ``floor`` under it."""

    def __init__(
        self, decay: float = 0.99, low: float = 0.05, high: float = 0.95, floor: float = 1.0
    ) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"PercentileScale decay must be in [0, 1), got {decay}")
        if not 0 <= low < high <= 1:
            raise ValueError(f"PercentileScale needs 0 <= low < high <= 1, got {low}, {high}")
        self.decay, self.low, self.high, self.floor = decay, low, high, floor
        self.range: float | None = None

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> float:
        """Fold a batch in; the new value."""
        q = torch.quantile(
            x.detach().float().flatten(), torch.tensor([self.low, self.high], device=x.device)
        )
        spread = float(q[1] - q[0])
        self.range = (
            spread if self.range is None else self.decay * self.range + (1 - self.decay) * spread
        )
        return self.value

    @property
    def value(self) -> float:
        return max(self.range if self.range is not None else self.floor, self.floor)

    def state_dict(self) -> dict[str, Any]:
        return {"range": self.range}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.range = None if state["range"] is None else float(state["range"])
