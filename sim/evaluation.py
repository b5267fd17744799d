"""Episode statistics of a policy in the batched simulator (an act function and a VecEnv).

Shared by checkpoint evaluation and by sim2sim evaluation of exported ONNX files,
so both report the same numbers in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# act(obs, reset_mask) -> actions; reset_mask tells a stateful policy which envs
# started a new episode (all True on the first call).
ActFn = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


def evaluate(act: ActFn, env, episodes: int, max_steps: int | None = None) -> dict[str, Any]:
    """Run each env's first episode to its end (or to `max_steps` control steps);
    `env.num_envs` must be >= `episodes`.

    Taking the first episode of every env (rather than the first `episodes` that end)
    avoids favouring short episodes.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if env.num_envs < episodes:
        raise ValueError(
            f"env has {env.num_envs} envs, fewer than the {episodes} episodes asked for"
        )
    obs = env.reset()
    n = env.num_envs
    done = np.zeros(n, dtype=bool)
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    fell = np.zeros(n, dtype=bool)
    extras: dict[str, list[float]] = {}
    # constraint name -> per env, the steps that violated it (tasks that declare
    # constraints report info["cstr_<name>"] > 0 when violated; training.constraints)
    violated: dict[str, np.ndarray] = {}
    any_violated = np.zeros(n, dtype=np.int64)
    reset_mask = torch.ones(n, dtype=torch.bool, device=env.device)
    limit = max_steps or env.max_episode_steps + 1
    lo = torch.as_tensor(env.action_spec.low, dtype=torch.float32, device=env.device)
    hi = torch.as_tensor(env.action_spec.high, dtype=torch.float32, device=env.device)
    for _ in range(limit):
        with torch.no_grad():
            actions = act(obs, reset_mask)
        actions = torch.clamp(
            torch.as_tensor(actions, dtype=torch.float32, device=env.device), lo, hi
        )
        obs, reward, terminated, truncated, info = env.step(actions)
        live = ~done
        ret[live] += reward.cpu().numpy().astype(np.float64)[live]
        length[live] += 1
        for k in ("lin_vel_error", "ang_vel_error", "base_vx"):
            if k in info:
                extras.setdefault(k, []).extend(info[k].cpu().numpy()[live[:]].tolist())
        step_any = np.zeros(n, dtype=bool)
        for k, v in info.items():
            if k.startswith("cstr_"):
                hit = (v.cpu().numpy() > 0) & live
                violated.setdefault(k.removeprefix("cstr_"), np.zeros(n, np.int64))[hit] += 1
                step_any |= hit
        any_violated += step_any
        term = terminated.cpu().numpy()
        fell |= term & live
        ended = term | truncated.cpu().numpy()
        reset_mask = torch.as_tensor(ended, device=env.device)
        done |= ended
        if done[:episodes].all():
            break
    sel = slice(0, episodes)
    out = {
        "episodes": int(episodes),
        "return_mean": float(ret[sel].mean()),
        "return_std": float(ret[sel].std()),
        "length_mean": float(length[sel].mean()),
        "length_std": float(length[sel].std()),
        "completed": int(done[sel].sum()),
        # ended by a termination (a fall) rather than a time-out or the step limit
        "terminated": int(fell[sel].sum()),
        # per episode as well: a mean with a large std hides whether one episode failed
        # (a fall, a flip) or all were mediocre
        "returns": ret[sel].tolist(),
        "lengths": length[sel].tolist(),
    }
    for k, v in extras.items():
        out[f"{k}_mean"] = float(np.mean(v))
    if violated:
        # share of the episodes' steps that violate each constraint, and any of them
        steps = max(int(length[sel].sum()), 1)
        out["violation_rate"] = float(any_violated[sel].sum() / steps)
        for name, count in violated.items():
            out[f"violation_rate_{name}"] = float(count[sel].sum() / steps)
    return out
