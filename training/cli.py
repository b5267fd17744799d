"""The `sim2real` command line: every subcommand is declared here.

    sim2real tasks | train {ppo,dppo,bc,grpo} | eval | play | export | collect | bench sim | demo

``sim2real train <algo> --help`` lists every config field of that learner (name, type,
default with the task's preset applied, one line of help), read from the field docs
where the configs are declared (training.config_docs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# MuJoCo picks its OpenGL backend when it is first imported: without a display the
# run's video needs EGL (offscreen), which a user should not have to know to ask for
if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")

STOPPED = 130
"""Exit status of a run stopped by Ctrl-C / SIGTERM (saved, resumable): the shell's."""

TRAIN_ALGOS: dict[str, str] = {
    "ppo": "PPO on a Gaussian actor-critic (any task; the task's preset applies)",
    "bc": "pretrain a diffusion or flow policy on demonstrations (sim2real collect)",
    "dppo": "fine-tune a pretrained diffusion policy with DPPO (--init a bc run)",
    "reinflow": "fine-tune a pretrained flow policy with ReinFlow (--init a flow bc run)",
    "fpo": "train a flow policy with FPO, from scratch or from a flow bc run (--init)",
    "grpo": "GRPO-family fine-tuning of a language model on verifiable rewards",
    "world-model": "a TD-MPC2-style latent world model with planning, off-policy from replay",
    "vla-sft": "supervised fine-tuning of a vision-language-action policy on demonstrations "
    "with images and instructions (sim2real collect expert --task instructed_reach)",
    "vla-rl": "RL fine-tuning of a vla-sft run in the simulator: GRPO on success with groups "
    "from one layout (--algo grpo) or PPO with a value head on the shared backbone (--algo ppo)",
}
# the checkpoint kinds a train command's runs write, for --resume
_KINDS = {
    "ppo": ("ppo",),
    "bc": ("diffusion_bc", "flow_bc"),
    "dppo": ("dppo",),
    "reinflow": ("reinflow",),
    "fpo": ("fpo",),
    "grpo": ("grpo",),
    "world-model": ("world_model",),
    "vla-sft": ("vla_sft",),
    "vla-rl": ("vla_rl",),
}
# the learners that start from a pretrained run (--init), by their config class name
_FINETUNE = {"dppo": "DPPOTrainConfig", "reinflow": "ReinFlowTrainConfig", "fpo": "FPOTrainConfig"}


def _count(text: str) -> int:
    """A whole number, also written as 5e6 or 1_000_000."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer() or value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(value)


def _opset(text: str) -> int:
    """An ONNX opset the exporter supports (the TorchScript exporter: 14 to 20)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an opset number, got {text!r}") from None
    if not 14 <= value <= 20:
        raise argparse.ArgumentTypeError(f"opset {value} is not supported; use 14 to 20")
    return value


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (--task-args, --s2r)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{{\"command_vx\": [0, 1]}}', got {text!r} ({e})"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def default_run_dir(task: str, algo: str) -> Path:
    # an external task's "prefix:Name" without its colon, which scp, rsync and
    # TensorBoard's --logdir_spec read as a separator
    name = task.replace(":", "-")
    return Path("runs") / f"{algo}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


# ---------------------------------------------------------------------- train
def _train_parser(algo: str, config_help: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"sim2real train {algo}",
        description=TRAIN_ALGOS[algo]
        + ". Any config field below can be set as section.field=value.",
        epilog=config_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if algo == "vla-sft":
        p.add_argument("--data", help="demonstrations with images and instructions (collect)")
        p.add_argument("--steps", type=_count, help="gradient updates (sft.num_updates)")
    elif algo == "vla-rl":
        p.add_argument("--init", default=None, help="the vla-sft run to start from (init)")
        p.add_argument("--algo", choices=("grpo", "ppo"), default=None, help="rl.algo")
        p.add_argument("--steps", type=_count, help="updates (rl.num_updates)")
    elif algo == "grpo":
        p.add_argument("--model", help="directory of a transformers causal LM (save_pretrained)")
        p.add_argument("--data", help="prompts file: JSON lines with 'prompt' and 'answer'")
        p.add_argument("--steps", type=_count, help="total training steps (run.steps)")
    else:
        p.add_argument("--task", default=None, help="task (see `sim2real tasks`)")
        if algo == "bc":
            p.add_argument("--data", default=None, help="demonstration file (sim2real collect)")
            p.add_argument(
                "--policy",
                choices=("diffusion", "flow"),
                default="diffusion",
                help="the policy family to pretrain (default diffusion)",
            )
            p.add_argument("--steps", type=_count, help="gradient updates (bc.num_updates)")
        else:
            p.add_argument(
                "--steps", type=_count, help="env steps, all processes (run.total_steps)"
            )
        if algo in _FINETUNE:
            family = "diffusion" if algo == "dppo" else "flow"
            p.add_argument("--init", default=None, help=f"pretrained {family} run (train bc)")
        p.add_argument("--device", default=None, help="cpu or cuda[:i] (run.device)")
        p.add_argument(
            "--no-artifacts", action="store_true", help="skip the final eval, plot and video"
        )
        p.add_argument("--export", action="store_true", help="export policy.onnx when done")
    seed_key = {"vla-sft": "sft.seed", "vla-rl": "rl.seed"}.get(algo, "run.seed")
    p.add_argument("--seed", type=int, default=None, help=f"random seed ({seed_key})")
    p.add_argument(
        "--config",
        default=None,
        help="YAML file of config fields (sections as mappings), applied after the task's "
        "preset and before the overrides on the command line",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    p.add_argument(
        "--run-dir", default=None, help="run directory (default runs/<algo>-<task>-<time>)"
    )
    p.add_argument("--resume", default=None, help="run directory or checkpoint to continue")
    p.add_argument("overrides", nargs="*", help="section.field=value config overrides")
    return p


def _config_for_help(algo: str, argv: list[str]) -> Any:
    """The config `--help` describes: the task's preset applied when --task is given."""
    from training import train_configs as tc

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default=None)
    known, _ = pre.parse_known_args(argv)
    task = known.task or "cartpole"
    pre.add_argument("--policy", default="diffusion")
    known, _ = pre.parse_known_args(argv)
    if algo == "ppo":
        return tc.build_ppo_config(task)
    if algo == "bc":
        return tc.build_bc_config(task, "", policy=known.policy)
    if algo == "world-model":
        return tc.build_world_model_config(task)
    if algo in _FINETUNE:
        cls = getattr(tc, _FINETUNE[algo])
        return cls(env=tc.EnvConfig(task=task, num_envs=16, randomize=False))
    if algo == "vla-sft":
        from training.vla_sft import VLASFTTrainConfig

        return VLASFTTrainConfig()
    if algo == "vla-rl":
        from training.vla_rl import VLARLTrainConfig

        return VLARLTrainConfig()
    from training.grpo.config import GRPOTrainConfig

    return GRPOTrainConfig()


def _resumed_config(
    algo: str, a: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[Any, Path]:
    """The config and run directory of `--resume`, refusing a run of another kind."""
    from training.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
    from training.config import ConfigError, apply_overrides

    ck_path = find_checkpoint(a.resume)
    ck = load_checkpoint(ck_path)
    if ck.get("kind") not in _KINDS[algo]:
        raise CheckpointError(
            f"{a.resume} is a {ck.get('kind')!r} checkpoint, not a {algo} run; resume it with "
            f"the command that made it"
        )
    if algo == "grpo":
        from training.config import from_dict
        from training.grpo.config import GRPOTrainConfig

        try:
            cfg = from_dict(GRPOTrainConfig, ck["config"])
        except (TypeError, KeyError, ValueError) as e:
            raise ConfigError(f"the checkpoint's config does not fit this version: {e}") from e
    elif algo == "vla-sft":
        from training.vla_sft import config_from_checkpoint as vla_config

        cfg = vla_config(ck)
    elif algo == "vla-rl":
        from training.vla_rl import config_from_checkpoint as vla_rl_config

        cfg = vla_rl_config(ck)
    else:
        from training.policy_kinds import config_from_checkpoint

        cfg = config_from_checkpoint(ck)
        task = getattr(a, "task", None)
        if task and task != cfg.env.task:
            raise CheckpointError(f"{ck_path} was trained on task {cfg.env.task!r}, not {task!r}")
    if a.run_dir:
        run_dir = Path(a.run_dir)
    else:
        from training.run_dir import checkpoint_run_dir

        run_dir = checkpoint_run_dir(ck_path)
        if run_dir is None:
            raise ConfigError(
                f"{ck_path} is not inside a run directory's checkpoints/; name the directory "
                f"the resumed run writes into with --run-dir (new or empty)"
            )
    return apply_overrides(cfg, overrides), run_dir


def _overrides(algo: str, a: argparse.Namespace) -> dict[str, Any]:
    """The config file's fields, then the command line's (flags and section.field=value):
    dotted paths to values, applied in that order."""
    from training.config import (
        ConfigError,
        overrides_from_mapping,
        parse_override,
        read_config_file,
    )

    merged: dict[str, Any] = {}
    if a.config:
        try:
            mapping = read_config_file(a.config)
            template = _config_template(algo, getattr(a, "policy", "diffusion"))
            merged.update(overrides_from_mapping(template, mapping))
        except ConfigError as e:
            raise ConfigError(f"{a.config}: {e}" if a.config not in str(e) else str(e)) from None
    merged.update(parse_override(o) for o in _flag_overrides(algo, a))
    if algo not in ("grpo", "vla-sft", "vla-rl") and a.task is None and "env.task" in merged:
        a.task = str(merged["env.task"])
    return merged


def _config_template(algo: str, a_policy: str = "diffusion") -> Any:
    """A config of the command's type, for reading a config file against its fields."""
    from training import train_configs as tc

    if algo == "grpo":
        from training.grpo.config import GRPOTrainConfig

        return GRPOTrainConfig()
    if algo == "ppo":
        return tc.PPOTrainConfig()
    if algo == "vla-sft":
        from training.vla_sft import VLASFTTrainConfig

        return VLASFTTrainConfig()
    if algo == "vla-rl":
        from training.vla_rl import VLARLTrainConfig

        return VLARLTrainConfig()
    if algo == "bc":
        return tc.BC_CONFIGS[a_policy]()
    if algo == "world-model":
        return tc.WorldModelTrainConfig()
    return getattr(tc, _FINETUNE[algo])()


def _flag_overrides(algo: str, a: argparse.Namespace) -> list[str]:
    steps_key = {"bc": "bc.num_updates", "grpo": "run.steps", "vla-sft": "sft.num_updates"}
    flags = [
        (a.seed, "run.seed"),
        (getattr(a, "device", None), "run.device"),
        (a.steps, steps_key.get(algo, "run.total_steps")),
    ]
    if algo == "grpo":
        flags += [(a.model, "model.path"), (a.data, "data")]
    elif algo == "vla-sft":
        flags = [(a.seed, "sft.seed"), (a.steps, "sft.num_updates"), (a.data, "data")]
    elif algo == "vla-rl":
        flags = [(a.seed, "rl.seed"), (a.steps, "rl.num_updates"), (a.init, "init")]
        flags.append((a.algo, "rl.algo"))
    return list(a.overrides) + [f"{key}={value}" for value, key in flags if value is not None]


def _new_config(algo: str, a: argparse.Namespace, overrides: dict[str, Any]) -> tuple[Any, Path]:
    from training.config import ConfigError
    from training.train_configs import build_bc_config, build_ppo_config

    if algo == "ppo":
        cfg = build_ppo_config(a.task or "cartpole", overrides)
    elif algo == "bc":
        if not a.data:
            raise ConfigError("sim2real train bc needs --data <demonstrations.hdf5>")
        from training.demos import load_demos

        cfg = build_bc_config(a.task or load_demos(a.data).task, a.data, overrides, a.policy)
    elif algo == "world-model":
        from training.train_configs import build_world_model_config

        cfg = build_world_model_config(a.task or "cartpole", overrides)
    elif algo == "fpo" and not a.init:
        from training.train_configs import build_fpo_config

        cfg = build_fpo_config(a.task or "cartpole", overrides)
    else:
        if not a.init:
            raise ConfigError(f"sim2real train {algo} needs --init <pretrained run>")
        from training import train_configs as tc
        from training.policy_kinds import finetune_config_from

        cfg = finetune_config_from(getattr(tc, _FINETUNE[algo]), a.init, a.task, overrides)
    return cfg, Path(a.run_dir) if a.run_dir else default_run_dir(cfg.env.task, algo)


def _train_sim(algo: str, a: argparse.Namespace) -> int:
    """Every learner that steps the simulator: train, then the run's artifacts and
    (--export) its ONNX file."""
    from training.artifacts import finish_run

    overrides = _overrides(algo, a)
    cfg, run_dir = (
        _resumed_config(algo, a, overrides) if a.resume else _new_config(algo, a, overrides)
    )
    if a.print_config:
        from training.config import dump_config

        print(dump_config(cfg), end="")
        return 0
    if algo == "bc":
        from training.bc_runner import BCRunner

        runner: Any = BCRunner(cfg, run_dir, resume=a.resume)
    elif algo == "world-model":
        from training.off_policy_runner import OffPolicyRunner

        runner = OffPolicyRunner(cfg, run_dir, resume=a.resume)
    else:
        from training.runner import OnPolicyRunner

        runner = OnPolicyRunner(cfg, run_dir, resume=a.resume)
    try:
        summary = runner.train()
    finally:
        # evaluation, video and export build envs of their own: the training env closes
        # first, since some simulators allow one per process (Isaac Lab)
        runner.close()
    main = getattr(runner, "is_main", True)
    if main:
        if algo == "bc":
            done = f"{summary['updates']:,} updates"
        else:
            done = (
                f"{summary['env_steps']:,} env steps; training return {summary['return']:.2f} "
                f"(stochastic policy, mean of the last 100 episodes)"
            )
        print(f"{algo}: trained {done}; run dir {run_dir}")
    if summary["stopped_early"]:
        print(f"stopped; resume with: sim2real train {algo} --resume {run_dir}")
        return STOPPED
    if main and not a.no_artifacts:
        finish_run(runner, summary)
    if "eval_planner" in summary:  # world model: the planner beside the exported actor
        ev = summary["eval_planner"]
        print(f"planner eval: return {ev['return_mean']:.2f} ± {ev['return_std']:.2f}")
    if main and a.export:
        from training.export import export_run

        print(f"exported: {export_run(run_dir)}")
    return 0


def _train_grpo(a: argparse.Namespace) -> int:
    from training.config import ConfigError
    from training.grpo.config import GRPOTrainConfig
    from training.grpo.trainer import GRPOTrainer

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = _overrides("grpo", a)
    if a.resume:
        cfg, run_dir = _resumed_config("grpo", a, overrides)
    else:
        from training.config import apply_overrides

        cfg = apply_overrides(GRPOTrainConfig(), overrides)
        run_dir = (
            Path(a.run_dir) if a.run_dir else Path("runs") / time.strftime("grpo-%Y%m%d-%H%M%S")
        )
    if a.print_config:
        from training.config import dump_config

        print(dump_config(cfg), end="")
        return 0
    if not cfg.model.path:
        raise ConfigError("--model is required (a directory saved with save_pretrained)")
    if not cfg.data:
        raise ConfigError("--data is required (a JSON-lines prompts file)")
    from training.rewards import RewardError

    try:
        result = GRPOTrainer(cfg, run_dir=run_dir, resume=a.resume).train()
    except RewardError as e:  # a reward function that failed on too many samples
        print(f"sim2real train: error: {e}", file=sys.stderr)
        return 2
    summary = {k: v for k, v in result.items() if k != "history"}
    last = result["history"][-1] if result["history"] else {}
    summary["reward/mean"] = last.get("reward/mean")
    summary["run_dir"] = str(run_dir)
    print(json.dumps(summary, indent=2))
    return STOPPED if result["stopped_early"] else 0


def _train_vla_sft(a: argparse.Namespace) -> int:
    from training.config import ConfigError, apply_overrides
    from training.vla_sft import VLASFTRunner, VLASFTTrainConfig

    overrides = _overrides("vla-sft", a)
    if a.resume:
        cfg, run_dir = _resumed_config("vla-sft", a, overrides)
    else:
        cfg = apply_overrides(VLASFTTrainConfig(), overrides)
        run_dir = (
            Path(a.run_dir) if a.run_dir else Path("runs") / time.strftime("vla-sft-%Y%m%d-%H%M%S")
        )
    if a.print_config:
        from training.config import dump_config

        print(dump_config(cfg), end="")
        return 0
    if not cfg.data:
        raise ConfigError("sim2real train vla-sft needs --data <demonstrations.hdf5>")
    runner = VLASFTRunner(cfg, run_dir, resume=a.resume)
    try:
        summary = runner.train()
    finally:
        runner.close()
    rates = ", ".join(f"{k} {v:.2f}" for k, v in summary.items() if k.startswith("eval/"))
    print(
        f"vla-sft: {summary['updates']:,} updates{'; ' + rates if rates else ''}; run dir {run_dir}"
    )
    if summary["stopped_early"]:
        print(f"stopped; resume with: sim2real train vla-sft --resume {run_dir}")
        return STOPPED
    return 0


def _train_vla_rl(a: argparse.Namespace) -> int:
    from training.config import apply_overrides
    from training.vla_rl import VLARLRunner, VLARLTrainConfig

    overrides = _overrides("vla-rl", a)
    if a.resume:
        cfg, run_dir = _resumed_config("vla-rl", a, overrides)
    else:
        cfg = apply_overrides(VLARLTrainConfig(), overrides)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(a.run_dir) if a.run_dir else Path("runs") / f"vla-rl-{cfg.rl.algo}-{stamp}"
    if a.print_config:
        from training.config import dump_config

        print(dump_config(cfg), end="")
        return 0
    runner = VLARLRunner(cfg, run_dir, resume=a.resume)
    try:
        summary = runner.train()
    finally:
        runner.close()
    rates = ", ".join(f"{k} {v:.2f}" for k, v in summary.items() if k.startswith("eval/"))
    print(
        f"vla-rl {cfg.rl.algo}: {summary['updates']:,} updates{'; ' + rates if rates else ''}; "
        f"run dir {run_dir}"
    )
    if summary["stopped_early"]:
        print(f"stopped; resume with: sim2real train vla-rl --resume {run_dir}")
        return STOPPED
    return 0


def cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    algo = args.algo
    config_help = None
    if "-h" in rest or "--help" in rest:
        from training.config_docs import format_config_help

        config_help = "config fields:\n\n" + format_config_help(_config_for_help(algo, rest))
    a = _train_parser(algo, config_help).parse_args(rest)
    if algo == "grpo":
        return _train_grpo(a)
    if algo == "vla-sft":
        return _train_vla_sft(a)
    if algo == "vla-rl":
        return _train_vla_rl(a)
    return _train_sim(algo, a)


# ---------------------------------------------------------------------- other commands
def cmd_tasks(args: argparse.Namespace, rest: list[str]) -> int:
    from sim.registry import make, task_names

    rows = []
    for name in task_names():
        env = make(name, 1)
        groups = env.observation_spec.groups
        obs = " ".join(f"{g}={spec.size}" for g, spec in groups.items())
        rows.append((name, obs, env.action_spec.size, env.control_rate_hz, env.physics_rate_hz))
        env.close()
    # columns as wide as their longest entry: a long task name must not run into the next
    w_name = max(len("task"), *(len(r[0]) for r in rows)) + 2
    w_obs = max(len("observations"), *(len(r[1]) for r in rows)) + 2
    print(f"{'task':<{w_name}}{'observations':<{w_obs}}{'actions':>8}{'control Hz':>12}{'physics Hz':>12}")
    for name, obs, act, ctl, phy in rows:
        print(f"{name:<{w_name}}{obs:<{w_obs}}{act:>8}{ctl:>12.4g}{phy:>12.4g}")
    return 0


def cmd_eval(args: argparse.Namespace, rest: list[str]) -> int:
    """Evaluate a run, checkpoint or policy.onnx; print the statistics (and, for a .onnx,
    the safety layer's intervention counts). Exit status 3, with an error line on stderr,
    when the policy output non-finite actions: the safety layer replaced them, so the
    return is not the policy's (2 stays the status of bad input)."""
    from training.artifacts import evaluate_source

    a = args
    if a.planner:
        return _eval_planner(a)
    if a.stress:
        return _eval_stress(a)
    stress_only = [
        f for f, v in (("--shifts", a.shifts), ("--seconds", a.seconds), ("--plot", a.plot)) if v
    ]
    if stress_only:
        raise ValueError(f"{', '.join(stress_only)} only apply with --stress")
    stats = evaluate_source(
        a.source,
        task=a.task,
        episodes=a.episodes,
        seed=a.seed,
        randomize=a.randomize,
        zero_noise=a.zero_noise,
        task_args=a.task_args,
        s2r=a.s2r,
        video=a.video,
    )
    safety: dict[str, int] = stats.get("safety") or {}
    if a.json:
        print(json.dumps(stats))
    else:
        print(
            f"{stats['task']}: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}, "
            f"length {stats['length_mean']:.1f} ± {stats['length_std']:.1f} over "
            f"{stats['episodes']} episodes (deterministic policy)"
        )
        if "lin_vel_error_mean" in stats:
            print(
                f"tracking error: {stats['lin_vel_error_mean']:.3f} m/s linear, "
                f"{stats.get('ang_vel_error_mean', float('nan')):.3f} rad/s yaw"
            )
        if "violation_rate" in stats:
            per = ", ".join(
                f"{k.removeprefix('violation_rate_')} {v:.2%}"
                for k, v in stats.items()
                if k.startswith("violation_rate_")
            )
            print(f"constraints violated in {stats['violation_rate']:.2%} of steps ({per})")
        if "video" in stats:
            print(f"video of the first episode: {stats['video']} ({stats['video_frames']} frames)")
        if safety:
            print("safety: " + ", ".join(f"{name} {count}" for name, count in safety.items()))
    bad = int(safety.get("nonfinite_action", 0))
    if bad > 0:
        print(
            f"sim2real eval: error: the policy output non-finite actions (NaN or inf) in "
            f"{bad} of {safety.get('steps', '?')} safety-layer steps; the safety layer "
            "replaced them, so the return above is not the policy's",
            file=sys.stderr,
        )
        return 3
    return 0


def _eval_planner(a: argparse.Namespace) -> int:
    """`sim2real eval RUN --planner`: a world-model run's MPPI planner instead of its
    exported actor (the same episodes and seed as without the flag)."""
    from training.off_policy_runner import evaluate_planner
    from training.policy_kinds import load_policy

    given = [f for f, v in (("--randomize", a.randomize), ("--video", a.video)) if v]
    if given or str(a.source).endswith(".onnx"):
        raise ValueError(
            "--planner plans with a world-model run's checkpoint (not a .onnx file), in the "
            f"nominal env{'; drop ' + ', '.join(given) if given else ''}"
        )
    loaded = load_policy(a.source, task=a.task).with_env_options(a.task_args, a.s2r)
    if loaded.kind.name != "world_model":
        raise ValueError(f"--planner needs a world-model run; {a.source} is a {loaded.kind.name}")
    stats = evaluate_planner(loaded.policy, loaded.cfg, a.episodes, a.seed)
    stats = {"task": loaded.cfg.env.task, "source": str(a.source), "planner": True, **stats}
    if a.json:
        print(json.dumps(stats))
    else:
        print(
            f"{stats['task']}: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}, "
            f"length {stats['length_mean']:.1f} over {stats['episodes']} episodes (MPPI planner)"
        )
    return 0


def _eval_stress(a: argparse.Namespace) -> int:
    """`sim2real eval --stress`: the robustness matrix of one policy (training.robustness)."""
    from training.robustness import format_matrix, plot_matrix, robustness_matrix

    options = {
        "--task": a.task,
        "--randomize": a.randomize,
        "--s2r": a.s2r,
        "--video": a.video,
    }
    given = [flag for flag, value in options.items() if value]
    if given:
        raise ValueError(f"--stress sets the world of every cell itself; drop {', '.join(given)}")
    seconds = 10.0 if a.seconds is None else a.seconds
    # task options (e.g. a fixed command) apply in every cell, over the policy's own
    result = robustness_matrix(
        a.source,
        a.shifts,
        episodes=a.episodes,
        seconds=seconds,
        seed=a.seed,
        task_args=a.task_args,
    )
    if a.plot:
        result["plot"] = str(plot_matrix(result, a.plot))
    print(json.dumps(result) if a.json else format_matrix(result))
    if a.plot and not a.json:
        print(f"heatmap: {result['plot']}")
    return 0


def cmd_play(args: argparse.Namespace, rest: list[str]) -> int:
    """Run a policy in one env: the MuJoCo viewer where there is a display, else an MP4."""
    from training.play import play

    a = args
    result = play(
        a.source,
        seconds=a.seconds,
        seed=a.seed,
        randomize=a.randomize,
        command=a.velocity_command,
        video=a.video,
        task_args=a.task_args,
        s2r=a.s2r,
    )
    if result.video is not None:
        print(
            f"video: {result.video} ({result.frames} frames, {result.seconds:.2f} s simulated, "
            f"{result.episodes} episode(s) ended)"
        )
    return 0


def cmd_export(args: argparse.Namespace, rest: list[str]) -> int:
    from deploy.export import ExportError, read_parity
    from deploy.metadata import PolicyLoadError
    from training.export import export_run

    if args.rsl_rl is not None:
        if args.source is not None:
            raise ValueError("give either a run directory/checkpoint or --rsl-rl FILE, not both")
        if args.task is None:
            raise ValueError("--rsl-rl needs --task: an rsl_rl checkpoint does not record its task")
    elif args.source is None:
        raise ValueError("give a run directory or checkpoint file (or --rsl-rl FILE --task TASK)")
    elif args.task is not None or args.activation is not None:
        raise ValueError("--task and --activation apply to --rsl-rl checkpoints only")
    try:
        if args.rsl_rl is not None:
            from training.rsl_rl_import import export_rsl_rl

            path = export_rsl_rl(
                args.rsl_rl,
                args.task,
                args.out,
                activation=args.activation or "elu",
                opset=args.opset,
            )
        else:
            path = export_run(args.source, args.out, opset=args.opset)
        parity = read_parity(path)
    except (ExportError, PolicyLoadError) as e:
        print(f"sim2real export: error: {e}", file=sys.stderr)
        return 2
    print(path)
    figure = "not recorded" if parity is None else f"{parity:.3g}"
    print(f"parity: max |onnx - torch| = {figure} on random observations")
    return 0


def cmd_collect(args: argparse.Namespace, rest: list[str]) -> int:
    from training.collect import collect_demos
    from training.demos import save_demos

    a = args
    data = collect_demos(
        a.source, a.task, a.episodes, a.noise, a.seed, num_envs=a.num_envs, progress=True
    )
    out = a.out or f"demos/{data.task}_noise{a.noise:g}.hdf5"
    path = save_demos(out, data)
    s = data.summary()
    print(
        f"{path}: {s['episodes']} episodes, {s['transitions']} transitions, "
        f"return {s['return_mean']:.1f} ± {s['return_std']:.1f}"
    )
    return 0


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from sim.bench import report

    return report(
        args.tasks,
        args.envs,
        args.seconds,
        args.async_max_envs,
        args.json,
        rounds=args.rounds,
        envpool=args.envpool,
        no_envpool=args.no_envpool,
        doc=args.doc,
        allow_busy=args.allow_busy,
    )


def cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    """The README's main job: train PPO on the default task, export, evaluate the file."""
    from training.artifacts import evaluate_source
    from training.export import export_run

    run_dir = args.run_dir or str(default_run_dir(args.task, "demo"))
    rc = main(
        ["train", "ppo", "--task", args.task, "--steps", str(args.steps), "--run-dir", run_dir]
    )
    if rc:
        return rc
    onnx_path = export_run(run_dir)
    stats = evaluate_source(onnx_path, episodes=10)
    print(
        f"onnx: {onnx_path}; sim2sim return {stats['return_mean']:.2f} ± "
        f"{stats['return_std']:.2f} (deterministic policy through the runtime and safety layer)"
    )
    return 0


# ---------------------------------------------------------------------- the parser
def _env_option_args(s: argparse.ArgumentParser) -> None:
    """The env options of eval and play: what the policy trained with, overridable."""
    s.add_argument(
        "--randomize",
        action="store_true",
        help="turn on the policy's sim-to-real settings (domain randomization, noise, "
        "latency, pushes): the task's defaults with its training's env.s2r over them; "
        "default: the nominal model",
    )
    s.add_argument(
        "--task-args",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="task options over those the policy trained with, e.g. "
        "'{\"command_vx\": [0.5, 1.0]}' (the trained ones apply by default)",
    )
    s.add_argument(
        "--s2r",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="with --randomize: sim-to-real settings over those the policy trained with, e.g. "
        '\'{"friction_scale": [0.3, 1.5], "action_latency": [0, 2]}\'',
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sim2real", description="Train, export and deploy robot policies."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    s = sub.add_parser("tasks", help="list tasks with observation/action sizes and rates")
    s.set_defaults(handler=cmd_tasks)

    s = sub.add_parser(
        "train",
        help="train a policy: sim2real train <algo> --task <task> [section.field=value ...]",
        description="Train a policy. `sim2real train <algo> --help` lists its options and "
        "every config field.",
    )
    algos = s.add_subparsers(dest="algo", required=True, metavar="algo")
    for name, text in TRAIN_ALGOS.items():
        # its own parser (built in cmd_train, with the config fields) handles the rest
        algos.add_parser(name, help=text, add_help=False)
    s.set_defaults(handler=cmd_train)

    s = sub.add_parser("eval", help="evaluate a run directory, checkpoint or policy.onnx")
    s.add_argument("source", help="run directory, checkpoint file, or exported .onnx")
    s.add_argument("--task", default=None, help="task (default: the one the policy was trained on)")
    s.add_argument("--episodes", type=_count, default=10)
    s.add_argument("--seed", type=int, default=0)
    _env_option_args(s)
    s.add_argument(
        "--zero-noise",
        action="store_true",
        help="generative policies: zero noise (one fixed draw) instead of seeded sampling",
    )
    s.add_argument(
        "--planner",
        action="store_true",
        help="world-model runs: act with the MPPI planner over the learned model instead of "
        "the actor that export writes (compare the two returns)",
    )
    s.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    s.add_argument(
        "--video",
        default=None,
        metavar="OUT.mp4",
        help="also record the first episode (env 0) into this MP4, rendered offscreen",
    )
    s.add_argument(
        "--stress",
        action="store_true",
        help="the robustness matrix instead: --episodes per cell of shifts beyond the training "
        "ranges (added mass, friction, motor strength, PD gains, latency, noise, pushes, "
        "terrain), fall rate and tracking error per cell",
    )
    s.add_argument(
        "--shifts",
        type=_json_object,
        default=None,
        metavar="JSON",
        help='with --stress: the rows and their levels, e.g. \'{"friction": [1, 0.3], '
        '"latency": [0, 3]}\' (default: every shift at its default levels)',
    )
    s.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="with --stress: horizon of each episode in seconds (default 10)",
    )
    s.add_argument(
        "--plot", default=None, metavar="OUT.png", help="with --stress: write the heatmap here"
    )
    s.set_defaults(handler=cmd_eval)

    from training.play import KEYS_HELP, VIDEO_SECONDS

    s = sub.add_parser(
        "play",
        help="watch a policy act: the MuJoCo viewer, or an MP4 without a display",
        description="Run a run directory's, checkpoint's or policy.onnx's policy in one env "
        "of its task. Where a display exists ($DISPLAY or $WAYLAND_DISPLAY) it is shown in "
        "MuJoCo's viewer in real time; otherwise, or with --video, it is rendered offscreen "
        "(MUJOCO_GL=egl) into an MP4 (default: play.mp4 in the run directory, or "
        "<name>_play.mp4 beside the file). The env is built as `sim2real eval` builds it.",
        epilog=KEYS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("source", help="run directory, checkpoint file or policy.onnx")
    s.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"simulated seconds (default: until the viewer closes; {VIDEO_SECONDS:g} for a video)",
    )
    s.add_argument("--seed", type=int, default=0)
    _env_option_args(s)
    s.add_argument(
        "--command",
        type=float,
        nargs=3,
        metavar=("VX", "VY", "YAW"),
        dest="velocity_command",  # `command` is the subcommand's name
        default=None,
        help="command-tracking tasks (quadruped): hold this command, vx and vy in m/s (body "
        "frame), yaw rate in rad/s; default: the task draws its own from its trained ranges",
    )
    s.add_argument(
        "--video", default=None, metavar="OUT.mp4", help="render offscreen into this MP4"
    )
    s.set_defaults(handler=cmd_play)

    s = sub.add_parser(
        "export",
        help="export a policy to ONNX: sim2real export <run-dir> [--out f], or "
        "sim2real export --rsl-rl model_<N>.pt --task <task> [--out f]",
        description="Export a run's policy to ONNX with its deployment metadata; the file is "
        "checked against torch (parity) and loaded with the robot-side runtime. With --rsl-rl "
        "the policy comes from an rsl_rl 5.x checkpoint instead (the model_<N>.pt rsl_rl's "
        "OnPolicyRunner saves, e.g. trained on sim.rsl_rl_env.RslRlVecEnv; MLP actor with a "
        "Gaussian distribution reading the 'policy' observation group), and --task names the "
        "task it was trained on, which supplies the deployment metadata.",
    )
    s.add_argument("source", nargs="?", default=None, help="run directory or checkpoint file")
    s.add_argument(
        "--rsl-rl",
        default=None,
        metavar="MODEL.pt",
        help="export this rsl_rl 5.x checkpoint instead of a sim2real run (needs --task)",
    )
    s.add_argument("--task", default=None, help="with --rsl-rl: the task the policy was trained on")
    s.add_argument(
        "--activation",
        default=None,
        help="with --rsl-rl: the actor MLP's activation, the train cfg's actor.activation "
        "(rsl_rl's names: elu, relu, tanh, ...; default elu, rsl_rl's default)",
    )
    s.add_argument(
        "--out",
        default=None,
        help="output file (default: <run-dir>/policy.onnx; with --rsl-rl, model_<N>.onnx "
        "beside the checkpoint)",
    )
    s.add_argument("--opset", type=_opset, default=17, help="ONNX opset, 14 to 20 (default 17)")
    s.set_defaults(handler=cmd_export)

    s = sub.add_parser(
        "collect",
        help="record demonstrations of a policy into HDF5 (robomimic layout)",
        description="Record demonstrations of a policy (a checkpoint or run directory of any "
        "kind, or an exported .onnx) into an HDF5 file laid out as robomimic does.",
    )
    s.add_argument(
        "source",
        help="run directory, checkpoint file, policy.onnx, or expert (the task's scripted expert)",
    )
    s.add_argument("--task", default=None, help="task (default: the policy's own)")
    s.add_argument("--episodes", type=_count, default=50)
    s.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="Gaussian action noise std, as a fraction of the half action range",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--num-envs", type=_count, default=16)
    s.add_argument("--out", default=None, help="output .hdf5 (default demos/<task>_noise<S>.hdf5)")
    s.set_defaults(handler=cmd_collect)

    s = sub.add_parser("bench", help="run a benchmark: sim2real bench sim")
    benches = s.add_subparsers(dest="what", required=True, metavar="what")
    b = benches.add_parser(
        "sim",
        help="env steps/s of the batched simulator vs Gymnasium's vector envs",
        description="Env steps per second of the batched simulator against Gymnasium's vector "
        "envs and the hardware limit.",
    )
    b.add_argument("--tasks", nargs="+", default=["halfcheetah", "quadruped"])
    b.add_argument("--envs", nargs="+", type=_count, default=[1, 16, 64, 256, 1024])
    b.add_argument("--seconds", type=float, default=2.0, help="timing window per measurement")
    b.add_argument(
        "--async-max-envs", type=_count, default=16, help="AsyncVectorEnv runs one process per env"
    )
    b.add_argument("--json", type=str, default=None, help="also write the rows to this JSON file")
    b.add_argument(
        "--rounds", type=_count, default=3, help="interleaved rounds (ours, peers, ours, ...)"
    )
    b.add_argument(
        "--envpool",
        default=None,
        help="EnvPool's interpreter (default .venv-envpool/bin/python if scripts/"
        "setup_envpool.sh made it)",
    )
    b.add_argument("--no-envpool", action="store_true", help="leave EnvPool out")
    b.add_argument("--doc", default=None, help="write the markdown table here (idle machine only)")
    b.add_argument("--allow-busy", action="store_true", help="with --doc: write it marked as busy")
    s.set_defaults(handler=cmd_bench)

    s = sub.add_parser("demo", help="train, export and evaluate on the built-in default")
    s.add_argument("--task", default="halfcheetah")
    s.add_argument("--steps", type=_count, default=300_000)
    s.add_argument("--run-dir", default=None, help="default: runs/demo-<task>-<time>")
    s.set_defaults(handler=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    handler: Callable[[argparse.Namespace, list[str]], int] = args.handler
    from training.checkpoint import CheckpointError
    from training.config import ConfigError
    from training.run_control import TrainingDiverged

    try:
        return handler(args, rest)
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"sim2real {args.command}: error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"sim2real {args.command}: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
