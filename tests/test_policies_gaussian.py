"""Gaussian actor-critic: distribution, normalization, memory and the inference module."""

import math

import pytest
import torch

from policies import (
    ActorCritic,
    ActorCriticConfig,
    GaussianInference,
    Policy,
    PolicyInfo,
    gaussian_kl,
)

SMALL = {"actor_hidden": (16, 16), "critic_hidden": (16,), "rnn_hidden": 8}


def make(rnn_type=None, critic=None, **kw) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(5, critic, 3, ActorCriticConfig(rnn_type=rnn_type, **{**SMALL, **kw}))


def obs_batch(n=4, critic=None, scale=3.0, shift=1.0):
    o = {"policy": torch.randn(n, 5) * scale + shift}
    if critic is not None:
        o["critic"] = torch.randn(n, critic) * scale - shift
    return o


def test_is_a_policy_and_describes_itself():
    p = make()
    assert isinstance(p, Policy)
    assert p.info == PolicyInfo("gaussian_mlp", 5, 3)
    r = make("lstm")
    assert r.info.policy_family == "recurrent"
    assert r.info.state_names == ("h", "c")
    assert r.info.state_shape == (1, 8)
    assert r.info.input_names == ("obs", "h_in", "c_in")
    assert r.info.output_names == ("actions", "h_out", "c_out")
    assert r.info.to_dict()["state_names"] == ["h", "c"]
    with pytest.raises(ValueError, match="policy_family"):
        PolicyInfo("transformer", 1, 1)


def test_log_std_floor_never_collapses_or_nans():
    p = make(min_std=1e-3)
    with torch.no_grad():
        p.log_std.fill_(-100.0)
    torch.testing.assert_close(p.std, torch.full((3,), 1e-3))
    out = p.act(obs_batch())
    assert torch.isfinite(out.log_prob).all() and torch.isfinite(out.actions).all()
    torch.testing.assert_close(out.std, torch.full((4, 3), 1e-3))
    ev = p.evaluate(obs_batch(), out.actions + 0.5)
    assert torch.isfinite(ev.log_prob).all() and torch.isfinite(ev.entropy).all()
    # a huge log_std is untouched (only a floor), and the init matches init_std
    assert torch.allclose(make(init_std=0.3).std, torch.full((3,), 0.3))


def test_log_prob_and_entropy_match_torch_normal():
    p = make(init_std=0.7)
    with torch.no_grad():
        p.log_std.copy_(torch.tensor([-0.5, 0.0, 0.4]))
    o = obs_batch(8)
    actions = torch.randn(8, 3)
    ev = p.evaluate(o, actions)
    dist = torch.distributions.Normal(ev.mean, ev.std)
    torch.testing.assert_close(ev.log_prob, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(ev.entropy, dist.entropy().sum(-1))
    # and the log-prob that act reports is that of the action it sampled
    out = p.act(o)
    ref = torch.distributions.Normal(out.mean, out.std).log_prob(out.actions).sum(-1)
    torch.testing.assert_close(out.log_prob, ref)
    # analytic KL agrees with torch's
    m2, s2 = ev.mean + 0.1, ev.std * 1.3
    kl_ref = torch.distributions.kl_divergence(dist, torch.distributions.Normal(m2, s2)).sum(-1)
    torch.testing.assert_close(gaussian_kl(ev.mean, ev.std, m2, s2), kl_ref)


@pytest.mark.parametrize("critic", [None, 7])
def test_normalizer_changes_only_through_update_normalizers(critic):
    p = make(critic=critic)
    o = obs_batch(16, critic)
    p.train()
    p.act(o)  # acting never moves the statistics (the learner folds in whole rollouts)
    assert int(p.actor_obs_normalizer.count) == 0
    p.update_normalizers(o)
    assert int(p.actor_obs_normalizer.count) == 16
    if critic is not None:
        assert int(p.critic_obs_normalizer.count) == 16
        torch.testing.assert_close(p.critic_obs_normalizer.mean, o["critic"].mean(0))
    else:
        assert p.critic_obs_normalizer is None  # the symmetric critic shares the actor's
    torch.testing.assert_close(p.actor_obs_normalizer.mean, o["policy"].mean(0))
    before = {k: v.clone() for k, v in p.state_dict().items()}
    p.evaluate(o, torch.zeros(16, 3))
    p.value(o)
    p.act_inference(o)
    p.eval()
    p.act(o)
    for k, v in p.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_normalization_off_is_identity():
    p = make(normalize_obs=False)
    p.act(obs_batch())
    assert not any("normalizer" in k for k in p.state_dict())


def test_asymmetric_critic_needs_its_group():
    p = make(critic=7)
    with pytest.raises(KeyError, match="critic"):
        p.act(obs_batch())
    with pytest.raises(ValueError, match="size"):
        p.act({"policy": torch.zeros(2, 4), "critic": torch.zeros(2, 7)})


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("rnn_type", [None, "gru", "lstm"])
def test_inference_module_is_deterministic_and_equals_act_mean(rnn_type):
    p = make(rnn_type, critic=7)
    p.train()
    for _ in range(3):  # move the statistics away from (0, 1)
        p.act(obs_batch(4, 7))
    p.eval()
    p.init_hidden(4)
    inf = p.inference_module()
    assert isinstance(inf, GaussianInference)
    assert not any(q.requires_grad for q in inf.parameters())
    state = inf.initial_state(4)
    traced = torch.jit.trace(inf, inf.example_inputs(4))
    for _ in range(3):
        o = obs_batch(4, 7)
        out = p.act(o)
        if rnn_type is None:
            a1, a2, a3 = inf(o["policy"]), inf(o["policy"]), traced(o["policy"])
        else:
            a1, *s1 = inf(o["policy"], *state)
            a2, *_ = inf(o["policy"], *state)
            a3, *s3 = traced(o["policy"], *state)
            for x, y in zip(s1, s3):
                torch.testing.assert_close(x, y)
            state = tuple(s1)
        assert torch.equal(a1, a2)
        torch.testing.assert_close(a1, out.mean)
        torch.testing.assert_close(a3, out.mean)
    # a frozen copy: training the policy further does not change it
    args = (obs_batch(4, 7)["policy"], *inf.initial_state(4))
    before = inf(*args)
    with torch.no_grad():
        for q in p.actor.parameters():
            q.add_(1.0)
    after = inf(*args)
    for x, y in zip(before if rnn_type else [before], after if rnn_type else [after]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_recurrent_hidden_resets_on_done(rnn_type):
    p = make(rnn_type)
    for _ in range(3):
        p.act(obs_batch(3))
    h = p.get_hidden()
    assert h is not None and len(h) == (4 if rnn_type == "lstm" else 2)
    assert all(x.shape == (1, 3, 8) for x in h)
    assert all(x[:, 0].abs().sum() > 0 for x in h)
    p.reset_hidden(torch.tensor([True, False, True]))
    after = p.get_hidden()
    for x, y in zip(h, after):
        assert torch.all(y[:, 0] == 0) and torch.all(y[:, 2] == 0)
        assert torch.equal(y[:, 1], x[:, 1])
    # value() reads the state without advancing it
    p.value(obs_batch(3))
    for x, y in zip(after, p.get_hidden()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_sequence_evaluate_reproduces_acting_across_episode_boundaries(rnn_type):
    torch.manual_seed(1)
    p = make(rnn_type, critic=7)
    p.train()
    p.act(obs_batch(4, 7))  # non-trivial statistics, then frozen
    p.eval()
    n, t = 4, 9
    for _ in range(2):  # start the recorded rollout mid-episode (non-zero state)
        p.act(obs_batch(n, 7))
    h0 = p.get_hidden()
    dones = torch.zeros(t, n, dtype=torch.bool)
    dones[2, 0] = dones[5, 0] = dones[4, 2] = dones[8, 3] = True
    obs, acts, logps, values = [], [], [], []
    for step in range(t):
        o = obs_batch(n, 7)
        out = p.act(o)
        obs.append(o)
        acts.append(out.actions)
        logps.append(out.log_prob)
        values.append(out.value)
        p.reset_hidden(dones[step])
    seq = {k: torch.stack([o[k] for o in obs]) for k in ("policy", "critic")}
    actions = torch.stack(acts)
    ev = p.evaluate(seq, actions, hidden=h0, dones=dones)
    assert ev.log_prob.shape == (t, n)
    # bit-exact on the CPU we test on; 1e-6 leaves room for BLAS kernels that differ by
    # batch size (evaluate runs the heads on T x B rows, act on B)
    torch.testing.assert_close(ev.log_prob, torch.stack(logps), rtol=0, atol=1e-6)
    torch.testing.assert_close(ev.value, torch.stack(values), rtol=0, atol=1e-6)
    # minibatches of envs reproduce them too
    idx = torch.tensor([3, 0])
    part = p.evaluate(
        {k: v[:, idx] for k, v in seq.items()},
        actions[:, idx],
        hidden=tuple(h[:, idx] for h in h0),
        dones=dones[:, idx],
    )
    torch.testing.assert_close(part.log_prob, torch.stack(logps)[:, idx], rtol=0, atol=1e-6)
    # ignoring the episode ends would not (the check above is not vacuous)
    wrong = p.evaluate(seq, actions, hidden=h0, dones=None)
    assert not torch.allclose(wrong.log_prob, torch.stack(logps), atol=1e-4)


def test_config_validation():
    for kw, field in (
        ({"activation": "gelu"}, "activation"),
        ({"min_std": 0.0}, "min_std"),
        ({"init_std": 1e-4, "min_std": 1e-3}, "init_std"),
        ({"rnn_type": "rnn"}, "rnn_type"),
        ({"rnn_hidden": 0}, "rnn_hidden"),
        ({"rnn_layers": 0}, "rnn_layers"),
        ({"actor_hidden": (16, 0)}, "actor_hidden"),
        ({"init": "xavier"}, "init"),
    ):
        with pytest.raises(ValueError, match=field):
            ActorCriticConfig(**kw)
    with pytest.raises(ValueError, match="action_size"):
        ActorCritic(3, None, 0)
    assert math.isclose(ActorCriticConfig().min_std, 1e-3)


def test_init_orthogonal_and_torch_default():
    """"orthogonal": orthonormal rows scaled by the gain, zero biases, the actor's mean
    near 0; "torch": nn.Linear's own uniform(+-1/sqrt(fan_in)) weights and biases."""
    ortho = make(init="orthogonal")
    lins = [m for m in ortho.actor if isinstance(m, torch.nn.Linear)]
    for lin, gain in zip(lins, (math.sqrt(2.0), math.sqrt(2.0), 0.01), strict=True):
        w = lin.weight
        small = min(w.shape)
        gram = w @ w.T if w.shape[0] == small else w.T @ w
        assert torch.allclose(gram, gain**2 * torch.eye(small), atol=1e-5)
        assert torch.count_nonzero(lin.bias) == 0
    crit_out = [m for m in ortho.critic if isinstance(m, torch.nn.Linear)][-1]
    assert math.isclose(crit_out.weight.norm().item(), 1.0, rel_tol=1e-5)

    default = make(init="torch")
    for net in (default.actor, default.critic):
        for lin in (m for m in net if isinstance(m, torch.nn.Linear)):
            bound = 1.0 / math.sqrt(lin.in_features)
            assert lin.weight.abs().max() <= bound and lin.bias.abs().max() <= bound
            assert torch.count_nonzero(lin.bias) == lin.out_features
            # spread over the bound, not a small-gain head: the std of U(-b, b) is b/sqrt(3)
            assert lin.weight.std() > 0.4 * bound
    # same seed, same shapes, another start: the option reaches the networks
    assert not torch.allclose(ortho.actor[0].weight, default.actor[0].weight)


def test_obs_clip_bounds_a_term_that_was_constant():
    """A term constant while the statistics accumulated (std ~0) would enter the
    network as ~1e4 on its first change; obs_clip bounds it, in the policy and in its
    deployable graph alike."""
    clipped = ActorCritic(5, None, 3, ActorCriticConfig(obs_clip=3.0, **SMALL))
    free = ActorCritic(5, None, 3, ActorCriticConfig(**SMALL))
    still = {"policy": torch.zeros(64, 5)}
    still["policy"][:, :4] = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    for p in (clipped, free):
        p.update_normalizers(still)
    x = torch.zeros(2, 5)
    x[:, 4] = 0.5  # the constant term moves
    assert free.actor_obs_normalizer(x)[:, 4].abs().min() > 1e3
    y = clipped.actor_obs_normalizer(x)
    assert torch.equal(y[:, 4], torch.full((2,), 3.0))
    z = clipped.actor_obs_normalizer(still["policy"])
    assert torch.equal(z[:, :4], free.actor_obs_normalizer(still["policy"])[:, :4].clamp(-3, 3))
    # the exported graph's normalizer is a copy: it clips the same
    assert torch.equal(clipped.inference_module().normalizer(x), y)
    x_big = x.clone()
    x_big[:, 4] = 50.0  # beyond the clip: the same action as at the clip
    assert torch.equal(clipped.act_inference({"policy": x}), clipped.act_inference({"policy": x_big}))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_obs_clip_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="obs_clip"):
        ActorCriticConfig(obs_clip=bad)
