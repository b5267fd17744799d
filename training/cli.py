"""The `sim2real` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# MuJoCo picks its OpenGL backend when it is first imported: without a display the
# run's video needs EGL (offscreen), which a user should not have to know to ask for
if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")


def _cmd_tasks(args: argparse.Namespace, rest: list[str]) -> int:
    from sim.registry import make, task_names

    rows = []
    for name in task_names():
        env = make(name, 1)
        groups = env.observation_spec.groups
        obs = " ".join(f"{g}={spec.size}" for g, spec in groups.items())
        rows.append((name, obs, env.action_spec.size, env.control_rate_hz, env.physics_rate_hz))
        env.close()
    print(f"{'task':<13}{'observations':<26}{'actions':>8}{'control Hz':>12}{'physics Hz':>12}")
    for name, obs, act, ctl, phy in rows:
        print(f"{name:<13}{obs:<26}{act:>8}{ctl:>12.4g}{phy:>12.4g}")
    return 0


def _cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from sim.bench import main as bench_main

    return bench_main(rest)


def _default_run_dir(task: str, algo: str) -> Path:
    import time

    return Path("runs") / f"{algo}-{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def train_ppo(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sim2real train ppo",
        description="Train a PPO policy. Any config field can be set as section.field=value "
        "(sections: env, policy, ppo, run), e.g. ppo.lr=3e-4 policy.actor_hidden=64,64.",
    )
    p.add_argument(
        "--task", default=None, help="task name (see `sim2real tasks`); default cartpole"
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu or cuda[:i]")
    p.add_argument("--steps", type=int, default=None, help="total env steps (all processes)")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--resume", default=None, help="run directory or checkpoint to continue")
    p.add_argument(
        "--no-artifacts", action="store_true", help="skip the final eval, plot and video"
    )
    p.add_argument("overrides", nargs="*", help="section.field=value")
    a = p.parse_args(argv)

    from training.checkpoint import find_checkpoint, load_checkpoint
    from training.config import apply_overrides
    from training.runner import PPORunner, build_config, config_from_checkpoint

    overrides = list(a.overrides)
    for flag, key in ((a.seed, "run.seed"), (a.device, "run.device"), (a.steps, "run.total_steps")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    if a.resume:
        ck_path = find_checkpoint(a.resume)
        cfg = config_from_checkpoint(load_checkpoint(ck_path))
        if a.task and a.task != cfg.env.task:
            from training.checkpoint import CheckpointError

            raise CheckpointError(f"{ck_path} was trained on task {cfg.env.task!r}, not {a.task!r}")
        cfg = apply_overrides(cfg, overrides)
        run_dir = Path(a.run_dir) if a.run_dir else ck_path.parent.parent
    else:
        cfg = build_config(a.task or "cartpole", overrides)
        run_dir = Path(a.run_dir) if a.run_dir else _default_run_dir(cfg.env.task, "ppo")
    runner = PPORunner(cfg, run_dir, resume=a.resume)
    summary = runner.train()
    if runner.is_main:
        print(
            f"trained {summary['env_steps']:,} env steps, recent return {summary['return']:.2f}; run dir {run_dir}"
        )
        if not a.no_artifacts and not summary["stopped_early"]:
            from training.artifacts import finish_run

            finish_run(runner)
    if summary["stopped_early"]:
        print(f"stopped; resume with: sim2real train ppo --resume {run_dir}")
    return 0


def _cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    if args.algo == "ppo":
        return train_ppo(rest)
    if args.algo == "grpo":
        from training.grpo.cli import main as grpo_main

        return grpo_main(rest)
    if args.algo == "bc":
        from training.dppo_runner import train_bc_cli

        return train_bc_cli(rest)
    if args.algo == "dppo":
        from training.dppo_runner import train_dppo_cli

        return train_dppo_cli(rest)
    raise SystemExit(f"unknown algorithm {args.algo!r}")


def _cmd_eval(args: argparse.Namespace, rest: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sim2real eval", description="Evaluate a run, checkpoint or policy.onnx."
    )
    p.add_argument("source", help="run directory, checkpoint file, or exported .onnx")
    p.add_argument("--task", default=None, help="task (default: the one the policy was trained on)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--randomize", action="store_true", help="domain randomization, noise and latency on"
    )
    p.add_argument(
        "--zero-noise",
        action="store_true",
        help="diffusion policies: zero noise (one fixed draw) instead of seeded sampling",
    )
    p.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    a = p.parse_args(rest)
    from training.artifacts import evaluate_source

    stats = evaluate_source(
        a.source,
        task=a.task,
        episodes=a.episodes,
        seed=a.seed,
        randomize=a.randomize,
        zero_noise=a.zero_noise,
    )
    if a.json:
        print(json.dumps(stats))
    else:
        print(
            f"{stats['task']}: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}, "
            f"length {stats['length_mean']:.1f} ± {stats['length_std']:.1f} over {stats['episodes']} episodes"
        )
    return 0


def _cmd_export(args: argparse.Namespace, rest: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sim2real export",
        description="Export a run's policy to ONNX with its deployment metadata; the file "
        "is checked against torch (parity) and loaded with the robot-side runtime.",
    )
    p.add_argument("source", help="run directory or checkpoint file")
    p.add_argument("--out", default=None, help="output file (default: <run-dir>/policy.onnx)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    a = p.parse_args(rest)
    from deploy.export import ExportError, export_checkpoint, read_parity
    from deploy.metadata import PolicyLoadError
    from training.artifacts import DIFFUSION_KINDS, checkpoint_kind

    try:
        if checkpoint_kind(a.source) in DIFFUSION_KINDS:
            from training.dppo_runner import export_diffusion

            path = export_diffusion(a.source, a.out, opset=a.opset)
        else:
            path = export_checkpoint(a.source, a.out, opset=a.opset)
        parity = read_parity(path)
    except (ExportError, PolicyLoadError) as e:
        print(f"sim2real export: error: {e}", file=sys.stderr)
        return 2
    print(path)
    figure = "not recorded" if parity is None else f"{parity:.3g}"
    print(f"parity: max |onnx - torch| = {figure} on random observations")
    return 0


def _cmd_collect(args: argparse.Namespace, rest: list[str]) -> int:
    from training.demos import main as collect_main

    return collect_main(rest)


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from training.artifacts import demo

    return demo(rest)


COMMANDS = {
    "tasks": (_cmd_tasks, "list tasks with observation/action sizes and rates"),
    "train": (
        _cmd_train,
        "train a policy: sim2real train ppo --task <task> [section.field=value ...]",
    ),
    "eval": (_cmd_eval, "evaluate a run directory, checkpoint or ONNX policy"),
    "export": (_cmd_export, "export a run's policy to ONNX: sim2real export <run-dir> [--out f]"),
    "bench": (_cmd_bench, "run a benchmark: sim2real bench sim"),
    "demo": (_cmd_demo, "train, export and evaluate on the built-in default"),
    "collect": (
        _cmd_collect,
        "record demonstrations: sim2real collect <checkpoint|policy.onnx> --task <task> "
        "--episodes N [--noise S]",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sim2real", description="Train, export and deploy robot policies."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    for name, (_, help_) in COMMANDS.items():
        s = sub.add_parser(name, help=help_, add_help=name == "tasks")
        if name == "train":
            s.add_argument("algo", choices=["ppo", "grpo", "bc", "dppo"])
        elif name == "bench":
            s.add_argument("what", choices=["sim"])
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    handler = COMMANDS[args.command][0]
    from training.checkpoint import CheckpointError
    from training.config import ConfigError

    try:
        return handler(args, rest)
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"sim2real {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
