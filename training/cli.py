"""The `sim2real` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys


def _cmd_tasks(args: argparse.Namespace) -> int:
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
    if args.what == "sim":
        from sim.bench import main as bench_main

        return bench_main(rest)
    raise SystemExit(f"unknown benchmark {args.what!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sim2real", description="Train, export and deploy robot policies.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("tasks", help="list tasks with observation/action sizes and rates")
    b = sub.add_parser("bench", help="run a benchmark (sim)", add_help=False)
    b.add_argument("what", choices=["sim"])
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _cmd_bench(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"tasks": _cmd_tasks}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
