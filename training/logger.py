"""What a run reports while it trains: metrics, the progress bar, episode statistics.

The logger owns the episode bookkeeping (returns and lengths of the last 100 finished
episodes, the task's per-step terms averaged over a rollout), so no learner counts
episodes itself, and it is the one writer of ``metrics.jsonl`` / TensorBoard, of the
optional Weights & Biases run (``run.wandb``) and of the progress bar. Only rank 0 of a
distributed run writes. :func:`log_final_evaluation` adds the final evaluation, with the
run's hyperparameters, once training is over.
"""

from __future__ import annotations

import math
import os
import secrets
import string
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.files import atomic_write
from training.config import ConfigError, to_dict
from training.metrics import MetricsLogger

__all__ = [
    "WANDB_ID_FILE",
    "RunLogger",
    "flatten_config",
    "log_final_evaluation",
    "start_wandb",
]

WANDB_ID_FILE = "wandb_run_id"
"""File of the run directory that keeps the W&B run id, so that a resume continues it."""

EPISODE_WINDOW = 100
"""Finished episodes that ``train/return`` and ``train/episode_length`` average over."""


class RunLogger:
    """Metrics, progress and episode statistics of one run (writes nothing unless enabled)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        progress: bool = True,
        config: Any = None,
    ) -> None:
        """``config``: the run's resolved train config; with ``config.run.wandb`` the
        metrics also go to a W&B run (see :func:`start_wandb`)."""
        self.enabled = enabled
        self.show_progress = enabled and progress
        self.metrics = MetricsLogger(run_dir, enabled=enabled, tensorboard=tensorboard)
        self.wandb: Any = None
        if enabled and config is not None and config.run.wandb:
            try:
                self.wandb = start_wandb(run_dir, config)
            except BaseException:
                self.metrics.close()
                raise
        self.recent_returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.recent_lengths: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._finished: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._terms: dict[str, torch.Tensor] = {}
        self._steps = 0
        self.bar: Any = None

    def start_progress(self, total: int, initial: int, unit: str, desc: str) -> None:
        """Open the progress bar (when progress is on and something is left to do)."""
        if self.show_progress and initial < total:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                unit=unit,
                unit_scale=unit == "step",
                dynamic_ncols=True,
                desc=desc,
            )

    # ------------------------------------------------------------------ episodes
    def record_env_step(self, info: Mapping[str, Any]) -> None:
        """Note one env step's episode ends and task terms (no host sync here)."""
        # the task's per-step terms (reward components, tracking errors), averaged over
        # the rollout: what a user reads to see which term the policy is trading off
        for k, v in info.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim == 1:
                if k in self._terms:
                    self._terms[k].add_(v)
                else:
                    self._terms[k] = v.clone()
        if "episode" in info:
            ep = info["episode"]
            self._finished.append((ep["return"][ep["done"]], ep["length"][ep["done"]]))
        self._steps += 1

    def end_rollout(self) -> dict[str, float]:
        """Fold the rollout's finished episodes in; its rows for the log."""
        n = max(self._steps, 1)
        row = {f"env/{k}": float(v.mean()) / n for k, v in self._terms.items()}
        for r, length in self._finished:
            self.recent_returns.extend(r.cpu().tolist())
            self.recent_lengths.extend(length.cpu().tolist())
        self._finished, self._terms, self._steps = [], {}, 0
        return row

    @property
    def mean_return(self) -> float:
        """Mean return of the last finished episodes (stochastic policy); NaN before any."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.recent_lengths)) if self.recent_lengths else float("nan")

    # ------------------------------------------------------------------ output
    def log(self, step: int, row: Mapping[str, Any]) -> None:
        self.metrics.log(step, dict(row))
        if self.wandb is not None:
            _wandb_log(self.wandb, step, row)

    def advance(self, n: int, **postfix: str) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(**postfix)

    def truncate_after(self, step: int) -> None:
        self.metrics.truncate_after(step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent_returns.clear()
        self.recent_lengths.clear()
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])


# ---------------------------------------------------------------------- config, W&B, final


def flatten_config(config: Any) -> dict[str, bool | int | float | str]:
    """The resolved config as ``{"ppo.lr": 0.0003, ...}``: scalars as they are, lists
    and None as text (what TensorBoard's hparams and W&B's run table can show)."""
    out: dict[str, bool | int | float | str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, bool | int | float | str):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", to_dict(config) if not isinstance(config, Mapping) else config)
    return out


def start_wandb(run_dir: str | os.PathLike, config: Any) -> Any:
    """The W&B run of ``run_dir``: a new one, or, when the directory keeps a W&B run id
    (:data:`WANDB_ID_FILE`; a resumed run, or the final evaluation), that same run again.

    wandb is imported here, so that runs without it never need the package; enabled but
    missing is a :class:`ConfigError` that says how to install it.
    """
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(
            "run.wandb=true needs the wandb package: pip install 'sim2real[wandb]' "
            "(or pip install wandb), or set run.wandb=false"
        ) from e
    run_dir = Path(run_dir)
    id_path = run_dir / WANDB_ID_FILE
    if id_path.exists():
        run_id = id_path.read_text().strip()
    else:
        # W&B's own format (8 of [a-z0-9]); wandb has no public generator for it
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        # kept before W&B starts: every later start in this directory (a resume, the
        # final evaluation) continues this W&B run instead of opening another
        atomic_write(id_path, run_id + "\n")
    run = wandb.init(
        project=config.run.wandb_project,
        name=run_dir.name,
        id=run_id,
        resume="allow",
        mode=config.run.wandb_mode or None,
        dir=os.environ.get("WANDB_DIR") or str(run_dir),
        config=flatten_config(config),
        # its own run object: a W&B run the caller already has open stays open
        reinit="create_new",
    )
    # the x axis is the run's own step (env steps, or updates for BC), as in
    # metrics.jsonl and TensorBoard; W&B's internal _step only counts log calls and
    # would refuse the rows a resume logs again after its checkpoint
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


def _finite_numbers(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    # what TensorBoard keeps of a row too (MetricsLogger drops NaN and text)
    return {
        prefix + k: float(v)
        for k, v in row.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _wandb_log(run: Any, step: int, row: Mapping[str, Any]) -> None:
    run.log({"step": int(step), **_finite_numbers(row)})


def log_final_evaluation(
    run_dir: str | os.PathLike, config: Any, step: int, stats: Mapping[str, Any]
) -> None:
    """The final evaluation of a finished run, where its training metrics are.

    ``stats``: the deterministic evaluation (``return_mean``, ``return_std``,
    ``length_mean``...), at ``step`` (the run's last env step, or update for BC).
    metrics.jsonl and TensorBoard get ``eval/return`` on the learning curve; TensorBoard
    also gets the hyperparameters (the flattened resolved config) with the final
    statistics as ``final/<stat>`` (its HParams tab); with ``run.wandb``, the run's W&B
    run gets the same row and the statistics in its summary.
    """
    run_dir = Path(run_dir)
    final = _finite_numbers(stats, prefix="final/")
    metrics = MetricsLogger(run_dir, tensorboard=False)
    metrics.log(step, {"eval/return": stats["return_mean"]})
    metrics.close()
    if config.run.tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        try:
            if "final/return_mean" in final:
                writer.add_scalar("eval/return", final["final/return_mean"], step)
            # the HParams tab: one session (this run) with its config and final numbers;
            # written by hand rather than add_hparams, which opens a second event file
            for summary in hparams(flatten_config(config), final):
                writer.file_writer.add_summary(summary, step)
            for k, v in final.items():
                writer.add_scalar(k, v, step)
        finally:
            writer.close()
    if config.run.wandb:
        run = start_wandb(run_dir, config)
        try:
            _wandb_log(run, step, {"eval/return": stats["return_mean"]})
            for k, v in final.items():
                run.summary[k] = v
        finally:
            run.finish()
