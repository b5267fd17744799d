"""VLA supervised fine-tuning (training/vla_sft.py, `sim2real train vla-sft`): the loss
falls, resume is exact, evaluation runs closed-loop on both splits, bad inputs are
named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from policies.vla import VLAConfig  # noqa: E402
from sim.tasks.instructed_reach import COLOURS, parse_instruction  # noqa: E402
from training.cli import main  # noqa: E402
from training.collect import collect_demos  # noqa: E402
from training.config import ConfigError  # noqa: E402
from training.demos import DatasetError, save_demos  # noqa: E402
from training.vla_sft import VLASFTConfig, VLASFTRunner, VLASFTTrainConfig  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "reach.hdf5"
    data = collect_demos(
        "expert", "instructed_reach", episodes=6, num_envs=6, env_kwargs={"image_size": SIZE}
    )
    save_demos(path, data)
    return path


def _cfg(data, **sft) -> VLASFTTrainConfig:
    values = dict(
        num_updates=20, batch_size=16, log_every=5, checkpoint_every=1000, eval_episodes=0,
        progress=False, tensorboard=False, warmup=0, lr=1e-3,
    )  # fmt: skip
    values.update(sft)
    return VLASFTTrainConfig(
        data=str(data), sft=VLASFTConfig(**values), model=VLAConfig(image_size=SIZE)
    )


def _fixed_loss(runner: VLASFTRunner) -> float:
    """The BC loss on the first 64 samples with fixed flow draws."""
    g = torch.Generator().manual_seed(7)
    idx = torch.arange(min(64, runner.images.shape[0]))
    with torch.no_grad():
        return float(
            runner.policy.bc_loss(
                runner.images[idx], runner.ids[idx], runner.proprio[idx], runner.chunks[idx], g
            )
        )


def test_sft_loss_falls_and_evaluation_runs_on_both_splits(demos, tmp_path):
    runner = VLASFTRunner(
        _cfg(demos, num_updates=150, lr=3e-3, eval_episodes=2, eval_envs=2), tmp_path / "r"
    )
    before = _fixed_loss(runner)
    summary = runner.train()
    after = _fixed_loss(runner)
    runner.close()
    assert after < 0.6 * before, (before, after)  # measured 0.67 -> 0.20 at 200 updates
    assert summary["updates"] == 150 and not summary["stopped_early"]
    for split in ("train", "eval"):
        assert 0.0 <= summary[f"eval/success_{split}"] <= 1.0
    assert (tmp_path / "r" / "tokenizer.json").is_file()
    assert (tmp_path / "r" / "checkpoints" / "latest.pt").is_file()
    # the video of the held-out episodes carries the instruction on every frame
    import imageio

    frames = imageio.mimread(tmp_path / "r" / "policy.mp4")
    assert len(frames) >= 10
    for f in frames[:: max(1, len(frames) // 5)]:
        band = f[:12]  # the caption band: dark, with white letters
        assert (band < 40).mean() > 0.5 and (band > 200).any()
        assert f[f.shape[0] // 2 :].mean() > 40  # the scene below it, not a blank frame


def test_draw_caption_writes_only_the_band():
    import numpy as np

    from training.artifacts import draw_caption

    frame = np.full((120, 160, 3), 128, np.uint8)
    out = draw_caption(frame, "reach the red ball\nepisode 1")
    assert out.shape == frame.shape and out.dtype == np.uint8
    rows = np.nonzero((out != 128).any(axis=(1, 2)))[0]
    assert rows.max() < 40  # two lines of text at the top of 120 rows
    assert (out[rows.max() + 1 :] == 128).all()
    assert (out[:40] > 200).any() and (out[:40] == 0).any()


def test_resume_is_exact(demos, tmp_path):
    """Stopped after 6 of 12 updates (as Ctrl-C does: the checkpoint is written) and
    resumed: the same weights as 12 straight, bit for bit."""
    straight = VLASFTRunner(_cfg(demos, num_updates=12), tmp_path / "a")
    straight.train()
    straight.close()
    half = VLASFTRunner(_cfg(demos, num_updates=12), tmp_path / "b")
    for _ in range(6):
        half.update()
    half.save()
    half.close()
    resumed = VLASFTRunner(_cfg(demos, num_updates=12), tmp_path / "b", resume=tmp_path / "b")
    assert resumed.num_updates == 6
    resumed.train()
    resumed.close()
    a, b = straight.policy.state_dict(), resumed.policy.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_bad_inputs_are_named(demos, tmp_path):
    no_images = tmp_path / "no_images.hdf5"
    save_demos(no_images, collect_demos("expert", "instructed_reach", episodes=2, num_envs=2,
                                        env_kwargs={"images": False}))  # fmt: skip
    with pytest.raises(DatasetError, match="no camera images under 'image'"):
        VLASFTRunner(_cfg(no_images), tmp_path / "x")
    cfg = _cfg(demos)
    cfg.model = VLAConfig(image_size=64)
    with pytest.raises(ConfigError, match=r"images are \[32, 32, 3\] but model.image_size is 64"):
        VLASFTRunner(cfg, tmp_path / "y")
    with pytest.raises(ConfigError, match="needs a demonstration file"):
        VLASFTRunner(VLASFTTrainConfig(), tmp_path / "z")
    with pytest.raises(ValueError, match="num_updates must be an integer >= 1"):
        VLASFTConfig(num_updates=0)
    with pytest.raises(ConfigError, match="goal_term='elbow' is not a proprioceptive term"):
        VLASFTRunner(_cfg(demos, goal_term="elbow"), tmp_path / "w")
    with pytest.raises(ValueError, match="goal_weight must be >= 0"):
        VLASFTConfig(goal_weight=-1.0)


def test_the_goal_probe_learns_where_each_demonstration_ends(demos, tmp_path):
    """goal_term="auto" takes the task's GOAL_TERM (instructed_reach: the fingertip); the
    probe's target is the fingertip in each episode's last frame, and its error falls."""
    runner = VLASFTRunner(_cfg(demos, num_updates=60, lr=3e-3), tmp_path / "g")
    first = runner.data.episodes[0]
    assert torch.equal(
        runner.goals[: len(first)],
        torch.as_tensor(first.next_obs[-1:, -2:]).expand(len(first), 2),
    )
    rmse = [runner.update()["goal_rmse"] for _ in range(60)]
    runner.close()
    assert np.mean(rmse[-10:]) < 0.5 * np.mean(rmse[:10]), rmse
    off = VLASFTRunner(_cfg(demos, goal_term=""), tmp_path / "o")
    assert off.goal_probe is None and np.isnan(off.update()["goal_rmse"])
    off.close()


def test_cli_trains_resumes_and_refuses_another_kind(demos, tmp_path, capsys):
    run = tmp_path / "cli"
    args = ["train", "vla-sft", "--data", str(demos), "--steps", "4", "--run-dir", str(run),
            f"model.image_size={SIZE}", "sft.eval_episodes=0", "sft.progress=false",
            "sft.tensorboard=false", "sft.batch_size=8"]  # fmt: skip
    assert main(args) == 0
    assert main(["train", "vla-sft", "--resume", str(run), "--steps", "6"]) == 0
    assert "6 updates" in capsys.readouterr().out
    assert main(["train", "ppo", "--resume", str(run)]) != 0
    assert "'vla_sft' checkpoint, not a ppo run" in capsys.readouterr().err


def test_an_sft_run_exports_and_the_robot_runtime_drives_the_task(demos, tmp_path):
    """`sim2real export` of a vla-sft run: the ONNX file and its tokenizer; the torch-free
    runtime gives the torch policy's chunk on a frame of the task and closes the loop."""
    import numpy as np

    from deploy.vla_runtime import OnnxVLAPolicy
    from sim.registry import make

    run = tmp_path / "sft"
    runner = VLASFTRunner(_cfg(demos, num_updates=5), run)
    runner.train()
    runner.close()
    assert main(["export", str(run)]) == 0
    runtime = OnnxVLAPolicy(run / "policy.onnx", deterministic=True)
    meta = runtime.metadata
    assert meta.policy_family == "vla_flow" and meta.task == "instructed_reach"
    assert meta.image_input["height"] == SIZE and (run / "tokenizer.json").is_file()
    # the task's sentences travel with the file (a robot's allow-list)
    assert runtime.trained_instructions == [f"reach the {c} ball" for c in COLOURS]

    env = make("instructed_reach", 1, seed=3, image_size=SIZE)
    obs = env.reset()
    text = env.instructions[0]
    runtime.set_instruction(text)
    image, proprio = obs["image"][0].numpy(), obs["policy"][0].numpy()
    chunk = runtime.act(image, proprio)
    from policies.vla_tokenizer import encode_instructions

    ids = encode_instructions(runner.tokenizer, [text], runner.cfg.model.max_instruction_tokens)
    zeros = torch.zeros(1, *chunk.shape)
    want = runner.policy.sample(obs["image"], ids, obs["policy"], stochastic=False, noise=zeros)
    np.testing.assert_allclose(chunk, want.actions[0].numpy(), atol=1e-4)
    for _ in range(10):  # the loop a robot runs: an image only when a new chunk is due
        img = obs["image"][0].numpy() if runtime.needs_observation else None
        action = runtime.next_action(img, obs["policy"][0].numpy())
        assert np.isfinite(action).all()
        obs, *_ = env.step(torch.as_tensor(action, dtype=torch.float32)[None])
    env.close()


# ---------------------------------------------------------------------- RL (training/vla_rl.py)
from training.checkpoint import CheckpointError, save_checkpoint  # noqa: E402
from training.core import dynamic_sampling_mask, gae, group_relative  # noqa: E402
from training.vla_rl import VLARLConfig, VLARLRunner, VLARLTrainConfig, vla_rl_loss  # noqa: E402


@pytest.fixture(scope="module")
def sft_run(demos, tmp_path_factory):
    run = tmp_path_factory.mktemp("sft") / "run"
    runner = VLASFTRunner(_cfg(demos, num_updates=10), run)
    runner.train()
    runner.close()
    return run


def _rl(sft_run, run_dir, resume=None, **rl) -> VLARLRunner:
    values = dict(
        num_envs=4, group_size=2, num_updates=2, max_episode_steps=8, eval_episodes=0,
        progress=False, tensorboard=False, max_sample_rounds=1, num_minibatches=2,
    )  # fmt: skip
    values.update(rl)
    cfg = VLARLTrainConfig(init=str(sft_run), rl=VLARLConfig(**values))
    return VLARLRunner(cfg, run_dir, resume=resume)


def test_grpo_loss_on_a_fixed_batch_equals_the_hand_computed_one(sft_run, tmp_path):
    """Group-relative advantages of fixed outcomes, dynamic sampling, and the clipped
    ratio of the chain's per-step log-probabilities (rows: executed chunk positions,
    columns: Euler steps), token-mean over the valid elements."""
    outcomes = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    s = 0.5**0.5  # unbiased std of {1, 0}
    adv = group_relative(outcomes)
    torch.testing.assert_close(adv, torch.tensor([[0.5 / (s + 1e-6), -0.5 / (s + 1e-6)], [0, 0]]))
    assert dynamic_sampling_mask(outcomes).tolist() == [True, False]

    runner = _rl(sft_run, tmp_path / "g", dynamic_sampling=False)
    batch, _ = runner.rollout()
    n = batch.advantages.shape[0]
    g = torch.Generator().manual_seed(3)
    batch = batch._replace(
        advantages=torch.randn(n, generator=g),
        logp=batch.logp + 0.5 * torch.randn(batch.logp.shape, generator=g),  # spread ratios
    )
    loss, stats = vla_rl_loss(runner.policy, batch, runner.loss_cfg, logprob_reduce="mean")
    with torch.no_grad():
        feat = runner.policy.features(batch.images, batch.ids, batch.proprio)
        new = runner.policy.head.chain_terms(feat, batch.chain, "mean").log_prob  # [S, K, Hz]
        r = torch.exp(new - batch.logp)
        a = batch.advantages.view(-1, 1, 1)
        obj = torch.minimum(r * a, r.clamp(1 - 0.2, 1 + 0.28) * a)
        m = batch.executed.unsqueeze(1).expand_as(r)
        want = -(obj * m).sum() / m.sum()
        clipped = ((a > 0) & (r > 1.28)) | ((a < 0) & (r < 0.8))
        want_clip = (clipped.float() * m).sum() / m.sum()
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["clip_frac"], want_clip)
    assert 0 < float(want_clip) < 1  # both branches of the clip are exercised
    runner.close()


def test_ppo_gae_bootstraps_time_outs_and_the_value_loss_is_the_cores(sft_run, tmp_path):
    rewards = torch.tensor([[0.0], [1.0], [0.0]])
    values = torch.tensor([[0.5], [0.4], [0.3]])
    next_values = torch.tensor([[0.4], [0.9], [0.7]])  # row 2: V(final obs) of a time-out
    terminated = torch.tensor([[0.0], [0.0], [0.0]])
    dones = torch.tensor([[False], [False], [True]])
    adv, ret = gae(rewards, values, next_values, terminated, dones, 0.9, 0.8)
    d2 = 0.0 + 0.9 * 0.7 - 0.3  # a time-out bootstraps from the final observation
    d1 = 1.0 + 0.9 * 0.9 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.5
    want = torch.tensor([[d0 + 0.72 * (d1 + 0.72 * d2)], [d1 + 0.72 * d2], [d2]])
    torch.testing.assert_close(adv, want)
    adv_t, _ = gae(
        rewards, values, next_values, torch.tensor([[0.0], [0.0], [1.0]]), dones, 0.9, 0.8
    )
    assert float(adv_t[2, 0]) == pytest.approx(-0.3)  # a success does not

    runner = _rl(sft_run, tmp_path / "p", algo="ppo")
    batch, _ = runner.rollout()
    assert torch.isfinite(batch.returns).all() and batch.returns.shape == batch.advantages.shape
    pl, _ = vla_rl_loss(runner.policy, batch, runner.loss_cfg)
    both, stats = vla_rl_loss(runner.policy, batch, runner.loss_cfg, value_coef=0.5)
    with torch.no_grad():
        v = runner.policy.value(batch.images, batch.ids, batch.proprio)
        want_vl = 0.5 * (v - batch.returns).square().mean()
    torch.testing.assert_close(stats["value_loss"], want_vl)
    torch.testing.assert_close(both - pl, 0.5 * want_vl)
    runner.close()


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_an_rl_update_changes_only_what_trains_and_stays_finite(sft_run, tmp_path):
    runner = _rl(sft_run, tmp_path / "p", algo="ppo", train_backbone=False, num_updates=1)
    before = _params(runner.policy)
    stats = runner.update()
    after = _params(runner.policy)
    assert stats["minibatch_steps"] > 0 and stats["nonfinite_steps"] == 0
    assert all(torch.isfinite(v).all() for v in after.values())
    for k in before:
        same = torch.equal(before[k], after[k])
        if k.startswith("backbone."):
            assert same, k  # train_backbone=False
    assert any(not torch.equal(before[k], after[k]) for k in before if ".critic." in k)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("head.actor"))
    runner.close()

    grpo = _rl(sft_run, tmp_path / "g", num_updates=1, dynamic_sampling=False)
    before = _params(grpo.policy)
    stats = grpo.update()
    after = _params(grpo.policy)
    assert all(torch.isfinite(v).all() for v in after.values())
    for k in before:
        if ".critic." in k:
            assert torch.equal(before[k], after[k]), k  # grpo keeps no critic
    grpo.close()


def test_rl_resume_is_exact(sft_run, tmp_path):
    straight = _rl(sft_run, tmp_path / "a", algo="ppo")
    straight.train()
    straight.close()
    half = _rl(sft_run, tmp_path / "b", algo="ppo")
    half.update()
    half.save()
    half.close()
    resumed = _rl(sft_run, tmp_path / "b", resume=tmp_path / "b", algo="ppo")
    assert resumed.num_updates == 1
    resumed.train()
    resumed.close()
    a, b = straight.policy.state_dict(), resumed.policy.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.env_steps == straight.env_steps


def test_rl_counts_every_simulator_step(sft_run, tmp_path, monkeypatch):
    """env_steps: num_envs per env.step call of the rollouts (the simulator's work,
    every env of the batch, finished or not), logged and returned."""
    runner = _rl(sft_run, tmp_path / "r", algo="grpo", num_updates=2)
    calls = []
    step = runner.env.step
    monkeypatch.setattr(runner.env, "step", lambda a: (calls.append(1), step(a))[1])
    summary = runner.train()
    runner.close()
    assert len(calls) > 0 and summary["env_steps"] == 4 * len(calls) == runner.env_steps
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["perf/env_steps"] == runner.env_steps


def test_wrong_instructions_name_another_ball_of_the_scene(sft_run, monkeypatch):
    """The grounding test tells each episode's policy about a ball that is in its scene
    and is not the named one; success still counts the named one."""
    import sim.registry
    import training.vla_sft as sft

    policy, tokenizer, ck, _ = sft.load_vla_run(sft_run)
    envs, told = [], []
    make = sim.registry.make
    monkeypatch.setattr(sim.registry, "make", lambda *a, **k: envs.append(make(*a, **k)) or envs[-1])

    def spy(tok, texts, *a):
        env = envs[-1]
        for i, text in enumerate(texts):
            told.append((text, env.instructions[i], [int(c) for c in env.ball_colour[i]]))
        return encode(tok, texts, *a)

    encode = sft.encode_instructions
    monkeypatch.setattr(sft, "encode_instructions", spy)
    rate = sft.evaluate_success(
        policy, tokenizer, ck["task"], 6, num_envs=3, seed=1,
        task_args={"image_size": SIZE, "max_episode_steps": 6}, wrong_instructions=True,
    )  # fmt: skip
    assert 0.0 <= rate <= 1.0 and len(told) >= 6
    for text, named, colours in told:
        assert text != named and parse_instruction(text) in colours, (text, named, colours)
    with pytest.raises(ValueError, match="act_steps must be in"):
        sft.evaluate_success(policy, tokenizer, ck["task"], 1, act_steps=0)


def test_rl_cli_help_trains_resumes_and_names_a_non_vla_init(sft_run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "vla-rl", "--help"])
    out = capsys.readouterr().out
    for line in ("  rl.algo: str = 'grpo'", "  rl.group_size: int = 8", "  init: str = ''"):
        assert line in out
    run = tmp_path / "cli"
    args = ["train", "vla-rl", "--init", str(sft_run), "--algo", "grpo", "--steps", "1",
            "--run-dir", str(run), "rl.num_envs=4", "rl.group_size=2",
            "rl.max_episode_steps=8", "rl.eval_episodes=0", "rl.progress=false",
            "rl.tensorboard=false", "rl.max_sample_rounds=1"]  # fmt: skip
    assert main(args) == 0
    assert (run / "tokenizer.json").is_file()
    assert main(["train", "vla-rl", "--resume", str(run), "--steps", "2"]) == 0
    assert "vla-rl grpo: 2 updates" in capsys.readouterr().out
    assert main(["export", str(run)]) == 0  # an RL run leaves as the SFT run does
    from deploy.vla_runtime import OnnxVLAPolicy

    assert OnnxVLAPolicy(run / "policy.onnx").metadata.policy_family == "vla_flow"

    other = tmp_path / "ppo_run"
    save_checkpoint(other / "checkpoints" / "latest.pt", {"kind": "ppo", "iteration": 0})
    assert main(["train", "vla-rl", "--init", str(other), "--run-dir", str(tmp_path / "x")]) != 0
    assert "'ppo' checkpoint, not a VLA run" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="not a VLA run"):
        _rl(other, tmp_path / "y")
    from training.config_docs import undocumented_fields

    assert undocumented_fields(VLARLTrainConfig()) == []
    with pytest.raises(ValueError, match="num_envs must be a multiple of group_size=8"):
        VLARLConfig(num_envs=12).check_groups()
