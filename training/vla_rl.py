"""RL fine-tuning of a vision-language-action policy from an SFT run
(``sim2real train vla-rl --init runs/<vla-sft run> --algo grpo|ppo``).

Both algorithms share one rollout and one loss, and differ in the advantage:

- **Rollout: one episode per env.** Every rollout resets all envs; with ``grpo`` the
  envs form groups of ``group_size`` that start from the *same* layout and instruction
  (the group leader's balls, colours, named ball and arm pose are copied onto the other
  members: ``ball_colour``, ``set_state``, ``instruct``), so group members differ only
  in the policy's noise. Each env runs until its first episode ends (success or the
  time limit); later env steps of an env whose episode ended are not recorded.
- **Decisions.** At every ``act_steps`` env steps each env samples a chunk through
  ReinFlow's noisy Euler chain (the flow head's noise network,
  :meth:`policies.flow.FlowPolicy.sample` with ``return_chain``), executes its first
  ``act_steps`` actions and stores the image, the proprio frame, the chain and the
  per-step log-probabilities.
- **Elements of the core's ``policy_loss``** (as ReinFlow's): rows are the executed
  (decision, chunk position) pairs, columns the K Euler steps of the chain; entry
  [row, k] is log N(x_{k+1}; x_k + v/K, sigma_k^2) of that chunk position (reduced
  over action dimensions by ``logprob_reduce``). Positions never executed (after
  ``act_steps`` or after the episode's end) are masked.
- **GRPO (SimpleVLA-RL):** the outcome reward is success (0/1) per episode; the
  advantage of every element of an episode is the core's ``group_relative`` of its
  group's outcomes; dynamic sampling (``dynamic_sampling_mask``) drops groups whose
  outcomes are all equal and collects more rollouts to refill the batch (up to
  ``max_sample_rounds``). No critic: the value head neither trains nor is read.
- **PPO (RL4VLA):** the critic is the value head on the shared backbone's features
  (:meth:`policies.vla.VLAPolicy.value`); advantages are the core's ``gae`` over
  decisions (a decision is one transition of the chunk-level MDP whose reward is the
  sum over its executed env steps); a time-out bootstraps from V of the true final
  observation (``info["final_obs"]``), a success does not. The value loss is the core's.

Why not :class:`training.runner.OnPolicyRunner`: its loop owns the env's resets (envs
reset in ``env.step`` to random layouts), so a learner cannot start a group from one
layout; its ``act(obs)`` carries no instruction text; it loads ``--init`` runs through
the checkpoint-kind registry, whose runs carry an env config and an ``architecture``
that an SFT run (demonstration file + model) does not. This runner reuses its pieces
instead: the logger, ``train_loop`` (checkpoint cadence, Ctrl-C), atomic checkpoints,
the guarded step, the core's losses and advantages, and the SFT run's closed-loop
evaluation.

Resume: the checkpoint holds the weights, the optimizer, the guard, the sampling
generator, torch's RNG and the counters; a rollout's layouts are drawn from a seed that
depends only on ``seed`` and the rollout's index, so N + N updates equal 2N bit for bit.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from policies.chunked import REDUCTIONS
from policies.flow import check_steps
from policies.vla import VLAConfig, VLAPolicy
from policies.vla_tokenizer import encode_instructions
from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from training.config import ConfigError, from_dict, to_dict
from training.core import (
    POLICY_LOSS_PRESETS,
    PolicyLossConfig,
    UpdateGuard,
    dynamic_sampling_mask,
    gae,
    get_loss_config,
    group_relative,
    policy_loss,
    value_loss,
    zero_variance_fraction,
)
from training.logger import RunLogger
from training.run_control import train_loop
from training.run_dir import prepare_run_dir
from training.runner import write_config
from training.vla_sft import KIND as SFT_KIND
from training.vla_sft import evaluate_success, vla_policy_from_checkpoint

__all__ = [
    "ALGOS",
    "KIND",
    "VLARLConfig",
    "VLARLRunner",
    "VLARLTrainConfig",
    "VLASamples",
    "grouped_reset",
    "learning_batch",
    "vla_rl_loss",
]

KIND = "vla_rl"
"""Checkpoint kind of a VLA RL run."""
ALGOS = ("grpo", "ppo")


@dataclass
class VLARLConfig:
    """The rollouts, the advantage, the loss and the run's bookkeeping."""

    algo: str = "grpo"
    """"grpo": group-relative outcome advantages, no critic (SimpleVLA-RL); "ppo": GAE
    with the value head on the shared backbone (RL4VLA)."""
    num_updates: int = 100
    """Updates in all (each: fresh rollouts, then num_epochs passes over them)."""
    num_envs: int = 16
    """Envs stepping at once; with grpo a multiple of group_size."""
    group_size: int = 8
    """grpo: rollouts per group, all from one layout and instruction."""
    dynamic_sampling: bool = True
    """grpo: drop groups whose outcomes are all equal (no signal) and roll out again to
    refill the batch."""
    max_sample_rounds: int = 4
    """grpo: rollouts per update at most while refilling (sampling stops once the kept
    groups number num_envs / group_size, or after this many; a batch with no kept group
    is not learned from)."""
    reward: str = "success"
    """ppo: the per-step reward, "success" (1 on the step that succeeds, else 0) or
    "env" (the task's shaped reward). grpo's outcome is always success."""
    split: str = "train"
    """The task's split the rollouts are drawn from."""
    max_episode_steps: int | None = None
    """Time limit of the rollouts' episodes (None: the task's)."""
    num_epochs: int = 2
    """Passes over each batch."""
    num_minibatches: int = 2
    """Minibatches (of decisions) per pass."""
    loss: str = "ppo"
    """Policy-loss preset of the optimizer core (training.core.POLICY_LOSS_PRESETS); its
    reference-KL term is switched off (no reference policy is kept)."""
    clip: float = 0.2
    """Ratio clip range, low side (the preset's eps_low)."""
    clip_high: float | None = 0.28
    """Ratio clip range, high side (DAPO's clip-higher; None: same as clip)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus of the chain's Gaussians (0: off)."""
    flow_steps: int | None = None
    """Euler steps of the chain while fine-tuning, 1 to 10 (None: the policy's)."""
    noise_min: float | None = None
    """Lower bound of the noise network's std (normalized action units; None: the policy's)."""
    noise_max: float | None = None
    """Upper bound of the noise network's std (None: the policy's)."""
    logprob_reduce: str = "mean"
    """A chunk position's log-probability from its action dimensions: "sum" or "mean"."""
    train_backbone: bool = True
    """Fine-tune the backbone (its trainable part: all of it, or the LoRA adapter and
    projectors); False: only the action head (and the value head with ppo)."""
    lr: float = 1e-5
    """Adam learning rate of the policy (backbone and action head). From an SFT policy
    at 94% held-out success on instructed_reach (seed 0, 20 updates), 1e-4 left 33%
    (GRPO) and 50% (PPO); 1e-5 kept GRPO at 90% (docs/benchmarks_vla.md)."""
    critic_lr: float = 1e-3
    """ppo: Adam learning rate of the value head."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this."""
    gamma: float = 0.99
    """ppo: discount per decision (one chunk)."""
    lam: float = 0.95
    """ppo: GAE lambda."""
    value_coef: float = 0.5
    """ppo: weight of the value loss."""
    value_clip: float | None = None
    """ppo: clip range of the clipped value loss (None: plain squared error)."""
    normalize_advantages: bool = True
    """ppo: normalize advantages over the batch."""
    seed: int = 0
    """Seeds the layouts and the chain's noise."""
    device: str = "cpu"
    """Torch device of the policy."""
    log_every: int = 1
    """Updates between rows of metrics."""
    checkpoint_every: int = 10
    """Updates between checkpoints (one is also written at the end and on Ctrl-C)."""
    eval_every: int = 0
    """Updates between closed-loop evaluations (0: only at the end)."""
    eval_episodes: int = 16
    """Episodes per split of each evaluation (0: none)."""
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
        def fail(name: str, why: str) -> ValueError:
            return ValueError(f"VLARLConfig.{name} {why}, got {getattr(self, name)!r}")

        if self.algo not in ALGOS:
            raise fail("algo", f"must be one of {list(ALGOS)}")
        for name in ("num_updates", "num_envs", "group_size", "max_sample_rounds",
                     "num_epochs", "num_minibatches", "log_every", "checkpoint_every"):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise fail(name, "must be an integer >= 1")
        for name in ("eval_every", "eval_episodes", "eval_envs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise fail(name, "must be an integer >= 0")
        if self.reward not in ("success", "env"):
            raise fail("reward", 'must be "success" or "env"')
        if self.split not in ("train", "eval"):
            raise fail("split", 'must be "train" or "eval"')
        if self.loss not in POLICY_LOSS_PRESETS:
            raise fail("loss", f"must be one of {sorted(POLICY_LOSS_PRESETS)}")
        if self.logprob_reduce not in REDUCTIONS:
            raise fail("logprob_reduce", f"must be one of {list(REDUCTIONS)}")
        if self.flow_steps is not None:
            check_steps(self.flow_steps, "VLARLConfig.flow_steps")
        for name in ("lr", "critic_lr", "max_grad_norm"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise fail(name, "must be a finite number > 0")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise fail(name, "must be in [0, 1]")
        if not (math.isfinite(self.entropy_coef) and self.entropy_coef >= 0):
            raise fail("entropy_coef", "must be a finite number >= 0")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise fail("max_episode_steps", "must be None or >= 1")
        self.loss_config()

    def check_groups(self) -> None:
        """grpo's groups tile the envs (checked by the runner, not per field, so that
        command-line overrides may set num_envs and group_size in either order)."""
        if self.algo != "grpo":
            return
        if self.group_size < 2:
            raise ValueError(
                f"VLARLConfig.group_size must be >= 2 (a group of one has no baseline), "
                f"got {self.group_size}"
            )
        if self.num_envs % self.group_size:
            raise ValueError(
                f"VLARLConfig.num_envs must be a multiple of group_size={self.group_size}, "
                f"got {self.num_envs}"
            )

    def loss_config(self) -> PolicyLossConfig:
        high = self.clip if self.clip_high is None else self.clip_high
        return get_loss_config(
            self.loss,
            eps_low=self.clip,
            eps_high=high,
            entropy_coef=self.entropy_coef,
            kl_coef=0.0,
        )

    @property
    def num_groups(self) -> int:
        return self.num_envs // self.group_size if self.algo == "grpo" else self.num_envs


@dataclass
class VLARLTrainConfig:
    """A VLA RL run: the SFT run it starts from and the RL settings. The model (and the
    task and tokenizer) are the SFT run's."""

    init: str = ""
    """The vla-sft (or vla-rl) run or checkpoint to start from."""
    rl: VLARLConfig = field(default_factory=VLARLConfig)
    """Rollouts, advantages, loss and bookkeeping."""


class VLASamples(NamedTuple):
    """The decisions of a batch, flat: one row per recorded chunk."""

    images: torch.Tensor
    """uint8 [S, H, W, 3]."""
    ids: torch.Tensor
    """Instruction token ids [S, L]."""
    proprio: torch.Tensor
    """[S, P]."""
    chain: torch.Tensor
    """The sampled chain [S, K + 1, horizon, A] (normalized action space)."""
    logp: torch.Tensor
    """Its log-probabilities at sampling time [S, K, horizon]."""
    executed: torch.Tensor
    """Which chunk positions were executed [S, horizon] (1.0 / 0.0)."""
    advantages: torch.Tensor
    """[S]: the episode's group-relative advantage (grpo) or the decision's GAE (ppo)."""
    returns: torch.Tensor
    """[S] value targets (ppo; zeros for grpo)."""
    values: torch.Tensor
    """[S] values at sampling time (ppo; zeros for grpo)."""


def _cat(parts: list[VLASamples]) -> VLASamples:
    return VLASamples(*(torch.cat(ts) for ts in zip(*parts)))


def _index(s: VLASamples, idx: torch.Tensor) -> VLASamples:
    return VLASamples(*(t[idx] for t in s))


def learning_batch(parts: list[VLASamples], rc: VLARLConfig) -> VLASamples:
    """The rollouts of an update as one batch, its advantages normalised where ppo asks."""
    batch = _cat(parts)
    if rc.algo == "ppo" and rc.normalize_advantages and batch.advantages.numel() > 1:
        a = batch.advantages
        batch = batch._replace(advantages=(a - a.mean()) / (a.std() + 1e-8))
    return batch


def grouped_reset(env: Any, group_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Reset every env and give each group of ``group_size`` consecutive envs its first
    member's layout, instruction and arm pose; the observation of the result."""
    env.reset(seed=seed)
    n = env.num_envs
    lead = (np.arange(n) // group_size) * group_size
    state = env.get_state()
    env.ball_colour[:] = env.ball_colour[lead]
    env.set_state(state["qpos"][lead], state["qvel"][lead])
    texts = env.instructions
    return env.instruct([texts[i] for i in lead])


def vla_rl_loss(
    policy: VLAPolicy,
    batch: VLASamples,
    loss_cfg: PolicyLossConfig,
    *,
    logprob_reduce: str = "mean",
    value_coef: float = 0.0,
    value_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of a minibatch: the core's policy loss on the chain's elements (rows:
    executed (decision, position) pairs; columns: Euler steps), plus ``value_coef``
    times the core's value loss of the value head when it is > 0 (ppo)."""
    feat = policy.features(batch.images, batch.ids, batch.proprio)
    terms = policy.head.chain_terms(feat, batch.chain, logprob_reduce)
    k = batch.chain.shape[1] - 1
    new = terms.log_prob.permute(0, 2, 1).reshape(-1, k)
    old = batch.logp.permute(0, 2, 1).reshape(-1, k)
    ent = terms.entropy.permute(0, 2, 1).reshape(-1, k)
    mask = batch.executed.reshape(-1, 1).expand(-1, k)
    horizon = batch.executed.shape[1]
    adv = batch.advantages.reshape(-1, 1).expand(-1, horizon).reshape(-1)
    loss, stats = policy_loss(new, old, adv, loss_cfg, mask=mask, entropy=ent)
    stats["noise_std"] = terms.std.detach().mean()
    if value_coef > 0:
        v = policy.head.value(feat)
        vl = value_loss(v, batch.values, batch.returns, clip_eps=value_clip)
        loss = loss + value_coef * vl
        stats["value_loss"] = vl.detach()
    return loss, stats


def _load_init(source: str) -> tuple[dict[str, Any], Path]:
    """(checkpoint, its run directory) of a VLA run to start from, or a CheckpointError."""
    if not source:
        raise ConfigError("vla-rl starts from a vla-sft run: --init runs/<vla-sft run>")
    path = find_checkpoint(source)
    ck = load_checkpoint(path)
    if ck.get("kind") not in (SFT_KIND, KIND):
        raise CheckpointError(
            f"--init {source} is a {ck.get('kind')!r} checkpoint, not a VLA run; vla-rl "
            f"starts from a {SFT_KIND!r} run (sim2real train vla-sft)"
        )
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return ck, run_dir


class VLARLRunner:
    """GRPO- or PPO-style fine-tuning of a VLAPolicy in the task's batched simulator."""

    def __init__(
        self,
        cfg: VLARLTrainConfig,
        run_dir: str | os.PathLike,
        resume: str | os.PathLike | None = None,
    ) -> None:
        self.cfg = cfg
        rc = cfg.rl
        rc.check_groups()
        self.run_dir = Path(run_dir)
        self.device = torch.device(rc.device)
        torch.manual_seed(rc.seed)
        if resume is not None:
            init_ck, init_dir = _load_init(str(resume))
            if init_ck.get("kind") != KIND:
                raise CheckpointError(
                    f"{resume} is a {init_ck.get('kind')!r} checkpoint, not {KIND!r}"
                )
        else:
            init_ck, init_dir = _load_init(cfg.init)
        self.model_cfg = from_dict(VLAConfig, init_ck["config"]["model"])
        self.task = str(init_ck["task"])
        tokenizer_src = init_dir / "tokenizer.json"
        if not tokenizer_src.is_file():
            raise FileNotFoundError(
                f"{tokenizer_src} is missing: the run's tokenizer travels with it"
            )
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_src))
        self.init_ck = init_ck
        self.policy = vla_policy_from_checkpoint(init_ck).to(self.device)
        head = self.policy.head
        lo, hi = (float(v) for v in head.noise_bounds)
        head.set_noise_bounds(
            lo if rc.noise_min is None else rc.noise_min,
            hi if rc.noise_max is None else rc.noise_max,
        )
        actor = head.enable_finetuning(rc.flow_steps)
        self.steps = head.steps
        critic = list(head.critic.parameters())
        backbone = [p for p in self.policy.backbone.parameters() if p.requires_grad]
        if not rc.train_backbone:
            for p in backbone:
                p.requires_grad_(False)
            backbone = []
        if rc.algo == "grpo":  # no critic: the value head stays as it was
            for p in critic:
                p.requires_grad_(False)
            groups = [{"params": backbone + actor, "lr": rc.lr}]
        else:
            groups = [
                {"params": backbone + actor, "lr": rc.lr},
                {"params": critic, "lr": rc.critic_lr},
            ]
        self.params = [p for g in groups for p in g["params"]]
        self.optimizer = torch.optim.Adam(groups)
        self.guard = UpdateGuard(self.optimizer, self.params, rc.max_grad_norm)
        self.loss_cfg = rc.loss_config()
        self.generator = torch.Generator(device=self.device).manual_seed(rc.seed)
        self.num_updates = 0
        self.rollouts = 0  # rollouts so far: the layouts' seed
        self.env_steps = 0  # simulator steps of every env (rollouts only, not evaluations)
        from sim.registry import make

        extra = {} if rc.max_episode_steps is None else {"max_episode_steps": rc.max_episode_steps}
        self.env = make(
            self.task,
            rc.num_envs,
            seed=rc.seed,
            split=rc.split,
            image_size=self.model_cfg.image_size,
            **extra,
        )
        prepare_run_dir(self.run_dir, resume)
        self.tokenizer_path = self.run_dir / "tokenizer.json"
        if tokenizer_src.resolve() != self.tokenizer_path.resolve():
            shutil.copyfile(tokenizer_src, self.tokenizer_path)
        self.logger = RunLogger(self.run_dir, tensorboard=rc.tensorboard, progress=rc.progress)
        if resume is not None:
            self._load(init_ck)
        write_config(self.run_dir, cfg)

    # ------------------------------------------------------------------ state
    def save(self) -> Path:
        ck = self.init_ck
        config = {**to_dict(self.cfg), "model": to_dict(self.model_cfg)}
        payload = {
            "kind": KIND,
            "config": config,
            "task": self.task,
            "proprio_size": ck["proprio_size"],
            "action_size": ck["action_size"],
            "action_low": ck["action_low"],
            "action_high": ck["action_high"],
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "guard": self.guard.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "iteration": self.num_updates,
            "rollouts": self.rollouts,
            "env_steps": self.env_steps,
        }
        return save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)

    def _load(self, ck: dict[str, Any]) -> None:
        saved = {k: v for k, v in ck["config"].items() if k != "model"}
        if saved["rl"]["algo"] != self.cfg.rl.algo:
            raise CheckpointError(f"the run was trained with algo={saved['rl']['algo']!r}")
        self.optimizer.load_state_dict(ck["optimizer"])
        self.guard.load_state_dict(ck["guard"])
        self.generator.set_state(ck["generator"])
        torch.set_rng_state(ck["torch_rng"])
        self.num_updates = int(ck["iteration"])
        self.rollouts = int(ck["rollouts"])
        self.env_steps = int(ck.get("env_steps", 0))
        self.logger.truncate_after(self.num_updates)

    # ------------------------------------------------------------------ rollouts
    def _encode(self, texts: list[str]) -> torch.Tensor:
        m = self.model_cfg
        ids = encode_instructions(self.tokenizer, texts, m.max_instruction_tokens, m.pad_token_id)
        return torch.as_tensor(ids, device=self.device)

    @torch.no_grad()
    def rollout(self) -> tuple[VLASamples, dict[str, float]]:
        """One episode per env (groups share a layout with grpo); the decisions with
        their advantages, and statistics. Dynamic sampling drops groups here."""
        rc = self.cfg.rl
        policy, head, env = self.policy, self.policy.head, self.env
        n = env.num_envs
        hz, act_steps = self.model_cfg.head.horizon, self.model_cfg.head.act_steps
        group = rc.group_size if rc.algo == "grpo" else 1
        seed = (rc.seed * 1_000_003 + self.rollouts) % (2**31)
        self.rollouts += 1
        obs = grouped_reset(env, group, seed)
        ids = self._encode(env.instructions)
        active = torch.ones(n, dtype=torch.bool)
        success = torch.zeros(n)
        length = torch.zeros(n)
        rec: dict[str, list[torch.Tensor]] = {k: [] for k in (
            "images", "proprio", "chain", "logp", "executed", "active", "values", "rewards",
            "terminated", "dones")}  # fmt: skip
        final_img = torch.zeros_like(obs["image"])
        final_prop = torch.zeros_like(obs["policy"])
        timed_out = torch.zeros(n, dtype=torch.bool)
        ppo = rc.algo == "ppo"
        while bool(active.any()):
            feat = policy.features(obs["image"], ids, obs["policy"])
            s = head.sample(feat, self.steps, self.generator, stochastic=True, return_chain=True)
            assert s.chain is not None
            logp = head.chain_terms(feat, s.chain, rc.logprob_reduce).log_prob
            rec["images"].append(obs["image"].clone())
            rec["proprio"].append(obs["policy"].clone())
            rec["chain"].append(s.chain)
            rec["logp"].append(logp)
            rec["active"].append(active.clone())
            rec["values"].append(head.value(feat) if ppo else torch.zeros(n))
            executed = torch.zeros(n, hz)
            reward = torch.zeros(n)
            ended = torch.zeros(n, dtype=torch.bool)
            terminal = torch.zeros(n, dtype=torch.bool)
            for j in range(act_steps):
                live = active & ~ended
                if not bool(live.any()):
                    break
                obs, r, term, trunc, info = env.step(s.actions[:, j].cpu())
                self.env_steps += n
                executed[live, j] = 1.0
                length += live.float()
                won = (term & ~info["unstable"]).cpu()
                step_r = won.float() if rc.reward == "success" else r.float().cpu()
                reward += torch.where(live, step_r, torch.zeros_like(step_r))
                new_end = live & (term | trunc).cpu()
                success[new_end & won] = 1.0
                cut = new_end & ~term.cpu()
                if bool(cut.any()):
                    final_img[cut] = info["final_obs"]["image"][cut]
                    final_prop[cut] = info["final_obs"]["policy"][cut]
                    timed_out |= cut
                terminal |= new_end & term.cpu()
                ended |= new_end
            rec["executed"].append(executed)
            rec["rewards"].append(reward)
            rec["terminated"].append(terminal.float())
            rec["dones"].append(ended | ~active)
            active = active & ~ended
        d = len(rec["chain"])
        t = {k: torch.stack(v) for k, v in rec.items()}  # [D, N, ...]
        stats = {
            "success_rate": float(success.mean()),
            "episode_length": float(length.mean()),
            "decisions": float(t["active"].sum()),
        }
        adv = torch.zeros(d, n)
        returns = torch.zeros(d, n)
        keep_env = torch.ones(n, dtype=torch.bool)
        if rc.algo == "grpo":
            outcomes = success.view(-1, group)
            adv[:] = group_relative(outcomes).reshape(1, n)
            stats["zero_variance_fraction"] = zero_variance_fraction(outcomes)
            if rc.dynamic_sampling:
                keep = dynamic_sampling_mask(outcomes)
                keep_env = keep.repeat_interleave(group)
                stats["kept_groups"] = float(keep.sum())
            else:
                stats["kept_groups"] = float(outcomes.shape[0])
        else:
            next_values = torch.zeros(d, n)
            next_values[:-1] = t["values"][1:]
            if bool(timed_out.any()):
                idx = timed_out.nonzero().squeeze(-1)
                v_final = policy.value(final_img[idx], ids[idx], final_prop[idx])
                last = (t["active"].sum(0) - 1).clamp_min(0)  # each env's last decision
                next_values[last[idx], idx] = v_final
            adv, returns = gae(
                t["rewards"], t["values"], next_values, t["terminated"], t["dones"],
                rc.gamma, rc.lam,
            )  # fmt: skip
        rows = (t["active"] & keep_env.view(1, n)).nonzero()  # [S, 2] (decision, env)
        di, ei = rows[:, 0], rows[:, 1]
        samples = VLASamples(
            t["images"][di, ei],
            ids[ei],
            t["proprio"][di, ei],
            t["chain"][di, ei],
            t["logp"][di, ei],
            t["executed"][di, ei],
            adv[di, ei],
            returns[di, ei],
            t["values"][di, ei],
        )
        return samples, stats

    # ------------------------------------------------------------------ update
    def update(self) -> dict[str, float]:
        """Roll out (refilling with grpo's dynamic sampling), then num_epochs passes of
        guarded Adam steps over minibatches of decisions."""
        rc = self.cfg.rl
        parts: list[VLASamples] = []
        roll: dict[str, list[float]] = {}
        rounds = kept = 0
        while True:
            s, st = self.rollout()
            rounds += 1
            for k, v in st.items():
                roll.setdefault(k, []).append(v)
            if s.advantages.numel():
                parts.append(s)
            kept += int(st.get("kept_groups", rc.num_groups))
            if rc.algo == "ppo" or not rc.dynamic_sampling:
                break
            if kept >= rc.num_groups or rounds >= rc.max_sample_rounds:
                break
        stats: dict[str, float] = {f"rollout/{k}": float(np.mean(v)) for k, v in roll.items()}
        stats["rollout/rounds"] = float(rounds)
        stats["perf/env_steps"] = float(self.env_steps)
        names = ("policy_loss", "approx_kl", "clip_frac", "ratio_max", "noise_std")
        if rc.algo == "ppo":
            names = (*names, "value_loss")
        sums = dict.fromkeys((*names, "grad_norm"), 0.0)
        steps = 0
        if parts:
            batch = learning_batch(parts, rc)
            if self.guard.finite_batch(batch.advantages, batch.returns):
                size = batch.advantages.shape[0]
                m = min(rc.num_minibatches, size)
                for _ in range(rc.num_epochs):
                    perm = torch.randperm(size, generator=self.generator)
                    for idx in perm.chunk(m):
                        loss, ls = vla_rl_loss(
                            self.policy,
                            _index(batch, idx),
                            self.loss_cfg,
                            logprob_reduce=rc.logprob_reduce,
                            value_coef=rc.value_coef if rc.algo == "ppo" else 0.0,
                            value_clip=rc.value_clip,
                        )
                        self.optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        vals = self.guard.step([loss, *(ls[k] for k in names)])
                        if vals is None:
                            continue
                        for k, v in zip(sums, vals[1:]):
                            sums[k] += v
                        steps += 1
            stats["samples"] = float(batch.advantages.shape[0])
        else:
            stats["samples"] = 0.0
        stats.update({k: v / max(steps, 1) for k, v in sums.items()})
        stats["minibatch_steps"] = float(steps)
        stats["nonfinite_steps"] = float(self.guard.nonfinite_steps)
        self.num_updates += 1
        return stats

    def evaluate(
        self, episodes: int | None = None, video: str | os.PathLike | None = None
    ) -> dict[str, float]:
        """Closed-loop success rates (deterministic chunks) on the train and eval splits;
        ``video``: an MP4 of the held-out split's first episodes with their instructions."""
        rc = self.cfg.rl
        n = rc.eval_episodes if episodes is None else episodes
        return {
            f"eval/success_{split}": evaluate_success(
                self.policy,
                self.tokenizer,
                self.task,
                n,
                num_envs=max(1, min(rc.eval_envs, n)),
                seed=rc.seed + 12345,
                task_args={"split": split, "image_size": self.model_cfg.image_size},
                video=video if split == "eval" else None,
            )
            for split in ("train", "eval")
        }

    def train(self) -> dict[str, Any]:
        rc = self.cfg.rl
        total = rc.num_updates
        self.logger.start_progress(total, self.num_updates, "update", f"vla-rl {rc.algo}")
        clock = [time.perf_counter()]

        def step() -> int:
            s = self.update()
            u = self.num_updates
            self.logger.advance(1, success=f"{s.get('rollout/success_rate', 0.0):.2f}")
            if u % rc.log_every == 0 or u == total:
                row = {f"rl/{k}" if "/" not in k else k: v for k, v in s.items()}
                row["perf/seconds_per_update"] = (time.perf_counter() - clock[0]) / rc.log_every
                clock[0] = time.perf_counter()
                if rc.eval_every and u % rc.eval_every == 0 and u < total:
                    row.update(self.evaluate())
                self.logger.log(u, row)
            return u

        stopped = train_loop(self.num_updates, total, step, self.save, rc.checkpoint_every)
        summary: dict[str, Any] = {
            "updates": self.num_updates,
            "env_steps": self.env_steps,
            "stopped_early": stopped,
        }
        if not stopped and rc.eval_episodes:
            summary.update(self.evaluate(video=self.run_dir / "policy.mp4" if rc.video else None))
            self.logger.log(self.num_updates, {k: v for k, v in summary.items() if "/" in k})
        self.logger.close()
        return summary

    def close(self) -> None:
        self.logger.close()
        self.env.close()


def config_from_checkpoint(ck: dict[str, Any]) -> VLARLTrainConfig:
    """The run's config as the checkpoint saved it."""
    try:
        return from_dict(VLARLTrainConfig, {k: v for k, v in ck["config"].items() if k != "model"})
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"the checkpoint's config does not fit this version: {e}") from e
