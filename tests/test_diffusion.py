"""Diffusion policy: schedule, samplers, chain log-probabilities by hand, export parity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.diffusion import (
    DiffusionConfig,
    DiffusionPolicy,
    diffusion_exporter,
    make_betas,
    make_chain,
)

OBS, ACT = 5, 2


def _policy(**kw) -> DiffusionPolicy:
    torch.manual_seed(0)
    cfg = DiffusionConfig(
        **{"hidden": (16, 16), "critic_hidden": (8,), "horizon": 3, "act_steps": 2, **kw}
    )
    p = DiffusionPolicy(OBS, ACT, cfg, action_low=[-1.0, -2.0], action_high=[1.0, 0.5])
    p.update_obs_normalizer(torch.randn(64, OBS) * 3 + 1)
    return p


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="act_steps"):
        DiffusionConfig(horizon=2, act_steps=3)
    with pytest.raises(ValueError, match="sample_steps"):
        DiffusionConfig(num_train_steps=4, sample_steps=5)
    with pytest.raises(ValueError, match="sampler"):
        DiffusionConfig(sampler="euler")
    with pytest.raises(ValueError, match="eta"):
        DiffusionConfig(eta=1.5)


def test_cosine_schedule_and_chain_constants():
    betas = make_betas(20, "cosine")
    assert betas.shape == (20,) and bool((betas > 0).all()) and float(betas.max()) <= 0.999
    abar = torch.cumprod(1 - betas, 0)
    chain = make_chain(abar, 5, 0.0)
    assert chain.timesteps == (16, 12, 8, 4, 0)
    assert chain.sigma == (0.0,) * 5  # DDIM
    assert chain.sqrt_ab_prev[-1] == 1.0 and chain.dir_coef[-1] == 0.0  # ends on x0


def test_ddpm_chain_is_the_ddpm_posterior():
    """sampler="ddpm" with N = T: mean and variance of q(x_{t-1} | x_t, x0) exactly."""
    p = _policy(num_train_steps=6, sample_steps=6, clip_sample=0.0)
    chain = p.chain(sampler="ddpm")
    betas = make_betas(6, "cosine")
    abar = torch.cumprod(1 - betas, 0)
    for k, t in enumerate(chain.timesteps):
        assert t == 5 - k
        ab, ab_prev = float(abar[t]), float(abar[t - 1]) if t > 0 else 1.0
        var = float(betas[t]) * (1 - ab_prev) / (1 - ab)
        assert chain.sigma[k] == pytest.approx(math.sqrt(var), abs=1e-9)
        # posterior mean coefficients: c0 * x0 + ct * x_t with eps = (x_t - sqrt(ab) x0)/sqrt(1-ab)
        c0 = math.sqrt(ab_prev) * float(betas[t]) / (1 - ab)
        ct = math.sqrt(1 - float(betas[t])) * (1 - ab_prev) / (1 - ab)
        x_t, x0 = 0.7, -0.3
        eps = (x_t - math.sqrt(ab) * x0) / math.sqrt(1 - ab)
        ddim = chain.sqrt_ab_prev[k] * x0 + chain.dir_coef[k] * eps
        assert ddim == pytest.approx(c0 * x0 + ct * x_t, abs=1e-6)


def test_chain_log_prob_equals_hand_computed_sum():
    """log p(stored chain) = sum over steps of log N(x_{k+1}; mu_k(x_k), max(sigma_k, floor)^2)."""
    p = _policy(sample_steps=4, eta=0.5)
    min_std = 0.1
    obs = torch.randn(3, OBS)
    chain = p.chain()
    s = p.sample(obs, chain=chain, min_std=min_std, return_chain=True)
    assert s.chain is not None and s.chain.shape == (3, 5, 3, ACT)

    abar = torch.cumprod(1 - make_betas(20, "cosine"), 0).to(torch.float64).tolist()
    feat = p.obs_normalizer(obs)
    total = torch.zeros(3, dtype=torch.float64)
    taus = chain.timesteps
    for k, tau in enumerate(taus):
        x = s.chain[:, k]
        ab = abar[tau]
        ab_prev = abar[taus[k + 1]] if k + 1 < len(taus) else 1.0
        sigma = 0.5 * math.sqrt((1 - ab_prev) / (1 - ab) * (1 - ab / ab_prev))
        std = max(sigma, min_std)
        with torch.no_grad():
            temb = p.actor.embed_time(torch.full((3,), tau))
            eps = p.actor(x.reshape(3, -1), temb, feat).view_as(x)
        x0 = ((x - math.sqrt(1 - ab) * eps) / math.sqrt(ab)).clamp(-1, 1)
        eps = (x - math.sqrt(ab) * x0) / math.sqrt(1 - ab)
        mu = math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev - sigma**2) * eps
        dist = torch.distributions.Normal(mu.double(), std)
        total += dist.log_prob(s.chain[:, k + 1].double()).sum(dim=(1, 2))
    got = p.chain_log_prob(obs, s.chain, chain=chain, min_std=min_std).sum(dim=(1, 2, 3))
    torch.testing.assert_close(got.double(), total, rtol=1e-5, atol=1e-4)
    # a suffix of the chain gives the same per-step terms
    tail = p.chain_log_prob(obs, s.chain[:, 2:], chain=chain, start=2, min_std=min_std)
    full = p.chain_log_prob(obs, s.chain, chain=chain, min_std=min_std)
    torch.testing.assert_close(tail, full[:, 2:], rtol=1e-5, atol=1e-5)


def test_sampling_is_deterministic_given_noise_and_respects_bounds():
    p = _policy()
    obs = torch.randn(4, OBS)
    noise = torch.randn(4, 3, ACT)
    a = p.sample(obs, noise=noise).actions
    b = p.sample(obs, noise=noise).actions
    torch.testing.assert_close(a, b)
    lo, hi = p.action_low, p.action_high
    assert bool((a >= lo).all() and (a <= hi).all())
    # ddpm and many-step ddim run too
    assert p.sample(obs, chain=p.chain(sampler="ddpm", steps=20)).actions.shape == (4, 3, ACT)


def test_bc_loss_trains_the_actor_only():
    p = _policy()
    loss = p.bc_loss(torch.randn(8, OBS), torch.rand(8, 3, ACT) - 0.5)
    loss.backward()
    assert p.actor.net[0].weight.grad is not None
    assert all(q.grad is None for q in p.critic.parameters())
    with pytest.raises(ValueError, match="action chunks"):
        p.bc_loss(torch.randn(8, OBS), torch.rand(8, 2, ACT))


def test_enable_finetuning_freezes_the_pretrained_actor_and_round_trips():
    p = _policy(sample_steps=4)
    p.enable_finetuning(2)
    assert all(not q.requires_grad for q in p.actor.parameters())
    assert all(q.requires_grad for q in p.actor_ft.parameters())
    assert [p.net_for_step(k, 4) is p.actor_ft for k in range(4)] == [False, False, True, True]
    q = _policy(sample_steps=4)
    q.load_state_dict(p.state_dict())  # builds the fine-tuned copy from the state
    assert q.num_ft_steps == 2 and q.actor_ft is not None
    with pytest.raises(ValueError, match="ft_steps"):
        p.enable_finetuning(5)


def test_inference_module_executes_chunks_like_torch_sampling():
    p = _policy(sample_steps=3)
    p.enable_finetuning(1)
    m = p.inference_module()
    obs = torch.randn(4, OBS)
    noise = torch.randn(4, 3, ACT)
    ref = p.sample(obs, noise=noise, chain=p.chain(eta=0.0)).actions
    chunk, step = m.initial_state(4)
    a0, chunk, step = m(obs, noise, chunk, step)
    torch.testing.assert_close(a0, ref[:, 0])
    # the second call executes the stored chunk whatever the new noise
    a1, chunk, step = m(obs, torch.randn(4, 3, ACT), chunk, step)
    torch.testing.assert_close(a1, ref[:, 1])
    assert bool((step == 0).all())  # act_steps = 2: the next call samples again


def test_fixed_time_net_equals_the_network_at_that_time():
    """The deployed samplers fold each step's time embedding into the first layer's bias
    (chunked.FixedTimeNet): the same function to float32 rounding."""
    p = _policy()
    net = p.actor
    x, obs = torch.randn(32, net.chunk_dim), torch.randn(32, OBS)
    for t in (0, 7, 19):
        emb = net.embed_time(torch.tensor([t])).squeeze(0)
        with torch.no_grad():
            want = net(x, emb.expand(32, -1), obs)
            got = net.at_time(emb)(x, obs)
        assert want.abs().mean() > 0.05
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="embedding of shape"):
        net.at_time(torch.zeros(3))
    # the export's folded sampler: the same chunks to rounding, the module untouched
    p.enable_finetuning(1)
    m = p.inference_module()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    f = m.folded()
    noise = torch.randn(32, 3, ACT)
    chunk, step = m.initial_state(32)
    torch.testing.assert_close(
        f(obs, noise, chunk, step), m(obs, noise, chunk, step), atol=1e-5, rtol=0
    )
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert m.denoise is None and len(f.denoise) == m.chain.num_steps


def test_chunk_execution_cycles_through_the_whole_chunk():
    """act_steps == horizon: positions 0..Ta-1 in turn, then a new chunk; a position out
    of range (a corrupted state) is clamped into the chunk."""
    p = _policy(horizon=3, act_steps=3)
    m = p.inference_module()
    obs, noise = torch.randn(2, OBS), torch.randn(2, 3, ACT)
    ref = p.sample(obs, noise=noise, chain=p.chain(eta=0.0)).actions
    chunk, step = m.initial_state(2)
    seen = []
    for i in range(4):
        a, chunk, step = m(obs, noise if i in (0, 3) else torch.randn(2, 3, ACT), chunk, step)
        seen.append(step[:, 0].tolist())
        torch.testing.assert_close(a, ref[:, i % 3], atol=1e-5, rtol=0)
    assert seen == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]
    a, _, nxt = m(obs, noise, chunk, torch.tensor([[7.0], [-3.0]]))
    torch.testing.assert_close(a[0], chunk[0, 2])  # 7 -> the last position
    torch.testing.assert_close(a[1], ref[1, 0], atol=1e-5, rtol=0)  # -3 -> 0: a new chunk
    assert nxt[:, 0].tolist() == [0.0, 1.0]


def test_onnx_export_parity_with_torch_sampling(tmp_path):
    from deploy.export import export_policy, register_exporter, registered_families
    from deploy.metadata import PolicyMetadata
    from deploy.runtime import OnnxPolicy

    if "diffusion" not in registered_families():
        register_exporter("diffusion", diffusion_exporter)
    p = _policy(sample_steps=3)
    m = p.inference_module()
    zeros = [0.0] * ACT
    meta = PolicyMetadata(
        policy_family="diffusion",
        obs_terms=[("a", 2), ("b", 3)],
        action_joint_names=["j0", "j1"],
        action_scale=[1.0, 1.0],
        action_offset=zeros,
        default_joint_pos=zeros,
        kp=zeros,
        kd=zeros,
        joint_pos_lower=[-1.0, -2.0],
        joint_pos_upper=[1.0, 0.5],
        control_period_s=0.02,
        recurrent_state=m.info.recurrent_state,
        noise_shape=list(m.info.noise_shape),
    )
    path = export_policy(m, meta, tmp_path / "d.onnx")
    policy = OnnxPolicy(path)
    obs = np.random.default_rng(0).standard_normal((6, OBS)).astype(np.float32)
    noise = np.random.default_rng(1).standard_normal((6, 3, ACT)).astype(np.float32)
    got, state = policy.act_batch(obs, noise=noise)
    ref = p.sample(torch.from_numpy(obs), noise=torch.from_numpy(noise), chain=p.chain(eta=0.0))
    np.testing.assert_allclose(got, ref.actions[:, 0].numpy(), atol=1e-5)
    got2, _ = policy.act_batch(obs, state, noise=np.zeros_like(noise))
    np.testing.assert_allclose(got2, ref.actions[:, 1].numpy(), atol=1e-5)
    # deterministic mode: zero noise selects the canonical draw, as torch's deterministic
    det = OnnxPolicy(path, deterministic=True)
    a, _ = det.act_batch(obs)
    det_ref = p.sample(torch.from_numpy(obs), deterministic=True, chain=p.chain(eta=0.0))
    np.testing.assert_allclose(a, det_ref.actions[:, 0].numpy(), atol=1e-5)
    canon = p.canonical_noise.expand(6, 3, ACT)
    torch.testing.assert_close(
        det_ref.actions,
        p.sample(torch.from_numpy(obs), noise=canon, chain=p.chain(eta=0.0)).actions,
    )
    # the robot-side single-step path runs it with its own chunk state
    for _ in range(3):
        assert np.isfinite(det.act(obs[0])).all()
