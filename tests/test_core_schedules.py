"""Learning-rate schedules, adaptive KL and the KL early stop."""

import math
import pickle

import pytest

from training.core import AdaptiveKL, constant, cosine, kl_early_stop, linear


def test_constant():
    s = constant(3e-4)
    assert s(0) == s(10_000) == 3e-4


def test_linear():
    s = linear(1.0, 0.0, 10)
    assert [s(0), s(5), s(10), s(20)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="total"):
        linear(1.0, 0.0, 0)


def test_cosine_with_warmup():
    s = cosine(1.0, 0.1, total=10, warmup=2)
    assert s(0) == 0.0
    assert s(1) == pytest.approx(0.5)
    assert s(2) == pytest.approx(1.0)
    # halfway through the 8 decay steps: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
    assert s(6) == pytest.approx(0.55)
    assert s(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert s(10) == pytest.approx(0.1)
    assert s(100) == pytest.approx(0.1)
    assert cosine(1.0, 0.0, 4)(0) == 1.0
    with pytest.raises(ValueError, match="warmup"):
        cosine(1.0, 0.0, 4, warmup=4)
    with pytest.raises(ValueError, match="step"):
        s(-1)


def test_schedules_round_trip_state_and_pickle():
    s = cosine(3e-4, 1e-5, 1000, 50)
    restored = cosine(1.0, 0.0, 1)
    restored.load_state_dict(s.state_dict())
    assert restored == s
    assert pickle.loads(pickle.dumps(s))(123) == s(123)
    with pytest.raises(ValueError, match="expected keys"):
        restored.load_state_dict({"start": 1.0})


def test_adaptive_kl_down_up_stay_and_bounds():
    ctl = AdaptiveKL(lr=1e-3, target_kl=0.01)
    assert ctl.update(0.03) == pytest.approx(1e-3 / 1.5)  # kl > 2 * target
    assert ctl.update(0.004) == pytest.approx(1e-3)  # kl < target / 2
    assert ctl.update(0.01) == pytest.approx(1e-3)  # inside [target/2, 2*target]
    assert ctl.update(0.02) == pytest.approx(1e-3)  # the edges stay
    assert ctl.update(0.005) == pytest.approx(1e-3)
    assert ctl(7) == ctl.lr

    top = AdaptiveKL(lr=8e-3, target_kl=0.01)
    assert top.update(0.0) == 1e-2
    bottom = AdaptiveKL(lr=1.2e-6, target_kl=0.01)
    assert bottom.update(1.0) == 1e-6

    state = ctl.state_dict()
    ctl.update(1.0)
    fresh = AdaptiveKL(lr=1e-4, target_kl=0.02)
    fresh.load_state_dict(state)
    assert fresh.lr == pytest.approx(1e-3) and fresh.target_kl == 0.01
    assert pickle.loads(pickle.dumps(fresh)) == fresh

    with pytest.raises(ValueError, match="not finite"):
        ctl.update(float("nan"))
    with pytest.raises(ValueError, match="outside"):
        AdaptiveKL(lr=1.0, target_kl=0.01)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKL(lr=1e-3, target_kl=0.0)


def test_kl_early_stop():
    assert kl_early_stop(0.03, 0.02)
    assert not kl_early_stop(0.01, 0.02)
    assert not kl_early_stop(5.0, None)
    assert kl_early_stop(float("inf"), 0.02)
