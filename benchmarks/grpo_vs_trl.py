"""GRPO throughput against TRL's GRPOTrainer, measured side by side in one run.

Same tiny randomly initialised causal LM (built in process, nothing downloaded), same
prompts, group size, completion limit, temperature, learning rate, loss (GRPO, beta 0,
one optimizer step per generation batch) and number of steps. For each framework:

- generated tokens per second: completion tokens / wall time of the training steps;
- generation-phase tokens per second: completion tokens / time spent generating (for
  both: tokenized prompts in, decoded completion texts out);
- optimizer steps per second: steps / wall time of the training steps, and steps per
  CPU-second of the process (less sensitive to other load on a shared machine).

Both log metrics every step (TRL to its log history, ours to a JSON-lines file); neither
saves checkpoints. The first step of every run is a warm-up and is not counted. Runs
alternate between the two frameworks ``--repeats`` times (which goes first alternates
too) and the medians are reported, so that a busy machine slows both alike.

    .venv/bin/python benchmarks/grpo_vs_trl.py --threads 1                     # <= 128 new tokens
    .venv/bin/python benchmarks/grpo_vs_trl.py --threads 1 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# nothing leaves the machine: no hub look-ups, no telemetry
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _ours(
    model_dir: Path, rows: list[dict], a: argparse.Namespace, seed: int, run_dir: Path
) -> dict[str, float]:
    from training.config import apply_overrides
    from training.grpo import GRPOTrainConfig, GRPOTrainer
    from training.rewards import exact_match

    cfg = apply_overrides(
        GRPOTrainConfig(),
        [
            f"model.path={model_dir}",
            f"sampling.prompts_per_step={a.prompts_per_step}",
            f"sampling.group_size={a.group_size}",
            f"sampling.max_new_tokens={a.max_new_tokens}",
            "sampling.temperature=1.0",
            "algo.loss=grpo",
            "algo.kl_coef=0",
            f"algo.lr={a.lr}",
            "algo.max_grad_norm=1.0",
            f"run.seed={seed}",
            f"run.steps={a.steps}",
            "run.progress=false",
            "run.tensorboard=false",
            "run.log_samples=0",
        ],
    )
    # metrics go to a JSON-lines file every step, as TRL logs every step here
    trainer = GRPOTrainer(cfg, rows=rows, reward_fns=[exact_match], run_dir=run_dir)
    trainer.train_step()  # warm-up
    hist = []
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps - 1):
        hist.append(trainer.train_step())
        trainer.logger.log(trainer.step, hist[-1])
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    gen = sum(h["perf/generation_seconds"] for h in hist)
    tokens = sum(h["perf/generated_tokens"] for h in hist)
    return {
        "tokens_per_s": tokens / wall,
        "gen_tokens_per_s": tokens / gen,
        "steps_per_s": len(hist) / wall,
        "steps_per_cpu_s": len(hist) / cpu,
        "mean_completion_length": tokens / (len(hist) * a.prompts_per_step * a.group_size),
    }


def _trl(
    model_dir: Path, rows: list[dict], a: argparse.Namespace, seed: int, out: Path
) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from training.rewards import exact_match

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    n = a.prompts_per_step * a.group_size
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=a.group_size,
        max_completion_length=a.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        loss_type="grpo",
        beta=0.0,
        num_iterations=1,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        max_steps=a.steps,
        use_cpu=True,
        bf16=False,  # float32 like ours (TRL's default is bf16 autocast, even on CPU)
        # ours keeps activations; TRL's default recomputes them (slower, less memory)
        gradient_checkpointing=a.trl_gradient_checkpointing,
        use_vllm=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
    )
    ends: list[float] = []
    cpu_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[exact_match],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Clock()],
    )
    gen_time = [0.0]
    inner = trainer._generate

    def timed_generate(*args, **kwargs):  # measurement only: the same call, timed
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            gen_time.append(time.perf_counter() - t)

    trainer._generate = timed_generate
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    lengths = [h["completions/mean_length"] for h in logs][1:]
    wall = ends[-1] - ends[0]
    tokens = sum(lengths) * n
    gen = sum(gen_time[2:])  # gen_time[1] is the warm-up step's
    return {
        "tokens_per_s": tokens / wall,
        "gen_tokens_per_s": tokens / gen,
        "steps_per_s": (len(ends) - 1) / wall,
        "steps_per_cpu_s": (len(ends) - 1) / (cpu_ends[-1] - cpu_ends[0]),
        "mean_completion_length": tokens / (len(lengths) * n),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="leave TRL's default activation checkpointing on (ours has none; off by default "
        "so that both do the same work)",
    )
    p.add_argument("--json", help="write the figures to this file too")
    a = p.parse_args(argv)
    if a.steps < 3:
        p.error("--steps must be >= 3 (the first step is a warm-up)")
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    from sim.machine_load import LoadMonitor
    from training.grpo.tiny import addition_rows, build_tiny_model

    # sampled between runs; torch's worker threads spin a while after each run
    monitor = LoadMonitor(own_threads=a.threads + 1)
    rows = addition_rows(18)
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", hidden_size=a.hidden_size, num_layers=a.layers, seed=a.seed
        )
        for r in range(a.repeats):
            # alternate which goes first, so that a drift in machine load hits both alike
            order = ("ours", "trl") if r % 2 == 0 else ("trl", "ours")
            for name in order:
                if name == "ours":
                    runs["ours"].append(
                        _ours(model_dir, rows, a, a.seed + r, Path(tmp) / f"ours{r}")
                    )
                else:
                    runs["trl"].append(_trl(model_dir, rows, a, a.seed + r, Path(tmp) / f"trl{r}"))
                monitor.sample()
            print(
                f"repeat {r + 1}/{a.repeats}: ours {runs['ours'][-1]['steps_per_s']:.2f} steps/s, "
                f"TRL {runs['trl'][-1]['steps_per_s']:.2f} steps/s",
                file=sys.stderr,
            )
    monitor.stop()
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}
    ratio = {
        m: med["ours"][m] / med["trl"][m]
        for m in ("tokens_per_s", "gen_tokens_per_s", "steps_per_s", "steps_per_cpu_s")
    }
    print(
        f"GRPO on CPU ({a.threads} threads), tiny Llama (hidden {a.hidden_size}, {a.layers} layers), "
        f"{a.prompts_per_step} prompts x {a.group_size} completions, <= {a.max_new_tokens} new tokens, "
        f"{a.steps} steps (first one warm-up), median of {a.repeats}"
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
        f"python {platform.python_version()}; TRL in float32, activation checkpointing "
        f"{'on' if a.trl_gradient_checkpointing else 'off'}"
    )
    print(f"{'':28}{'ours':>12}{'TRL':>12}{'ours/TRL':>10}")
    names = {
        "tokens_per_s": "generated tokens/s",
        "gen_tokens_per_s": "  (generation phase only)",
        "steps_per_s": "optimizer steps/s",
        "steps_per_cpu_s": "  (per CPU-second)",
        "mean_completion_length": "mean completion length",
    }
    for m, label in names.items():
        r = f"{ratio[m]:>9.2f}x" if m in ratio else ""
        print(f"{label:28}{med['ours'][m]:>12.2f}{med['trl'][m]:>12.2f}{r}")
    per_repeat = statistics.median(
        o["steps_per_s"] / t["steps_per_s"] for o, t in zip(runs["ours"], runs["trl"], strict=True)
    )
    print(f"optimizer steps/s ours/TRL, median of the per-repeat ratios: {per_repeat:.2f}x")
    print(monitor.describe())
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "args": vars(a),
                    "median": med,
                    "ratio": ratio,
                    "median_of_repeat_ratios": per_repeat,
                    "runs": runs,
                    "machine_load": {"verdict": monitor.describe(), "busy": monitor.busy},
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
