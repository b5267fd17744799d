"""The replay buffer of the world model: sequences stay inside one episode of one env,
time-outs and terminations keep their own flags, and a saved buffer samples on as the
original would."""

from __future__ import annotations

import pytest
import torch

from training.replay import ReplayError, SequenceReplay

ENVS, H = 3, 4
# per env, the steps (0-based, in the env's own time) whose transition ends an episode,
# and how: "T" terminated, "t" truncated (time-out)
ENDS = {0: {5: "T", 11: "t"}, 1: {2: "T", 3: "T", 17: "t"}, 2: {}}


def _fill(buf: SequenceReplay, steps: int) -> None:
    """obs = (env, episode, step in episode, global step); the final observation of an
    ended episode is marked with -1 in its episode slot's sign (it is not a reset obs)."""
    episode = [0] * ENVS
    t_ep = [0] * ENVS
    for t in range(steps):
        obs = torch.tensor([[e, episode[e], t_ep[e], t] for e in range(ENVS)], dtype=torch.float32)
        term = torch.tensor([ENDS[e].get(t) == "T" for e in range(ENVS)])
        trunc = torch.tensor([ENDS[e].get(t) == "t" for e in range(ENVS)])
        nxt = obs.clone()
        nxt[:, 2] += 1
        nxt[:, 3] += 1
        ended = term | trunc
        nxt[ended, 1] = -1 - nxt[ended, 1]  # the true last observation, marked
        action = obs[:, :1].repeat(1, 2)
        buf.add(obs, action, obs[:, 3], nxt, term, trunc)
        for e in range(ENVS):
            if ended[e]:
                episode[e] += 1
                t_ep[e] = 0
            else:
                t_ep[e] += 1


def test_sequences_never_cross_an_episode_boundary_and_flags_sit_at_the_end():
    buf = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    _fill(buf, 20)
    batch = buf.sample(2000)
    obs = batch["obs"]  # [H+1, B, 4]
    assert obs.shape == (H + 1, 2000, 4) and batch["action"].shape == (H, 2000, 2)
    assert batch["reward"].shape == batch["terminated"].shape == (H, 2000)
    env, episode = obs[0, :, 0], obs[0, :, 1]
    # one env, one episode, consecutive steps; the last next-observation may be an
    # episode's true last observation (marked), never the next episode's reset one
    assert (obs[:, :, 0] == env).all()
    assert (obs[:-1, :, 1] == episode).all()
    last_ep = obs[-1, :, 1]
    assert ((last_ep == episode) | (last_ep == -1 - episode)).all()
    assert (obs[1:, :, 3] - obs[:-1, :, 3] == 1).all()
    ended = batch["terminated"] + batch["truncated"]
    assert (ended[:-1] == 0).all(), "an episode ended inside a sequence"
    assert ((last_ep < 0) == (ended[-1] > 0)).all()
    # every end flag matches how that episode really ended
    for i in torch.nonzero(ended[-1]).flatten().tolist():
        e, step = int(env[i]), int(obs[-2, i, 3])
        kind = ENDS[e][step]
        assert batch["terminated"][-1, i] == (kind == "T")
        assert batch["truncated"][-1, i] == (kind == "t")
    # env 1's one-step episode (step 3) is too short for a sequence; the others are seen
    assert {int(e) for e in env} == {0, 1, 2}
    assert set(torch.nonzero(ended[-1]).flatten().tolist())  # episode ends are sampled


def test_a_full_ring_never_samples_across_its_write_position():
    buf = SequenceReplay(capacity=3 * 7, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    assert buf.slots == 7
    _fill(buf, 20)  # wrapped almost three times
    assert len(buf) == 21
    batch = buf.sample(1000)
    steps = batch["obs"][:, :, 3]
    assert (steps[1:] - steps[:-1] == 1).all()
    assert (steps[0] >= 20 - 7).all()  # only what is still held
    # starts 13..16 (windows up to step 19) of env 2, which never ends an episode
    assert buf.valid[:, 2].sum() == 7 - H + 1


def test_state_dict_round_trip_samples_the_same_batches():
    a = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H, seed=3)
    _fill(a, 20)
    a.sample(5)
    b = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.valid, b.valid)
    for _ in range(3):
        x, y = a.sample(64), b.sample(64)
        for k in x:
            assert torch.equal(x[k], y[k]), k
    other = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H + 1)
    with pytest.raises(ValueError, match="horizon"):
        other.load_state_dict(a.state_dict())


def test_an_empty_buffer_says_so():
    buf = SequenceReplay(capacity=100, num_envs=2, obs_size=4, action_size=2, horizon=3)
    with pytest.raises(ReplayError, match="no sequence of 3 transitions"):
        buf.sample(4)
