"""Flow policies end to end through the shared pieces: flow BC from demonstrations,
ReinFlow and FPO (from a BC start and from scratch) in the one runner, exact resume,
export to ONNX and evaluation through the robot-side runtime; wrong starts refused."""

from __future__ import annotations

import pytest
import torch
from demo_support import random_demos

from deploy.metadata import read_metadata
from training.checkpoint import load_checkpoint
from training.cli import main
from training.policy_kinds import finetune_config_from, load_policy
from training.runner import OnPolicyRunner
from training.train_configs import FPOTrainConfig, ReinFlowTrainConfig, build_fpo_config

QUIET = ["run.progress=false", "run.tensorboard=false", "run.video=false"]
FLOW = ["policy.hidden=16,16", "policy.critic_hidden=16", "policy.noise_hidden=8"]
FLOW += ["policy.horizon=4", "policy.act_steps=2", "policy.sample_steps=2"]
TINY = ["env.num_envs=2", "run.checkpoint_every=1", "env.max_episode_steps=30"]


@pytest.fixture(scope="module")
def flow_bc(tmp_path_factory):
    root = tmp_path_factory.mktemp("flow")
    demos = random_demos(root / "demos.hdf5")
    argv = ["train", "bc", "--policy", "flow", "--data", str(demos), "--steps", "20"]
    argv += ["--run-dir", str(root / "bc"), "--no-artifacts", *QUIET, *FLOW]
    argv += ["bc.batch_size=16", "bc.warmup=2"]
    assert main(argv) == 0
    assert load_checkpoint(root / "bc" / "checkpoints" / "latest.pt")["kind"] == "flow_bc"
    return root / "bc"


def _params(runner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in runner.policy.parameters()]


@pytest.mark.parametrize(
    "cls, section", [(ReinFlowTrainConfig, "reinflow"), (FPOTrainConfig, "fpo")]
)
def test_fine_tuning_from_flow_bc_resumes_exactly(tmp_path, flow_bc, cls, section):
    over = QUIET + TINY + [f"{section}.num_steps=8", f"{section}.num_epochs=1"]
    straight = OnPolicyRunner(
        finetune_config_from(cls, flow_bc, "hopper", over + ["run.total_steps=48"]), tmp_path / "a"
    )
    straight.train()
    first = OnPolicyRunner(
        finetune_config_from(cls, flow_bc, "hopper", over + ["run.total_steps=32"]), tmp_path / "b"
    )
    first.train()
    cfg = finetune_config_from(cls, flow_bc, "hopper", over + ["run.total_steps=48"])
    resumed = OnPolicyRunner(cfg, tmp_path / "b", resume=tmp_path / "b")
    resumed.train()
    for a, b in zip(_params(straight), _params(resumed)):
        assert torch.equal(a, b)
    # fine-tuning moved the pretrained weights
    init = load_policy(flow_bc).policy
    assert any(
        not torch.equal(a, b) for a, b in zip(init.parameters(), straight.policy.parameters())
    )


def test_reinflow_trains_exports_and_runs_on_the_runtime(tmp_path, flow_bc, capsys):
    run = tmp_path / "rf"
    argv = ["train", "reinflow", "--init", str(flow_bc), "--steps", "32", "--run-dir", str(run)]
    argv += ["--export", *QUIET, *TINY, "reinflow.num_steps=8", "reinflow.num_epochs=1"]
    assert main(argv) == 0
    onnx_path = run / "policy.onnx"
    meta = read_metadata(onnx_path)
    assert meta.policy_family == "flow" and meta.noise_shape == [4, 3]
    assert meta.extra["flow_steps"] == "2" and meta.extra["checkpoint_kind"] == "reinflow"
    assert [n for n, _ in meta.recurrent_state] == ["action_chunk", "chunk_step"]
    capsys.readouterr()
    # torch and the file agree in deterministic mode; sampling is seeded as on the robot
    torch_stats = load_policy(run).evaluate(episodes=2, seed=5)
    from deploy.sim2sim import evaluate_onnx

    onnx_stats = evaluate_onnx(onnx_path, episodes=2, seed=5, safety=False, zero_noise=True)
    assert onnx_stats["return_mean"] == pytest.approx(
        torch_stats["return_mean"], rel=1e-3, abs=1e-2
    )
    sampled = [evaluate_onnx(onnx_path, episodes=2, seed=s, safety=False) for s in (5, 5, 6)]
    assert sampled[0]["return_mean"] == sampled[1]["return_mean"] != sampled[2]["return_mean"]
    assert main(["eval", str(onnx_path), "--episodes", "2"]) == 0


def test_fpo_from_scratch_runs_and_exports(tmp_path):
    cfg = build_fpo_config(
        "cartpole",
        QUIET + FLOW + TINY + ["fpo.num_steps=8", "fpo.num_epochs=1", "run.total_steps=32"],
    )
    runner = OnPolicyRunner(cfg, tmp_path / "fpo")
    before = _params(runner)
    assert runner.train()["env_steps"] == 32
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(runner)))
    assert main(["export", str(tmp_path / "fpo")]) == 0
    assert read_metadata(tmp_path / "fpo" / "policy.onnx").extra["checkpoint_kind"] == "fpo"


def test_a_start_of_the_wrong_family_is_refused(tmp_path, flow_bc, capsys):
    from demo_support import random_demos as demos_of

    diffusion = tmp_path / "dbc"
    argv = ["train", "bc", "--data", str(demos_of(tmp_path / "d.hdf5")), "--steps", "2"]
    argv += ["--run-dir", str(diffusion), "--no-artifacts", *QUIET, "policy.hidden=8"]
    assert main(argv) == 0
    capsys.readouterr()
    for algo, start in (("reinflow", diffusion), ("fpo", diffusion), ("dppo", flow_bc)):
        assert main(["train", algo, "--init", str(start), "--run-dir", str(tmp_path / algo)]) == 2
        err = capsys.readouterr().err
        assert f"--init {start} is a" in err and "starts from a" in err
        assert not (tmp_path / algo).exists()


def test_flow_bc_names_a_dataset_whose_observations_do_not_fit(tmp_path, capsys):
    """Demonstrations without an observation the task has (a term left out of the file's
    schema, or its data missing from an episode) are refused before anything is trained,
    with the problem named."""
    import dataclasses

    import h5py

    from training.demos import load_demos, save_demos

    full = load_demos(random_demos(tmp_path / "full.hdf5"))
    (name0, n0), (name1, _) = full.obs_terms  # hopper: qpos, qvel
    short = dataclasses.replace(
        full,
        obs_terms=[(name0, n0)],
        episodes=[dataclasses.replace(e, obs=e.obs[:, :n0], next_obs=e.next_obs[:, :n0])
                  for e in full.episodes],  # fmt: skip
    )
    missing = random_demos(tmp_path / "missing.hdf5")
    with h5py.File(missing, "r+") as f:
        del f[f"data/demo_0/obs/{name1}"]
    for path, message in (
        (save_demos(tmp_path / "short.hdf5", short), f"observation terms [('{name0}', {n0})] differ from task 'hopper'"),
        (missing, f"demo_0: dataset 'obs/{name1}'"),
    ):  # fmt: skip
        run = tmp_path / f"bc-{path.stem}"
        argv = ["train", "bc", "--policy", "flow", "--data", str(path), "--steps", "2"]
        assert main([*argv, "--run-dir", str(run), "--no-artifacts", *QUIET, *FLOW]) == 2
        assert message in capsys.readouterr().err
        assert not (run / "checkpoints").exists()


def test_fpo_from_scratch_takes_one_action_per_chunk_unless_told_otherwise(tmp_path):
    """The from-scratch preset (training.presets.FPO_SCRATCH_PRESET) through the CLI, and
    the user's override above it."""
    import json

    small = ["policy.hidden=16,16", "policy.critic_hidden=16", *TINY, "fpo.num_steps=8"]
    for name, extra, want in (("preset", [], (1, 1)), ("told", ["policy.horizon=4"], (4, 1))):
        argv = ["train", "fpo", "--task", "cartpole", "--steps", "16", "--no-artifacts"]
        argv += ["--run-dir", str(tmp_path / name), *QUIET, *small, "fpo.num_epochs=1", *extra]
        assert main(argv) == 0
        policy = json.loads((tmp_path / name / "config.json").read_text())["policy"]
        assert (policy["horizon"], policy["act_steps"]) == want
    assert build_fpo_config("hopper").policy.horizon == 1


@pytest.mark.parametrize("algo", ["reinflow", "fpo"])
def test_fine_tuning_beats_its_bc_start_on_cartpole(tmp_path, algo):
    """Flow BC on poor demonstrations (random actions), then 20k env steps of RL."""
    demos = random_demos(tmp_path / "d.hdf5", "cartpole", lengths=(40, 40, 40, 40))
    argv = ["train", "bc", "--policy", "flow", "--data", str(demos), "--steps", "200"]
    argv += ["--run-dir", str(tmp_path / "bc"), "--no-artifacts", *QUIET, "bc.batch_size=64"]
    argv += ["policy.hidden=64,64", "policy.critic_hidden=64,64", "policy.horizon=4"]
    argv += ["policy.act_steps=2", "policy.sample_steps=2"]
    assert main(argv) == 0
    bc = load_policy(tmp_path / "bc").evaluate(episodes=16, seed=1, deterministic=False)
    argv = ["train", algo, "--init", str(tmp_path / "bc"), "--steps", "20000"]
    argv += ["--run-dir", str(tmp_path / algo), "--no-artifacts", *QUIET]
    argv += ["env.num_envs=16", f"{algo}.num_steps=32"]
    if algo == "reinflow":
        # ReinFlow's default rate (6e-5) is set for the flow benchmark's 250k steps; at
        # 20k it moves cartpole too little to show (7 -> 25), so the test takes DPPO's
        argv += ["reinflow.actor_lr=3e-4"]
    assert main(argv) == 0
    tuned = load_policy(tmp_path / algo).evaluate(episodes=16, seed=1, deterministic=False)
    assert tuned["return_mean"] > 2 * bc["return_mean"] + 20, (bc["return_mean"], tuned)


def test_an_action_range_keeps_a_first_quadruped_policy_on_its_feet(tmp_path):
    """From scratch over the quadruped's wide bounds the untrained sampler flails and the
    robot falls within a second; over policy.action_range=1 it stands, as a Gaussian
    policy of std 1 does. The exported file maps its actions over the same range."""
    import numpy as np

    from deploy.runtime import OnnxPolicy
    from training.export import export_run

    falls = {}
    for name, extra in (("bounds", []), ("range", ["policy.action_range=1"])):
        over = QUIET + ["policy.act_steps=1", "policy.horizon=1", "env.num_envs=16"]
        over += ["env.randomize=false", "env.threads=1", *extra]
        runner = OnPolicyRunner(build_fpo_config("quadruped", over), tmp_path / name)
        env, policy = runner.env, runner.policy
        obs = env.reset(seed=1)
        g = torch.Generator().manual_seed(0)
        ended = torch.zeros(16, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(50):  # 1 s of control, the sampler's own x0 ~ N(0, I)
                x0 = torch.randn(16, 1, 12, generator=g)
                actions = policy.sample(obs, noise=x0, stochastic=False).actions
                obs, _, terminated, _, _ = env.step(actions.reshape(16, 12))
                ended |= terminated
        falls[name] = int(ended.sum())
        if name == "range":
            assert policy.action_low.tolist() == [-1.0] * 12
            assert policy.action_high.tolist() == [1.0] * 12
            runner.save()
            onnx = OnnxPolicy(str(export_run(tmp_path / name)))
            o = obs["policy"][:3]
            x0 = torch.randn(3, 1, 12, generator=g)
            got, _ = onnx.act_batch(o.numpy(), noise=x0.numpy())
            with torch.no_grad():
                want = policy.sample(o, noise=x0, stochastic=False).actions.reshape(3, 12)
            np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
            assert np.abs(got).max() <= 1.0
        runner.close()
    assert falls["bounds"] >= 12 and falls["range"] == 0, falls


def test_a_bad_action_range_is_named():
    from policies.flow import FlowConfig

    for bad in (0, -1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match=r"FlowConfig\.action_range must be a positive"):
            FlowConfig(action_range=bad)
