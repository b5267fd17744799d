"""The policy loss against numbers worked out by hand on tiny tensors."""

import math

import pytest
import torch

from training.core import (
    POLICY_LOSS_PRESETS,
    PolicyLossConfig,
    aggregate,
    get_loss_config,
    kl_estimate,
    kl_reward_penalty,
    policy_loss,
    value_loss,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def logs(*ratios: float) -> torch.Tensor:
    """logp_new that gives these ratios against logp_old = 0."""
    return torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)


def close(actual: torch.Tensor, expected, tol: float = 1e-9) -> None:
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol
    )


def test_ppo_clip_both_signs_of_advantage_with_gradients():
    new = logs(1.5, 0.5, 1.1, 0.9, 1.5, 0.5)
    adv = t(1.0, -1.0, 2.0, -2.0, -1.0, 1.0)
    loss, stats = policy_loss(new, torch.zeros(6, dtype=torch.float64), adv, PolicyLossConfig())
    # per element -min(r*A, clip(r, 0.8, 1.2)*A):
    # 1.5,+1 -> -1.2 (clipped) | 0.5,-1 -> +0.8 (clipped) | 1.1,+2 -> -2.2 | 0.9,-2 -> +1.8
    # 1.5,-1 -> +1.5 (pessimistic branch, not clipped) | 0.5,+1 -> -0.5 (not clipped)
    per = [-1.2, 0.8, -2.2, 1.8, 1.5, -0.5]
    close(loss, sum(per) / 6)
    close(stats["policy_loss"], sum(per) / 6)
    close(stats["clip_frac"], 2 / 6)
    close(stats["ratio_mean"], (1.5 + 0.5 + 1.1 + 0.9 + 1.5 + 0.5) / 6)
    close(stats["ratio_max"], 1.5)
    kl = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 0.9, 1.5, 0.5)]
    close(stats["approx_kl"], sum(kl) / 6)
    loss.backward()
    # d loss / d logp_new = -A * r / 6 where unclipped, exactly 0 where clipped.
    close(new.grad, [0.0, 0.0, -2 * 1.1 / 6, 2 * 0.9 / 6, 1.5 / 6, -0.5 / 6])
    assert new.grad[0] == 0 and new.grad[1] == 0
    assert all(not v.requires_grad for v in stats.values())


def test_asymmetric_clip_higher():
    cfg = PolicyLossConfig(eps_low=0.2, eps_high=0.28)
    new = logs(1.25, 1.3, 0.75)
    loss, stats = policy_loss(new, torch.zeros(3, dtype=torch.float64), t(1, 1, -1), cfg)
    # 1.25 stays under 1.28; 1.3 -> 1.28; 0.75 -> 0.8 on the low side (A < 0)
    close(loss, (-1.25 - 1.28 + 0.8) / 3)
    close(stats["clip_frac"], 2 / 3)
    sym, _ = policy_loss(new, torch.zeros(3, dtype=torch.float64), t(1, 1, -1), PolicyLossConfig())
    close(sym, (-1.2 - 1.2 + 0.8) / 3)


def test_dual_clip_bounds_negative_advantages():
    cfg = get_loss_config("dual_clip")
    new = logs(4.0, 2.0, 4.0, 0.5)
    adv = t(-1.0, -1.0, 1.0, -2.0)
    loss, stats = policy_loss(new, torch.zeros(4, dtype=torch.float64), adv, cfg)
    # r=4,A=-1: min(-4,-1.2)=-4, bounded by 3*A=-3 -> loss 3 (dual active)
    # r=2,A=-1: -2 > -3 -> loss 2 (gradient flows)
    # r=4,A=+1: ordinary clip -> -1.2 ; r=0.5,A=-2: min(-1,-1.6)=-1.6 -> 1.6 (ordinary clip)
    close(loss, (3 + 2 - 1.2 + 1.6) / 4)
    close(stats["clip_frac"], 3 / 4)
    loss.backward()
    close(new.grad, [0.0, 2.0 / 4, 0.0, 0.0])
    plain, _ = policy_loss(
        new.detach(), torch.zeros(4, dtype=torch.float64), adv, PolicyLossConfig()
    )
    close(plain, (4 + 2 - 1.2 + 1.6) / 4)


def test_log_ratio_clip_cpgd():
    cfg = get_loss_config("cpgd", log_ratio_delta=0.2)
    new = t(0.3, -0.3, 0.1, 0.3).requires_grad_(True)
    adv = t(1.0, -1.0, 1.0, -1.0)
    loss, stats = policy_loss(new, torch.zeros(4, dtype=torch.float64), adv, cfg)
    # objective min(log r * A, clip(log r, -0.2, 0.2) * A):
    # 0.3,+1 -> 0.2 (clipped) | -0.3,-1 -> 0.2 (clipped) | 0.1,+1 -> 0.1 | 0.3,-1 -> -0.3
    close(loss, (-0.2 - 0.2 - 0.1 + 0.3) / 4)
    close(stats["clip_frac"], 0.5)
    loss.backward()
    close(new.grad, [0.0, 0.0, -1 / 4, 1 / 4])


def test_spo_objective_and_gradient():
    cfg = get_loss_config("spo")
    new = logs(1.5, 0.5)
    adv = t(2.0, -1.0)
    loss, stats = policy_loss(new, torch.zeros(2, dtype=torch.float64), adv, cfg)
    # r*A - |A|/(2*0.2)*(r-1)^2: 3 - 5*0.25 = 1.75 ; -0.5 - 2.5*0.25 = -1.125
    close(loss, (-1.75 + 1.125) / 2)
    close(stats["clip_frac"], 1.0)  # both beyond the PPO range on the side A pushes
    loss.backward()
    # d obj/dr = A - |A|/eps*(r-1); times dr/dlogp = r; loss = -mean
    g0 = (2 - 2 / 0.2 * 0.5) * 1.5
    g1 = (-1 - 1 / 0.2 * (-0.5)) * 0.5
    close(new.grad, [-g0 / 2, -g1 / 2])
    # asymmetric: A >= 0 uses eps_high, A < 0 uses eps_low
    asym = get_loss_config("spo", eps_high=0.25)
    loss2, _ = policy_loss(new.detach(), torch.zeros(2, dtype=torch.float64), adv, asym)
    close(loss2, (-(3 - 2 / 0.5 * 0.25) + 1.125) / 2)


def test_aspo_clips_positive_advantages_and_pulls_negative_ones_back():
    """FPO++'s asymmetric trust region: PPO's clip where A > 0, SPO where A < 0."""
    cfg = get_loss_config("aspo", eps_low=0.2, eps_high=0.2)
    new = logs(1.5, 1.1, 0.5, 0.9)
    adv = t(2.0, 2.0, -1.0, -1.0)
    loss, stats = policy_loss(new, torch.zeros(4, dtype=torch.float64), adv, cfg)
    # A > 0: min(r A, clip(r) A) = 2.4 (clipped), 2.2 ; A < 0: r A - |A|/(2 eps) (r - 1)^2
    objs = [2.4, 2.2, -0.5 - 2.5 * 0.25, -0.9 - 2.5 * 0.01]
    close(loss, -sum(objs) / 4)
    close(stats["clip_frac"], 0.5)  # 1.5 with A > 0, 0.5 with A < 0
    loss.backward()
    g2 = (-1 - 1 / 0.2 * (0.5 - 1)) * 0.5
    g3 = (-1 - 1 / 0.2 * (0.9 - 1)) * 0.9
    # the clipped element has no gradient; SPO's side keeps one beyond the bound
    close(new.grad, [0.0, -2.0 * 1.1 / 4, -g2 / 4, -g3 / 4])


def test_gspo_sequence_ratio_with_mask():
    new = torch.tensor([[0.1, 0.3, 5.0], [-0.2, 0.0, -0.1]], dtype=torch.float64)
    new.requires_grad_(True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = t(1.0, -1.0)  # one advantage per sequence
    cfg = get_loss_config("gspo", eps_low=0.2, eps_high=0.2)
    loss, stats = policy_loss(new, old, adv, cfg, mask=mask)
    r0 = math.exp((0.1 + 0.3) / 2)  # the padded 5.0 does not count
    r1 = math.exp((-0.2 + 0.0 - 0.1) / 3)
    assert r0 > 1.2 and 0.8 < r1 < 1.0
    close(loss, (-1.2 + r1) / 2)  # row 0 clipped at 1.2, row 1 unclipped: -(r1 * -1)
    close(stats["clip_frac"], 2 / 5)
    close(stats["ratio_mean"], (2 * r0 + 3 * r1) / 5)
    loss.backward()
    # row 1: d(r1)/d logp_j = r1 / 3; the row's token mean is the sequence loss; mean of 2 rows
    close(new.grad, [[0.0, 0.0, 0.0], [r1 / 6, r1 / 6, r1 / 6]])
    # with GSPO's own narrow band both sequences are clipped
    loss_narrow, stats_narrow = policy_loss(new, old, adv, get_loss_config("gspo"), mask=mask)
    close(loss_narrow, (-(1 + 4e-4) + (1 - 3e-4)) / 2)
    close(stats_narrow["clip_frac"], 1.0)


def test_reinforce():
    new = t(-1.0, -0.5).requires_grad_(True)
    cfg = get_loss_config("reinforce")
    loss, stats = policy_loss(new, new.detach(), t(2.0, -1.0), cfg)
    close(loss, (2.0 - 0.5) / 2)
    close(stats["clip_frac"], 0.0)
    close(stats["ratio_mean"], 1.0)
    loss.backward()
    close(new.grad, [-2.0 / 2, 1.0 / 2])


def test_kl_estimators():
    logp = t(-1.0, -2.0)
    ref = t(-1.5, -1.0)  # logp - ref = 0.5, -1.0
    close(kl_estimate(logp, ref, "k1"), [0.5, -1.0])
    close(kl_estimate(logp, ref, "k2"), [0.125, 0.5])
    close(kl_estimate(logp, ref, "k3"), [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k4")


def test_kl_as_loss_term_and_as_reward_penalty():
    new = t(-1.0, -2.0)
    ref = t(-1.5, -1.0)
    adv = t(1.0, 3.0)
    cfg = PolicyLossConfig(kl_coef=0.1, kl_estimator="k1")
    loss, stats = policy_loss(new, new, adv, cfg, logp_ref=ref)
    close(stats["kl_ref"], (0.5 - 1.0) / 2)
    close(loss, -(1.0 + 3.0) / 2 + 0.1 * (0.5 - 1.0) / 2)
    close(kl_reward_penalty(t(1.0, 1.0), new, ref, 0.1, "k1"), [0.95, 1.1])
    with pytest.raises(ValueError, match="needs logp_ref"):
        policy_loss(new, new, adv, cfg)


def test_entropy_bonus():
    new = t(-1.0, -2.0)
    cfg = PolicyLossConfig(entropy_coef=0.01)
    loss, stats = policy_loss(new, new, t(1.0, 3.0), cfg, entropy=t(0.5, 1.5))
    close(stats["entropy"], 1.0)
    close(loss, -2.0 - 0.01 * 1.0)
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(new, new, t(1.0, 3.0), cfg)


def test_per_element_weights_dppo_discount():
    # three denoising steps of one env step, denoising discount 0.9^(K-k-1)
    new = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([[0.81, 0.9, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss(new, new.detach(), t(2.0), PolicyLossConfig(), weights=weights)
    close(loss, -2.0 * (0.81 + 0.9 + 1.0) / 3)
    loss.backward()
    close(new.grad, [[-2.0 * 0.81 / 3, -2.0 * 0.9 / 3, -2.0 / 3]])


def test_clip_scale_widens_the_clip_range():
    new = logs(1.15, 1.15)
    cfg = PolicyLossConfig(eps_low=0.1, eps_high=0.1)
    loss, stats = policy_loss(
        new, torch.zeros(2, dtype=torch.float64), t(1.0, 1.0), cfg, clip_scale=t(1.0, 2.0)
    )
    close(loss, -(1.1 + 1.15) / 2)
    close(stats["clip_frac"], 0.5)


AGG_VALUES = [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]]
AGG_MASK = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]  # last row is all padding


@pytest.mark.parametrize(
    ("mode", "norm_constant", "expected"),
    [
        ("token_mean", None, (1 + 2 + 3 + 4) / 4),
        ("seq_mean_token_mean", None, (6 / 3 + 4 / 1) / 2),
        ("seq_mean_token_sum_norm", None, (6 / 3 + 4 / 3) / 2),
        ("seq_mean_token_sum_norm", 4.0, (6 / 4 + 4 / 4) / 2),
    ],
)
def test_aggregations_with_padding(mode, norm_constant, expected):
    values = torch.tensor(AGG_VALUES, dtype=torch.float64)
    mask = torch.tensor(AGG_MASK, dtype=torch.bool)
    close(aggregate(values, mask, mode, norm_constant), expected)
    # the same through the loss: on-policy, loss per element = -A
    cfg = PolicyLossConfig(aggregation=mode, norm_constant=norm_constant)
    zeros = torch.zeros(3, 3, dtype=torch.float64)
    loss, _ = policy_loss(zeros, zeros, -values, cfg, mask=mask)
    close(loss, expected)


def test_decoupled_proximal_policy():
    old = torch.zeros(2, dtype=torch.float64)
    prox = t(math.log(1.1), math.log(0.9))
    new = logs(1.43, 0.99)  # r_prox = 1.3 (clipped at 1.2) and 1.1
    cfg = PolicyLossConfig(decoupled=True)
    loss, stats = policy_loss(new, old, t(1.0, 1.0), cfg, logp_prox=prox)
    close(loss, -(1.1 * 1.2 + 0.9 * 1.1) / 2)
    close(stats["clip_frac"], 0.5)
    close(stats["off_policy_weight_mean"], 1.0)
    loss.backward()
    close(new.grad, [0.0, -0.9 * 1.1 / 2])
    coupled, _ = policy_loss(new.detach(), old, t(1.0, 1.0), PolicyLossConfig())
    close(coupled, -(1.2 + 0.99) / 2)
    with pytest.raises(ValueError, match="needs logp_prox"):
        policy_loss(new, old, t(1.0, 1.0), cfg)
    with pytest.raises(ValueError, match="decoupled is False"):
        policy_loss(new, old, t(1.0, 1.0), PolicyLossConfig(), logp_prox=prox)


def test_one_dim_equals_column_layout_and_row_advantages():
    gen = torch.Generator().manual_seed(0)
    new = torch.randn(5, generator=gen, dtype=torch.float64) * 0.3
    old = torch.randn(5, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    a, _ = policy_loss(new, old, adv, PolicyLossConfig())
    b, _ = policy_loss(new[:, None], old[:, None], adv, PolicyLossConfig())
    c, _ = policy_loss(new[:, None], old[:, None], adv[:, None], PolicyLossConfig())
    close(a, b)
    close(a, c)


def test_value_loss_plain_and_clipped():
    values, old, returns = t(1.0, 2.0), t(0.5, 2.5), t(2.0, 0.0)
    close(value_loss(values, old, returns, clip_eps=None), 0.5 * (1.0 + 4.0) / 2)
    # clipped values 0.7 and 2.3: max(1, 1.69) and max(4, 5.29)
    close(value_loss(values, old, returns, clip_eps=0.2), 0.5 * (1.69 + 5.29) / 2)
    close(
        value_loss(values, old, returns, clip_eps=0.2, mask=torch.tensor([True, False])),
        0.5 * 1.69,
    )
    with pytest.raises(ValueError, match="old_values"):
        value_loss(values, None, returns, clip_eps=0.2)


def test_presets_and_registry():
    assert set(POLICY_LOSS_PRESETS) >= {
        "ppo",
        "dual_clip",
        "cpgd",
        "spo",
        "aspo",
        "reinforce",
        "grpo",
        "dapo",
        "dr_grpo",
        "gspo",
    }
    assert get_loss_config("dapo").eps_high == 0.28
    assert get_loss_config("gspo").ratio == "sequence"
    assert get_loss_config("dr_grpo").aggregation == "seq_mean_token_sum_norm"
    cfg = get_loss_config("ppo", eps_high=0.3)
    assert cfg.eps_high == 0.3 and POLICY_LOSS_PRESETS["ppo"].eps_high == 0.2
    with pytest.raises(ValueError, match="known:.*'dapo'"):
        get_loss_config("ppo2")
    with pytest.raises(ValueError, match="unknown PolicyLossConfig field"):
        get_loss_config("ppo", epsilon=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eps_low": -0.1}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"clip": "trust"}, "clip='trust' is unknown"),
        ({"ratio": "tokens"}, "ratio='tokens' is unknown"),
        ({"aggregation": "mean"}, "aggregation='mean' is unknown"),
        ({"kl_estimator": "k5"}, "kl_estimator"),
        ({"dual_clip_c": 0.5}, "dual_clip_c"),
        ({"log_ratio_delta": 0.0}, "log_ratio_delta"),
        ({"norm_constant": -1.0}, "norm_constant"),
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"ratio": "none"}, "set clip='none'"),
        ({"eps_low": float("nan")}, "finite"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**kwargs)


def test_bad_shapes():
    cfg = PolicyLossConfig()
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(4), torch.zeros(4), torch.zeros(3), cfg)
    with pytest.raises(ValueError, match="one value per row"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), cfg)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), cfg)
    with pytest.raises(ValueError, match="logp_old"):
        policy_loss(torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(2), cfg)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), cfg, mask=torch.ones(2))
    with pytest.raises(ValueError, match="1-D"):
        policy_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2), cfg)


def test_extreme_ratio_gives_finite_zero_gradient_when_clipped():
    new = torch.tensor([200.0], requires_grad=True)
    loss, _ = policy_loss(new, torch.zeros(1), torch.ones(1), PolicyLossConfig())
    loss.backward()
    assert torch.isfinite(loss) and new.grad.item() == 0.0


@pytest.mark.parametrize("name", ["ppo", "reinforce", "gspo"])
def test_padding_with_infinite_log_probs_stays_out_of_loss_and_gradient(name):
    new = torch.tensor([[-0.5, float("-inf")], [-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.4, float("-inf")], [-1.0, -2.1]])
    mask = torch.tensor([[True, False], [True, True]])
    loss, stats = policy_loss(new, old, torch.tensor([1.0, -1.0]), get_loss_config(name), mask=mask)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
    assert torch.isfinite(new.grad).all() and new.grad[0, 1] == 0


def test_no_mask_is_the_all_ones_mask_to_the_bit():
    # the mask-free fast path must not change a single bit of the loss or its gradient
    g = torch.Generator().manual_seed(0)
    new = torch.randn(257, generator=g, requires_grad=True)
    old, adv, ent = (torch.randn(257, generator=g) for _ in range(3))
    cfg = get_loss_config("ppo", entropy_coef=0.01)
    loss_a, stats_a = policy_loss(new, old, adv, cfg, entropy=ent)
    (grad_a,) = torch.autograd.grad(loss_a, new)
    loss_b, stats_b = policy_loss(new, old, adv, cfg, entropy=ent, mask=torch.ones(257))
    (grad_b,) = torch.autograd.grad(loss_b, new)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    for k in stats_a:
        assert torch.equal(stats_a[k], stats_b[k]), k
    x = torch.randn(7, 5, generator=g)
    assert torch.equal(aggregate(x), aggregate(x, torch.ones(7, 5)))
    assert aggregate(torch.empty(0)).item() == 0.0


LOG_RATIO_CONFIGS = {
    "ppo": PolicyLossConfig(),
    "dual": PolicyLossConfig(clip="dual"),
    "cpgd": PolicyLossConfig(clip="log"),
    "spo": PolicyLossConfig(clip="spo", eps_low=0.1, eps_high=0.3),
    "unclipped": PolicyLossConfig(clip="none"),
    "gspo": get_loss_config("gspo"),
    "dr_grpo": get_loss_config("dr_grpo"),
    "entropy": PolicyLossConfig(entropy_coef=0.01),
}


@pytest.mark.parametrize("name", sorted(LOG_RATIO_CONFIGS))
def test_log_ratio_gives_exactly_the_loss_of_its_pair(name):
    """A learner without a likelihood (FPO) hands the core only log(p_new / p_old): loss,
    statistics and gradient are those of the pair it came from, to the bit."""
    cfg = LOG_RATIO_CONFIGS[name]
    gen = torch.Generator().manual_seed(3)
    new = (torch.randn(6, 4, generator=gen) * 0.3).requires_grad_(True)
    old = torch.randn(6, 4, generator=gen) * 0.3
    adv = torch.randn(6, 4, generator=gen)
    mask = torch.rand(6, 4, generator=gen) > 0.3
    weights = torch.rand(1, 4, generator=gen)
    scale = torch.rand(1, 4, generator=gen) + 0.5
    entropy = torch.rand(6, 4, generator=gen)
    kw = dict(mask=mask, weights=weights, clip_scale=scale, entropy=entropy)
    loss_a, stats_a = policy_loss(new, old, adv, cfg, **kw)
    loss_a.backward()
    grad_a = new.grad.clone()
    new.grad = None
    loss_b, stats_b = policy_loss(None, None, adv, cfg, log_ratio=new - old, **kw)
    loss_b.backward()
    assert torch.equal(loss_a, loss_b)
    assert stats_a.keys() == stats_b.keys()
    for k in stats_a:
        assert torch.equal(stats_a[k], stats_b[k]), k
    assert torch.equal(grad_a, new.grad)
    # 1-D elements as well
    flat_a, fs_a = policy_loss(new[:, 0], old[:, 0], adv[:, 0], cfg, entropy=entropy[:, 0])
    flat_b, fs_b = policy_loss(
        None, None, adv[:, 0], cfg, log_ratio=new[:, 0] - old[:, 0], entropy=entropy[:, 0]
    )
    assert torch.equal(flat_a, flat_b)
    assert all(torch.equal(fs_a[k], fs_b[k]) for k in fs_a)


def test_log_ratio_refuses_what_needs_log_probabilities():
    lr = torch.zeros(3)
    adv = torch.ones(3)
    with pytest.raises(ValueError, match="not both"):
        policy_loss(torch.zeros(3), torch.zeros(3), adv, PolicyLossConfig(), log_ratio=lr)
    with pytest.raises(ValueError, match="not both"):
        policy_loss(torch.zeros(3), None, adv, PolicyLossConfig(), log_ratio=lr)
    with pytest.raises(ValueError, match="needs logp_new and logp_old"):
        policy_loss(None, None, adv, PolicyLossConfig())
    with pytest.raises(ValueError, match="REINFORCE"):
        policy_loss(None, None, adv, get_loss_config("reinforce"), log_ratio=lr)
    with pytest.raises(ValueError, match="KL to a reference"):
        policy_loss(None, None, adv, get_loss_config("grpo"), log_ratio=lr)
    with pytest.raises(ValueError, match="KL to a reference"):
        policy_loss(None, None, adv, PolicyLossConfig(), log_ratio=lr, logp_ref=lr)
    with pytest.raises(ValueError, match="decoupled proximal"):
        policy_loss(None, None, adv, PolicyLossConfig(decoupled=True), log_ratio=lr)
    with pytest.raises(ValueError, match="decoupled proximal"):
        policy_loss(None, None, adv, PolicyLossConfig(), log_ratio=lr, logp_prox=lr)
    with pytest.raises(ValueError, match="log_ratio has shape"):
        policy_loss(None, None, adv, PolicyLossConfig(), log_ratio=lr, mask=torch.ones(2))
    with pytest.raises(ValueError, match="log_ratio must be 1-D"):
        policy_loss(None, None, adv, PolicyLossConfig(), log_ratio=torch.zeros(1, 1, 3))
