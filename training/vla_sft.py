"""Supervised fine-tuning (behaviour cloning) of a vision-language-action policy on
demonstrations with camera images and instructions, with exact resume.

The data: a demonstration file (training.demos) whose episodes carry an image key and
an instruction (``sim2real collect expert --task instructed_reach``). Every step t of
every episode is one sample: the frame's image, the episode's instruction as token ids,
the proprioceptive frame, and the action chunk t .. t + horizon - 1 (the last action
repeated past the episode's end, as flow BC does). The loss is the VLA's shortcut
flow-matching loss (policies.vla.VLAPolicy.bc_loss), through the one guarded update
(training.core.guard) with a cosine schedule.

The tokenizer is built from the words of the demonstrations' instructions and of the
task's own instruction list where the task has one (so held-out instructions tokenise),
and saved as ``tokenizer.json`` in the run directory, next to the checkpoints; the
export ships it beside the ONNX file.

Evaluation is closed-loop in the batched simulator on the task's ``train`` and ``eval``
splits (held-out instruction/layout pairs): deterministic chunks (zero noise), act_steps
of each executed, success = the episode ended by reaching the named target.

Resume: the checkpoint holds the weights, the optimizer, the guard, both generators
and the update count, so N + N updates equal 2N bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from policies.vla import VLAConfig, VLAPolicy
from policies.vla_tokenizer import build_word_tokenizer, encode_instructions, instruction_vocabulary
from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from training.config import ConfigError, from_dict, to_dict
from training.core.guard import UpdateGuard
from training.core.schedules import CosineSchedule
from training.demos import DatasetError, DemoDataset, load_demos
from training.logger import RunLogger
from training.run_control import train_loop
from training.run_dir import prepare_run_dir
from training.runner import write_config

__all__ = [
    "KIND",
    "VLASFTConfig",
    "VLASFTRunner",
    "VLASFTTrainConfig",
    "evaluate_success",
    "export_vla_run",
    "load_vla_run",
    "vla_policy_from_checkpoint",
]

KIND = "vla_sft"
"""Checkpoint kind of a VLA SFT run."""
VLA_KINDS = ("vla_sft", "vla_rl")
"""Checkpoint kinds of VLA runs, which export_vla_run turns into ONNX."""


@dataclass
class VLASFTConfig:
    """The optimisation and the run's bookkeeping."""

    ADDED: ClassVar[dict[str, str]] = {"goal_term": ""}
    """Runs saved before the goal probe existed trained without it."""

    num_updates: int = 4000
    """Gradient updates in all."""
    batch_size: int = 128
    """Samples (steps of demonstrations) per update."""
    lr: float = 2e-3
    """Peak learning rate of AdamW (after the warm-up). The flow head is what needs it:
    on instructed_reach, 2 000 updates at 3e-4 and batch 64 left the BC loss at 0.25 and
    0% success (and a flow head given the true goal, at that budget, explained no more
    of the expert's actions than proprioception does); at 2e-3 and batch 128 the loss
    was 0.056 and success 41-47% after 2 000 updates (docs/benchmarks_vla.md)."""
    lr_final: float = 1e-4
    """Learning rate at the end of the cosine schedule."""
    warmup: int = 50
    """Updates of linear warm-up (cut to the run's length if longer)."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this."""
    goal_term: str = "auto"
    """Proprioceptive term whose value at each demonstration's end the image's reading
    learns to predict, through a linear probe beside the BC loss (a reach ends on its
    target: the fingertip's last position says where the named ball was). The probe reads
    the film_keypoints encoder's keypoints (a SigLIP backbone: its features). The BC loss
    alone teaches where the target is only through the noisy action regression; and a
    probe on the features is first fitted from proprioception, which predicts the goal
    to 0.07 m on instructed_reach and kept the image unused for 1 000 updates, where the
    keypoints, which only the image feeds, reached 0.004 m in 500. "auto": the task's
    GOAL_TERM where it declares one; "": no auxiliary loss. The probe is a training aid:
    not exported."""
    goal_weight: float = 1.0
    """Weight of the probe's loss (mean squared error of the normalised goal)."""
    seed: int = 0
    """Seeds the weights, the minibatches and the flow draws."""
    device: str = "cpu"
    """Torch device of the policy and the data."""
    log_every: int = 50
    """Updates between rows of metrics (JSONL, TensorBoard, progress bar)."""
    checkpoint_every: int = 500
    """Updates between checkpoints (one is also written at the end and on Ctrl-C)."""
    eval_every: int = 0
    """Updates between closed-loop evaluations during training (0: only at the end)."""
    eval_episodes: int = 16
    """Episodes per split of each evaluation."""
    eval_envs: int = 8
    """Envs stepping at once during evaluation."""
    video: bool = True
    """Record policy.mp4 in the run directory during the final evaluation: the held-out
    split's first episodes, the instruction written on every frame."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard event files beside metrics.jsonl."""

    def __post_init__(self) -> None:
        for name in ("num_updates", "batch_size", "log_every", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"VLASFTConfig.{name} must be an integer >= 1, got {v!r}")
        for name in ("eval_every", "eval_episodes", "eval_envs", "warmup"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"VLASFTConfig.{name} must be an integer >= 0, got {v!r}")
        if not self.lr > 0 or not self.lr_final >= 0 or not self.max_grad_norm > 0:
            raise ValueError("VLASFTConfig: lr and max_grad_norm must be > 0, lr_final >= 0")
        if not self.goal_weight >= 0:
            raise ValueError(f"VLASFTConfig.goal_weight must be >= 0, got {self.goal_weight!r}")


@dataclass
class VLASFTTrainConfig:
    """A VLA SFT run: the demonstrations, the model and the optimisation."""

    data: str = ""
    """Demonstration file with camera images and instructions (sim2real collect)."""
    image_key: str = "image"
    """The demonstrations' image key the policy sees."""
    sft: VLASFTConfig = field(default_factory=VLASFTConfig)
    """Optimisation and bookkeeping."""
    model: VLAConfig = field(default_factory=VLAConfig)
    """The VLA: towers, tokens, LoRA and the flow action head."""


def _check_dataset(data: DemoDataset, cfg: VLASFTTrainConfig) -> tuple[int, int, int]:
    """The image shape (H, W, C) the demonstrations give the policy, or a DatasetError."""
    keys = data.image_keys
    if cfg.image_key not in keys:
        raise DatasetError(
            f"{cfg.data}: no camera images under {cfg.image_key!r} (image keys: "
            f"{sorted(keys) or 'none'}); a VLA learns from demonstrations of a task with an "
            "image group, e.g. sim2real collect expert --task instructed_reach"
        )
    missing = [i for i, t in enumerate(data.instructions) if not t]
    if missing:
        raise DatasetError(
            f"{cfg.data}: episodes {missing[:8]} have no instruction; a VLA needs one per episode"
        )
    shape = keys[cfg.image_key]
    s = cfg.model.image_size
    if shape != (s, s, 3):
        raise ConfigError(
            f"{cfg.data}: images are {list(shape)} but model.image_size is {s}; set "
            f"model.image_size={shape[0]} (square RGB images)"
        )
    return shape


def _task_module(task: str) -> Any:
    """The module that defines ``task`` (None: the task cannot be looked up)."""
    import importlib

    from sim.registry import task_class

    try:
        cls = task_class(task)
    except Exception:  # an unknown task declares nothing
        return None
    return importlib.import_module(cls.__module__)


def _task_instructions(task: str) -> list[str]:
    """Every instruction the task can give (for the tokenizer's vocabulary), if it says."""
    fn = getattr(_task_module(task), "all_instructions", None)
    return list(fn()) if callable(fn) else []


def _goal_slice(data: DemoDataset, term: str) -> slice | None:
    """Where in a proprioceptive frame the goal term sits (None: no goal loss)."""
    if term == "auto":
        term = str(getattr(_task_module(data.task), "GOAL_TERM", ""))
    if not term:
        return None
    from sim.spec import ObsGroup, ObsTerm

    slices = ObsGroup(tuple(ObsTerm(n, s) for n, s in data.obs_terms)).slices()
    if term in slices:
        return slices[term]
    raise ConfigError(
        f"sft.goal_term={term!r} is not a proprioceptive term of {data.task!r}'s "
        f"demonstrations (terms: {[n for n, _ in data.obs_terms]}); '' turns the goal loss off"
    )


class VLASFTRunner:
    """Behaviour cloning of a VLAPolicy on image + instruction demonstrations."""

    def __init__(
        self,
        cfg: VLASFTTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        if not cfg.data:
            raise ConfigError("VLA SFT needs a demonstration file (--data / data=...)")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        sc = cfg.sft
        self.device = torch.device(sc.device)
        torch.manual_seed(sc.seed)
        self.data = load_demos(cfg.data)
        _check_dataset(self.data, cfg)
        prepare_run_dir(self.run_dir, resume)  # one run per directory

        # samples: every step of every episode
        proprio, chunks = self.data.windows(1, cfg.model.head.horizon)
        words = instruction_vocabulary(
            [t for t in self.data.instructions if t] + _task_instructions(self.data.task)
        )
        self.tokenizer_path = self.run_dir / "tokenizer.json"
        self.tokenizer = build_word_tokenizer(words, self.tokenizer_path)
        if self.tokenizer.get_vocab_size() > cfg.model.vocab_size:
            raise ConfigError(
                f"the instructions have {self.tokenizer.get_vocab_size()} tokens but "
                f"model.vocab_size is {cfg.model.vocab_size}; raise it"
            )
        ids = encode_instructions(
            self.tokenizer,
            [e.instruction for e in self.data.episodes],
            cfg.model.max_instruction_tokens,
            cfg.model.pad_token_id,
        )
        lengths = [len(e) for e in self.data.episodes]
        self.ids = torch.as_tensor(np.repeat(ids, lengths, axis=0), device=self.device)
        self.images = torch.as_tensor(
            np.concatenate([e.images[cfg.image_key] for e in self.data.episodes]),
            device=self.device,
        )
        self.proprio = proprio.to(self.device)
        self.chunks = chunks.to(self.device)
        goal = _goal_slice(self.data, sc.goal_term) if sc.goal_weight > 0 else None
        self.goals: torch.Tensor | None = None
        if goal is not None:  # each sample's goal: the term in its episode's last next frame
            ends = np.concatenate(
                [np.repeat(e.next_obs[-1:, goal], len(e), 0) for e in self.data.episodes]
            )
            self.goals = torch.as_tensor(ends, dtype=torch.float32, device=self.device)

        self.policy = VLAPolicy(
            self.data.frame_size,
            self.data.action_size,
            cfg.model,
            action_low=self.data.action_low,
            action_high=self.data.action_high,
        ).to(self.device)
        self.policy.update_proprio_normalizer(self.proprio)
        self.params = [p for _, p in self.policy.trainable_named_parameters()]
        # the goal probe: linear, so the features must hold the goal plainly
        self.goal_probe: torch.nn.Linear | None = None
        if self.goals is not None:
            bb = self.policy.backbone
            reads = 2 * cfg.model.keypoints if bb.keypoint_encoder else bb.feature_size
            self.goal_probe = torch.nn.Linear(reads, self.goals.shape[1]).to(self.device)
            self.goal_mean = self.goals.mean(0)
            self.goal_std = self.goals.std(0).clamp_min(1e-6)
            self.params += list(self.goal_probe.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=sc.lr, weight_decay=sc.weight_decay)
        warmup = min(sc.warmup, sc.num_updates - 1)
        self.schedule = CosineSchedule(sc.lr, sc.lr_final, sc.num_updates, warmup)
        self.guard = UpdateGuard(self.optimizer, self.params, sc.max_grad_norm)
        self.generator = torch.Generator(device=self.device).manual_seed(sc.seed)
        self.num_updates = 0
        self.logger = RunLogger(self.run_dir, tensorboard=sc.tensorboard, progress=sc.progress)
        if resume is not None:
            self._load(resume)
        write_config(self.run_dir, cfg)

    # ------------------------------------------------------------------ state
    def save(self) -> Path:
        payload = {
            "kind": KIND,
            "config": to_dict(self.cfg),
            "task": self.data.task,
            "proprio_size": self.data.frame_size,
            "action_size": self.data.action_size,
            "action_low": self.data.action_low.tolist(),
            "action_high": self.data.action_high.tolist(),
            "policy": self.policy.state_dict(),
            "goal_probe": None if self.goal_probe is None else self.goal_probe.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "guard": self.guard.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "iteration": self.num_updates,
            "dataset": {"path": str(self.cfg.data), **self.data.summary()},
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, source: str | os.PathLike) -> None:
        ck = load_checkpoint(find_checkpoint(source))
        if ck.get("kind") != KIND:
            raise CheckpointError(f"{source} is a {ck.get('kind')!r} checkpoint, not {KIND!r}")
        if to_dict(_model_config(ck["config"]["model"])) != to_dict(self.cfg.model):
            raise CheckpointError(f"{source} was trained with another model config")
        saved = from_dict(VLASFTConfig, ck["config"]["sft"])
        if (saved.goal_term, saved.goal_weight) != (
            self.cfg.sft.goal_term,
            self.cfg.sft.goal_weight,
        ):
            raise CheckpointError(f"{source} was trained with another goal_term / goal_weight")
        self.policy.load_state_dict(ck["policy"])
        if self.goal_probe is not None:
            self.goal_probe.load_state_dict(ck["goal_probe"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.guard.load_state_dict(ck["guard"])
        self.generator.set_state(ck["generator"])
        torch.set_rng_state(ck["torch_rng"])
        self.num_updates = int(ck["iteration"])
        self.logger.truncate_after(self.num_updates)

    # ------------------------------------------------------------------ training
    def update(self) -> dict[str, float]:
        """One guarded AdamW step on a random minibatch of samples."""
        sc = self.cfg.sft
        lr = self.schedule(min(self.num_updates, sc.num_updates))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        idx = torch.randint(
            0, self.images.shape[0], (sc.batch_size,), generator=self.generator, device=self.device
        )
        features, keypoints = self.policy.features_and_keypoints(
            self.images[idx], self.ids[idx], self.proprio[idx]
        )
        bc = self.policy.head.bc_loss(features, self.chunks[idx], self.generator)
        loss, stats = bc, [bc.detach()]
        if self.goal_probe is not None:
            assert self.goals is not None
            read = features if keypoints is None else keypoints.flatten(1)
            err = self.goal_probe(read) - (self.goals[idx] - self.goal_mean) / self.goal_std
            loss = bc + self.cfg.sft.goal_weight * err.square().mean()
            # in the term's own units (metres for a fingertip), for the log
            stats.append((err.detach() * self.goal_std).square().sum(-1).mean().sqrt())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stepped = self.guard.step([loss, *stats])
        self.num_updates += 1
        nan = float("nan")
        return {
            "loss": nan if stepped is None else stepped[1],
            "grad_norm": nan if stepped is None else stepped[-1],
            "goal_rmse": nan if stepped is None or len(stats) < 2 else stepped[2],
            "lr": lr,
            "nonfinite_steps": float(self.guard.nonfinite_steps),
        }

    def evaluate(
        self, episodes: int | None = None, video: str | os.PathLike | None = None
    ) -> dict[str, float]:
        """Closed-loop success rates on the task's train and eval splits; ``video``: an
        MP4 of the held-out split's first episodes with their instructions."""
        sc = self.cfg.sft
        n = episodes if episodes is not None else sc.eval_episodes
        out: dict[str, float] = {}
        for split in ("train", "eval"):
            out[f"eval/success_{split}"] = evaluate_success(
                self.policy,
                self.tokenizer,
                self.data.task,
                n,
                num_envs=max(1, min(sc.eval_envs, n)),
                seed=sc.seed + 12345,
                task_args={"split": split, "image_size": self.cfg.model.image_size},
                video=video if split == "eval" else None,
            )
        return out

    def train(self) -> dict[str, Any]:
        sc = self.cfg.sft
        total = sc.num_updates
        self.logger.start_progress(total, self.num_updates, "update", "vla-sft")
        losses: deque[float] = deque(maxlen=sc.log_every)
        goal_rmse: deque[float] = deque(maxlen=sc.log_every)
        clock = [time.perf_counter()]

        def step() -> int:
            s = self.update()
            losses.append(s["loss"])
            goal_rmse.append(s["goal_rmse"])
            u = self.num_updates
            self.logger.advance(1)
            if u % sc.log_every == 0 or u == total:
                row: dict[str, float] = {
                    "sft/loss": float(np.mean(losses)),
                    "sft/lr": s["lr"],
                    "sft/grad_norm": s["grad_norm"],
                    "sft/nonfinite_steps": s["nonfinite_steps"],
                    **({"sft/goal_rmse": float(np.mean(goal_rmse))} if self.goal_probe else {}),
                    "perf/updates_per_second": sc.log_every
                    / max(time.perf_counter() - clock[0], 1e-9),
                }
                clock[0] = time.perf_counter()
                if sc.eval_every and u % sc.eval_every == 0 and u < total:
                    row.update(self.evaluate())
                self.logger.log(u, row)
            return u

        stopped = train_loop(self.num_updates, total, step, self.save, sc.checkpoint_every)
        summary: dict[str, Any] = {"updates": self.num_updates, "stopped_early": stopped}
        if not stopped and sc.eval_episodes:
            summary.update(self.evaluate(video=self.run_dir / "policy.mp4" if sc.video else None))
            self.logger.log(self.num_updates, {k: v for k, v in summary.items() if "/" in k})
        self.logger.close()
        return summary

    def close(self) -> None:
        self.logger.close()


@torch.no_grad()
def evaluate_success(
    policy: VLAPolicy,
    tokenizer: Any,
    task: str,
    episodes: int,
    *,
    num_envs: int = 8,
    seed: int = 0,
    task_args: dict[str, Any] | None = None,
    max_steps: int = 100_000,
    act_steps: int | None = None,
    wrong_instructions: bool = False,
    video: str | os.PathLike | None = None,
    video_episodes: int = 3,
) -> float:
    """Fraction of ``episodes`` that end by reaching the named target (terminated, not
    timed out), deterministic chunks (zero noise), ``act_steps`` of each executed (None:
    the policy's).

    ``wrong_instructions``: the policy is told, in each episode, to reach one of the
    *other* balls (the task's ``wrong_instructions``) while success still counts the
    named one: the language-grounding test.

    ``video``: an MP4 of env 0's first ``video_episodes`` episodes, the instruction the
    policy was given written on every frame (with the named one, when they differ) and
    each episode's outcome.
    """
    from sim.registry import make

    cfg = policy.cfg
    act_steps = cfg.head.act_steps if act_steps is None else int(act_steps)
    if not 1 <= act_steps <= cfg.head.horizon:
        raise ValueError(f"act_steps must be in [1, {cfg.head.horizon}], got {act_steps}")
    env = make(task, num_envs, seed=seed, **(task_args or {}))
    if wrong_instructions and not hasattr(env, "wrong_instructions"):
        env.close()
        raise ValueError(f"task {task!r} has no wrong_instructions: no grounding test")
    rng = np.random.default_rng(seed)
    was_training = policy.training
    policy.eval()
    try:
        obs = env.reset()
        told = list(env.wrong_instructions(rng) if wrong_instructions else env.instructions)
        recorder, episode0, outcomes = None, 0, []
        if video is not None:
            from training.artifacts import VideoWriter

            def caption() -> str:
                said = (
                    told[0]
                    if told[0] == env.instructions[0]
                    else (f"{told[0]} (the task names: {env.instructions[0]})")
                )
                return f"{said}\nepisode {episode0 + 1}   " + " ".join(outcomes)

            recorder = VideoWriter(env, video, caption=caption)
        chunk = torch.zeros(num_envs, cfg.head.horizon, policy.action_size)
        pos = np.full(num_envs, act_steps)  # every env plans at the first step
        done_count, successes, steps = 0, 0, 0
        while done_count < episodes and steps < max_steps:
            need = pos >= act_steps
            if need.any():
                ids = encode_instructions(
                    tokenizer, told, cfg.max_instruction_tokens, cfg.pad_token_id
                )
                noise = torch.zeros(num_envs, cfg.head.horizon, policy.action_size)
                new = policy.sample(
                    obs["image"], ids, obs["policy"], stochastic=False, noise=noise
                ).actions
                mask = torch.as_tensor(need)
                chunk[mask] = new[mask].to(chunk.dtype)
                pos[need] = 0
            action = chunk[torch.arange(num_envs), torch.as_tensor(pos)]
            if recorder is not None:
                recorder.capture()
            obs, _, terminated, truncated, info = env.step(action)
            pos += 1
            ended = (terminated | truncated).numpy()
            if ended.any():
                won = (terminated & ~info["unstable"]).numpy()
                for i in np.nonzero(ended)[0]:
                    if done_count < episodes:
                        done_count += 1
                        successes += int(won[i])
                pos[ended] = act_steps  # a new episode plans from its first frame
                fresh = env.wrong_instructions(rng) if wrong_instructions else env.instructions
                for i in np.nonzero(ended)[0]:
                    told[i] = fresh[i]
                if recorder is not None and ended[0]:
                    outcomes.append("success" if won[0] else "fail")
                    episode0 += 1
                    if episode0 >= video_episodes:
                        recorder.close()
                        recorder = None
            steps += 1
    finally:
        if recorder is not None:
            recorder.close()
        env.close()
        policy.train(was_training)
    return successes / max(done_count, 1)


def _model_config(saved: dict[str, Any]) -> VLAConfig:
    """The VLAConfig a checkpoint saved (fields added since read as it was trained)."""
    try:
        return from_dict(VLAConfig, saved)
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"the checkpoint's model config does not fit this version: {e}") from e


def vla_policy_from_checkpoint(ck: dict[str, Any]) -> VLAPolicy:
    """The VLAPolicy a VLA checkpoint (SFT or RL) holds, with its weights, on the CPU."""
    try:  # SFT and RL runs both save the model's config under "model"
        model_cfg = _model_config(ck["config"]["model"])
    except KeyError as e:
        raise ConfigError(f"the checkpoint has no model config: {e}") from e
    policy = VLAPolicy(
        int(ck["proprio_size"]),
        int(ck["action_size"]),
        model_cfg,
        action_low=ck["action_low"],
        action_high=ck["action_high"],
    )
    policy.load_state_dict(ck["policy"])
    return policy


def load_vla_run(source: str | os.PathLike) -> tuple[VLAPolicy, Any, dict[str, Any], Path]:
    """(policy, tokenizer, checkpoint, run directory) of a VLA run (SFT or RL; a run
    directory or a checkpoint file), the policy in eval mode on the CPU.

    CheckpointError: not a VLA run; FileNotFoundError: no checkpoint or no tokenizer.
    """
    from tokenizers import Tokenizer

    ck_path = find_checkpoint(source)
    ck = load_checkpoint(ck_path)
    if ck.get("kind") not in VLA_KINDS:
        raise CheckpointError(
            f"{source} is a {ck.get('kind')!r} checkpoint, not a VLA run {VLA_KINDS}"
        )
    run_dir = ck_path.parent.parent if ck_path.parent.name == "checkpoints" else ck_path.parent
    tokenizer = run_dir / "tokenizer.json"
    if not tokenizer.is_file():
        raise FileNotFoundError(f"{tokenizer} is missing: the run's tokenizer travels with it")
    policy = vla_policy_from_checkpoint(ck).eval()
    return policy, Tokenizer.from_file(str(tokenizer)), ck, run_dir


def export_vla_run(
    source: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    steps: int | None = None,
    camera: str = "top",
) -> Path:
    """Export a VLA run (SFT or RL; directory or checkpoint) to ONNX with its tokenizer
    beside it.

    The metadata is the task's robot description (as for every policy) plus the VLA's
    inputs: the image size and normalisation, the instruction's token budget, pad id,
    vocabulary and the tokenizer's hash, the chunk and the flow steps. ``steps``: Euler
    steps of the exported sampler (default the policy's).
    """
    from deploy.export import export_policy
    from deploy.tokenizer import file_sha256
    from sim.registry import make
    from training.config import config_hash
    from training.metadata import metadata_from_checkpoint
    from training.run_control import code_version

    policy, _, ck, run_dir = load_vla_run(source)
    model_cfg = policy.cfg
    tokenizer = run_dir / "tokenizer.json"
    module = policy.inference_module(steps).cpu()
    task = str(ck["task"])
    env = make(task, 1, image_size=model_cfg.image_size)
    try:
        frame_ck = {
            "robot": env.robot.to_dict(),
            "architecture": {"task": task, "policy": {}},
            "config": {"env": {}},
            "obs_terms": {"policy": [(t.name, t.size) for t in env.observation_spec.policy.terms]},
            "obs_history": 1,
            "run_id": run_dir.name,
            "code_version": code_version(),
            "config_hash": config_hash(model_cfg),
            "iteration": ck["iteration"],
        }
        base = metadata_from_checkpoint(frame_ck, (env.action_spec.low, env.action_spec.high))
    finally:
        env.close()
    m = model_cfg
    meta = dataclasses.replace(
        base,
        policy_family="vla_flow",
        noise_shape=list(module.noise_shape),
        image_input={
            "name": "image",
            "height": m.image_size,
            "width": m.image_size,
            "channels": 3,
            "dtype": "uint8",
            "channel_order": "RGB",
            "layout": "HWC",
            "camera": camera,
            "mean": list(m.image_mean),
            "std": list(m.image_std),
        },
        instruction_input={
            "name": "instruction_ids",
            "max_tokens": m.max_instruction_tokens,
            "pad_id": m.pad_token_id,
            "vocab_size": module.backbone.vocab_size,
            "tokenizer_file": "tokenizer.json",
            "tokenizer_sha256": file_sha256(tokenizer),
            "instructions": _task_instructions(task),
        },
        action_chunk={"horizon": m.head.horizon, "act_steps": m.head.act_steps},
        flow_steps=module.steps,
    )
    return export_policy(module, meta, out or run_dir / "policy.onnx", tokenizer=tokenizer)


def config_from_checkpoint(ck: dict[str, Any]) -> VLASFTTrainConfig:
    """The run's config as the checkpoint saved it."""
    try:
        return from_dict(VLASFTTrainConfig, ck["config"])
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"the checkpoint's config does not fit this version: {e}") from e
