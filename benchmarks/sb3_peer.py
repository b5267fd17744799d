"""stable-baselines3 PPO as the benchmarks' peer: training with a return curve, and the
deterministic evaluation on Gymnasium's own env, shared by the scripts that compare
against it (ppo_vs_sb3.py, ppo_quality.py).

benchmarks/ is a folder of scripts, not a package: a script imports this module after
putting its own folder on sys.path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

# our task name -> the Gymnasium env it reproduces exactly
GYM_IDS = {
    "cartpole": "InvertedPendulum-v5",
    "halfcheetah": "HalfCheetah-v5",
    "hopper": "Hopper-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
}


def evaluate(
    model, env_id: str, vecnorm=None, episodes: int = 10, seed: int = 100
) -> dict[str, float]:
    """Deterministic return and episode length over `episodes` episodes of `env_id`,
    observations normalized by SB3's VecNormalize statistics where the model trained
    with them."""
    env = gym.make(env_id)
    rets, lens = [], []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, ret, n = False, 0.0, 0
        while not done:
            o = vecnorm.normalize_obs(obs) if vecnorm is not None else obs
            a, _ = model.predict(o, deterministic=True)
            obs, r, term, trunc, _ = env.step(a)
            ret += float(r)
            n += 1
            done = term or trunc
        rets.append(ret)
        lens.append(n)
    env.close()
    return {
        "return_mean": float(np.mean(rets)),
        "return_std": float(np.std(rets)),
        "length_mean": float(np.mean(lens)),
    }


class Curve:
    """SB3 callback recording (wall s, env steps, mean return of the last 20 episodes)."""

    def __init__(self) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self
        self.points: list[tuple[float, int, float]] = []
        self.returns: list[float] = []
        self.t0 = time.perf_counter()

        class CB(BaseCallback):
            def _on_step(self) -> bool:
                for info in self.locals["infos"]:
                    if "episode" in info:
                        outer.returns.append(info["episode"]["r"])
                        outer.points.append(
                            (
                                time.perf_counter() - outer.t0,
                                self.num_timesteps,
                                float(np.mean(outer.returns[-20:])),
                            )
                        )
                return True

        self.cb = CB()


def train_default(env_id: str, steps: int, seed: int) -> dict:
    """SB3 PPO as its users run it on MuJoCo: the library's defaults (one env, 2048-step
    rollouts, 10 epochs of 64-sample minibatches, lr 3e-4) with VecNormalize."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    venv = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed))
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu")
    curve = Curve()
    t0 = time.perf_counter()
    model.learn(steps, callback=curve.cb)
    wall = time.perf_counter() - t0
    venv.training = False
    stats = evaluate(model, env_id, venv, episodes=10, seed=10_000 + seed)
    return {"env_id": env_id, "seed": seed, "steps": steps, "wall_s": wall,
            "train_return": curve.points[-1][2] if curve.points else float("nan"),
            "curve": curve.points, **stats}  # fmt: skip


def cached_default(env_id: str, steps: int, seed: int, out: Path) -> dict:
    """train_default, read back from `out` when this (env, budget, seed) already ran."""
    path = Path(out) / f"sb3_default_{env_id}_{steps}_s{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    res = train_default(env_id, steps, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(path)
    return res
