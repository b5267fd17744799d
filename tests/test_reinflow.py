"""ReinFlow: exact chain log-probabilities, bounded noise, what trains, resume, crediting."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from policies.flow import FlowConfig, FlowPolicy
from training.algorithms.reinflow import ReinFlow, ReinFlowConfig, credit_chunks

OBS, ACT = 4, 2


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # small nets: a thread pool only adds contention (and 10x slower tests on a busy box)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _policy(horizon=4, act_steps=2, steps=3) -> FlowPolicy:
    torch.manual_seed(0)
    cfg = FlowConfig(
        hidden=(16, 16),
        noise_hidden=(8,),
        critic_hidden=(8,),
        horizon=horizon,
        act_steps=act_steps,
        sample_steps=steps,
    )
    p = FlowPolicy(OBS, ACT, cfg, action_low=[-2.0, -1.0], action_high=[2.0, 0.5])
    p.update_obs_normalizer(torch.randn(256, OBS) * 2 + 0.5)  # as behaviour cloning leaves it
    return p


def _learner(policy, num_envs=3, num_steps=6, **kw) -> ReinFlow:
    cfg = ReinFlowConfig(num_steps=num_steps, num_epochs=2, num_minibatches=2, actor_lr=1e-2, **kw)
    return ReinFlow(policy, cfg, num_envs=num_envs, obs_sizes={"policy": OBS})


def _rollout(learner, ends: dict[int, list[int]] | None = None, seed: int = 0) -> None:
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


def test_chain_log_prob_equals_hand_computed_gaussians():
    """log p(chain) = sum over Euler steps of log N(x_{k+1}; x_k + v(x_k, k/K, 1/K)/K,
    sigma(x_k, k/K)^2), with the policy's own velocity and noise networks."""
    p = _policy(steps=3)
    p.set_noise_bounds(0.05, 0.3)
    with torch.no_grad():  # a noise network whose output depends on its inputs
        for q in p.noise_net.parameters():
            q.add_(0.5 * torch.randn_like(q))
    obs = torch.randn(5, OBS)
    s = p.sample(obs, generator=torch.Generator().manual_seed(1), return_chain=True)
    assert s.chain is not None and s.chain.shape == (5, 4, 4, ACT)
    feat = p.obs_normalizer(obs)
    total = torch.zeros(5, dtype=torch.float64)
    per_position = []
    with torch.no_grad():
        for k in range(3):
            x = s.chain[:, k].reshape(5, -1)
            t = torch.full((5,), k / 3)
            v = p.actor(x, p.actor.embed(t, torch.full((5,), 1 / 3)), feat)
            raw = p.noise_net(x, p.noise_net.embed(t), feat)
            std = 0.05 + 0.25 * torch.sigmoid(raw)
            dist = torch.distributions.Normal((x + v / 3).double(), std.double())
            lp = dist.log_prob(s.chain[:, k + 1].reshape(5, -1).double())
            total += lp.sum(-1)
            per_position.append(lp.view(5, 4, ACT).sum(-1))
    got = p.chain_log_prob(obs, s.chain)
    assert got.shape == (5, 3, 4)
    torch.testing.assert_close(got.sum(dim=(1, 2)).double(), total, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.double(), torch.stack(per_position, 1), rtol=1e-5, atol=1e-4)
    mean = p.chain_log_prob(obs, s.chain, "mean")
    torch.testing.assert_close(mean, got / ACT, rtol=1e-5, atol=1e-5)
    # the gradient reaches both networks
    got.sum().backward()
    assert p.actor.net[0].weight.grad is not None and p.noise_net.net[0].weight.grad is not None
    assert bool(p.noise_net.net[0].weight.grad.abs().sum() > 0)


def test_noise_std_stays_inside_its_bounds_for_extreme_inputs():
    p = _policy()
    p.set_noise_bounds(0.07, 0.21)
    with torch.no_grad():
        for q in p.noise_net.parameters():
            q.mul_(0.0).add_(100.0 * torch.randn_like(q))  # saturates the sigmoid
    g = torch.Generator().manual_seed(0)
    feat = p.obs_features(torch.randn(64, OBS, generator=g) * 1e6)
    x = torch.randn(64, 4, ACT, generator=g) * 1e4
    for t in (0.0, 0.5, 1.0):
        with torch.no_grad():
            std = p.noise_std(x, torch.full((64,), t), feat)
        assert bool(torch.isfinite(std).all())
        assert float(std.min()) >= 0.07 - 1e-7 and float(std.max()) <= 0.21 + 1e-7
    assert float(std.min()) == pytest.approx(0.07) and float(std.max()) == pytest.approx(0.21)
    chain = torch.cat([x.unsqueeze(1)] * 4, dim=1)
    assert bool(torch.isfinite(p.chain_log_prob(torch.randn(64, OBS) * 1e6, chain)).all())


def test_ratios_start_at_one():
    learner = _learner(_policy())
    _rollout(learner)
    st = learner.storage
    c = st.num_chunks
    with torch.no_grad():
        again = learner.chunk_log_prob(st.chunk_obs[:c], st.chunk_chain[:c])
    # the stored chains under the same parameters: the same log-probabilities, up to the
    # rounding of elementwise kernels (sigmoid, log), whose vectorized body and scalar tail
    # differ in the last bit, so a batch of 3 chunks at acting and of all at once disagree
    # by ~1e-7
    torch.testing.assert_close(again, st.chunk_logp[:c], rtol=0.0, atol=1e-6)
    stats = learner.update()
    assert np.isfinite(stats["policy_loss"]) and stats["minibatch_steps"] == 4
    # ReinFlowConfig's bounds (0.1, 0.24) replace the policy's (0.05, 0.2)
    assert 0.1 <= stats["noise_std"] <= 0.24


@pytest.mark.parametrize("train_velocity", [True, False])
def test_update_changes_only_the_networks_meant_to_train(train_velocity):
    policy = _policy()
    before = copy.deepcopy(policy.state_dict())
    learner = _learner(policy, flow_steps=2, train_velocity=train_velocity, noise_max=0.3)
    assert policy.steps == 2 and learner.storage.chunk_chain.shape[1] == 3
    assert not learner.fit_obs  # a pretrained normalizer stays as BC left it
    _rollout(learner)
    learner.update()
    after = policy.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    trains = {"noise_net."} | ({"actor."} if train_velocity else set()) | {"critic."}
    for k in after:
        meant = any(k.startswith(prefix) for prefix in trains)
        if k in ("ft_steps", "noise_bounds"):
            continue  # set by fine-tuning itself
        if not meant:
            assert k not in changed, k
    for prefix in trains:
        assert any(k.startswith(prefix) for k in changed), prefix
    assert int(after["ft_steps"]) == 2
    assert after["noise_bounds"].tolist() == pytest.approx([0.1, 0.3])
    opt = {id(q) for g in learner.optimizer.param_groups for q in g["params"]}
    assert bool(opt & {id(q) for q in policy.actor.parameters()}) == train_velocity


def test_only_executed_chunk_positions_are_credited():
    """Tp = 4, Ta = 2; env 1's episode ends after the first action of a chunk."""
    learner = _learner(_policy(horizon=4, act_steps=2), num_envs=2, num_steps=6)
    _rollout(learner, ends={2: [1]})
    st = learner.storage
    adv = torch.arange(12, dtype=torch.float32).view(6, 2) + 1.0
    adv_c, mask_c = credit_chunks(st, adv, 4)
    assert st.num_chunks == 7 and mask_c.sum() == 12 and mask_c[:, 2:].sum() == 0
    for t in range(6):
        for n in range(2):
            c, j = int(st.chunk_index[t, n]), int(st.position[t, n])
            assert mask_c[c, j] == 1 and adv_c[c, j] == adv[t, n]
    assert mask_c[int(st.chunk_index[2, 1])].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_state_dict_round_trip_continues_identically():
    def make():
        policy = _policy()
        return policy, _learner(policy, entropy_coef=0.01)

    policy_a, a = make()
    _rollout(a, seed=0)
    a.update()
    saved_policy = copy.deepcopy(policy_a.state_dict())
    saved = copy.deepcopy(a.state_dict())
    policy_b, b = make()
    policy_b.load_state_dict(saved_policy)
    b.load_state_dict(saved)
    _rollout(a, seed=1)
    _rollout(b, seed=1)
    assert a.update() == b.update()
    for (k, v), w in zip(policy_a.state_dict().items(), policy_b.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)


def test_config_errors():
    for steps in (0, 11):
        with pytest.raises(ValueError, match=r"ReinFlowConfig\.flow_steps"):
            ReinFlowConfig(flow_steps=steps)
    with pytest.raises(ValueError, match="noise_max"):
        ReinFlowConfig(noise_min=0.2, noise_max=0.1)
    with pytest.raises(ValueError, match="logprob_reduce"):
        ReinFlowConfig(logprob_reduce="max")
    with pytest.raises(ValueError, match="num_minibatches"):
        _learner(_policy(), num_envs=1, num_steps=1)
