"""benchmarks/vla_gradient_agreement.py's estimator on gradients of known signal and noise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "vla_gradient_agreement.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vla_gradients", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("noise_scale", [0.5, 3.0])
def test_signal_and_noise_of_independent_batches_are_recovered(bench, noise_scale):
    g = torch.Generator().manual_seed(0)
    dim, batches = 20_000, 12
    mu = torch.randn(dim, generator=g, dtype=torch.float64) / dim**0.5  # |mu|^2 ~ 1
    grads = [mu + noise_scale * torch.randn(dim, generator=g, dtype=torch.float64) / dim**0.5
             for _ in range(batches)]  # fmt: skip
    r = bench.agreement(grads)
    signal, noise = float(mu @ mu), noise_scale**2
    assert r["signal"] == pytest.approx(signal, rel=0.1)
    assert r["noise"] == pytest.approx(noise, rel=0.1)
    # independent batches agree as signal / (signal + noise)
    assert r["cos_mean"] == pytest.approx(signal / (signal + noise), abs=0.05)


def test_pure_noise_gives_no_agreement_and_one_batch_is_refused(bench):
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(5_000, generator=g, dtype=torch.float64) for _ in range(10)]
    r = bench.agreement(grads)
    assert abs(r["cos_mean"]) < 0.02 and abs(r["signal"]) < 0.05 * r["noise"]
    with pytest.raises(SystemExit, match="fewer than two batches"):
        bench.agreement(grads[:1])
