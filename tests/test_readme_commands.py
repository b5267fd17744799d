"""Every `sim2real` command that README.md and docs/user_guide.md show, run by the suite,
so that the documentation cannot drift from the CLI again.

Each command runs through the real CLI (`training.cli.main`) as written, in a scratch
working directory, with three substitutions that keep the suite fast and offline:
- placeholders (`runs/ppo-quadruped-...`, `runs/<dir>`, `demos.hdf5`, `path/to/hf_model`,
  `logs/model_299.pt`, ...) become small runs and files made here, of the kind the
  command expects;
- `train` commands get `--print-config`: the arguments, the preset, the config file and
  every override are resolved and checked exactly as for training, which then does not
  start (training itself is tested elsewhere);
- `play` runs for 0.1 s of simulated time whatever `--seconds` says (offscreen
  rendering is slow).
One working directory per documentation file is shared by its commands, which run in
file order, so a file written by one (`--out demos.hdf5`,
`--print-config > hopper.yaml`) is there for the next, as for a reader.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from training.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "user_guide.md"]

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]
PPO_TINY = ["env.num_envs=2", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.num_epochs=1"]
PPO_TINY += ["policy.actor_hidden=[8]", "policy.critic_hidden=[8]"]
CHUNK = ["policy.hidden=8", "policy.critic_hidden=8", "policy.horizon=4", "policy.act_steps=2"]
FT_TINY = ["env.num_envs=2", "env.max_episode_steps=30"]


def documented_commands(path: Path) -> list[tuple[str, list[str], str | None]]:
    """(where, argv after `sim2real`, stdout redirect) of every sim2real command in the
    bash blocks of a markdown file; `a && b` gives two, `torchrun ... -m training.cli X`
    gives X."""
    out = []
    lines = path.read_text().splitlines()
    in_bash = False
    i = 0
    while i < len(lines):
        line = lines[i]
        start = i + 1
        i += 1
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        while line.rstrip().endswith("\\") and i < len(lines):
            line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if "training.cli" in words:
                words = ["sim2real", *words[words.index("training.cli") + 1 :]]
            if not words or words[0] != "sim2real":
                continue
            redirect = None
            if ">" in words:
                redirect = words[words.index(">") + 1]
                words = words[: words.index(">")]
            out.append((f"{path.name}:{start}", words[1:], redirect))
    return out


CASES = [case for doc in DOCS for case in documented_commands(doc)]


def test_the_docs_show_commands_of_every_kind():
    """The parser above finds what it should (it is not silently finding nothing)."""
    kinds = {argv[0] for _, argv, _ in CASES}
    assert {"train", "eval", "export", "play", "collect", "tasks"} <= kinds
    assert len(CASES) > 30


# ---------------------------------------------------------------------- the fixtures
def _run(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """The runs and files the placeholders stand for, each as small as it can be."""
    root = tmp_path_factory.mktemp("readme")
    runs: dict[str, Path] = {}
    for task in ("quadruped", "halfcheetah", "hopper", "cartpole"):
        run = root / f"ppo-{task}"
        _run(
            ["train", "ppo", "--task", task, "--steps", "32", "--run-dir", str(run)]
            + ["--no-artifacts", "--export", *QUIET, *PPO_TINY]
        )
        runs[f"ppo-{task}"] = run
    demos = root / "demos.hdf5"
    _run(
        ["collect", str(runs["ppo-hopper"]), "--episodes", "2", "--num-envs", "2"]
        + ["--out", str(demos)]
    )
    for policy in ("diffusion", "flow"):
        run = root / f"bc-{policy}"
        _run(
            ["train", "bc", "--policy", policy, "--data", str(demos), "--steps", "2"]
            + ["--run-dir", str(run), "--no-artifacts", *QUIET, *CHUNK]
        )
        runs[f"bc-{policy}"] = run
    for algo, start in (("dppo", "bc-diffusion"), ("reinflow", "bc-flow")):
        run = root / algo
        _run(
            ["train", algo, "--init", str(runs[start]), "--run-dir", str(run)]
            + ["--no-artifacts", "--export", *QUIET, *FT_TINY, f"{algo}.num_steps=8"]
            + [f"{algo}.num_epochs=1", "run.total_steps=16"]
        )
        runs[f"{algo}-hopper"] = run
    reach = root / "reach.hdf5"
    _run(
        ["collect", "expert", "--task", "instructed_reach", "--episodes", "2", "--out", str(reach)]
    )
    sft = root / "vla-sft"
    _run(
        ["train", "vla-sft", "--data", str(reach), "--steps", "2", "--run-dir", str(sft)]
        + ["sft.progress=false", "sft.tensorboard=false", "sft.eval_episodes=0"]
    )
    rl = root / "vla-rl"
    _run(
        ["train", "vla-rl", "--init", str(sft), "--steps", "1", "--run-dir", str(rl)]
        + ["rl.progress=false", "rl.tensorboard=false", "rl.eval_episodes=0", "rl.num_envs=2"]
        + ["rl.group_size=2", "rl.max_episode_steps=4", "rl.max_sample_rounds=1"]
    )
    runs["vla-sft"], runs["vla-rl"] = sft, rl
    from training.grpo.tiny import build_tiny_model

    runs["hf_model"] = build_tiny_model(root / "model", chars="0123456789+=", seed=0)
    runs["rsl_rl"] = _rsl_rl_checkpoint(root / "rsl")
    return runs


def _rsl_rl_checkpoint(log_dir: Path) -> Path:
    """One iteration of rsl_rl's own runner on cartpole: a real rsl_rl checkpoint."""
    from rsl_rl.runners import OnPolicyRunner

    from sim.rsl_rl_env import RslRlVecEnv

    mlp = {"class_name": "MLPModel", "hidden_dims": [8], "activation": "elu"}
    cfg = {
        "num_steps_per_env": 8,
        "save_interval": 1,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {
            **mlp,
            "obs_normalization": True,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0},
        },
        "critic": {**mlp, "obs_normalization": True},
        "algorithm": {"class_name": "PPO", "num_learning_epochs": 1, "num_mini_batches": 1},
        "logger": "tensorboard",
    }
    try:
        runner = OnPolicyRunner(
            RslRlVecEnv("cartpole", num_envs=2, seed=0), cfg, str(log_dir), "cpu"
        )
        runner.logger.git_status_repos = []  # rsl_rl would run git on this checkout
        with contextlib.redirect_stdout(io.StringIO()):
            runner.learn(1)
    except Exception as e:  # the rsl_rl config schema is rsl_rl's: say which part broke
        pytest.fail(f"making a tiny rsl_rl checkpoint failed: {type(e).__name__}: {e}")
    return sorted(log_dir.glob("model_*.pt"))[-1]


# ---------------------------------------------------------------------- substitution
PLACEHOLDER = re.compile(r"runs/(\w+)-(\w+)-\.\.\.")


def substitute(argv: list[str], made: dict[str, Path]) -> list[str]:
    algo = argv[1] if argv[0] == "train" and len(argv) > 1 else None
    out = []
    for word in argv:
        m = PLACEHOLDER.search(word)
        if m:
            kind, task = m.groups()
            if kind == "bc":  # the start of a fine-tuning run: the family it needs
                kind = "bc-diffusion" if algo == "dppo" else "bc-flow"
                key = kind
            elif kind == "vla":  # runs/vla-sft-..., runs/vla-rl-...
                key = f"vla-{task}"
            else:
                key = f"{kind}-{task}"
            word = word.replace(m.group(0), str(made[key]))
        elif word.startswith("runs/<dir>"):
            word = word.replace("runs/<dir>", str(made["ppo-quadruped"]))
        elif word == "path/to/hf_model":
            word = str(made["hf_model"])
        elif word.startswith("logs/model_"):
            word = str(made["rsl_rl"])
        out.append(word)
    return out


_CWD: dict[str, Path] = {}


@pytest.mark.parametrize(
    "where,argv,redirect", CASES, ids=[f"{w}:{' '.join(a)[:60]}" for w, a, _ in CASES]
)
def test_documented_command_runs(where, argv, redirect, made, tmp_path_factory, monkeypatch):
    doc = where.split(":")[0]
    if doc not in _CWD:
        _CWD[doc] = tmp_path_factory.mktemp(doc.replace(".", "_"))
        # the files the docs read without making them: prompts for GRPO
        from training.grpo.tiny import addition_rows, write_jsonl

        write_jsonl(_CWD[doc] / "prompts.jsonl", addition_rows(4))
    monkeypatch.chdir(_CWD[doc])
    args = substitute(argv, made)
    if args[0] == "train" and "--help" not in args:
        args.append("--print-config")
        if "--resume" not in args and "--run-dir" in args:  # may exist from the fixtures
            j = args.index("--run-dir")
            args[j + 1] = str(_CWD[doc] / Path(args[j + 1]).name)
    if args[0] == "play":
        if "--seconds" in args:
            args[args.index("--seconds") + 1] = "0.1"
        else:
            args += ["--seconds", "0.1"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            rc = main(args)
        except SystemExit as e:  # --help: argparse exits 0 after printing
            rc = e.code or 0
    assert rc == 0, f"{where}: `sim2real {' '.join(argv)}` exited {rc}"
    if redirect:
        (_CWD[doc] / redirect).write_text(buf.getvalue())
