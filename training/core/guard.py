"""The guarded optimizer step that every learner takes: one rule for non-finite numbers,
gradient clipping and the averaging of gradients and statistics across processes.

The rule, the same for PPO, DPPO, behaviour cloning, GRPO and every learner to come:
**skip, never roll back.**

- A minibatch step whose loss, any of its statistics or its gradient norm is not finite
  is skipped: its gradients are discarded and the optimizer is not touched (no moment
  update, no step count), so the weights and the optimizer state stay exactly as the
  last good step left them. The step is counted in ``nonfinite_steps``.
- A batch whose data is not finite (rewards, returns, advantages) is not learned from
  at all (:meth:`UpdateGuard.finite_batch`): no step, and no statistics update, so a
  value normalizer never absorbs a NaN. It is counted the same way.

Why not PPO's former rollback of the whole update with a halved rate: it discarded the
good steps taken before the bad one, it needed a full copy of weights and optimizer
state before every update (for a fine-tuned language model that is gigabytes), and the
halved rate silently changed the schedule the config describes. A skipped step keeps
every good step, costs nothing when numbers are finite, and leaves the schedule as
configured. With finite gradients Adam's update is finite, so no parameter can turn
non-finite through a step this guard lets through.

Under ``torch.distributed`` the gradients and the step's statistics are averaged over
ranks in one all-reduce before the decision, so a NaN on any rank reaches every rank
and all of them skip together (they stay in lockstep).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["UpdateGuard", "distributed", "mean_stats"]


def distributed() -> bool:
    """True inside an initialized torch.distributed process group."""
    return dist.is_available() and dist.is_initialized()


class UpdateGuard:
    """Clip, check and step one optimizer over ``params``.

    max_grad_norm: clip the global gradient norm to it (None: measure it only).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        params: Iterable[torch.nn.Parameter],
        max_grad_norm: float | None,
    ) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        self.max_norm = math.inf if max_grad_norm is None else float(max_grad_norm)
        self.nonfinite_steps = 0

    def _average_over_ranks(self, stats: torch.Tensor) -> torch.Tensor:
        """Average gradients and ``stats`` over ranks in one all-reduce (a no-op alone).

        A missing gradient counts as zeros, so every rank reduces a buffer of one size.
        """
        if not distributed():
            return stats
        world = dist.get_world_size()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([*(g.reshape(-1) for g in grads), stats.to(grads[0].dtype)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return flat[offset:].to(stats.dtype)

    def step(
        self,
        stats: Sequence[torch.Tensor],
        before_step: Callable[[list[float]], None] | None = None,
    ) -> list[float] | None:
        """Take the optimizer step for the gradients already in ``.grad``.

        ``stats``: scalar tensors of the step (the loss first, then whatever the learner
        logs); they are averaged over ranks with the gradients and read back in the one
        host synchronization of the step, together with the gradient norm. If all of
        them are finite, ``before_step(values)`` runs (e.g. an adaptive rate that needs
        the measured KL), the optimizer steps, and ``[*stats, grad_norm]`` as floats is
        returned; otherwise the gradients are discarded, the step is counted in
        ``nonfinite_steps`` and None is returned.
        """
        stacked = torch.stack([s.detach().reshape(()).to(torch.float32) for s in stats])
        stacked = self._average_over_ranks(stacked)
        # with max_norm = inf this only measures the norm
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm, foreach=True)
        values = torch.cat([stacked, norm.reshape(1).to(stacked.dtype)]).tolist()
        if not all(math.isfinite(v) for v in values):
            self.skip()
            return None
        if before_step is not None:
            before_step(values)
        self.optimizer.step()
        return values

    def skip(self) -> None:
        """Count a skipped step and discard its gradients."""
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_steps += 1

    def finite_batch(self, *tensors: torch.Tensor) -> bool:
        """True if every element of the batch's tensors is finite; else the batch counts
        as skipped (the caller learns nothing from it)."""
        ok = bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
        if distributed():  # every rank drops the batch if one rank's data is bad
            flag = torch.tensor([0.0 if ok else 1.0])
            dist.all_reduce(flag)
            ok = bool(flag.item() == 0)
        if not ok:
            self.nonfinite_steps += 1
        return ok

    def state_dict(self) -> dict[str, Any]:
        return {"nonfinite_steps": self.nonfinite_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nonfinite_steps = int(state["nonfinite_steps"])


def mean_stats(sums: dict[str, float], count: int) -> dict[str, float]:
    """Per-step means of summed statistics (0 steps: zeros, not a division by zero)."""
    return {k: v / max(count, 1) for k, v in sums.items()}
