"""Record demonstrations by rolling a trained policy out in the simulator.

The source is any checkpoint kind (training.policy_kinds), an exported ONNX file run
through the deployment runtime, or ``"expert"``: the task's own scripted expert (a task
that has one offers ``expert_action()``; it reads the true simulator state). The episodes
are written in the layout of :mod:`training.demos`, with the camera frames of a task's
image groups and the instruction of each episode where the task has them.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from training.demos import DemoDataset, Episode
from training.policy_kinds import load_policy

__all__ = ["EXPERT", "collect_demos"]

# the source that names a task's scripted expert; a run directory called "expert" is
# still reachable as "./expert"
EXPERT = "expert"


def _expert_actor(task: str | None, num_envs: int, seed: int, env_kwargs: dict):
    from sim.registry import make

    if task is None:
        raise ValueError("the scripted expert needs a task (--task)")
    env = make(task, num_envs, seed=seed, **env_kwargs)
    if not callable(getattr(env, "expert_action", None)):
        env.close()
        raise ValueError(f"task {task!r} has no scripted expert (no expert_action())")

    def act(obs, reset):
        return torch.as_tensor(env.expert_action(), dtype=torch.float32)

    return act, env


def _source_actor(
    source: str | os.PathLike,
    task: str | None,
    num_envs: int,
    seed: int,
    env_kwargs: dict | None = None,
):
    """(act(obs, reset) -> actions, env) for a checkpoint of any kind, an ONNX file or
    the task's scripted expert."""
    if str(source) == EXPERT:
        return _expert_actor(task, num_envs, seed, env_kwargs or {})
    if env_kwargs:
        raise ValueError(
            f"env_kwargs {sorted(env_kwargs)} apply to the scripted expert only; a policy's "
            "env is the one it was trained on"
        )
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
    env_kwargs: dict | None = None,
) -> DemoDataset:
    """Roll a policy out (deterministically, plus optional action noise) and record it.

    source: a run directory, checkpoint or .onnx file, or "expert" for the task's
    scripted expert. env_kwargs: task options for the expert's env (e.g.
    ``{"split": "eval", "image_size": 128}``), recorded in the file's env_args.
    Observation groups that hold images (uint8 [N, H, W, C]) are recorded as image
    keys, and an env's ``instructions`` (one text per env) as each episode's instruction.

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
    act, env = _source_actor(source, task, n, seed, env_kwargs)
    try:
        group = env.observation_spec.policy
        frame = group.frame_size
        terms = [(t.name, t.size) for t in group.terms]
        spoken = hasattr(env, "instructions")
        low = np.asarray(env.action_spec.low, dtype=np.float64)
        high = np.asarray(env.action_spec.high, dtype=np.float64)
        half = 0.5 * (high - low)
        rng = np.random.default_rng(seed + 1)
        quota = np.full(n, episodes // n)
        quota[: episodes % n] += 1
        done_count = np.zeros(n, dtype=np.int64)
        bufs: list[dict[str, list]] = [_new_buffer() for _ in range(n)]
        finished: list[list[Episode]] = [[] for _ in range(n)]
        obs = env.reset()
        image_keys = [k for k, v in obs.items() if v.dim() == 4 and v.dtype == torch.uint8]
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
            shown = {k: obs[k].cpu().numpy() for k in image_keys}
            said = env.instructions if spoken else None
            obs, reward, terminated, truncated, info = env.step(
                torch.as_tensor(a, dtype=torch.float32)
            )
            final_obs = info.get("final_obs", obs)
            final = final_obs["policy"][:, -frame:].cpu().numpy()
            shown_next = {k: final_obs[k].cpu().numpy() for k in image_keys}
            r = reward.cpu().numpy()
            term = terminated.cpu().numpy()
            ended = (terminated | truncated).cpu().numpy()
            for i in range(n):
                if done_count[i] >= quota[i]:
                    continue
                b = bufs[i]
                if said is not None and not b["act"]:
                    b["instruction"] = said[i]
                b["obs"].append(frames[i])
                b["next"].append(final[i])
                b["act"].append(a[i])
                b["rew"].append(r[i])
                for k in image_keys:
                    b["img"].setdefault(k, []).append(shown[k][i])
                    b["next_img"].setdefault(k, []).append(shown_next[k][i])
                if ended[i]:
                    finished[i].append(
                        Episode(
                            np.asarray(b["obs"], np.float32),
                            np.asarray(b["next"], np.float32),
                            np.asarray(b["act"], np.float32),
                            np.asarray(b["rew"], np.float32),
                            bool(term[i]),
                            {k: np.stack(v) for k, v in b["img"].items()},
                            {k: np.stack(v) for k, v in b["next_img"].items()},
                            b["instruction"],
                        )
                    )
                    bufs[i] = _new_buffer()
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
            info={
                "source": str(source),
                "action_noise": float(noise),
                "seed": int(seed),
                **({"env_kwargs": dict(env_kwargs)} if env_kwargs else {}),
            },
        )
    finally:
        env.close()


def _new_buffer() -> dict:
    return {
        "obs": [],
        "next": [],
        "act": [],
        "rew": [],
        "img": {},
        "next_img": {},
        "instruction": None,
    }
