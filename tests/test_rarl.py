"""Adversarial disturbances (RARL, training.adversary): bounded forces reach the
simulator, a push matters, the phases alternate, resume is exact, bad settings are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sim
from sim.randomization import SimToRealConfig
from training.adversary import Adversary, AdversaryConfig, bounded_forces
from training.algorithms.ppo import PPOConfig
from training.checkpoint import CheckpointError, load_checkpoint
from training.config import ConfigError
from training.policy_kinds import load_policy
from training.runner import OnPolicyRunner, parameters_vector
from training.train_configs import build_ppo_config

QUIET = ["run.progress=false", "run.video=false", "run.tensorboard=false"]
SMALL = [
    "env.num_envs=4",
    "ppo.num_steps=8",
    "env.threads=1",
    "run.torch_threads=1",
    "policy.actor_hidden=32,32",
    "policy.critic_hidden=32,32",
    "adversary.actor_hidden=16",
    "adversary.critic_hidden=16",
]
PER_ITER = 4 * 8


def _quadruped(n: int, **kw):
    return sim.make(
        "quadruped", n, seed=0, s2r=SimToRealConfig(), num_threads=1, fixed_command=[0.0] * 3, **kw
    )


def _applied(env, bodies=None) -> np.ndarray:
    """The forces MuJoCo applies to `bodies` in each env, read from its data."""
    ids = env.body_ids(bodies)
    return np.stack([env.engine.get_data(i).xfrc_applied[ids] for i in range(env.num_envs)])


def _runner(tmp_path, name, overrides, resume=None) -> OnPolicyRunner:
    cfg = build_ppo_config("quadruped", QUIET + SMALL + overrides)
    return OnPolicyRunner(cfg, tmp_path / name, resume=resume)


# ---------------------------------------------------------------------- bounded forces
def test_forces_never_exceed_the_bound_whatever_the_adversary_outputs():
    limit = 7.5
    actions = torch.tensor(
        [[0.1, -0.2, 0.3], [1e30, -3e38, 2.0], [float("nan"), 1.0, 0.0], [float("inf"), 0, 0]]
    )
    forces = bounded_forces(actions, limit)
    norms = torch.linalg.vector_norm(forces, dim=-1)
    assert torch.allclose(forces[0], actions[0].double() * limit)  # inside: proportional
    assert norms[1] == pytest.approx(limit)  # huge: clipped to the bound, direction kept
    assert forces[1, 1] < 0 < forces[1, 0]
    assert norms[2] == 0 and norms[3] == 0  # non-finite: no push

    env = _quadruped(3)
    env.reset()
    adversary = Adversary(
        AdversaryConfig(enabled=True, force_limit=limit), PPOConfig(num_steps=4), env, "cpu"
    )
    obs = env.reset()
    head = adversary.policy.actor[-1]
    for bias in (1e30, -1e38, float("nan"), float("inf")):
        with torch.no_grad():
            head.bias.fill_(bias)
        adversary.act(obs)
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 12))
        adversary.process_env_step(obs, reward, terminated, truncated, info)
        applied = _applied(env)
        assert np.isfinite(applied).all()
        assert (np.linalg.norm(applied[..., :3], axis=-1) <= limit * (1 + 1e-12)).all(), bias
        assert (applied[..., 3:] == 0).all()  # forces only, no torques
    # and a reset takes the push away with the episode
    env.set_external_forces(np.full((3, 3), 5.0))
    env.reset()
    assert (_applied(env) == 0).all()


def test_external_forces_refuse_bad_input():
    env = _quadruped(2)
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.set_external_forces(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="finite"):
        env.set_external_forces(np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="no bodies"):
        env.set_external_forces(np.zeros((2, 3)), bodies=["no_such_body"])


def test_a_bounded_lateral_push_changes_velocity_and_return():
    # the same standing robot twice, the second pushed sideways by a constant force
    env = _quadruped(2)
    env.reset()
    push = np.array([[0.0, 0.0, 0.0], [0.0, 50.0, 0.0]])
    returns = np.zeros(2)
    for _ in range(50):
        env.set_external_forces(push)
        _, reward, terminated, _, _ = env.step(torch.zeros(2, 12))
        returns += reward.numpy()
    assert not terminated.any()
    vy = env.engine.get("qvel")[:, 1]
    assert abs(vy[0]) < 0.01 and vy[1] > 0.1, vy
    assert returns[1] < 0.9 * returns[0], returns


# ---------------------------------------------------------------------- the game
def test_phases_alternate_and_the_frozen_side_does_not_change(tmp_path):
    runner = _runner(
        tmp_path,
        "run",
        [
            "adversary.enabled=true",
            "adversary.protagonist_iterations=2",
            "adversary.adversary_iterations=1",
            "run.total_steps=1000",
        ],
    )
    adversary = runner.adversary
    assert adversary is not None and adversary.group == "critic"  # privileged observations
    phases = []
    for _ in range(4):
        pro, adv = parameters_vector(runner.policy), parameters_vector(adversary.policy)
        runner._iteration(10)
        pro_changed = not torch.equal(pro, parameters_vector(runner.policy))
        adv_changed = not torch.equal(adv, parameters_vector(adversary.policy))
        assert pro_changed != adv_changed
        phases.append("adversary" if adv_changed else "protagonist")
    assert phases == ["protagonist", "protagonist", "adversary", "protagonist"]
    # zero-sum: the adversary's stored rewards are minus the protagonist's
    assert torch.equal(adversary.learner.storage.rewards, -runner.alg.storage.rewards)
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 4 and '"env/adversary_force"' in rows[0] and '"adversary/kl"' in rows[2]


def test_resume_with_the_adversary_is_exact(tmp_path):
    adv = [
        "adversary.enabled=true",
        "adversary.protagonist_iterations=1",
        "adversary.adversary_iterations=2",
    ]
    n = 3 * PER_ITER  # the split falls inside an adversary phase
    whole = _runner(tmp_path, "whole", adv + [f"run.total_steps={2 * n}"])
    whole.train()
    _runner(tmp_path, "split", adv + [f"run.total_steps={n}"]).train()
    resumed = _runner(tmp_path, "split", adv + [f"run.total_steps={2 * n}"], tmp_path / "split")
    resumed.train()
    assert resumed.env_steps == whole.env_steps == 2 * n
    assert torch.equal(parameters_vector(resumed.policy), parameters_vector(whole.policy))
    assert torch.equal(
        parameters_vector(resumed.adversary.policy), parameters_vector(whole.adversary.policy)
    )
    a = load_checkpoint(tmp_path / "whole" / "checkpoints" / "latest.pt")["adversary"]
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "latest.pt")["adversary"]
    for k in a["policy"]:
        assert torch.equal(a["policy"][k], b["policy"][k]), k
    state_a, state_b = a["algorithm"]["optimizer"]["state"], b["algorithm"]["optimizer"]["state"]
    for k in state_a:
        assert torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"]), k
    # export ignores the adversary: the run's policy is the protagonist alone
    loaded = load_policy(tmp_path / "whole")
    assert torch.equal(parameters_vector(loaded.policy), parameters_vector(whole.policy))


def test_resuming_a_run_without_adversary_with_one_is_refused(tmp_path):
    _runner(tmp_path, "plain", [f"run.total_steps={PER_ITER}"]).train()
    with pytest.raises(CheckpointError, match="without an adversary"):
        _runner(
            tmp_path,
            "plain",
            ["adversary.enabled=true", f"run.total_steps={2 * PER_ITER}"],
            tmp_path / "plain",
        )


def test_off_by_default():
    cfg = build_ppo_config("quadruped", QUIET)
    assert cfg.adversary.enabled is False


@pytest.mark.parametrize(
    "override, field",
    [
        ("adversary.force_limit=-5", "force_limit"),
        ("adversary.force_limit=nan", "force_limit"),
        ("adversary.protagonist_iterations=0", "protagonist_iterations"),
        ("adversary.adversary_iterations=0", "adversary_iterations"),
        ("adversary.lr=0", "lr"),
        ("adversary.schedule=cosine", "schedule"),
    ],
)
def test_bad_settings_name_the_field(override, field):
    with pytest.raises((ConfigError, ValueError), match=field):
        build_ppo_config("quadruped", QUIET + [override])


def test_unknown_body_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="adversary.bodies"):
        _runner(tmp_path, "run", ["adversary.enabled=true", "adversary.bodies=nowhere"])


@pytest.mark.parametrize(("phases", "updates"), [((1, 1), 3), ((2, 1), 4)])
def test_a_decaying_rate_spans_the_protagonists_own_updates(tmp_path, phases, updates):
    """With RARL the protagonist updates only in its phases: a linear rate reaches its end
    at the last of those updates, not half-way down."""
    p, a = phases
    extra = [*QUIET, *SMALL, "adversary.enabled=true", f"adversary.protagonist_iterations={p}",
             f"adversary.adversary_iterations={a}", "ppo.schedule=linear", "ppo.lr=1e-3",
             f"run.total_steps={6 * PER_ITER}"]  # fmt: skip
    runner = OnPolicyRunner(build_ppo_config("quadruped", extra), tmp_path / "run")
    assert runner.alg.cfg.total_updates == updates
    runner.train()
    assert runner.alg.learning_rate == pytest.approx(0.0)
