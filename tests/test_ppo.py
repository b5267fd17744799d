"""PPO: bootstrapping, the shared non-finite guard, checkpoints, config checks and a tiny
learning run."""

import io

import pytest
import torch
import torch.distributed as dist

import training.algorithms.ppo as ppo_module
from policies import ActorCritic, ActorCriticConfig
from training.algorithms import PPO, PPOConfig
from training.storage import RolloutStorage


class Bandit:
    """One-step episodes: obs is +-1, reward -(a - 0.5 * obs)^2; every step terminates."""

    def __init__(self, num_envs: int, seed: int = 0, critic: bool = False):
        self.n, self.critic = num_envs, critic
        self.g = torch.Generator().manual_seed(seed)

    def _obs(self):
        self.x = torch.randint(0, 2, (self.n, 1), generator=self.g).float() * 2 - 1
        o = {"policy": self.x.clone()}
        if self.critic:
            o["critic"] = torch.cat([self.x, -self.x], 1)
        return o

    def reset(self):
        return self._obs()

    def step(self, actions):
        reward = -(actions - 0.5 * self.x).square().sum(-1)
        final = {"policy": self.x.clone()}
        if self.critic:
            final["critic"] = torch.cat([self.x, -self.x], 1)
        terminated = torch.ones(self.n, dtype=torch.bool)
        return self._obs(), reward, terminated, torch.zeros_like(terminated), {"final_obs": final}


def rollout(algo: PPO, env, obs):
    for _ in range(algo.cfg.num_steps):
        actions = algo.act(obs)
        obs, r, te, tr, info = env.step(actions)
        algo.process_env_step(obs, r, te, tr, info)
    return obs


def make_ppo(num_envs=16, rnn_type=None, critic=False, **kw):
    torch.manual_seed(0)
    cfg = PPOConfig(**{"num_steps": 4, "num_minibatches": 2, "num_epochs": 2, **kw})
    acfg = ActorCriticConfig(
        actor_hidden=(16,), critic_hidden=(16,), rnn_hidden=8, rnn_type=rnn_type
    )
    policy = ActorCritic(1, 2 if critic else None, 1, acfg)
    sizes = {"policy": 1, **({"critic": 2} if critic else {})}
    return PPO(policy, cfg, num_envs, sizes, 1), Bandit(num_envs, critic=critic)


def params(algo: PPO):
    return [p.detach().clone() for p in algo.policy.parameters()]


# ---------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw, field",
    [
        ({"lr": -1e-3}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"num_minibatches": 0}, "num_minibatches"),
        ({"num_epochs": 0}, "num_epochs"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"gamma": 1.5}, "gamma"),
        ({"lam": -0.1}, "lam"),
        ({"clip": 0.0}, "clip"),
        ({"value_clip": -0.2}, "value_clip"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"entropy_coef": -0.01}, "entropy_coef"),
        ({"schedule": "step"}, "schedule"),
        ({"schedule": "cosine", "total_updates": 0}, "total_updates"),
        ({"schedule": "linear", "total_updates": 10, "warmup_updates": 10}, "warmup_updates"),
        ({"lr": 0.1}, "lr"),  # above lr_max for the adaptive schedule
        ({"desired_kl": 0.0}, "desired_kl"),
        ({"loss": "trpo"}, "loss"),
        ({"target_kl": 0.0}, "target_kl"),
        ({"std_lr_scale": 0.0}, "std_lr_scale"),
        ({"std_lr_scale": float("inf")}, "std_lr_scale"),
    ],
)
def test_config_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=f"PPOConfig.{field}"):
        PPOConfig(**kw)


def test_config_builds_core_loss_and_rejects_impossible_batches():
    cfg = PPOConfig(loss="dual_clip", clip=0.1, clip_high=0.3, entropy_coef=0.01)
    lc = cfg.loss_config()
    assert (lc.clip, lc.eps_low, lc.eps_high, lc.entropy_coef) == ("dual", 0.1, 0.3, 0.01)
    with pytest.raises(ValueError, match="num_minibatches"):
        make_ppo(num_envs=2, rnn_type="gru", num_minibatches=4)
    # a decaying schedule without its length is caught where the learner is built
    with pytest.raises(ValueError, match="needs total_updates"):
        make_ppo(schedule="linear")


# ------------------------------------------------------------------------- bootstrapping
class LinearCritic(ActorCritic):
    """V(obs) = obs[0] exactly, so the expected advantages can be worked out by hand."""

    def __init__(self):
        super().__init__(
            1, None, 1, ActorCriticConfig(actor_hidden=(), critic_hidden=(), normalize_obs=False)
        )
        with torch.no_grad():
            self.critic[0].weight.fill_(1.0)
            self.critic[0].bias.zero_()


def test_timeout_bootstraps_from_final_obs_and_termination_does_not():
    gamma = 0.9
    algo = PPO(
        LinearCritic(),
        PPOConfig(num_steps=3, num_minibatches=1, gamma=gamma, lam=1.0, normalize_advantages=False),
        2,
        {"policy": 1},
        1,
    )
    col = lambda *v: {"policy": torch.tensor(v).reshape(-1, 1)}  # noqa: E731
    ones, no = torch.ones(2), torch.zeros(2, dtype=torch.bool)
    # env 0 times out and env 1 terminates at t = 1; their true last observations (10, 20)
    # differ from the reset observations (0.5) the next step starts from
    steps = [
        (col(1.0, 2.0), col(3.0, 4.0), no, no, col(3.0, 4.0)),
        (
            col(3.0, 4.0),
            col(0.5, 0.5),
            torch.tensor([False, True]),
            torch.tensor([True, False]),
            col(10.0, 20.0),
        ),
        (col(0.5, 0.5), col(5.0, 6.0), no, no, col(5.0, 6.0)),
    ]
    for obs, next_obs, term, trunc, final in steps:
        algo.act(obs)
        algo.process_env_step(next_obs, ones, term, trunc, {"final_obs": final})
    s = algo.storage
    torch.testing.assert_close(s.values, torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]]))
    torch.testing.assert_close(s.next_values, torch.tensor([[3.0, 4.0], [10.0, 20.0], [5.0, 6.0]]))
    assert s.dones[1].tolist() == [True, True] and s.terminated[1].tolist() == [False, True]
    s.compute_advantages(gamma, 1.0)
    # env 0: A2 = 1 + .9*5 - .5 = 5; A1 = 1 + .9*10 - 3 = 7 (chain cut); A0 = 2.7 + .9*7 = 9
    # env 1: A2 = 1 + .9*6 - .5 = 5.9; A1 = 1 + 0 - 4 = -3; A0 = 2.6 + .9*(-3) = -0.1
    expected = torch.tensor([[9.0, -0.1], [7.0, -3.0], [5.0, 5.9]])
    torch.testing.assert_close(s.advantages, expected)
    torch.testing.assert_close(s.returns, expected + s.values)
    stats = algo.update()
    assert stats["nonfinite_steps"] == 0.0


# ------------------------------------------------------------------------------ NaN guard
def test_nan_gradient_skips_every_step_and_leaves_weights_and_optimizer_alone():
    algo, env = make_ppo()
    obs = rollout(algo, env, env.reset())
    algo.update()  # give the optimizer some state
    obs = rollout(algo, env, obs)
    before, lr = params(algo), algo.learning_rate
    adam = {k: v.clone() for k, v in algo.optimizer.state_dict()["state"][0].items()}
    handle = algo.policy.log_std.register_hook(lambda g: torch.full_like(g, float("nan")))
    stats = algo.update()
    handle.remove()
    steps = algo.cfg.num_epochs * algo.cfg.num_minibatches
    assert stats["minibatch_steps"] == 0.0 and stats["nonfinite_steps"] == steps
    assert all(torch.equal(a, b) for a, b in zip(before, params(algo)))
    after = algo.optimizer.state_dict()["state"][0]
    assert all(torch.equal(adam[k], after[k]) for k in adam)  # no moment or step update
    assert algo.learning_rate == lr  # the rate follows its schedule, nothing else
    # it goes on: the next update learns
    rollout(algo, env, obs)
    stats = algo.update()
    assert stats["minibatch_steps"] == steps and stats["nonfinite_steps"] == steps
    assert not all(torch.equal(a, b) for a, b in zip(before, params(algo)))


def test_nan_loss_mid_update_skips_that_step_only(monkeypatch):
    algo, env = make_ppo(schedule="fixed", lr=1e-3)
    obs = rollout(algo, env, env.reset())
    algo.update()
    obs = rollout(algo, env, obs)
    adam_steps = [float(s["step"]) for s in algo.optimizer.state_dict()["state"].values()]
    real, calls = ppo_module.policy_loss, []

    def poisoned(*args, **kwargs):
        calls.append(1)
        loss, stats = real(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 3 else loss), stats

    monkeypatch.setattr(ppo_module, "policy_loss", poisoned)
    stats = algo.update()
    steps = algo.cfg.num_epochs * algo.cfg.num_minibatches
    assert len(calls) == steps  # the update went on after the bad step
    assert stats["minibatch_steps"] == steps - 1 and stats["nonfinite_steps"] == 1.0
    after_steps = [float(s["step"]) for s in algo.optimizer.state_dict()["state"].values()]
    assert after_steps == [a + steps - 1 for a in adam_steps]
    assert all(torch.isfinite(p).all() for p in params(algo))
    assert algo.learning_rate == pytest.approx(1e-3)


def test_nan_reward_is_not_learned_from_and_never_reaches_the_statistics():
    algo, env = make_ppo(value_normalization=True)
    obs = env.reset()
    for _ in range(algo.cfg.num_steps):
        a = algo.act(obs)
        obs, r, te, tr, info = env.step(a)
        algo.process_env_step(obs, r * float("nan"), te, tr, info)
    vn_before = algo.value_normalizer.state_dict()["count"].clone()
    before = params(algo)
    stats = algo.update()
    assert stats["nonfinite_steps"] == 1.0 and stats["minibatch_steps"] == 0.0
    assert torch.equal(algo.value_normalizer.state_dict()["count"], vn_before)
    assert all(torch.equal(a, b) for a, b in zip(before, params(algo)))


# ------------------------------------------------------------------------ recurrent / misc
class Episodes:
    """Random observations; env i's episodes last 2 + i steps and end in a time-out."""

    def __init__(self, num_envs: int):
        self.n = num_envs
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.length = torch.arange(num_envs) + 2

    def _obs(self):
        x = torch.randn(self.n, 1)
        return {"policy": x, "critic": torch.cat([x, self.t[:, None].float()], 1)}

    def reset(self):
        return self._obs()

    def step(self, actions):
        self.t += 1
        truncated = self.t >= self.length
        final = self._obs()
        self.t[truncated] = 0
        obs = self._obs()
        obs = {k: torch.where(truncated[:, None], obs[k], final[k]) for k in obs}
        terminated = torch.zeros_like(truncated)
        return obs, -actions.square().sum(-1), terminated, truncated, {"final_obs": final}


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_recurrent_update_rescores_the_rollout_exactly(rnn_type):
    algo, _ = make_ppo(num_envs=6, rnn_type=rnn_type, critic=True, num_steps=5, num_epochs=1)
    env = Episodes(6)
    obs = env.reset()
    algo.policy.act(obs)  # non-trivial normalizer statistics ...
    algo.policy.eval()  # ... then frozen, so acting and re-scoring see the same inputs
    algo.policy.init_hidden(6)
    for _ in range(2):  # the second rollout starts mid-episode: non-zero hidden0
        obs = rollout(algo, env, obs)
        s = algo.storage
        assert bool(s.dones.any())
        ev = algo.policy.evaluate(s.obs, s.actions, hidden=s.hidden0, dones=s.dones)
        torch.testing.assert_close(ev.log_prob, s.log_probs, rtol=0, atol=1e-6)
        torch.testing.assert_close(ev.value, s.values, rtol=0, atol=1e-6)
        stats = algo.update()
        assert stats["nonfinite_steps"] == 0.0
    assert s.hidden0 is not None and all(h.abs().sum() > 0 for h in s.hidden0)


def test_minibatches_cover_the_rollout_once_per_epoch():
    s = RolloutStorage(3, 4, {"policy": 2}, 1)
    for t in range(3):
        obs = {"policy": torch.arange(8.0).reshape(4, 2) + 100 * t}
        s.add_action(
            obs,
            torch.zeros(4, 1),
            torch.zeros(4),
            torch.zeros(4),
            torch.zeros(4, 1),
            torch.ones(4, 1),
        )
        s.add_env_step(
            torch.ones(4),
            torch.zeros(4, dtype=torch.bool),
            torch.zeros(4, dtype=torch.bool),
            torch.zeros(4),
        )
    s.compute_advantages(0.99, 0.95)
    seen = torch.cat(
        [b.obs["policy"][:, 0] for b in s.minibatches(5, torch.Generator().manual_seed(0))]
    )
    assert sorted(seen.tolist()) == sorted(s.obs["policy"][..., 0].reshape(-1).tolist())
    with pytest.raises(RuntimeError, match="full"):
        s.add_action(
            obs,
            torch.zeros(4, 1),
            torch.zeros(4),
            torch.zeros(4),
            torch.zeros(4, 1),
            torch.ones(4, 1),
        )


def test_update_needs_a_full_rollout():
    algo, env = make_ppo()
    algo.act(env.reset())
    with pytest.raises(RuntimeError, match="full rollout"):
        algo.update()


def test_std_lr_scale_steps_the_std_faster_and_nothing_else():
    """Adam's first step moves each weight by the rate times g / |g|: with the std's rate
    scaled by 10, log_std moves 10x as far and every other weight exactly as before."""
    runs = {}
    for scale in (1.0, 10.0):
        algo, env = make_ppo(schedule="fixed", lr=1e-3, num_epochs=1, num_minibatches=1,
                             std_lr_scale=scale)  # fmt: skip
        before = {n: p.detach().clone() for n, p in algo.policy.named_parameters()}
        rollout(algo, env, env.reset())
        algo.update()
        runs[scale] = {n: p.detach() - before[n] for n, p in algo.policy.named_parameters()}
        assert [g["lr"] for g in algo.optimizer.param_groups] == (
            [1e-3] if scale == 1.0 else [1e-3, 1e-2]
        )
    base, fast = runs[1.0], runs[10.0]
    assert base["log_std"].abs().min() > 1e-4  # it moved at all
    torch.testing.assert_close(fast["log_std"], 10.0 * base["log_std"], rtol=1e-4, atol=0)
    for name in base:
        if name != "log_std":
            assert torch.equal(fast[name], base[name]), name
    # the adaptive rate carries the scale through its changes, and through a resume
    algo, env = make_ppo(std_lr_scale=3.0)
    rollout(algo, env, env.reset())
    algo.update()
    lr = algo.learning_rate
    assert lr != 1e-3 and [g["lr"] for g in algo.optimizer.param_groups] == [lr, 3.0 * lr]
    clone, _ = make_ppo(std_lr_scale=3.0)
    clone.load_state_dict(algo.state_dict())
    assert [g["lr"] for g in clone.optimizer.param_groups] == [lr, 3.0 * lr]


def test_std_lr_scale_needs_a_trained_log_std():
    torch.manual_seed(0)
    policy = ActorCritic(1, None, 1, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    policy.log_std.requires_grad_(False)
    with pytest.raises(ValueError, match=r"std_lr_scale=2.0 needs a policy with a trained log_std"):
        PPO(policy, PPOConfig(std_lr_scale=2.0), 4, {"policy": 1}, 1)
    PPO(policy, PPOConfig(), 4, {"policy": 1}, 1)  # without the scale it does not care


def test_state_dict_round_trip_continues_identically():
    algo, env = make_ppo(value_normalization=True)
    rollout(algo, env, env.reset())
    algo.update()
    buf = io.BytesIO()
    torch.save(algo.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # loads without executing code
    clone, _ = make_ppo(value_normalization=True)
    clone.load_state_dict(state)
    assert clone.learning_rate == algo.learning_rate and clone.num_updates == 1
    assert "policy" not in state  # the runner stores the weights, once
    clone.policy.load_state_dict(algo.policy.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(params(algo), params(clone)))
    assert torch.equal(clone.generator.get_state(), algo.generator.get_state())
    # the same data and the same shuffling give the same next update
    results = []
    for learner in (algo, clone):
        torch.manual_seed(5)
        env = Bandit(16, seed=7)
        rollout(learner, env, env.reset())
        results.append((learner.update(), params(learner)))
    (s0, p0), (s1, p1) = results
    assert s0 == s1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    with pytest.raises(ValueError, match="schedule"):
        make_ppo(schedule="fixed")[0].load_state_dict(state)


def test_distributed_single_rank_matches_local(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    results = []
    for distributed in (False, True):
        if distributed:
            dist.init_process_group(
                "gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1
            )
        try:
            algo, env = make_ppo()
            rollout(algo, env, env.reset())
            torch.manual_seed(3)
            stats = algo.update()
            results.append((params(algo), stats["kl"]))
        finally:
            if distributed:
                dist.destroy_process_group()
    (p0, kl0), (p1, kl1) = results
    assert kl0 == pytest.approx(kl1)
    assert all(torch.allclose(a, b) for a, b in zip(p0, p1))


# -------------------------------------------------------------------------------- learning
@pytest.mark.parametrize("critic", [False, True])
def test_learns_a_contextual_bandit(critic):
    algo, env = make_ppo(num_envs=64, critic=critic, num_steps=4, num_epochs=5)
    obs = env.reset()
    for _ in range(40):
        obs = rollout(algo, env, obs)
        stats = algo.update()
    assert stats["nonfinite_steps"] == 0.0
    algo.policy.eval()
    inf = algo.policy.inference_module()
    actions = inf(torch.tensor([[1.0], [-1.0]])).squeeze(-1)
    torch.testing.assert_close(actions, torch.tensor([0.5, -0.5]), atol=0.08, rtol=0)
    assert stats["action_std"] < 0.5  # exploration narrowed from init_std = 1
    assert stats["returns_mean"] > -0.1
