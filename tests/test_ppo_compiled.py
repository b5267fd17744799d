"""PPO's compiled minibatch step (ppo.compile): the flag reaches the learner, compiled and
eager agree on a fixed batch, the guard skips a non-finite step, training and exact resume
work, recurrent policies are refused.

Compiling costs ~20 s on a cold Inductor cache (a few seconds when the cache in
/tmp/torchinductor_$USER is warm). Dynamo caches the compiled graph per function and
guards on the values it read (shapes, config numbers), not on the learner object, so
every test here uses the same settings and they all share one compilation.
"""

from __future__ import annotations

import pytest
import torch

from policies import ActorCritic, ActorCriticConfig
from training.algorithms import PPO, PPOConfig
from training.checkpoint import load_checkpoint
from training.runner import OnPolicyRunner, parameters_vector
from training.train_configs import build_ppo_config

# small enough that a rollout and an update take milliseconds; every runner here shares
# these, so the compiled graph (which depends on shapes and config values) is one
SETTINGS = [
    "run.progress=false",
    "run.video=false",
    "run.tensorboard=false",
    "env.num_envs=4",
    "ppo.num_steps=16",
    "ppo.num_minibatches=2",
    "ppo.num_epochs=2",
    "policy.actor_hidden=16,16",
    "policy.critic_hidden=16,16",
]
PER_ITERATION = 4 * 16

# compiled and eager differ in the last bits from the first forward pass on (Inductor
# fuses and vectorizes the elementwise ops and reductions differently): on this batch
# the statistics differ by up to 7e-8 relative, the parameters after one step by 3e-8
STATS_RTOL = 1e-5
PARAMS_ATOL = 1e-6


def _runner(path, compile_: bool, total_steps: int = 2 * PER_ITERATION, resume=None):
    cfg = build_ppo_config(
        "cartpole",
        SETTINGS + [f"ppo.compile={str(compile_).lower()}", f"run.total_steps={total_steps}"],
    )
    return OnPolicyRunner(cfg, path, resume=resume)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(compiled, eager) runners from the same seed, each with one rollout stored and its
    advantages computed, ready for minibatch steps."""
    root = tmp_path_factory.mktemp("compiled")
    runners = []
    for name, compile_ in (("compiled", True), ("eager", False)):
        # built and rolled out one after the other: a runner seeds the global generator
        # its actions are sampled from, and acting is eager either way, so the two
        # rollouts are identical
        r = _runner(root / name, compile_)
        r._rollout()
        c = r.alg.cfg
        r.alg.storage.compute_advantages(c.gamma, c.lam, c.normalize_advantages)
        runners.append(r)
    return tuple(runners)


def _batch(runner):
    return next(runner.alg.storage.minibatches(2, torch.Generator().manual_seed(0)))


def test_the_config_flag_reaches_the_learner(pair):
    compiled, eager = pair
    assert compiled.alg.cfg.compile and not eager.alg.cfg.compile
    assert eager.alg._loss_fn == eager.alg._losses
    assert compiled.alg._loss_fn != compiled.alg._losses
    # the function is compiled, not the module: checkpoints keep their keys
    assert list(compiled.policy.state_dict()) == list(eager.policy.state_dict())
    assert not any("_orig_mod" in k for k in compiled.policy.state_dict())


def test_compiled_step_agrees_with_eager_on_a_fixed_batch(pair):
    compiled, eager = pair
    start = parameters_vector(eager.policy).clone()
    assert torch.equal(parameters_vector(compiled.policy), start)
    bc, be = _batch(compiled), _batch(eager)
    assert torch.equal(bc.obs["policy"], be.obs["policy"])
    assert torch.equal(bc.advantages, be.advantages)
    stats_c = compiled.alg._minibatch_step(bc)
    stats_e = eager.alg._minibatch_step(be)
    assert stats_c is not None and stats_e is not None
    # loss, kl, policy loss, value loss, entropy, approx kl, clip fraction, grad norm
    assert stats_c == pytest.approx(stats_e, rel=STATS_RTOL, abs=1e-7)
    torch.testing.assert_close(
        parameters_vector(compiled.policy),
        parameters_vector(eager.policy),
        rtol=0,
        atol=PARAMS_ATOL,
    )
    # the step did move the weights (the comparison is not of two untouched policies)
    assert not torch.equal(parameters_vector(compiled.policy), start)


def _adam_state(alg) -> list[torch.Tensor]:
    return [v.clone() for st in alg.optimizer.state.values() for v in st.values()]


def test_the_guard_skips_a_nonfinite_step_in_compiled_mode(pair):
    alg = pair[0].alg
    batch = _batch(pair[0])
    assert alg._minibatch_step(batch) is not None  # Adam has moments to leave untouched
    before, adam = parameters_vector(alg.policy).clone(), _adam_state(alg)
    skipped = alg.guard.nonfinite_steps
    batch.advantages[0] = float("nan")
    assert alg._minibatch_step(batch) is None
    assert alg.guard.nonfinite_steps == skipped + 1
    assert torch.equal(parameters_vector(alg.policy), before)
    assert all(torch.equal(a, b) for a, b in zip(_adam_state(alg), adam, strict=True))
    assert all(p.grad is None for p in alg.params)
    # the same compiled graph steps on a finite batch afterwards
    batch.advantages[0] = 0.0
    assert alg._minibatch_step(batch) is not None
    assert not torch.equal(parameters_vector(alg.policy), before)


def test_compiled_training_resumes_exactly(tmp_path):
    n = 2 * PER_ITERATION
    whole = _runner(tmp_path / "whole", True, 2 * n)
    whole.train()
    _runner(tmp_path / "split", True, n).train()
    resumed = _runner(tmp_path / "split", True, 2 * n, resume=tmp_path / "split")
    resumed.train()
    assert resumed.env_steps == whole.env_steps == 2 * n
    # compiled kernels are deterministic: resume N + N equals 2N to the bit
    assert torch.equal(parameters_vector(resumed.policy), parameters_vector(whole.policy))
    ck = load_checkpoint(tmp_path / "split" / "checkpoints" / "latest.pt")
    assert set(ck["policy"]) == set(whole.policy.state_dict())
    # a compiled run's checkpoint continues eagerly (the flag is no part of the architecture)
    eager = _runner(tmp_path / "split", False, 3 * n, resume=tmp_path / "split")
    eager.train()
    assert eager.env_steps == 3 * n


def test_a_recurrent_policy_is_refused():
    policy = ActorCritic(1, None, 1, ActorCriticConfig(rnn_type="gru", rnn_hidden=8))
    with pytest.raises(ValueError, match="recurrent"):
        PPO(policy, PPOConfig(num_steps=4, num_minibatches=2, compile=True), 4, {"policy": 1}, 1)
