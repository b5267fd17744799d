"""Learners built on the optimizer core."""

from training.algorithms.ppo import PPO, SCHEDULES, PPOConfig

__all__ = ["PPO", "SCHEDULES", "PPOConfig"]
