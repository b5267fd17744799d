"""The GRPO-family trainer: sample groups, score them, update through the shared core.

One training step:
1. draw ``prompts_per_step`` prompts (a seeded epoch order, or the variance curriculum);
2. sample ``group_size`` completions per prompt in one batch;
3. score them with the reward functions; samples whose reward failed are counted,
   logged to ``reward_errors.jsonl`` and handled per ``reward.on_error``; no NaN ever
   reaches an advantage or a loss;
4. with dynamic sampling, drop groups whose rewards are all equal and sample more
   prompts (up to ``max_rounds`` rounds) to refill the batch;
5. group advantages (group-relative, Dr. GRPO or RLOO) from the core;
6. ``num_iterations`` passes of ``num_minibatches`` optimizer steps each, the loss
   computed by ``training.core.policy_loss`` against log-probabilities stored before
   the first update (and reference log-probabilities when the KL term is on).

Run directory: config.json, metrics.jsonl (+ tensorboard/), samples.jsonl,
reward_errors.jsonl, checkpoints/latest.pt (everything needed to continue exactly:
trainable weights, optimizer, RNG states of torch/numpy/python and of the sampler,
prompt order and curriculum state, counters), final/ (the trained model or adapter).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.files import atomic_write
from policies.language_model import LanguageModelPolicy, Rollout
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.config import config_hash, to_dict
from training.core import (
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    UpdateGuard,
    Warmup,
)
from training.grpo.config import GRPOTrainConfig
from training.grpo.data import PromptSampler, load_prompts, validate_rows
from training.grpo.loss import advantages as group_advantages
from training.grpo.loss import grpo_loss, loss_config
from training.metrics import MetricsLogger, append_jsonl, truncate_jsonl
from training.rewards import RewardError, RewardFn, RewardModel, resolve
from training.run_control import code_version, train_loop
from training.run_dir import prepare_run_dir

log = logging.getLogger("sim2real.grpo")

CHECKPOINT_KIND = "grpo"
# what one more forward/backward pass costs, in token positions (automatic micro-batches)
_PASS_COST = 256
# statistics of training.core.policy_loss that are means over valid tokens
_TOKEN_MEAN_STATS = frozenset({"clip_frac", "approx_kl", "ratio_mean", "off_policy_weight_mean"})


class GRPOTrainer:
    """Train a language-model policy on verifiable rewards.

    cfg: the full config. policy: a ready LanguageModelPolicy (else loaded from
    cfg.model.path). rows: validated prompt rows (else loaded from cfg.data).
    reward_fns: callables (else resolved from cfg.reward.functions). run_dir: where
    metrics and checkpoints go (None: nothing is written). resume: a checkpoint file or
    run directory to continue from.
    """

    def __init__(
        self,
        cfg: GRPOTrainConfig,
        *,
        policy: LanguageModelPolicy | None = None,
        rows: list[dict[str, Any]] | None = None,
        reward_fns: Sequence[RewardFn] | None = None,
        run_dir: str | os.PathLike | None = None,
        resume: str | os.PathLike | None = None,
    ) -> None:
        self.cfg = cfg
        if cfg.run.threads > 0:
            torch.set_num_threads(cfg.run.threads)
        seed = cfg.run.seed
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        self.rows = validate_rows(rows, "<rows>") if rows is not None else load_prompts(cfg.data)
        self.columns = [k for k in self.rows[0] if k != "prompt"]
        self.loss_cfg = loss_config(cfg.algo, cfg.sampling.max_new_tokens)
        need_ref = self.loss_cfg.kl_coef > 0
        if policy is None:
            if not cfg.model.path:
                raise ValueError("no model: set model.path (--model) or pass a policy")
            policy = LanguageModelPolicy.from_pretrained(
                cfg.model.path, cfg.model, need_reference=need_ref
            )
        if need_ref and not policy.has_reference:
            raise ValueError(
                f"the KL term (kl_coef={self.loss_cfg.kl_coef}) needs a reference policy, but "
                f"this policy has none (model.reference={policy.reference!r})"
            )
        self.policy = policy.to(torch.device(cfg.run.device))
        self.policy.model.train()
        self.use_ref = need_ref or (policy.has_reference and cfg.model.reference != "auto")
        self.prompt_tokens = self.policy.encode_prompts([r["prompt"] for r in self.rows])
        if reward_fns is None:
            reward_fns = [
                resolve(
                    name,
                    numeric_tolerance=cfg.reward.numeric_tolerance,
                    format_pattern=cfg.reward.format_pattern,
                )
                for name in cfg.reward.functions
            ]
        self.rewards = RewardModel(reward_fns, cfg.reward.weights or None)
        self.params = [p for _, p in self.policy.trainable_named_parameters()]
        if not self.params:
            raise ValueError("the policy has no trainable parameters")
        a = cfg.algo
        opt_kwargs = dict(lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), weight_decay=a.weight_decay)
        try:  # one fused kernel for all tensors (CPU and CUDA, float32/bf16/fp16)
            self.optimizer = torch.optim.AdamW(self.params, fused=True, **opt_kwargs)
        except (RuntimeError, ValueError):
            self.optimizer = torch.optim.AdamW(self.params, foreach=True, **opt_kwargs)
        self.guard = UpdateGuard(
            self.optimizer, self.params, a.max_grad_norm if a.max_grad_norm > 0 else None
        )
        self.schedule = self._schedule()
        self.sampler = PromptSampler(
            len(self.rows),
            seed,
            curriculum=cfg.curriculum.enabled,
            history=cfg.curriculum.history,
            temperature=cfg.curriculum.temperature,
            floor=cfg.curriculum.floor,
        )
        self.sample_gen = torch.Generator(device=self.policy.device).manual_seed(seed + 1)
        self.shuffle_gen = torch.Generator().manual_seed(seed + 2)
        self.step = 0
        self.counters = {
            "samples": 0,
            "generated_tokens": 0,
            "optimizer_steps": 0,
            "reward_invalid": 0,
            "groups_skipped_invalid": 0,
        }
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logger: MetricsLogger | None = None
        if self.run_dir is not None:
            prepare_run_dir(self.run_dir, resume)  # one run per directory
            self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.run.tensorboard)
        if resume is not None:
            self.load(resume)
        if self.run_dir is not None:
            atomic_write(self.run_dir / "config.json", json.dumps(to_dict(cfg), indent=2))

    # ------------------------------------------------------------------ schedule
    def _schedule(self) -> Warmup:
        """algo.lr_schedule over run.steps, after a warm-up of algo.warmup_steps."""
        a = self.cfg.algo
        warm = a.warmup_steps
        n = max(1, self.cfg.run.steps - warm)
        after: ConstantSchedule | LinearSchedule | CosineSchedule = ConstantSchedule(a.lr)
        if a.lr_schedule == "linear":
            after = LinearSchedule(a.lr, a.lr * a.min_lr_ratio, n)
        elif a.lr_schedule == "cosine":
            after = CosineSchedule(a.lr, a.lr * a.min_lr_ratio, n)
        return Warmup(after, warm, peak=a.lr)

    def lr_at(self, step: int) -> float:
        return self.schedule(step)

    # ------------------------------------------------------------------ sampling
    def _columns(self, idx: np.ndarray, G: int) -> dict[str, list[Any]]:
        return {c: [self.rows[i][c] for i in idx for _ in range(G)] for c in self.columns}

    def _write(self, name: str, records: list[dict[str, Any]]) -> None:
        if self.run_dir is None or not records:
            return
        append_jsonl(self.run_dir / name, records)

    def collect(self) -> tuple[Rollout | None, torch.Tensor | None, dict[str, float]]:
        """Sample, score and filter one step's groups; returns (batch, advantages, stats)."""
        cfg = self.cfg
        P, G = cfg.sampling.prompts_per_step, cfg.sampling.group_size
        dynamic = cfg.dynamic_sampling_enabled
        max_rounds = cfg.dynamic_sampling.max_rounds if dynamic else 1
        parts: list[Rollout] = []
        advs: list[torch.Tensor] = []
        kept = 0
        st = {
            "sampled_groups": 0,
            "zero_var_groups": 0,
            "valid_groups": 0,
            "invalid_samples": 0,
            "skipped_groups": 0,
            "generated_tokens": 0,
            "generation_seconds": 0.0,
            "reward_seconds": 0.0,
            "rounds": 0,
            "truncated": 0,
            "samples": 0,
        }
        valid_rewards: list[np.ndarray] = []
        per_fn: dict[str, list[np.ndarray]] = {n: [] for n in self.rewards.names}
        lengths: list[torch.Tensor] = []
        samples_logged = 0
        for _ in range(max_rounds):
            st["rounds"] += 1
            idx = self.sampler.next(P)
            t0 = time.perf_counter()
            rollout = self.policy.generate(
                [self.prompt_tokens[i] for i in idx],
                G,
                max_new_tokens=cfg.sampling.max_new_tokens,
                temperature=cfg.sampling.temperature,
                top_p=cfg.sampling.top_p,
                top_k=cfg.sampling.top_k,
                generator=self.sample_gen,
                record_logprobs=False,
            )
            texts = self.policy.decode_completions(rollout)
            t1 = time.perf_counter()
            st["generation_seconds"] += t1 - t0  # sampling and decoding to text
            n_tok = int(rollout.completion_mask.sum())
            st["generated_tokens"] += n_tok
            st["truncated"] += int(rollout.truncated.sum())
            st["samples"] += len(rollout)
            lengths.append(rollout.completion_mask.sum(1))
            prompts = [self.rows[i]["prompt"] for i in idx for _ in range(G)]
            scores = self.rewards(prompts, texts, self._columns(idx, G))
            st["reward_seconds"] += time.perf_counter() - t1
            n_bad = scores.num_invalid
            if n_bad:
                self._report_invalid(scores, idx, G, prompts, texts)
            st["invalid_samples"] += n_bad
            rewards = scores.total.reshape(P, G).copy()
            invalid = scores.invalid.reshape(P, G)
            if cfg.reward.on_error == "zero":
                rewards[invalid] = 0.0
                group_ok = np.ones(P, dtype=bool)
            else:
                group_ok = ~invalid.any(1)
            st["skipped_groups"] += int((~group_ok).sum())
            for g in range(P):
                self.sampler.record(int(idx[g]), rewards[g])
            ok_rewards = rewards[group_ok]
            spread = (ok_rewards.max(1) - ok_rewards.min(1)) if ok_rewards.size else np.zeros(0)
            zero_var = np.zeros(P, dtype=bool)
            zero_var[group_ok] = spread <= cfg.dynamic_sampling.atol
            st["sampled_groups"] += P
            st["valid_groups"] += int(group_ok.sum())
            st["zero_var_groups"] += int(zero_var.sum())
            valid_rewards.append(
                rewards[~invalid] if cfg.reward.on_error != "zero" else rewards.ravel()
            )
            for name, v in scores.per_function.items():
                per_fn[name].append(v[np.isfinite(v)])
            if cfg.run.log_samples and samples_logged < cfg.run.log_samples:
                recs = []
                for i in range(min(cfg.run.log_samples - samples_logged, len(texts))):
                    recs.append(
                        {
                            "step": self.step + 1,
                            "prompt": prompts[i],
                            "completion": texts[i],
                            "reward": None if invalid.ravel()[i] else float(rewards.ravel()[i]),
                        }
                    )
                samples_logged += len(recs)
                self._write("samples.jsonl", recs)
            keep = group_ok & ~zero_var if dynamic else group_ok
            keep_groups = np.flatnonzero(keep)[: max(0, P - kept)]
            if keep_groups.size:
                r = torch.as_tensor(rewards[keep_groups], dtype=torch.float32)
                adv = group_advantages(r, cfg.algo.advantage_estimator, cfg.algo.adv_eps)
                rows = torch.as_tensor(
                    (keep_groups[:, None] * G + np.arange(G)[None, :]).ravel(), dtype=torch.long
                )
                parts.append(rollout.select(rows))
                advs.append(adv.reshape(-1))
                kept += keep_groups.size
            if kept >= P:
                break
        n = max(st["samples"], 1)
        if st["invalid_samples"] > cfg.reward.max_invalid_fraction * n:
            raise RewardError(
                f"step {self.step + 1}: {st['invalid_samples']} of {n} rewards failed (more than "
                f"reward.max_invalid_fraction={cfg.reward.max_invalid_fraction}); see "
                f"reward_errors.jsonl or the log for the first errors"
            )
        all_valid = np.concatenate(valid_rewards) if valid_rewards else np.zeros(0)
        lens = torch.cat(lengths).float()
        stats: dict[str, float] = {
            "reward/mean": float(all_valid.mean()) if all_valid.size else math.nan,
            "reward/std": float(all_valid.std()) if all_valid.size else math.nan,
            "groups/zero_variance_fraction": (
                st["zero_var_groups"] / st["valid_groups"] if st["valid_groups"] else math.nan
            ),
            "groups/sampled": st["sampled_groups"],
            "groups/trained": kept,
            "groups/skipped_invalid": st["skipped_groups"],
            "reward/invalid_samples": st["invalid_samples"],
            "sampling/rounds": st["rounds"],
            "response_length/mean": float(lens.mean()),
            "response_length/max": float(lens.max()),
            "response_length/truncated_fraction": st["truncated"] / n,
            "perf/generated_tokens": st["generated_tokens"],
            "perf/generation_seconds": st["generation_seconds"],
            "perf/reward_seconds": st["reward_seconds"],
            "perf/generated_tokens_per_second": st["generated_tokens"]
            / max(st["generation_seconds"], 1e-9),
        }
        if len(self.rewards.names) > 1:
            for name, vals in per_fn.items():
                v = np.concatenate(vals) if vals else np.zeros(0)
                stats[f"reward/{name}"] = float(v.mean()) if v.size else math.nan
        self.counters["samples"] += st["samples"]
        self.counters["generated_tokens"] += st["generated_tokens"]
        self.counters["reward_invalid"] += st["invalid_samples"]
        self.counters["groups_skipped_invalid"] += st["skipped_groups"]
        if not parts:
            return None, None, stats
        batch = Rollout.concat(parts, self.policy.pad_id)
        return batch, torch.cat(advs), stats

    def _report_invalid(
        self, scores: Any, idx: np.ndarray, G: int, prompts: list[str], texts: list[str]
    ) -> None:
        cfg = self.cfg
        per_sample = [e for e in scores.errors if e[1] is not None]
        first = (per_sample or scores.errors or [("?", None, "invalid reward")])[0]
        if cfg.reward.on_error == "raise":
            name, i, msg = first
            where = f" on sample {i} (prompt {prompts[i]!r})" if i is not None else ""
            raise RewardError(
                f"step {self.step + 1}: reward function {name!r} failed{where}: {msg} "
                f"(reward.on_error=raise)"
            )
        action = "their groups are skipped" if cfg.reward.on_error == "skip_group" else "scored 0"
        log.warning(
            "step %d: %d of %d rewards invalid (reward.on_error=%s: %s). First: %s, sample %s: %s",
            self.step + 1,
            scores.num_invalid,
            len(texts),
            cfg.reward.on_error,
            action,
            first[0],
            first[1],
            first[2],
        )
        recs = []
        for name, i, msg in scores.errors[:100]:
            rec: dict[str, Any] = {
                "step": self.step + 1,
                "function": name,
                "sample": i,
                "error": msg,
            }
            if i is not None:
                rec["prompt_index"] = int(idx[i // G])
                rec["prompt"] = prompts[i]
                rec["completion"] = texts[i]
            recs.append(rec)
        self._write("reward_errors.jsonl", recs)

    # ------------------------------------------------------------------ update
    def update(self, batch: Rollout, adv: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        a = cfg.algo
        temp = cfg.sampling.temperature
        device = self.policy.device
        passes = a.num_iterations * a.num_minibatches
        mask = batch.completion_mask.to(device)
        adv = adv.to(device)
        with torch.no_grad():
            ref = self.policy.reference_logprobs(batch, temperature=temp) if self.use_ref else None
            old = self.policy.logprobs(batch, temperature=temp)[0].detach() if passes > 1 else None
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        N = len(batch)
        splits = max(1, min(a.num_minibatches, N))
        lengths = batch.completion_mask.sum(1)
        by_tokens = self.loss_cfg.aggregation == "token_mean"
        sums: dict[str, float] = {}
        count = 0
        for _ in range(a.num_iterations):
            order = torch.randperm(N, generator=self.shuffle_gen) if splits > 1 else torch.arange(N)
            for rows in torch.tensor_split(order, splits):
                self.optimizer.zero_grad(set_to_none=True)
                # micro-batches of similar lengths (less padding); their losses are
                # weighted so that the sum is exactly the minibatch's loss
                rows = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
                micro = self._micro_batches(rows, batch)
                tokens = float(lengths[rows].sum())
                total = tokens if by_tokens else float(len(rows))
                loss_sum = 0.0
                stats_sum: dict[str, float] = {}
                finite = True
                for idx in micro:
                    sub = batch.select(idx)
                    T = sub.completion_ids.shape[1]
                    logp, ent = self.policy.logprobs(
                        sub, temperature=temp, with_entropy=True, entropy_grad=a.entropy_coef > 0
                    )
                    d = idx.to(device)
                    loss, stats = grpo_loss(
                        logp,
                        old[d][:, :T] if old is not None else logp.detach(),
                        adv[d],
                        mask[d][:, :T],
                        self.loss_cfg,
                        logp_ref=ref[d][:, :T] if ref is not None else None,
                        entropy=ent,
                    )
                    if not bool(torch.isfinite(loss)):
                        finite = False
                        break
                    n_tok = float(lengths[idx].sum())
                    w = (n_tok if by_tokens else float(len(idx))) / total
                    (loss * w).backward()
                    loss_sum += w * float(loss.detach())
                    for k, v in stats.items():
                        v = float(v)
                        if k.endswith("_max"):
                            stats_sum[k] = max(stats_sum.get(k, v), v)
                        else:  # the core's token means are weighted by tokens
                            wk = n_tok / tokens if k in _TOKEN_MEAN_STATS else w
                            stats_sum[k] = stats_sum.get(k, 0.0) + wk * v
                if not finite:
                    self.guard.skip()
                    log.warning("step %d: non-finite loss; step skipped", self.step + 1)
                    continue
                stepped = self.guard.step([torch.tensor(loss_sum)])
                if stepped is None:
                    log.warning("step %d: non-finite gradient; step skipped", self.step + 1)
                    continue
                self.counters["optimizer_steps"] += 1
                count += 1
                row = {"loss": loss_sum, "grad_norm": stepped[-1], **stats_sum}
                for k, v in row.items():
                    sums[k] = max(sums.get(k, v), v) if k.endswith("_max") else sums.get(k, 0.0) + v
        out = (
            {k: (v if k.endswith("_max") else v / count) for k, v in sums.items()} if count else {}
        )
        if "kl_ref" in out:
            out["kl"] = out.pop("kl_ref")
        out["lr"] = lr
        out["optimizer_steps"] = count
        return out

    def _micro_batches(self, rows: torch.Tensor, batch: Rollout) -> list[torch.Tensor]:
        """Forward passes of a minibatch whose rows come sorted by length, longest first.

        algo.micro_batch_size > 0: chunks of that many rows. 0 (auto): 1, 2, 4 or 8
        equal chunks, whichever computes the fewest positions (each chunk is padded to
        its own longest prompt and completion) counting _PASS_COST positions for each
        extra pass. Long, uneven completions then stop paying for their padding.
        """
        size = self.cfg.algo.micro_batch_size
        if size > 0:
            return list(torch.split(rows, size))
        p_len = batch.prompt_mask[rows].sum(1)
        c_len = batch.completion_mask[rows].sum(1)
        best, best_cost = [rows], None
        for k in (1, 2, 4, 8):
            if len(rows) < 4 * k:
                break
            chunks = list(torch.tensor_split(torch.arange(len(rows)), k))
            cost = (
                sum(len(c) * (int(p_len[c].max()) + int(c_len[c].max())) for c in chunks)
                + (k - 1) * _PASS_COST
            )
            if best_cost is None or cost < best_cost:
                best, best_cost = [rows[c] for c in chunks], cost
        return best

    # ------------------------------------------------------------------ loop
    def train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        batch, adv, stats = self.collect()
        t1 = time.perf_counter()
        if batch is None:
            log.warning("step %d: no group to train on; no update", self.step + 1)
            upd: dict[str, float] = {"optimizer_steps": 0, "lr": self.lr_at(self.step)}
        else:
            upd = self.update(batch, adv)
        t2 = time.perf_counter()
        self.step += 1
        row = {**stats, **upd}
        row["perf/update_seconds"] = t2 - t1
        row["perf/step_seconds"] = t2 - t0
        row["total/reward_invalid"] = self.counters["reward_invalid"]
        row["nonfinite_steps"] = self.guard.nonfinite_steps
        row["total/generated_tokens"] = self.counters["generated_tokens"]
        return row

    def train(self, steps: int | None = None) -> dict[str, Any]:
        """Train until ``steps`` (default run.steps) steps in all have been taken."""
        total = self.cfg.run.steps if steps is None else steps
        bar = None
        if self.cfg.run.progress and self.step < total:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True, desc="grpo")
        history: list[dict[str, float]] = []

        def step() -> int:
            row = self.train_step()
            history.append(row)
            if self.logger is not None:
                self.logger.log(self.step, row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{row['reward/mean']:.3f}",
                    zv=f"{row['groups/zero_variance_fraction']:.2f}",
                )
            return self.step

        def save() -> None:
            if self.run_dir is not None:
                self.save()

        stopped = train_loop(self.step, total, step, save, self.cfg.run.checkpoint_every)
        if bar is not None:
            bar.close()
        if self.run_dir is not None and not stopped and self.cfg.run.save_final_model:
            self.policy.save_pretrained(self.run_dir / "final")
        if self.logger is not None:
            self.logger.close()
            self.logger = None
        return {
            "steps": self.step,
            "stopped_early": stopped,
            "history": history,
            **self.counters,
            "nonfinite_steps": self.guard.nonfinite_steps,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": CHECKPOINT_KIND,
            "config": to_dict(self.cfg),
            "config_hash": config_hash(self.cfg),
            "code_version": code_version(),
            "model_path": str(self.cfg.model.path),
            "reference": self.policy.reference,
            "trainable": self.policy.trainable_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                "sample": self.sample_gen.get_state(),
                "shuffle": self.shuffle_gen.get_state(),
            },
            "sampler": self.sampler.state_dict(),
            "step": self.step,
            "counters": dict(self.counters),
            "guard": self.guard.state_dict(),
            "num_prompts": len(self.rows),
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        if path is None:
            if self.run_dir is None:
                raise ValueError("no run directory to save into; pass a path")
            path = self.run_dir / "checkpoints" / "latest.pt"
        return save_checkpoint(path, self.state_dict())

    def load(self, source: str | os.PathLike) -> None:
        src = Path(source)
        if src.is_dir():
            src = src / "checkpoints" / "latest.pt"
        ck = load_checkpoint(src)
        if ck.get("kind") != CHECKPOINT_KIND:
            raise CheckpointError(f"{src} is a {ck.get('kind')!r} checkpoint, not a GRPO one")
        if ck["num_prompts"] != len(self.rows):
            raise CheckpointError(
                f"{src} was trained on {ck['num_prompts']} prompts; this run has {len(self.rows)}"
            )
        try:
            self.policy.load_trainable_state_dict(ck["trainable"])
            self.optimizer.load_state_dict(ck["optimizer"])
            self.sampler.load_state_dict(ck["sampler"])
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{src} does not fit this run: {e}") from e
        rng = ck["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        self.sample_gen.set_state(rng["sample"])
        self.shuffle_gen.set_state(rng["shuffle"])
        self.step = int(ck["step"])
        counters = dict(ck["counters"])
        # checkpoints before the shared guard counted skipped steps here
        skipped = counters.pop("nonfinite_updates", 0)
        self.counters.update(counters)
        self.guard.load_state_dict(ck.get("guard", {"nonfinite_steps": skipped}))
        if self.run_dir is not None:
            if self.logger is not None:
                self.logger.truncate_after(self.step)
            for name in ("samples.jsonl", "reward_errors.jsonl"):
                truncate_jsonl(self.run_dir / name, self.step)


__all__ = ["CHECKPOINT_KIND", "GRPOTrainer"]
