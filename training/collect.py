"""Record demonstrations by rolling a trained policy out in the simulator.

The source is any checkpoint kind (training.policy_kinds) or an exported ONNX file run
through the deployment runtime; the episodes are written in the layout of
:mod:`training.demos`.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from training.demos import DemoDataset, Episode
from training.policy_kinds import load_policy

__all__ = ["collect_demos"]


def _source_actor(source: str | os.PathLike, task: str | None, num_envs: int, seed: int):
    """(act(obs, reset) -> actions, env) for a checkpoint of any kind or an ONNX file."""
    if str(source).endswith(".onnx"):
        from deploy.runtime import OnnxPolicy
        from deploy.sim2sim import Sim2SimActor, make_env_for

        policy = OnnxPolicy(source, deterministic=True)
        env = make_env_for(policy.metadata, task, num_envs, seed, randomize=False)
        return Sim2SimActor(policy, env.num_envs, env.dt, safety=False), env
    loaded = load_policy(source, task=task)
    env = loaded.make_env(num_envs, seed, randomize=False)
    return loaded.actor(env.num_envs, deterministic=True), env


def collect_demos(
    source: str | os.PathLike,
    task: str | None = None,
    episodes: int = 10,
    noise: float = 0.0,
    seed: int = 0,
    num_envs: int = 16,
    progress: bool = False,
) -> DemoDataset:
    """Roll a policy out (deterministically, plus optional action noise) and record it.

    noise: std of Gaussian action noise as a fraction of each joint's half range, so for
    actions bounded by [-1, 1] it is the std itself; noisy actions are clipped to the
    bounds and the *executed* action is recorded (the demonstrations are imperfect, not
    the labels of a perfect policy). Each env records a fixed quota of its first
    episodes, so short episodes are not favoured.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    n = max(1, min(int(num_envs), episodes))
    act, env = _source_actor(source, task, n, seed)
    try:
        group = env.observation_spec.policy
        frame = group.frame_size
        terms = [(t.name, t.size) for t in group.terms]
        low = np.asarray(env.action_spec.low, dtype=np.float64)
        high = np.asarray(env.action_spec.high, dtype=np.float64)
        half = 0.5 * (high - low)
        rng = np.random.default_rng(seed + 1)
        quota = np.full(n, episodes // n)
        quota[: episodes % n] += 1
        done_count = np.zeros(n, dtype=np.int64)
        bufs: list[dict[str, list]] = [
            {"obs": [], "next": [], "act": [], "rew": []} for _ in range(n)
        ]
        finished: list[list[Episode]] = [[] for _ in range(n)]
        obs = env.reset()
        reset = torch.ones(n, dtype=torch.bool)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=episodes, unit="episode", desc=f"collect {env.name}")
        while (done_count < quota).any():
            with torch.no_grad():
                a = act(obs, reset)
            a = np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a, np.float64)
            if noise > 0:
                a = a + noise * half * rng.standard_normal(a.shape)
            a = np.clip(a, low, high)
            frames = obs["policy"][:, -frame:].cpu().numpy()
            obs, reward, terminated, truncated, info = env.step(
                torch.as_tensor(a, dtype=torch.float32)
            )
            final = info.get("final_obs", obs)["policy"][:, -frame:].cpu().numpy()
            r = reward.cpu().numpy()
            term = terminated.cpu().numpy()
            ended = (terminated | truncated).cpu().numpy()
            for i in range(n):
                if done_count[i] >= quota[i]:
                    continue
                b = bufs[i]
                b["obs"].append(frames[i])
                b["next"].append(final[i])
                b["act"].append(a[i])
                b["rew"].append(r[i])
                if ended[i]:
                    finished[i].append(
                        Episode(
                            np.asarray(b["obs"], np.float32),
                            np.asarray(b["next"], np.float32),
                            np.asarray(b["act"], np.float32),
                            np.asarray(b["rew"], np.float32),
                            bool(term[i]),
                        )
                    )
                    bufs[i] = {"obs": [], "next": [], "act": [], "rew": []}
                    done_count[i] += 1
                    if bar is not None:
                        bar.update(1)
            reset = torch.as_tensor(ended)
        if bar is not None:
            bar.close()
        eps = [e for per_env in finished for e in per_env]
        return DemoDataset(
            task=env.name,
            obs_terms=terms,
            action_joint_names=list(env.action_spec.joint_names),
            action_low=low,
            action_high=high,
            control_period_s=float(env.dt),
            episodes=eps,
            info={"source": str(source), "action_noise": float(noise), "seed": int(seed)},
        )
    finally:
        env.close()
