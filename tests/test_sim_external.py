"""Envs of other frameworks through rsl_rl's interface (sim/external.py).

Two stand-ins with that interface, since Isaac Lab and mjlab do not install here: our
own tasks behind rsl_rl's VecEnv (sim.rsl_rl_env), which makes a round trip that must
give back what the task gives directly, and a pure-torch env shaped like Isaac Lab's
RslRlVecEnvWrapper (float episode limit, an extra image group, scalar logs).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from sim.external import RslRlStyleEnv, register_external
from sim.randomization import SimToRealConfig
from sim.registry import make
from sim.rsl_rl_env import RslRlVecEnv


def _through_rsl_rl(name, num_envs, seed=None, device="cpu", **options):
    """`rsl:<task>`: our task behind rsl_rl's VecEnv, adapted back."""
    env = make(name, num_envs, seed=seed, s2r=SimToRealConfig(), **options)
    return RslRlStyleEnv(RslRlVecEnv(env), f"rsl:{name}", robot=env.robot, dt=env.dt)


class IsaacLike:
    """A point mass to steer to the origin, with Isaac Lab's wrapper's interface."""

    def __init__(self, num_envs, seed=None, device="cpu", horizon=50):
        self.num_envs, self.num_actions, self.device = num_envs, 2, device
        self.max_episode_length = float(horizon)  # Isaac Lab's is a float
        self.step_dt = 0.05
        self.g = torch.Generator().manual_seed(0 if seed is None else seed)
        self.pos = torch.zeros(num_envs, 2)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self._reset(torch.ones(num_envs, dtype=torch.bool))

    def _reset(self, ids):
        self.pos[ids] = torch.rand(int(ids.sum()), 2, generator=self.g) * 4 - 2
        self.episode_length_buf[ids] = 0

    def get_observations(self):
        return TensorDict(
            {
                "policy": self.pos.clone(),
                "critic": torch.cat([self.pos, self.pos.norm(dim=1, keepdim=True)], 1),
                "camera": torch.zeros(self.num_envs, 3, 4, 4),  # not a vector group
            },
            batch_size=[self.num_envs],
        )

    def step(self, actions):
        self.pos += self.step_dt * actions.clamp(-1, 1)
        self.episode_length_buf += 1
        dist = self.pos.norm(dim=1)
        reward = -dist
        fell = dist > 3.0
        time_outs = self.episode_length_buf >= self.max_episode_length
        dones = fell | time_outs
        self._reset(dones)
        extras = {"time_outs": time_outs & ~fell, "log": {"Episode_Reward/dist": dist.mean()}}
        return self.get_observations(), reward, dones.long(), extras


register_external("rsl", _through_rsl_rl)
register_external(
    "isaaclike",
    lambda name, num_envs, seed=None, device="cpu", **kw: IsaacLike(num_envs, seed, device, **kw),
)


def test_a_task_through_rsl_rl_and_back_gives_what_it_gives_directly():
    direct = make("hopper", 4, seed=3, s2r=SimToRealConfig())
    ext = make("rsl:hopper", 4, seed=0)
    try:
        od = direct.reset()
        oe = ext.reset(seed=3)
        torch.testing.assert_close(oe["policy"], od["policy"])
        assert ext.observation_spec["policy"].size == direct.observation_spec["policy"].size
        assert ext.action_spec.joint_names == direct.action_spec.joint_names
        assert ext.max_episode_steps == direct.max_episode_steps and ext.dt == direct.dt
        g = torch.Generator().manual_seed(0)
        ends = 0
        for _ in range(80):
            a = torch.rand(4, 3, generator=g) * 2 - 1
            prev = oe
            od, rd, td, trd, infod = direct.step(a)
            oe, re, te, tre, infoe = ext.step(a)
            torch.testing.assert_close(oe["policy"], od["policy"])
            torch.testing.assert_close(re, rd)
            assert torch.equal(te, td) and torch.equal(tre, trd)
            if "episode" in infoe:
                ends += int(infoe["episode"]["done"].sum())
                ended = infoe["episode"]["done"]
                torch.testing.assert_close(
                    infoe["episode"]["return"][ended], infod["episode"]["return"][ended]
                )
                # the last observation the adapter has of an ended episode: the one
                # before the step (rsl_rl's interface carries no final observation)
                torch.testing.assert_close(
                    infoe["final_obs"]["policy"][ended], prev["policy"][ended]
                )
        assert ends > 0  # hopper falls under random actions: the episode path ran
    finally:
        direct.close(), ext.close()


def test_an_isaac_lab_shaped_env_maps_groups_time_outs_and_logs():
    env = make("isaaclike:PointMass", 8, seed=1)
    obs = env.reset()
    assert set(obs) == {"policy", "critic"}  # the image group is not a vector group
    assert env.observation_spec["critic"].size == 3 and env.max_episode_steps == 50
    assert env.action_spec.joint_names == ("action_0", "action_1")
    assert env.robot.control_dt == pytest.approx(0.05)
    timeouts = 0
    for _ in range(50):
        obs, r, term, trunc, info = env.step(torch.zeros(8, 2))
        assert info["log/Episode_Reward/dist"].shape == (8,)
        timeouts += int(trunc.sum())
        assert not bool(term.any())  # standing still: never out of bounds
    assert timeouts == 8  # every env timed out once, at step 50, as truncated
    # pushing outward ends episodes as terminations
    for _ in range(40):
        obs, r, term, trunc, info = env.step(torch.sign(obs["policy"]))
        if term.any():
            break
    assert bool(term.any()) and not bool((term & trunc).any())


def test_ppo_learns_on_an_external_env_exports_and_runs_it_in_onnx(tmp_path):
    from deploy.runtime import OnnxPolicy
    from training.export import export_run
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = ["run.progress=false", "run.tensorboard=false", "env.num_envs=16", "run.seed=0"]
    over += ["ppo.num_steps=50", "run.total_steps=24000", "env.randomize=false"]
    cfg = build_ppo_config("isaaclike:PointMass", over)
    runner = OnPolicyRunner(cfg, tmp_path / "run")
    try:
        untrained = runner.evaluate(episodes=8)["return_mean"]
        runner.train()
        trained = runner.evaluate(episodes=8)["return_mean"]
        runner.save()
    finally:
        runner.close()
    # a policy that holds still scores about -50 * 1.15 (mean start distance); steering
    # home gets the distance down within the first ~25 steps
    assert trained > untrained + 10, (untrained, trained)
    onnx = export_run(tmp_path / "run", tmp_path / "policy.onnx")
    policy = OnnxPolicy(str(onnx))
    assert policy.metadata.task == "isaaclike:PointMass"
    # the exported actor steers home as the trained one does: parity on a few states
    from training.policy_kinds import load_policy

    torch_policy = load_policy(tmp_path / "run").policy
    states = np.array([[0.5, -1.0], [-1.5, 1.0], [0.0, 0.2]], dtype=np.float32)
    with torch.no_grad():
        x = torch.from_numpy(states)
        obs = {"policy": x, "critic": torch.cat([x, x.norm(dim=1, keepdim=True)], 1)}
        want = torch_policy.act_inference(obs).numpy()
    got, _ = policy.act_batch(states)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_factory_declared_as_an_entry_point_is_found_by_its_prefix(monkeypatch):
    import sim.external as ext

    class EntryPoint:
        name = "pkgenv"

        def load(self):
            return lambda name, num_envs, seed=None, device="cpu": IsaacLike(num_envs, seed)

    monkeypatch.setattr(ext, "_entry_points", lambda: {"pkgenv": EntryPoint()})
    monkeypatch.setattr(ext, "_EXTERNAL", dict(ext._EXTERNAL))
    assert "pkgenv" in ext.external_prefixes()
    env = make("pkgenv:PointMass", 3, seed=0)
    assert env.num_envs == 3 and env.name == "pkgenv:PointMass"


def test_bad_external_envs_and_settings_are_named():
    with pytest.raises(ValueError, match="unknown env source 'nope'"):
        make("nope:Thing", 2)
    with pytest.raises(ValueError, match="names no env"):
        make("rsl:", 2)
    with pytest.raises(ValueError, match="apply to our simulator only"):
        make("isaaclike:PointMass", 2, max_episode_steps=10)
    with pytest.raises(ValueError, match="randomizes itself"):
        make("isaaclike:PointMass", 2, s2r={"friction_scale": [0.5, 1.5]})

    class NoObs:
        num_envs, num_actions, max_episode_length = 2, 1, 10

        def step(self, a):
            raise AssertionError

    with pytest.raises(TypeError, match="lacks 'get_observations'"):
        RslRlStyleEnv(NoObs(), "x:NoObs")

    class NoPeriod(IsaacLike):
        def __init__(self, n):
            super().__init__(n)
            self.step_dt = None

    with pytest.raises(ValueError, match="control period is unknown"):
        RslRlStyleEnv(NoPeriod(2), "x:NoPeriod")

    class Flat(IsaacLike):
        def get_observations(self):
            return TensorDict({"state": self.pos.clone()}, batch_size=[self.num_envs])

    with pytest.raises(ValueError, match="no 'policy' group"):
        RslRlStyleEnv(Flat(2), "x:Flat")

    class Deep(IsaacLike):
        def get_observations(self):
            return TensorDict({"policy": self.pos[:, None, :]}, batch_size=[self.num_envs])

    with pytest.raises(ValueError, match=r"must be \(num_envs, size\)"):
        RslRlStyleEnv(Deep(2), "x:Deep")
    env = make("isaaclike:PointMass", 2)
    with pytest.raises(ValueError, match="must have shape"):
        env.step(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-finite"):
        env.step(torch.full((2, 2), math.nan))
    with pytest.raises(ValueError, match="env state is of"):
        env.load_state_dict({"external": "rsl:hopper"})


def test_a_run_on_an_external_env_resumes_with_its_episodes_started_anew(tmp_path):
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    over = ["run.progress=false", "run.tensorboard=false", "env.num_envs=4", "run.seed=0"]
    over += ["ppo.num_steps=20", "env.randomize=false"]
    first = OnPolicyRunner(
        build_ppo_config("isaaclike:PointMass", over + ["run.total_steps=160"]), tmp_path / "r"
    )
    first.train()
    first.save()
    weights = {k: v.clone() for k, v in first.policy.state_dict().items()}
    first.close()
    again = OnPolicyRunner(
        build_ppo_config("isaaclike:PointMass", over + ["run.total_steps=320"]),
        tmp_path / "r",
        resume=tmp_path / "r",
    )
    try:
        assert again.env_steps == 160
        for k, v in again.policy.state_dict().items():
            torch.testing.assert_close(v, weights[k], rtol=0, atol=0)
        # the observations to go on from are the restarted env's, not the checkpoint's
        torch.testing.assert_close(again.obs["policy"], again.env._last["policy"])
        summary = again.train()
        assert summary["env_steps"] == 320 and summary["iterations"] == 4
    finally:
        again.close()


class ActorGroup(IsaacLike):
    """mjlab 1.6's naming: the policy's group is "actor"."""

    def get_observations(self):
        td = super().get_observations()
        return TensorDict(
            {"actor": td["policy"], "critic": td["critic"]}, batch_size=[self.num_envs]
        )


def test_group_names_and_observation_terms_map_another_frameworks_groups():
    env = RslRlStyleEnv(
        ActorGroup(3, seed=0),
        "x:Actor",
        group_names={"policy": "actor"},
        obs_terms={"policy": [("pos_x", 1), ("pos_y", 1)], "critic": [("pos", 2), ("dist", 1)]},
        render=lambda: np.full((4, 5, 3), 7, np.uint8),
    )
    obs = env.reset()
    torch.testing.assert_close(obs["policy"], env.env.pos)
    assert [t.name for t in env.observation_spec["policy"].terms] == ["pos_x", "pos_y"]
    assert env.observation_spec["critic"].size == 3
    assert env.render().shape == (4, 5, 3) and env.control_rate_hz == pytest.approx(20.0)
    with pytest.raises(ValueError, match="only env 0 renders"):
        env.render(1)
    with pytest.raises(NotImplementedError, match="no rendering hook"):
        RslRlStyleEnv(IsaacLike(2), "x:P").render()
    # without the mapping the policy's group is missing, and the error says which it has
    with pytest.raises(ValueError, match=r"no 'policy' group .*\['actor', 'critic'\]"):
        RslRlStyleEnv(ActorGroup(2), "x:Actor")
    with pytest.raises(ValueError, match="our groups are policy, critic"):
        RslRlStyleEnv(ActorGroup(2), "x:Actor", group_names={"actor": "policy"})
    with pytest.raises(ValueError, match="add up to 3 values, the env's observation has 2"):
        RslRlStyleEnv(
            ActorGroup(2), "x:A", group_names={"policy": "actor"}, obs_terms={"policy": [("p", 3)]}
        )


class OneAtATime(IsaacLike):
    """Refuses a second live instance, as Isaac Lab allows one simulation per process."""

    live = 0

    def __init__(self, *args, **kwargs):
        if OneAtATime.live:
            raise RuntimeError("a second env while one is open")
        OneAtATime.live += 1
        super().__init__(*args, **kwargs)

    def close(self):
        OneAtATime.live -= 1


register_external(
    "oneatatime",
    lambda name, num_envs, seed=None, device="cpu", **kw: OneAtATime(num_envs, seed, device, **kw),
)


def test_train_closes_its_env_before_the_final_eval_and_export(tmp_path, capsys):
    from training.cli import main

    run = tmp_path / "run"
    args = ["train", "ppo", "--task", "oneatatime:PointMass", "--steps", "400"]
    args += ["--run-dir", str(run), "--export", "env.num_envs=4", "ppo.num_steps=50"]
    args += ["run.video=false", "run.progress=false", "run.tensorboard=false"]
    assert main(args) == 0, capsys.readouterr()
    # the evaluation and the export each opened (and closed) an env of their own
    assert OneAtATime.live == 0
    assert "eval" in json.loads((run / "summary.json").read_text())
    assert "exported:" in capsys.readouterr().out
