"""Learning-curve plots from a run's metrics file."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from training.metrics import read_metrics  # noqa: E402


def plot_learning_curve(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    run_dir = Path(run_dir)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "train/return" in r]
    out = Path(out) if out else run_dir / "learning_curve.png"
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [r["step"] for r in rows]
    axes[0].plot(steps, [r["train/return"] for r in rows], label="episode return")
    axes[0].set_xlabel("env steps")
    axes[0].set_ylabel("return")
    axes[0].grid(alpha=0.3)
    axes[1].plot(
        steps, [r.get("train/episode_length", float("nan")) for r in rows], color="tab:orange"
    )
    axes[1].set_xlabel("env steps")
    axes[1].set_ylabel("episode length")
    axes[1].grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
