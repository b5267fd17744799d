"""Learning-curve plots from a run's metrics file."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from training.metrics import read_metrics  # noqa: E402


def plot_learning_curve(
    run_dir: str | os.PathLike, out: str | os.PathLike | None = None, x_label: str = "env steps"
) -> Path:
    """Returns (training episodes, stochastic policy; evaluations, deterministic) and, on
    the right, episode length, or for a run without episodes (behaviour cloning) its
    loss."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    out = Path(out) if out else run_dir / "learning_curve.png"
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))

    def series(key: str) -> tuple[list[float], list[float]]:
        picked = [r for r in rows if key in r]
        return [r["step"] for r in picked], [r[key] for r in picked]

    steps, train = series("train/return")
    if train:
        axes[0].plot(steps, train, label="training episodes (stochastic)")
    steps, ev = series("eval/return")
    if ev:
        axes[0].plot(steps, ev, "o-", label="evaluation (deterministic)")
    axes[0].set_ylabel("return")
    axes[0].legend(loc="best", fontsize=8)
    right = "train/episode_length" if train else next(
        (k for r in rows for k in r if k.endswith("/loss")), "train/episode_length"
    )
    steps, values = series(right)
    axes[1].plot(steps, values, color="tab:orange")
    axes[1].set_ylabel("episode length" if right == "train/episode_length" else right)
    for ax in axes:
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
