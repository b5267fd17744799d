"""Demonstration files for tests: random but well-formed, in the task's own layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def random_demos(path: Path, task: str = "hopper", lengths: tuple[int, ...] = (12, 9)) -> Path:
    """Episodes of random observations and actions (seed 0) that fit ``task``'s spec."""
    from sim.registry import make
    from training.demos import DemoDataset, Episode, save_demos

    env = make(task, 1)
    group = env.observation_spec.policy
    terms = [(t.name, t.size) for t in group.terms]
    n_obs, n_act = group.frame_size, len(env.action_spec.joint_names)
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            rng.standard_normal((n, n_obs)).astype(np.float32),
            rng.standard_normal((n, n_obs)).astype(np.float32),
            rng.uniform(-1, 1, (n, n_act)).astype(np.float32),
            np.ones(n, np.float32),
            True,
        )
        for n in lengths
    ]
    data = DemoDataset(
        task,
        terms,
        list(env.action_spec.joint_names),
        np.asarray(env.action_spec.low, np.float64),
        np.asarray(env.action_spec.high, np.float64),
        float(env.dt),
        episodes,
    )
    env.close()
    return save_demos(path, data)
