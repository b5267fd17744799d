"""DPPO: only the last K' steps learn, chunk crediting, the core's loss, runner round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.diffusion import DiffusionConfig, DiffusionPolicy
from training.algorithms.dppo import DPPO, DPPOConfig
from training.core import get_loss_config, policy_loss

OBS, ACT = 4, 2
QUIET = ["run.progress=false", "run.tensorboard=false"]


def _policy(horizon=4, act_steps=2, steps=4) -> DiffusionPolicy:
    torch.manual_seed(0)
    cfg = DiffusionConfig(
        hidden=(16, 16),
        critic_hidden=(8,),
        horizon=horizon,
        act_steps=act_steps,
        sample_steps=steps,
    )
    return DiffusionPolicy(OBS, ACT, cfg)


def _learner(policy, num_envs=3, num_steps=6, **kw) -> DPPO:
    cfg = DPPOConfig(
        num_steps=num_steps, num_epochs=2, num_minibatches=2, ft_steps=2, actor_lr=1e-2, **kw
    )
    return DPPO(policy, cfg, num_envs=num_envs, obs_sizes={"policy": OBS})


def _rollout(learner: DPPO, ends: dict[int, list[int]] | None = None, seed: int = 0):
    """Fill the storage with random observations; ends[t] = envs whose episode ends at t."""
    g = torch.Generator().manual_seed(seed)
    n = learner.num_envs
    obs = {"policy": torch.randn(n, OBS, generator=g)}
    for t in range(learner.cfg.num_steps):
        learner.act(obs)
        obs = {"policy": torch.randn(n, OBS, generator=g)}
        term = torch.zeros(n, dtype=torch.bool)
        for i in (ends or {}).get(t, []):
            term[i] = True
        learner.process_env_step(obs, torch.randn(n, generator=g), term, torch.zeros_like(term))


def test_clip_schedule_and_denoising_discount():
    cfg = DPPOConfig(ft_steps=4, clip=0.02, clip_base=0.002, denoising_gamma=0.9)
    eps = cfg.clip_schedule()
    assert eps[0] == pytest.approx(0.002) and eps[-1] == pytest.approx(0.02)
    assert all(a < b for a, b in zip(eps, eps[1:]))  # grows toward the last step
    learner = DPPO(_policy(steps=5), cfg, num_envs=1, obs_sizes={"policy": OBS})
    torch.testing.assert_close(learner.weights, torch.tensor([[0.9**3, 0.9**2, 0.9, 1.0]]))
    torch.testing.assert_close(learner.clip_scale, torch.tensor([eps]) / 0.02)


def test_finetuning_changes_only_the_last_k_steps():
    policy = _policy(steps=4)
    frozen_before = {k: v.clone() for k, v in policy.actor.state_dict().items()}
    learner = _learner(policy)  # K' = 2 of 4 steps
    ft_before = {k: v.clone() for k, v in policy.actor_ft.state_dict().items()}
    obs = torch.randn(5, OBS)
    chain = policy.chain(eta=0.0)
    x = torch.randn(5, 4, ACT)
    means_before = [
        policy._eps(
            policy.net_for_step(k, 4),
            x,
            torch.full((5,), chain.timesteps[k]),
            policy.obs_features(obs),
        )
        for k in range(4)
    ]
    _rollout(learner)
    stats = learner.update()
    assert stats["minibatch_steps"] > 0
    for k, v in policy.actor.state_dict().items():
        torch.testing.assert_close(v, frozen_before[k], rtol=0, atol=0)
    changed = [not torch.equal(v, ft_before[k]) for k, v in policy.actor_ft.state_dict().items()]
    assert any(changed)
    with torch.no_grad():
        means_after = [
            policy._eps(
                policy.net_for_step(k, 4),
                x,
                torch.full((5,), chain.timesteps[k]),
                policy.obs_features(obs),
            )
            for k in range(4)
        ]
    for k in range(2):  # the frozen early steps compute exactly what they did
        torch.testing.assert_close(means_after[k], means_before[k].detach(), rtol=0, atol=0)
    for k in range(2, 4):
        assert not torch.allclose(means_after[k], means_before[k].detach())
    # the optimizer only holds the fine-tuned copy and the critic
    opt_params = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert not opt_params & {id(p) for p in policy.actor.parameters()}


def test_chunk_crediting_only_executed_positions():
    """Tp = 4, Ta = 2: positions 2, 3 are never credited; an episode ending after the
    first action of a chunk leaves that chunk's second position uncredited too."""
    policy = _policy(horizon=4, act_steps=2)
    learner = _learner(policy, num_envs=2, num_steps=6)
    _rollout(learner, ends={2: [1]})  # env 1 ends at t = 2, the first step of a chunk
    st = learner.storage
    # env 0: chunks at t = 0, 2, 4; env 1: at t = 0, 2, 3 (new episode), 5
    assert st.num_chunks == 7
    assert st.position[:, 0].tolist() == [0, 1, 0, 1, 0, 1]
    assert st.position[:, 1].tolist() == [0, 1, 0, 0, 1, 0]
    adv = torch.arange(12, dtype=torch.float32).view(6, 2) + 1.0
    adv_c, mask_c = learner._credit(adv)
    assert mask_c[:, 2:].sum() == 0  # beyond act_steps: never executed
    assert mask_c.sum() == 12  # one credited position per env step
    for t in range(6):
        for n in range(2):
            c, j = int(st.chunk_index[t, n]), int(st.position[t, n])
            assert mask_c[c, j] == 1 and adv_c[c, j] == adv[t, n]
    cut = int(st.chunk_index[2, 1])  # env 1's chunk cut short by the episode's end
    assert mask_c[cut].tolist() == [1.0, 0.0, 0.0, 0.0]
    # uncredited positions get no gradient through the core's loss
    k = learner.cfg.ft_steps
    logp = torch.randn(st.num_chunks, 4, k, requires_grad=True)
    loss, _ = policy_loss(
        logp.reshape(-1, k),
        logp.detach().reshape(-1, k),
        adv_c.reshape(-1),
        get_loss_config("ppo"),
        mask=mask_c.reshape(-1, 1).expand(-1, k),
        weights=learner.weights,
        clip_scale=learner.clip_scale,
    )
    loss.backward()
    grad = logp.grad.abs().sum(-1)
    assert bool((grad[mask_c == 0] == 0).all()) and bool((grad[mask_c == 1] > 0).all())


def test_update_uses_stored_log_probs_and_ratios_start_at_one():
    policy = _policy()
    learner = _learner(policy, bc_coef=0.1)
    _rollout(learner)
    st = learner.storage
    c = st.num_chunks
    with torch.no_grad():
        again = learner.chunk_log_prob(st.chunk_obs[:c], st.chunk_chain[:c])
    torch.testing.assert_close(again, st.chunk_logp[:c], rtol=1e-5, atol=1e-5)
    stats = learner.update()
    # the BC term is a negative log-density (it can be negative with std 0.1)
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["bc_loss"])
    assert stats["bc_loss"] != 0.0


def _make_bc_run(tmp_path, task: str = "hopper"):
    """A tiny pretrained diffusion run on `task` from two short random demonstrations."""
    from demo_support import random_demos

    from training.bc_runner import BCRunner
    from training.train_configs import build_bc_config

    demos = random_demos(tmp_path / "demos.hdf5", task)
    cfg = build_bc_config(
        task,
        str(demos),
        QUIET
        + [
            "bc.num_updates=20",
            "bc.batch_size=16",
            "bc.warmup=2",
            "run.eval_episodes=2",
            "policy.hidden=16,16",
            "policy.critic_hidden=16",
            "policy.sample_steps=3",
            "policy.horizon=4",
            "policy.act_steps=2",
            "env.max_episode_steps=30",
        ],
    )
    runner = BCRunner(cfg, tmp_path / "bc")
    out = runner.train()
    assert out["updates"] == 20 and np.isfinite(runner.evaluate()["return_mean"])
    runner.close()
    return tmp_path / "bc"


def test_dppo_runner_exact_resume_and_export(tmp_path):
    from deploy.sim2sim import evaluate_onnx
    from training.export import export_run
    from training.policy_kinds import finetune_config_from, load_policy
    from training.runner import OnPolicyRunner
    from training.train_configs import DPPOTrainConfig

    bc = _make_bc_run(tmp_path)
    over = QUIET + [
        "env.num_envs=2",
        "dppo.num_steps=8",
        "dppo.num_epochs=1",
        "dppo.num_minibatches=2",
        "dppo.ft_steps=2",
        "run.eval_episodes=2",
        "run.checkpoint_every=1",
    ]
    straight = OnPolicyRunner(
        finetune_config_from(DPPOTrainConfig, bc, "hopper", over + ["run.total_steps=48"]),
        tmp_path / "a",
    )
    straight.train()
    first = OnPolicyRunner(
        finetune_config_from(DPPOTrainConfig, bc, "hopper", over + ["run.total_steps=32"]),
        tmp_path / "b",
    )
    first.train()
    cfg = finetune_config_from(DPPOTrainConfig, bc, "hopper", over + ["run.total_steps=48"])
    resumed = OnPolicyRunner(cfg, tmp_path / "b", resume=tmp_path / "b")
    resumed.train()
    for (k, v), (_, w) in zip(
        straight.policy.state_dict().items(), resumed.policy.state_dict().items()
    ):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)

    # export: the same metadata contract, deterministic mode, sim2sim runs the file
    onnx_path = export_run(tmp_path / "a")
    from deploy.metadata import read_metadata

    meta = read_metadata(onnx_path)
    assert meta.policy_family == "diffusion" and meta.noise_shape == [4, 3]
    assert [n for n, _ in meta.recurrent_state] == ["action_chunk", "chunk_step"]
    assert meta.task == "hopper" and meta.run_id == "a"
    torch_stats = load_policy(tmp_path / "a").evaluate(episodes=2, seed=5)
    onnx_stats = evaluate_onnx(onnx_path, episodes=2, seed=5, safety=False, zero_noise=True)
    assert onnx_stats["return_mean"] == pytest.approx(
        torch_stats["return_mean"], rel=1e-3, abs=1e-2
    )
    # by default the file samples as on the robot: seeded noise, so repeatable per seed
    sampled = [evaluate_onnx(onnx_path, episodes=2, seed=s, safety=False) for s in (5, 5, 6)]
    assert sampled[0]["zero_noise"] is False
    assert sampled[0]["return_mean"] == sampled[1]["return_mean"]
    assert sampled[0]["return_mean"] != sampled[2]["return_mean"]
    assert sampled[0]["return_mean"] != onnx_stats["return_mean"]


def test_dppo_config_errors(tmp_path):
    from training.config import ConfigError
    from training.policy_kinds import finetune_config_from
    from training.train_configs import DPPOTrainConfig

    with pytest.raises(ValueError, match="clip_base"):
        DPPOConfig(clip=0.01, clip_base=0.1)
    with pytest.raises(ValueError, match="min_std"):
        DPPOConfig(min_std=0.0)
    with pytest.raises(ValueError, match="ft_steps"):
        DPPO(_policy(steps=3), DPPOConfig(ft_steps=4), num_envs=1, obs_sizes={"policy": OBS})
    bc = _make_bc_run(tmp_path)
    with pytest.raises(ConfigError, match="pretrained networks"):
        finetune_config_from(DPPOTrainConfig, bc, "hopper", ["policy.hidden=8,8"])


def test_dppo_task_preset_sits_between_defaults_and_overrides(tmp_path):
    from training.policy_kinds import finetune_config_from
    from training.presets import DPPO_PRESETS
    from training.train_configs import DPPOTrainConfig

    default = DPPOConfig()
    hopper = finetune_config_from(DPPOTrainConfig, _make_bc_run(tmp_path / "h"), "hopper")
    assert (hopper.dppo.clip, hopper.dppo.clip_base) == (default.clip, default.clip_base)
    bc = str(_make_bc_run(tmp_path / "c", "halfcheetah"))
    cheetah = finetune_config_from(DPPOTrainConfig, bc)
    preset = DPPO_PRESETS["halfcheetah"]
    assert cheetah.dppo.clip == preset["dppo.clip"] != default.clip
    assert cheetah.dppo.clip_base == preset["dppo.clip_base"] != default.clip_base
    mine = finetune_config_from(DPPOTrainConfig, bc, "halfcheetah", ["dppo.clip=0.05"])
    assert (mine.dppo.clip, mine.dppo.clip_base) == (0.05, preset["dppo.clip_base"])


def test_dppo_benchmark_reruns_a_cached_result_made_with_other_settings(tmp_path):
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "dppo.py"
    spec = importlib.util.spec_from_file_location("bench_dppo", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bc = str(_make_bc_run(tmp_path))
    tiny = ["env.num_envs=2", "dppo.num_steps=8", "dppo.num_epochs=1", "dppo.ft_steps=2"]
    a = argparse.Namespace(budget=40, dppo_extra=tiny)
    cache = bench.Cache(tmp_path / "results.json", fresh=False)
    cache.put("hopper/bc/s0", {"run_dir": bc})
    # a real result, evaluated along the way (which moves the runner's step budget)
    run = bench.dppo("hopper", bc, 0, tmp_path, a.budget, 2, tiny)
    assert run["env_steps"] == 48 and len(run["curve"]) == 3
    for h, kept in ((run["config_hash"], True), ("another", False)):
        for k in ("hopper/dppo/s0", "hopper/dppo/s0/stochastic", "hopper/onnx"):
            cache.put(k, {**run, "config_hash": h})
        bench.drop_if_stale(cache, "hopper", 0, a, first=True)
        assert (cache.get("hopper/dppo/s0/stochastic") is not None) is kept
    assert cache.get("hopper/dppo/s0") is None and cache.get("hopper/onnx") is None
    assert cache.get("hopper/bc/s0") == {"run_dir": bc}
    reread = bench.Cache(tmp_path / "results.json", fresh=False)
    assert set(reread.data) == {"hopper/bc/s0"}


def test_collect_from_a_diffusion_run_and_its_onnx(tmp_path):
    from training.cli import main
    from training.demos import load_demos
    from training.export import export_run

    bc = _make_bc_run(tmp_path)
    out = tmp_path / "d.hdf5"
    rc = main(["collect", str(bc), "--episodes", "3", "--noise", "0.2", "--out", str(out)])
    assert rc == 0
    data = load_demos(out, task="hopper")
    assert len(data.episodes) == 3 and data.info["action_noise"] == pytest.approx(0.2)
    assert all(len(e) <= 30 for e in data.episodes)
    onnx_path = export_run(bc)
    out2 = tmp_path / "o.hdf5"
    assert main(["collect", str(onnx_path), "--episodes", "2", "--out", str(out2)]) == 0
    assert len(load_demos(out2).episodes) == 2
