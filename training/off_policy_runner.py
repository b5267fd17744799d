"""The off-policy runner: a batched env feeds a replay buffer, a world model learns from
it at a fixed update-to-data ratio, with exact resume.

Built from the on-policy runner's pieces, as training.bc_runner is: the train config's
env and run sections, the checkpoint payload (training.runner.run_payload), the logger
and its episode statistics (training.logger), the loop with checkpoints and Ctrl-C
(training.run_control.train_loop) and evaluation (training.policy_kinds). What differs
is the data: every iteration steps all envs once, stores the transitions (the true last
observation of an ended episode from ``info["final_obs"]``, time-out and termination
kept apart) and then takes as many updates as ``utd_ratio`` x env steps asks for.

The checkpoint (kind ``world_model``) holds the replay buffer with its sampling
generator, the planner's warm start, the env and every random stream, so an
interrupted run continues exactly as if it had not stopped.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from policies.world_model import WorldModel
from sim.evaluation import evaluate
from training.algorithms.mppi import MPPIPlanner
from training.algorithms.tdmpc import TDMPC
from training.checkpoint import CheckpointError, save_checkpoint
from training.logger import RunLogger
from training.policy_kinds import (
    CHECKPOINT_KINDS,
    architecture,
    evaluate_policy,
    load_run_checkpoint,
    make_env,
)
from training.replay import SequenceReplay
from training.run_control import StallWatch, train_loop
from training.run_dir import prepare_run_dir
from training.runner import run_payload, write_config
from training.train_configs import WorldModelTrainConfig

__all__ = ["OffPolicyRunner", "evaluate_planner"]


def evaluate_planner(
    model: WorldModel, cfg: WorldModelTrainConfig, episodes: int, seed: int = 0
) -> dict[str, Any]:
    """Deterministic episodes (one per env, as evaluate_policy) of the MPPI planner over
    ``model``: the planner's figure beside the exported actor's. Its noise is seeded by
    ``seed``; nothing of the training's random streams is touched."""
    env = make_env(cfg, episodes, seed, randomize=False)
    planner = MPPIPlanner(model, cfg.planner, cfg.tdmpc.horizon, cfg.tdmpc.gamma, episodes, seed)
    try:

        def act(obs: dict[str, torch.Tensor], reset: torch.Tensor) -> torch.Tensor:
            planner.reset(reset)
            return model.to_env(planner.plan(obs["policy"]))

        return evaluate(act, env, episodes)
    finally:
        env.close()


class OffPolicyRunner:
    """Train a world model (``sim2real train world-model``) into ``run_dir``; ``resume``:
    a run directory or checkpoint to continue exactly where it stopped."""

    def __init__(
        self,
        cfg: WorldModelTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = torch.device(cfg.run.device)
        if self.device.type == "cpu" and cfg.run.torch_threads:
            torch.set_num_threads(cfg.run.torch_threads)
        torch.manual_seed(cfg.run.seed)
        self.kind = CHECKPOINT_KINDS[cfg.KIND]
        self.family = self.kind.family
        self.env = make_env(cfg)
        self.policy: WorldModel = self.family.build_policy(cfg, self.env).to(self.device)
        self.policy.eval()  # dropout only inside updates
        self.arch = architecture(cfg, self.env, self.family)
        self.learner = TDMPC(self.policy, cfg.tdmpc)
        # an update whose model and prior steps were both skipped as non-finite counts
        # as stalled (no KL here: the world model's updates have none)
        self.stall = StallWatch(cfg.run.max_stalled_updates, "world-model")
        self.replay = SequenceReplay(
            cfg.tdmpc.buffer_size,
            self.env.num_envs,
            self.policy.obs_size,
            self.policy.action_size,
            cfg.tdmpc.horizon,
            seed=cfg.run.seed + 1,
            device=self.device,
        )
        self.planner = MPPIPlanner(
            self.policy,
            cfg.planner,
            cfg.tdmpc.horizon,
            cfg.tdmpc.gamma,
            self.env.num_envs,
            seed=cfg.run.seed + 2,
        )
        self.generator = torch.Generator().manual_seed(cfg.run.seed + 3)  # acting noise
        self.iteration = 0
        self.env_steps = 0
        self.eval_history: list[dict[str, float]] = []
        self.obs: dict[str, torch.Tensor] = self.env.reset() if resume is None else {}
        prepare_run_dir(self.run_dir, resume)
        self.logger = RunLogger(
            self.run_dir, tensorboard=cfg.run.tensorboard, progress=cfg.run.progress, config=cfg
        )
        self._stats: dict[str, list[float]] = defaultdict(list)
        self._clock = time.perf_counter()
        if resume is not None:
            self._load(resume)
        write_config(self.run_dir, cfg)

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        payload = {
            "kind": self.kind.name,
            **run_payload(self.run_dir, self.cfg, self.env, self.arch),
            "policy": self.policy.state_dict(),
            "algorithm": self.learner.state_dict(),
            "replay": self.replay.state_dict(),
            "planner": self.planner.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.cpu() for k, v in self.obs.items()},
            "torch_rng": torch.get_rng_state(),
            "act_rng": self.generator.get_state(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            **self.logger.state_dict(),
            "eval_history": list(self.eval_history),
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, source: str | os.PathLike) -> None:
        src, ck = load_run_checkpoint(source, self.kind.name, self.arch)
        self.policy.load_state_dict(ck["policy"])
        self.learner.load_state_dict(ck["algorithm"])
        try:
            self.replay.load_state_dict(ck["replay"])
        except ValueError as e:
            raise CheckpointError(
                f"{src}: {e} (env.num_envs, tdmpc.buffer_size and "
                "tdmpc.horizon must stay as they were)"
            ) from None
        self.planner.load_state_dict(ck["planner"])
        self.env.load_state_dict(ck["env"])
        self.obs = {k: v.to(self.device) for k, v in ck["obs"].items()}
        torch.set_rng_state(ck["torch_rng"])
        self.generator.set_state(ck["act_rng"])
        self.iteration = int(ck["iteration"])
        self.env_steps = int(ck["env_steps"])
        self.logger.load_state_dict(ck)
        self.eval_history = list(ck.get("eval_history", []))
        self.logger.truncate_after(self.env_steps)

    # ------------------------------------------------------------------ acting
    def _actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1]: uniform before learning starts, then the planner's or the
        policy prior's, sampled."""
        n, a = obs.shape[0], self.policy.action_size
        if self.env_steps < self.cfg.tdmpc.seed_steps:
            return (torch.rand(n, a, generator=self.generator) * 2 - 1).to(self.device)
        if self.cfg.planner.act:
            return self.planner.plan(obs, explore=True)
        with torch.no_grad():
            return self.policy.pi(self.policy.encode(obs.float()), self.generator)[0]

    def updates_due(self) -> int:
        """Updates the run should have made by now: utd_ratio x env steps once the seed
        steps are done (so the first learning iteration catches up at once)."""
        if self.env_steps < self.cfg.tdmpc.seed_steps:
            return 0
        return math.floor(self.env_steps * self.cfg.tdmpc.utd_ratio)

    # ------------------------------------------------------------------ training
    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Deterministic episodes of the policy prior as it is exported (seed run.seed +
        12345)."""
        return evaluate_policy(
            self.policy,
            self.cfg,
            self.family,
            episodes or self.cfg.run.eval_episodes,
            seed=self.cfg.run.seed + 12345,
        )

    def evaluate_planner(self, episodes: int | None = None) -> dict[str, Any]:
        """The same episodes, acted by the planner."""
        return evaluate_planner(
            self.policy,
            self.cfg,
            episodes or self.cfg.run.eval_episodes,
            seed=self.cfg.run.seed + 12345,
        )

    def _iteration(self, total_iters: int) -> int:
        cfg = self.cfg
        obs = self.obs["policy"]
        actions = self._actions(obs)
        next_obs, reward, terminated, truncated, info = self.env.step(self.policy.to_env(actions))
        final = info["final_obs"]["policy"]  # the true last observation of ended episodes
        self.replay.add(obs, actions, reward, final, terminated, truncated)
        self.planner.reset(terminated | truncated)
        self.logger.record_env_step(info)
        self.obs = next_obs
        self.iteration += 1
        self.env_steps += self.env.num_envs
        while self.learner.num_updates < self.updates_due():
            stats = self.learner.update(self.replay.sample(cfg.tdmpc.batch_size))
            for k, v in stats.items():
                self._stats[k].append(v)
            self.stall.observe(stats, self.iteration, self.env_steps)
            if self.stall.diverged:
                self._log(total_iters)
                self.logger.close()
                raise self.stall.error(self.save())
        if self.iteration % cfg.run.log_every == 0 or self.iteration == total_iters:
            self._log(total_iters)
        self.logger.advance(self.env.num_envs, ret=f"{self.logger.mean_return:.1f}")
        return self.iteration

    def _log(self, total_iters: int) -> None:
        now = time.perf_counter()
        row: dict[str, Any] = {**self.logger.end_rollout()}
        row["train/return"] = self.logger.mean_return
        row["train/episode_length"] = self.logger.mean_length
        row["iteration"] = self.iteration
        row["tdmpc/updates"] = self.learner.num_updates
        updates = len(self._stats.get("model_loss", []))
        for k, values in self._stats.items():
            finite = [v for v in values if math.isfinite(v)]
            row[f"tdmpc/{k}"] = sum(finite) / len(finite) if finite else float("nan")
        seconds = max(now - self._clock, 1e-9)
        row["perf/steps_per_second"] = self.cfg.run.log_every * self.env.num_envs / seconds
        row["perf/updates_per_second"] = updates / seconds
        row["replay/transitions"] = len(self.replay)
        every = self.cfg.run.eval_every
        if every and self.iteration % every == 0 and self.iteration < total_iters:
            actor = self.evaluate()["return_mean"]
            planner = self.evaluate_planner()["return_mean"]
            row["eval/return"], row["eval/planner_return"] = actor, planner
            self.eval_history.append(
                {"env_steps": self.env_steps, "return": actor, "planner_return": planner}
            )
        self.logger.log(self.env_steps, row)
        self._stats.clear()
        self._clock = time.perf_counter()

    def train(self) -> dict[str, Any]:
        """Train up to run.total_steps. The summary: ``return`` (mean of the last 100
        training episodes, as collected), and when the run is complete ``eval_planner``
        (the planner's deterministic evaluation; finish_run adds the actor's)."""
        cfg = self.cfg
        total_iters = math.ceil(cfg.run.total_steps / self.env.num_envs)
        self.logger.start_progress(
            total_iters * self.env.num_envs, self.env_steps, "step", f"world-model {cfg.env.task}"
        )
        self._clock = time.perf_counter()
        stopped = train_loop(
            self.iteration,
            total_iters,
            lambda: self._iteration(total_iters),
            self.save,
            cfg.run.checkpoint_every,
        )
        self.logger.close()
        out: dict[str, Any] = {
            "iterations": self.iteration,
            "env_steps": self.env_steps,
            "updates": self.learner.num_updates,
            "return": self.logger.mean_return,
            "stopped_early": stopped,
            "eval_history": list(self.eval_history),
        }
        if not stopped and cfg.run.eval_planner:
            out["eval_planner"] = self.evaluate_planner()
        return out

    def close(self) -> None:
        self.env.close()
