"""Flow policy: config checks, shortcut BC on a bimodal toy, CFM loss by hand, export parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.flow import FlowConfig, FlowPolicy, flow_exporter
from training.algorithms.bc import BC, BCConfig

OBS, ACT = 5, 2


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # small nets: a thread pool only adds contention (and 10x slower tests on a busy box)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _policy(**kw) -> FlowPolicy:
    torch.manual_seed(0)
    cfg = FlowConfig(
        **{
            "hidden": (16, 16),
            "noise_hidden": (8,),
            "critic_hidden": (8,),
            "horizon": 3,
            "act_steps": 2,
            **kw,
        }
    )
    p = FlowPolicy(OBS, ACT, cfg, action_low=[-1.0, -2.0], action_high=[1.0, 0.5])
    p.update_obs_normalizer(torch.randn(64, OBS) * 3 + 1)
    return p


@pytest.mark.parametrize("steps", [0, -1, 11])
def test_sample_steps_outside_one_to_ten_is_refused(steps):
    with pytest.raises(ValueError, match=r"FlowConfig\.sample_steps"):
        FlowConfig(sample_steps=steps)
    with pytest.raises(ValueError, match="steps must be an integer in"):
        _policy().sample(torch.zeros(1, OBS), steps=steps)
    with pytest.raises(ValueError, match="steps must be an integer in"):
        _policy().inference_module(steps=steps)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="act_steps"):
        FlowConfig(horizon=2, act_steps=3)
    with pytest.raises(ValueError, match="noise_min"):
        FlowConfig(noise_min=0.0)
    with pytest.raises(ValueError, match="noise_max"):
        FlowConfig(noise_min=0.2, noise_max=0.1)
    with pytest.raises(ValueError, match="consistency_fraction"):
        FlowConfig(consistency_fraction=1.0)


# a contextual bimodal toy: the chunk is base(obs) +- 0.5 along u, with a little spread
_U = torch.tensor([1.0, 1.0]) / 2**0.5
_W = torch.tensor([[1.0, -0.5, 0.3], [0.2, 0.8, -1.0]])


def _toy(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 3, generator=g)
    base = 0.5 * torch.tanh(obs @ _W.T)
    side = (torch.randint(0, 2, (n, 1), generator=g) * 2 - 1).float()
    x = base + 0.5 * side * _U + 0.03 * torch.randn(n, 2, generator=g)
    return obs, x.unsqueeze(1), base


def _gap_fraction(actions: torch.Tensor, base: torch.Tensor) -> float:
    """Fraction of samples in the empty middle between the two modes (|s| < 0.25)."""
    s = (actions[:, 0] - base) @ _U
    return float((s.abs() < 0.25).float().mean())


def test_shortcut_bc_samples_the_modes_in_one_and_four_steps():
    """BC (the learner, unchanged) fits the shortcut model: the loss falls, and one
    Euler step samples the two modes almost as well as four (plain flow matching puts
    nearly every one-step sample between the modes: measured 0.97)."""
    torch.manual_seed(0)
    cfg = FlowConfig(horizon=1, act_steps=1, hidden=(64, 64), critic_hidden=(8,))
    p = FlowPolicy(3, 2, cfg)
    obs, x, _ = _toy(4096, seed=0)
    bc = BC(
        p,
        BCConfig(num_updates=1200, batch_size=256, lr=3e-3, lr_final=1e-4, warmup=50, ema_decay=0),
        obs,
        x,
    )
    losses = [bc.update()["loss"] for _ in range(1200)]
    assert np.mean(losses[-100:]) < 0.8 * np.mean(losses[:100])
    tobs, _, base = _toy(2000, seed=1)
    g = torch.Generator().manual_seed(5)
    one = p.sample(tobs, steps=1, stochastic=False, generator=g).actions
    four = p.sample(tobs, steps=4, stochastic=False, generator=g).actions
    for a in (one, four):
        assert _gap_fraction(a, base) < 0.6
        # on the line through the modes: the orthogonal error is small
        r = a[:, 0] - base
        orth = r - (r @ _U)[:, None] * _U
        assert float(orth.norm(dim=-1).median()) < 0.15


def test_bc_loss_trains_the_velocity_network_only():
    p = _policy()
    loss = p.bc_loss(torch.randn(8, OBS), torch.rand(8, 3, ACT) - 0.5)
    loss.backward()
    assert p.actor.net[0].weight.grad is not None
    assert all(q.grad is None for q in p.critic.parameters())
    assert all(q.grad is None for q in p.noise_net.parameters())
    with pytest.raises(ValueError, match="action chunks"):
        p.bc_loss(torch.randn(8, OBS), torch.rand(8, 2, ACT))
    # the same generator state gives the same loss (all randomness from it)
    a = p.bc_loss(torch.ones(8, OBS), torch.zeros(8, 3, ACT), torch.Generator().manual_seed(1))
    b = p.bc_loss(torch.ones(8, OBS), torch.zeros(8, 3, ACT), torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_cfm_loss_by_hand_and_without_randomness():
    p = _policy()
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(4, OBS, generator=g)
    x1 = torch.rand(4, 3, ACT, generator=g) * 2 - 1
    tau = torch.rand(4, 5, generator=g)
    eps = torch.randn(4, 5, 3, ACT, generator=g)
    got = p.cfm_loss(obs, x1, tau, eps)
    assert got.shape == (4, 5)
    assert torch.equal(got, p.cfm_loss(obs, x1, tau, eps))
    feat = p.obs_normalizer(obs)
    want = torch.zeros(4, 5)
    for b in range(4):
        for i in range(5):
            t = float(tau[b, i])
            xt = (1 - t) * eps[b, i] + t * x1[b]
            emb = p.actor.embed(torch.tensor([t]), torch.tensor([0.0]))
            v = p.actor(xt.reshape(1, -1), emb, feat[b : b + 1]).view(3, ACT)
            want[b, i] = (v - (x1[b] - eps[b, i])).square().mean()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    summed = p.cfm_loss(obs, x1, tau, eps, reduce="sum")
    torch.testing.assert_close(summed, want * 3 * ACT, rtol=1e-5, atol=1e-5)


def test_sampling_is_deterministic_given_noise_and_respects_bounds():
    p = _policy(sample_steps=3)
    obs = torch.randn(4, OBS)
    x0 = torch.randn(4, 3, ACT)
    a = p.sample(obs, stochastic=False, noise=x0).actions
    torch.testing.assert_close(a, p.sample(obs, stochastic=False, noise=x0).actions)
    assert bool((a >= p.action_low).all() and (a <= p.action_high).all())
    full = torch.randn(4, 4, 3, ACT)
    s = p.sample(obs, stochastic=True, noise=full, return_chain=True)
    assert s.chain is not None and s.chain.shape == (4, 4, 3, ACT)
    torch.testing.assert_close(s.chain[:, 0], full[:, 0])
    # the deterministic mode: x0 = 0, no per-step noise, in both chains
    zeros = p.sample(obs, stochastic=False, noise=torch.zeros(4, 3, ACT)).actions
    torch.testing.assert_close(p(obs), zeros[:, 0])
    torch.testing.assert_close(
        p.sample(obs, stochastic=True, noise=torch.zeros(4, 4, 3, ACT)).actions, zeros
    )


class _Teacher:
    """A velocity field standing in for a teacher network: ``fn(x, t)``."""

    def __init__(self, fn):
        self.fn = fn

    def velocity(self, x, t, d, feat):
        return self.fn(x, t.view(-1, 1, 1))


def test_consistency_target_is_exact_for_the_true_flow_and_bounded_for_a_runaway_teacher():
    """The shortcut's two-half-step target keeps a correct teacher's velocity and holds a
    wrong one to what a flow onto the data's range allows: a teacher that says 1e6 gives
    the target that ends the path at the top of the data, not a million beyond it (its
    outputs fed back through the midpoint is how FPO's consistency loss ran away)."""
    policy = _policy()
    g = torch.Generator().manual_seed(1)
    n = 64
    c = torch.rand(1, 3, ACT, generator=g) - 0.5  # every chunk the same: a point mass
    x0 = torch.randn(n, 3, ACT, generator=g)
    big, t = policy._consistency_draws(n, g, x0)
    tt = t.view(-1, 1, 1)
    xt = (1 - tt) * x0 + tt * c
    feat = torch.zeros(n, 1)
    lo, hi = c.min(), c.max()
    # onto a point mass the flow is straight: every step's average velocity is (c - x)/(1 - t)
    exact = _Teacher(lambda x, s: (c - x) / (1 - s))
    target = policy.consistency_target(feat, xt, t, big, (lo, hi), exact)
    torch.testing.assert_close(target, (c - xt) / (1 - tt), rtol=1e-5, atol=1e-5)
    runaway = _Teacher(lambda x, s: torch.full_like(x, 1e6))
    target = policy.consistency_target(feat, xt, t, big, (lo, hi), runaway)
    torch.testing.assert_close(xt + (1 - tt) * target, hi.expand_as(xt), rtol=1e-5, atol=1e-5)
    down = _Teacher(lambda x, s: torch.full_like(x, -1e6))
    target = policy.consistency_target(feat, xt, t, big, (lo, hi), down)
    torch.testing.assert_close(xt + (1 - tt) * target, lo.expand_as(xt), rtol=1e-5, atol=1e-5)


def _consistency_chain(policy: FlowPolicy, updates: int) -> list[float]:
    """Self-consistency training alone on fixed chunks, the teacher refreshed to the
    network of the step before at every step: targets fed by the network's own outputs,
    as FPO's frozen-per-update teacher is over many updates."""
    import copy

    g = torch.Generator().manual_seed(1)
    obs = torch.randn(64, OBS, generator=g)
    x1 = torch.rand(64, 3, ACT, generator=g) * 2 - 1
    opt = torch.optim.Adam(policy.actor.parameters(), lr=1e-2)
    losses = []
    for _ in range(updates):
        teacher = copy.deepcopy(policy).requires_grad_(False)
        loss = policy.consistency_loss(obs, x1, g, teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_bounded_consistency_targets_stop_the_runaway(monkeypatch):
    """The same chain with the targets unbounded runs away (the loss passes 1e3, as FPO's
    did on halfcheetah at 790k steps); bounded it stays small."""
    import policies.flow as flow_module

    bounded = _consistency_chain(_policy(), 100)
    monkeypatch.setattr(flow_module, "_toward_box", lambda v, x, t, lo, hi: v)
    unbounded = _consistency_chain(_policy(), 100)
    assert max(unbounded) > 1e3, max(unbounded)
    assert max(bounded) < 0.1 and np.isfinite(bounded).all(), max(bounded)


def test_inference_module_executes_chunks_like_torch_sampling():
    p = _policy(sample_steps=3)
    obs = torch.randn(4, OBS)
    for stochastic in (False, True):
        m = p.inference_module(stochastic=stochastic)
        assert m.info.noise_shape == ((4, 3, ACT) if stochastic else (3, ACT))
        noise = torch.randn(4, *m.info.noise_shape)
        ref = p.sample(obs, stochastic=stochastic, noise=noise).actions
        chunk, step = m.initial_state(4)
        a0, chunk, step = m(obs, noise, chunk, step)
        torch.testing.assert_close(a0, ref[:, 0])
        a1, chunk, step = m(obs, torch.randn(4, *m.info.noise_shape), chunk, step)
        torch.testing.assert_close(a1, ref[:, 1])
        assert bool((step == 0).all())


def test_finetuning_state_round_trips():
    p = _policy(sample_steps=4)
    trainable = p.enable_finetuning(2, velocity=False)
    assert {id(q) for q in trainable} == {id(q) for q in p.noise_net.parameters()}
    assert all(not q.requires_grad for q in p.actor.parameters())
    p.set_noise_bounds(0.1, 0.3)
    q = _policy(sample_steps=4)
    q.load_state_dict(p.state_dict())
    assert q.steps == 2 and q.info.steps == 2 and q.inference_module().info.steps == 2
    assert q.noise_bounds.tolist() == pytest.approx([0.1, 0.3])


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
@pytest.mark.parametrize("steps", [1, 3])
def test_folded_sampler_equals_the_module(steps, stochastic):
    """The export's sampler (each Euler step's time and 1 / K folded into the networks,
    chunked.FixedTimeNet) gives the same chunks to float32 rounding, and folding leaves
    the module that training evaluates untouched."""
    p = _policy(sample_steps=4)
    m = p.inference_module(steps, stochastic=stochastic)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    f = m.folded()
    obs = torch.randn(32, OBS)
    noise = torch.randn(32, *m.info.noise_shape)
    state = m.initial_state(32)
    with torch.no_grad():
        want, got = m(obs, noise, *state), f(obs, noise, *state)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    assert want[0].abs().mean() > 0.05
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert m.velocity is None and len(f.velocity) == steps
    assert (f.noise_scale is not None) == stochastic


def _meta(module, family="flow"):
    from deploy.metadata import PolicyMetadata

    zeros = [0.0] * ACT
    return PolicyMetadata(
        policy_family=family,
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
        recurrent_state=module.info.recurrent_state,
        noise_shape=list(module.info.noise_shape),
    )


@pytest.fixture
def flow_export(monkeypatch):
    """deploy.export with flow_exporter registered for this test only (the registry is
    restored afterwards, so no other test sees the registration)."""
    import deploy.export as export_mod
    from deploy.metadata import POLICY_FAMILIES

    if "flow" not in POLICY_FAMILIES:
        pytest.skip("deploy.metadata.POLICY_FAMILIES lacks 'flow': register_exporter refuses it")
    monkeypatch.setattr(export_mod, "_EXPORTERS", dict(export_mod._EXPORTERS))
    export_mod.register_exporter("flow", flow_exporter, replace=True)
    return export_mod


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
@pytest.mark.parametrize("steps", [1, 4])
def test_onnx_export_parity_with_torch_sampling(tmp_path, flow_export, steps, stochastic):
    from deploy.runtime import OnnxPolicy

    p = _policy(sample_steps=steps)
    m = p.inference_module(stochastic=stochastic)
    path = flow_export.export_policy(m, _meta(m), tmp_path / "f.onnx")
    assert flow_export.read_parity(path) < 1e-5  # measured by the export itself
    policy = OnnxPolicy(path)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((6, OBS)).astype(np.float32)
    noise = rng.standard_normal((6, *m.info.noise_shape)).astype(np.float32)
    got, state = policy.act_batch(obs, noise=noise)
    ref = p.sample(
        torch.from_numpy(obs), steps, stochastic=stochastic, noise=torch.from_numpy(noise)
    )
    np.testing.assert_allclose(got, ref.actions[:, 0].numpy(), atol=1e-5)
    got2, _ = policy.act_batch(obs, state, noise=np.zeros_like(noise))
    np.testing.assert_allclose(got2, ref.actions[:, 1].numpy(), atol=1e-5)
    # deterministic mode: zero noise = x0 = 0 and no per-step noise
    det = OnnxPolicy(path, deterministic=True)
    a, _ = det.act_batch(obs)
    np.testing.assert_allclose(a, p(torch.from_numpy(obs)).numpy(), atol=1e-5)
    # the robot-side single-step path, its own chunk state, zero noise by default
    first = det.act(obs[0])
    np.testing.assert_allclose(first, a[0], atol=1e-5)
    for _ in range(3):
        assert np.isfinite(det.act(obs[0])).all()


def test_exporter_checks_the_metadata():
    p = _policy(sample_steps=2)
    m = p.inference_module(stochastic=True)
    meta = _meta(m)
    wrapped = flow_exporter(m, meta)  # the folded copy (see the test above)
    assert wrapped is not m and len(wrapped.velocity) == 2 and m.velocity is None
    import dataclasses

    with pytest.raises(ValueError, match="noise_shape"):
        flow_exporter(m, dataclasses.replace(meta, noise_shape=[3, ACT]))
    with pytest.raises(ValueError, match="recurrent_state"):
        flow_exporter(m, dataclasses.replace(meta, recurrent_state=[]))
