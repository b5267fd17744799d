"""How much one RL update of the VLA knows: do the policy gradients of independent
rollout batches point the same way?

From a fixed policy (an SFT run, nothing updated), ``--batches`` independent rollouts of
``--num-envs`` episodes each (the runner's own rollout: GRPO groups with dynamic
sampling, or PPO's GAE with normalised advantages), and the gradient of the core's
policy loss on each whole batch at ratio 1 (the first minibatch step's direction, before
clipping can act), over the parameters RL trains. Then, with g_i = mu + e_i (mu the
true gradient, e_i the batch's noise):

- the mean cosine between pairs of batches (1: every batch agrees; ~0: noise);
- |mu|^2 estimated by the mean of g_i . g_j over pairs (unbiased for independent
  batches), the noise E|e|^2 by mean |g_i|^2 - |mu|^2, and their ratio, the
  signal-to-noise of one batch;
- the episodes per batch at which the signal would equal the noise (noise falls as
  1/episodes): ``episodes * noise / signal``.

    OMP_NUM_THREADS=1 python benchmarks/vla_gradient_agreement.py \
        --init runs/bench_vla_few_s0/sft-s0 --algo grpo ppo --num-envs 32 --batches 8

This is the measurement behind docs/benchmarks_vla.md's "Why RL adds little here".
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def batch_gradients(init: str, algo: str, num_envs: int, batches: int, seed: int) -> dict:
    """Flat policy-loss gradients of ``batches`` independent rollouts of a fixed policy."""
    from training.vla_rl import (
        VLARLConfig,
        VLARLRunner,
        VLARLTrainConfig,
        learning_batch,
        vla_rl_loss,
    )

    rc = VLARLConfig(
        algo=algo, num_envs=num_envs, seed=seed, progress=False, tensorboard=False,
        video=False, eval_episodes=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        runner = VLARLRunner(VLARLTrainConfig(init=init, rl=rc), Path(tmp) / "run")
        params = [p for g in runner.optimizer.param_groups[:1] for p in g["params"]]
        grads, episodes, success = [], [], []
        t0 = time.perf_counter()
        for _ in range(batches):
            s, st = runner.rollout()
            success.append(st["success_rate"])
            if s.advantages.numel() == 0:  # grpo: no group with mixed outcomes
                continue
            s = learning_batch([s], rc)  # the batch an update learns from
            loss, _ = vla_rl_loss(runner.policy, s, runner.loss_cfg)
            g = torch.autograd.grad(loss, params, allow_unused=True)
            grads.append(
                torch.cat(
                    [
                        (x if x is not None else torch.zeros_like(p)).flatten()
                        for x, p in zip(g, params)
                    ]
                ).double()  # fmt: skip
            )
            episodes.append(num_envs if algo == "ppo" else st["kept_groups"] * rc.group_size)
        runner.close()
    return {
        "grads": grads,
        "episodes": episodes,
        "success": success,
        "seconds": time.perf_counter() - t0,
    }


def agreement(grads: list[torch.Tensor]) -> dict[str, float]:
    """Mean pairwise cosine, |mu|^2 and E|e|^2 of independent gradient estimates."""
    pairs = list(itertools.combinations(range(len(grads)), 2))
    if not pairs:
        raise SystemExit("fewer than two batches gave a gradient: raise --batches")
    dots = [float(grads[i] @ grads[j]) for i, j in pairs]
    norms = [float(g.norm()) for g in grads]
    cos = [dots[k] / (norms[i] * norms[j]) for k, (i, j) in enumerate(pairs)]
    signal = float(np.mean(dots))
    noise = float(np.mean([n * n for n in norms])) - signal
    return {
        "cos_mean": float(np.mean(cos)),
        "cos_sem": float(np.std(cos) / np.sqrt(len(cos))),
        "signal": signal,
        "noise": noise,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True, help="the vla-sft run to measure from")
    p.add_argument("--algo", nargs="+", default=["grpo", "ppo"], choices=["grpo", "ppo"])
    p.add_argument("--num-envs", nargs="+", type=int, default=[32])
    p.add_argument("--batches", type=int, default=8, help="independent rollouts per setting")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"policy: {a.init}; {a.batches} independent rollouts per setting, load "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    head = (
        "| algo | envs | batches with a gradient | episodes / batch | rollout success | "
        "mean cosine between batches | signal / noise of one batch | "
        "episodes for signal = noise | seconds per batch |"
    )
    print(head)
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for algo, n in itertools.product(a.algo, a.num_envs):
        r = batch_gradients(a.init, algo, n, a.batches, a.seed)
        ag = agreement(r["grads"])
        eps = float(np.mean(r["episodes"]))
        snr = ag["signal"] / ag["noise"]
        # a signal estimated <= 0 is below what these batches can detect
        need = f"{eps / snr:,.0f}" if snr > 0 else "not detectable"
        print(
            f"| {algo} | {n} | {len(r['grads'])} of {a.batches} | {eps:.1f} | "
            f"{np.mean(r['success']):.2f} | {ag['cos_mean']:.3f} +- {ag['cos_sem']:.3f} | "
            f"{snr:.4f} | {need} | {r['seconds'] / a.batches:.0f} |",
            flush=True,
        )
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
