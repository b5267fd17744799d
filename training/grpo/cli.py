"""`sim2real train grpo`: fine-tune a causal LM on verifiable rewards.

    sim2real train grpo --model DIR --data prompts.jsonl [--run-dir D] [--steps N]
        [--seed S] [section.field=value ...]
    sim2real train grpo --resume RUN_DIR [--steps N] [section.field=value ...]

--steps is the total number of training steps of the run (run.steps), so a resumed run
continues up to it. On --resume the run's saved config is used, with the overrides given
on the command line on top; the run directory is the resumed one unless --run-dir says
otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
from training.config import ConfigError, apply_overrides, from_dict


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sim2real train grpo",
        description="GRPO-family fine-tuning of a causal language model on verifiable rewards "
        "(algo.loss=grpo|dapo|dr_grpo|gspo).",
    )
    p.add_argument("--model", help="directory of a transformers causal LM (save_pretrained)")
    p.add_argument("--data", help="prompts file: JSON lines with 'prompt' and 'answer'")
    p.add_argument("--run-dir", help="run directory (default runs/grpo-<time>)")
    p.add_argument("--resume", help="run directory or checkpoint file to continue from")
    p.add_argument("--steps", type=int, help="total training steps (run.steps)")
    p.add_argument("--seed", type=int, help="random seed (run.seed)")
    p.add_argument("overrides", nargs="*", help="section.field=value config overrides")
    return p


def build_config(args: argparse.Namespace):
    from training.grpo.config import GRPOTrainConfig

    if args.resume:
        ck = load_checkpoint(find_checkpoint(args.resume))
        if ck.get("kind") != "grpo":
            raise CheckpointError(
                f"{args.resume} is a {ck.get('kind')!r} checkpoint, not a GRPO one"
            )
        try:
            cfg = from_dict(GRPOTrainConfig, ck["config"])
        except (TypeError, KeyError, ValueError) as e:
            raise ConfigError(f"the checkpoint's config does not fit this version: {e}") from e
    else:
        cfg = GRPOTrainConfig()
    items = list(args.overrides)
    if args.model is not None:
        items.append(f"model.path={args.model}")
    if args.data is not None:
        items.append(f"data={args.data}")
    if args.steps is not None:
        items.append(f"run.steps={args.steps}")
    if args.seed is not None:
        items.append(f"run.seed={args.seed}")
    cfg = apply_overrides(cfg, items)
    if not cfg.model.path:
        raise ConfigError("--model is required (a directory saved with save_pretrained)")
    if not cfg.data:
        raise ConfigError("--data is required (a JSON-lines prompts file)")
    return cfg


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.grpo.data import PromptDataError
    from training.rewards import RewardError

    try:
        cfg = build_config(args)
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        parser.error(str(e))
    if args.run_dir:
        run_dir = Path(args.run_dir)
    elif args.resume and Path(args.resume).is_dir():
        run_dir = Path(args.resume)
    elif args.resume:
        run_dir = Path(args.resume).resolve().parent.parent
    else:
        run_dir = Path("runs") / time.strftime("grpo-%Y%m%d-%H%M%S")
    from training.grpo.trainer import GRPOTrainer

    try:
        trainer = GRPOTrainer(cfg, run_dir=run_dir, resume=args.resume)
        result = trainer.train()
    except (PromptDataError, RewardError, CheckpointError, ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # a config that does not fit the model or the data
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {k: v for k, v in result.items() if k != "history"}
    last = result["history"][-1] if result["history"] else {}
    summary["reward/mean"] = last.get("reward/mean")
    summary["run_dir"] = str(run_dir)
    print(json.dumps(summary, indent=2))
    return 130 if result["stopped_early"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
