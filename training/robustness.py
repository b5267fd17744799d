"""The robustness matrix: one policy evaluated across shifts of the world beyond the
ranges it trained on, one shift at a time.

Each row of the matrix is a :class:`Shift` (added base mass, friction, motor strength,
PD gain error, action latency, observation noise, pushes, terrain), each column one of
its levels; the first level is the nominal world. A cell is the nominal model with that
one shift applied as a fixed value (a (v, v) range of the simulator's own sim-to-real
settings, :class:`sim.randomization.SimToRealConfig`, so the shifts are the mechanisms
training randomizes over, not new ones), evaluated for ``episodes`` deterministic
episodes of at most ``seconds``. A cell reports the fall rate (episodes that ended by a
termination), the success rate (the others), the velocity-tracking error where the task
has one, and the return.

The default levels lie beyond the quadruped's training ranges (e.g. friction scale 0.35
against 0.5..1.25, latency 2 steps against 0..1), so every cell but the nominal one is
out of distribution (``ood``). Terrain needs a task with a heightfield variant
(:data:`ROUGH_VARIANTS`: the quadruped's ``terrain`` option, ``go1_rough`` for the Go1);
a policy for another task skips that row, as a task without
observation noise skips the noise row (``skipped`` in the result says why).

A policy is a run directory, a checkpoint or an exported ``.onnx`` file, the sources of
``sim2real eval``: the file runs through the runtime and the safety layer, as on the
robot.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy.files import atomic_write

__all__ = [
    "NOMINAL_S2R",
    "PUSH_INTERVAL_S",
    "ROUGH_VARIANTS",
    "SHIFTS",
    "Shift",
    "evaluate_world",
    "format_matrix",
    "plot_matrix",
    "robustness_matrix",
    "write_matrix",
]

NOMINAL_S2R: dict[str, Any] = {
    "mass_scale": None,
    "added_base_mass": None,
    "friction_scale": None,
    "motor_strength": None,
    "kp_scale": None,
    "kd_scale": None,
    "obs_noise": {},
    "obs_bias": {},
    "action_latency": (0, 0),
    "push_interval_s": None,
    "push_velocity": 0.0,
}
"""Sim-to-real settings of the nominal world: every randomization, noise, latency and
push off. A cell is these with its one shift over them."""

PUSH_INTERVAL_S = 2.0
"""Mean time between pushes in the push row (training pushes every 8 s by default)."""

ROUGH_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "go1": ("go1_rough", {}),
    "go1_rough": ("go1_rough", {}),
    "quadruped": ("quadruped", {"terrain": True}),
}
"""The heightfield task a policy of each task walks on in the terrain row (same robot,
same observations), with the task options that put it there (a policy trained on a
terrain keeps its own); the ``level`` option fixes the difficulty."""


@dataclass(frozen=True)
class Shift:
    """One row of the matrix: how a level turns into env settings."""

    name: str
    unit: str
    description: str
    levels: tuple[float, ...]
    """Default levels; the first is the nominal world."""
    settings: Callable[[float, Mapping[str, float]], dict[str, Any] | None]
    """(level, the task's training observation-noise stds) -> sim-to-real settings over
    :data:`NOMINAL_S2R`; None where the shift cannot apply to the task."""
    nominal: float = 0.0
    """The level that changes nothing."""
    terrain: bool = False
    """The level is a terrain level of the task's heightfield variant."""


def _fixed(field: str) -> Callable[[float, Mapping[str, float]], dict[str, Any]]:
    return lambda v, _noise: {field: (v, v)}


def _latency(v: float, _noise: Mapping[str, float]) -> dict[str, Any]:
    if int(v) != v or v < 0:
        raise ValueError(f"latency levels are whole control steps >= 0, got {v!r}")
    return {"action_latency": (int(v), int(v))}


def _noise(v: float, noise: Mapping[str, float]) -> dict[str, Any] | None:
    if not noise:
        return None
    return {"obs_noise": {term: std * v for term, std in noise.items()}}


def _push(v: float, _noise: Mapping[str, float]) -> dict[str, Any]:
    return {"push_interval_s": PUSH_INTERVAL_S, "push_velocity": float(v)} if v > 0 else {}


def _gains(v: float, _noise: Mapping[str, float]) -> dict[str, Any]:
    return {"kp_scale": (v, v), "kd_scale": (v, v)}


SHIFTS: dict[str, Shift] = {
    s.name: s
    for s in (
        Shift(
            "added_mass", "kg", "mass added to the base", (0, 3, 6, 9), _fixed("added_base_mass")
        ),
        Shift(
            "friction",
            "x",
            "scale of every geom's friction",
            (1, 0.35, 0.2, 0.1),
            _fixed("friction_scale"),
            nominal=1.0,
        ),
        Shift(
            "motor_strength",
            "x",
            "scale of every actuator's torque",
            (1, 0.75, 0.6, 0.45),
            _fixed("motor_strength"),
            nominal=1.0,
        ),
        Shift(
            "pd_gain_error",
            "x",
            "scale of the PD gains kp and kd",
            (1, 0.7, 0.5, 0.35),
            _gains,
            nominal=1.0,
        ),
        Shift("latency", "steps", "action delay in control steps", (0, 2, 3, 4), _latency),
        Shift("obs_noise", "x", "observation noise, times the training stds", (0, 2, 3, 5), _noise),
        Shift(
            "push",
            "m/s",
            f"base velocity kicks every {PUSH_INTERVAL_S:g} s (mean)",
            (0, 1.0, 1.5, 2.0),
            _push,
        ),
        Shift(
            "terrain",
            "level",
            "terrain level of the heightfield variant (0-9)",
            (0, 3, 6, 9),
            lambda v, _noise: {},
            terrain=True,
        ),
    )
}


# ---------------------------------------------------------------------- policies
class _Policy:
    """A policy source and how to evaluate it in a given world."""

    def __init__(self, source: str | os.PathLike, episodes: int, seed: int) -> None:
        self.source = str(source)
        self.episodes, self.seed = episodes, seed
        self.onnx = self.source.endswith(".onnx")
        if self.onnx:
            from deploy.metadata import read_metadata

            meta = read_metadata(source)
            self.task, self.task_args = meta.task, dict(meta.task_args)
            self.dt = float(meta.control_period_s)
            self.max_episode_steps = int(meta.extra.get("max_episode_steps") or 0) or None
        else:
            from training.policy_kinds import load_policy

            self.loaded = load_policy(source)
            cfg = self.loaded.cfg
            self.task, self.task_args = cfg.env.task, dict(cfg.env.task_args)
            self.dt = float(self.loaded.ck["robot"]["control_dt"])
            self.max_episode_steps = cfg.env.max_episode_steps
        if not self.task:
            raise ValueError(f"{source}: the policy names no task to evaluate it on")

    def training_noise(self) -> dict[str, float]:
        from sim.registry import sim_to_real_config

        return dict(sim_to_real_config(self.task).obs_noise)

    def evaluate(
        self,
        task: str,
        extra_args: Mapping[str, Any],
        s2r: Mapping[str, Any] | None,
        max_steps: int | None,
        training_world: bool = False,
    ) -> dict[str, Any]:
        """Statistics in ``task`` with the policy's task options and ``extra_args`` over
        them; ``s2r``: sim-to-real settings over the nominal ones (None: the nominal
        model, or with ``training_world`` the task's own training randomization)."""
        task_args = {**self.task_args, **extra_args}
        settings = None if s2r is None else {**NOMINAL_S2R, **s2r}
        randomize = settings is not None or training_world
        if self.onnx:
            from deploy.sim2sim import evaluate_onnx

            counters: dict[str, int] = {}
            stats = evaluate_onnx(
                self.source,
                task=task,
                episodes=self.episodes,
                seed=self.seed,
                randomize=randomize,
                counters=counters,
                task_args=task_args,
                s2r=settings,
                max_steps=max_steps,
            )
            return {**stats, "safety": counters}
        from training.policy_kinds import evaluate_policy

        cfg = self.loaded.cfg
        env = dataclasses.replace(
            cfg.env,
            task=task,
            task_args=task_args,
            s2r=dict(settings or {}),
            randomize=randomize,
        )
        return evaluate_policy(
            self.loaded.policy,
            dataclasses.replace(cfg, env=env),
            self.loaded.kind.family,
            self.episodes,
            self.seed,
            randomize,
            max_steps=max_steps,
        )


# ---------------------------------------------------------------------- the matrix
def _policy(
    source: str | os.PathLike,
    episodes: int,
    seconds: float | None,
    seed: int,
    task_args: Mapping[str, Any] | None,
) -> tuple[_Policy, int | None]:
    """The policy with ``task_args`` over its own, and the step limit of ``seconds``."""
    if not (isinstance(episodes, int) and episodes >= 1):
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0 or None, got {seconds!r}")
    if task_args is not None and not isinstance(task_args, Mapping):
        raise ValueError(f"task_args must map task options to values, got {task_args!r}")
    policy = _Policy(source, episodes, seed)
    policy.task_args.update(task_args or {})
    max_steps = None if seconds is None else max(1, round(seconds / policy.dt))
    if max_steps is not None and policy.max_episode_steps:
        max_steps = min(max_steps, policy.max_episode_steps)
    return policy, max_steps


def evaluate_world(
    source: str | os.PathLike,
    episodes: int = 16,
    seconds: float | None = 10.0,
    seed: int = 0,
    task_args: Mapping[str, Any] | None = None,
    training_world: bool = False,
) -> dict[str, Any]:
    """Episode statistics of ``source`` in one world: the nominal model, or with
    ``training_world`` the task's own training randomization, noise, latency and pushes.
    The statistics of sim.evaluation (returns, falls, tracking errors, the share of steps
    that violate each declared constraint) with ``task`` and ``seconds``."""
    policy, max_steps = _policy(source, episodes, seconds, seed, task_args)
    stats = policy.evaluate(policy.task, {}, None, max_steps, training_world=training_world)
    return {
        "source": str(source),
        "task": policy.task,
        "seconds": None if max_steps is None else max_steps * policy.dt,
        **stats,
    }


def _check_levels(levels: Mapping[str, Sequence[float]] | None) -> dict[str, tuple[float, ...]]:
    if levels is None:
        return {name: s.levels for name, s in SHIFTS.items()}
    if not isinstance(levels, Mapping):
        raise ValueError(f"shifts must map shift names to lists of levels, got {levels!r}")
    unknown = sorted(set(levels) - set(SHIFTS))
    if unknown:
        raise ValueError(f"unknown shifts {unknown}; known: {list(SHIFTS)}")
    out = {}
    for name, values in levels.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"shift {name!r}: levels must be a non-empty list, got {values!r}")
        try:
            out[name] = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            raise ValueError(f"shift {name!r}: levels must be numbers, got {values!r}") from None
        if not all(math.isfinite(v) for v in out[name]):
            raise ValueError(f"shift {name!r}: levels must be finite, got {values!r}")
    return out


def robustness_matrix(
    source: str | os.PathLike,
    levels: Mapping[str, Sequence[float]] | None = None,
    episodes: int = 16,
    seconds: float | None = 10.0,
    seed: int = 0,
    progress: bool = True,
    task_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The matrix of ``source`` (run directory, checkpoint or .onnx).

    ``levels``: shift name -> its levels, for the rows wanted (default: every shift of
    :data:`SHIFTS` at its default levels). ``seconds``: the episodes' horizon (None: the
    task's whole episode). ``task_args``: task options over the policy's own in every
    cell, e.g. a fixed command ``{"command_vx": [0.5, 0.5]}``. Returns a JSON-able dict:
    the policy, ``rows`` (per shift its cells: level, fall_rate, success_rate,
    tracking_error, forward_speed (body frame, m/s), return_mean, violation_rate where the
    task declares constraints, ood), ``skipped`` (shift -> why) and ``ood_fall_rate``,
    the mean fall rate over the out-of-distribution cells.
    """
    grid = _check_levels(levels)
    policy, max_steps = _policy(source, episodes, seconds, seed, task_args)
    noise = policy.training_noise()
    rows, skipped = [], {}
    total = sum(len(v) for v in grid.values())
    done = 0
    for name, values in grid.items():
        shift = SHIFTS[name]
        task, rough_args = policy.task, {}
        if shift.terrain:
            if policy.task not in ROUGH_VARIANTS:
                skipped[name] = f"task {policy.task!r} has no heightfield variant"
                done += len(values)
                continue
            task, variant_args = ROUGH_VARIANTS[policy.task]
            rough_args = {k: v for k, v in variant_args.items() if not policy.task_args.get(k)}
        elif shift.settings(shift.nominal, noise) is None:
            skipped[name] = f"task {policy.task!r} has no such setting to shift"
            done += len(values)
            continue
        cells = []
        for v in values:
            extra: dict[str, Any] = {}
            if shift.terrain:
                if int(v) != v:
                    raise ValueError(f"terrain levels are whole numbers, got {v!r}")
                extra = {**rough_args, "level": int(v), "curriculum": False}
            # every row's nominal cell is the same nominal model (same draws, same commands)
            s2r = None if v == shift.nominal and not shift.terrain else shift.settings(v, noise)
            stats = policy.evaluate(task, extra, s2r or None, max_steps)
            n = stats["episodes"]
            fall = stats["terminated"] / n
            cells.append(
                {
                    "level": v,
                    "fall_rate": fall,
                    "success_rate": 1.0 - fall,
                    "tracking_error": stats.get("lin_vel_error_mean", float("nan")),
                    "forward_speed": stats.get("base_vx_mean", float("nan")),
                    "return_mean": stats["return_mean"],
                    "length_mean": stats["length_mean"],
                    "violation_rate": stats.get("violation_rate", float("nan")),
                    "ood": v != shift.nominal,
                }
            )
            done += 1
            if progress:
                print(
                    f"[{done}/{total}] {name}={v:g} {shift.unit}: fall {fall:.0%}, tracking "
                    f"error {cells[-1]['tracking_error']:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
        rows.append({"shift": name, "unit": shift.unit, "task": task, "cells": cells})
    ood = [c["fall_rate"] for r in rows for c in r["cells"] if c["ood"]]
    return {
        "source": str(source),
        "task": policy.task,
        "episodes": episodes,
        "seconds": None if max_steps is None else max_steps * policy.dt,
        "seed": seed,
        "rows": rows,
        "skipped": skipped,
        "ood_fall_rate": float(np.mean(ood)) if ood else float("nan"),
    }


# ---------------------------------------------------------------------- reporting
def format_matrix(result: Mapping[str, Any]) -> str:
    """The matrix as text: a line per shift, fall rate and tracking error per level."""
    lines = [
        f"{result['source']} ({result['task']}): {result['episodes']} episodes of "
        f"{result['seconds']} s per cell; fall rate / tracking error (m/s)"
    ]
    for row in result["rows"]:
        cells = "  ".join(
            f"{c['level']:g}: {c['fall_rate']:4.0%} / {c['tracking_error']:.3f}"
            for c in row["cells"]
        )
        lines.append(f"  {row['shift']:<15}({row['unit']}) {cells}")
    for name, why in result["skipped"].items():
        lines.append(f"  {name:<15}skipped: {why}")
    lines.append(f"out-of-distribution fall rate: {result['ood_fall_rate']:.1%}")
    return "\n".join(lines)


def plot_matrix(result: Mapping[str, Any], out: str | os.PathLike) -> Path:
    """A heatmap PNG: fall rate (left) and tracking error (right), a row per shift, a
    column per level, each cell labelled with its level and value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    if not rows:
        raise ValueError("the matrix has no rows to plot")
    width = max(len(r["cells"]) for r in rows)
    metrics = (
        ("fall_rate", "fall rate", "Reds", 0.0, 1.0),
        ("tracking_error", "tracking error (m/s)", "Blues", 0.0, None),
    )
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.6 * width, 1.2 + 0.55 * len(rows)))
    for ax, (key, title, cmap, lo, hi) in zip(axes, metrics):
        grid = np.full((len(rows), width), np.nan)
        for i, row in enumerate(rows):
            for j, cell in enumerate(row["cells"]):
                grid[i, j] = cell[key]
        finite = grid[np.isfinite(grid)]
        top = hi if hi is not None else (float(finite.max()) if finite.size else 1.0)
        image = ax.imshow(grid, cmap=cmap, vmin=lo, vmax=max(top, 1e-9), aspect="auto")
        for i, row in enumerate(rows):
            for j, cell in enumerate(row["cells"]):
                value = cell[key]
                text = (
                    "n/a"
                    if not math.isfinite(value)
                    else (f"{value:.0%}" if key == "fall_rate" else f"{value:.2f}")
                )
                dark = math.isfinite(value) and value > 0.6 * max(top, 1e-9)
                ax.text(
                    j,
                    i,
                    f"{cell['level']:g} {row['unit']}\n{text}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
        ax.set_yticks(range(len(rows)), [r["shift"] for r in rows])
        ax.set_xticks(range(width), ["nominal" if j == 0 else f"level {j}" for j in range(width)])
        ax.set_title(title)
        fig.colorbar(image, ax=ax, fraction=0.04)
    fig.suptitle(
        f"{Path(result['source']).name} ({result['task']}): {result['episodes']} episodes x "
        f"{result['seconds']:g} s per cell",
        fontsize=9,
    )
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_matrix(result: Mapping[str, Any], out: str | os.PathLike) -> Path:
    """The result as JSON (atomically)."""
    atomic_write(Path(out), json.dumps(result, indent=2))
    return Path(out)
