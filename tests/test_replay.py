"""The replay buffer of the world model: sequences follow one env, a mask ends them at
their first episode's end, every transition starts sequences (an episode's last one
too), time-outs and terminations keep their own flags, and a saved buffer samples on
as the original would."""

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


def test_sequences_follow_one_env_and_mask_everything_after_an_episode_end():
    buf = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    _fill(buf, 20)
    batch = buf.sample(4000)
    obs = batch["obs"]  # [H+1, B, 4]
    assert obs.shape == (H + 1, 4000, 4) and batch["action"].shape == (H, 4000, 2)
    assert batch["reward"].shape == batch["terminated"].shape == batch["mask"].shape == (H, 4000)
    env, episode = obs[0, :, 0], obs[0, :, 1]
    # one env, consecutive steps of its own time
    assert (obs[:, :, 0] == env).all()
    assert (obs[1:, :, 3] - obs[:-1, :, 3] == 1).all()
    ended = batch["terminated"] + batch["truncated"]
    mask = batch["mask"]
    for i in range(4000):
        ends = torch.nonzero(ended[:, i]).flatten().tolist()
        first = ends[0] if ends else H - 1
        # the mask holds the first episode's transitions, its ending one included
        assert mask[: first + 1, i].eq(1).all() and mask[first + 1 :, i].eq(0).all()
        # inside the mask: the same episode; its end's next obs is the true last one
        assert (obs[: first + 1, i, 1] == episode[i]).all()
        if ends:
            assert obs[first + 1, i, 1] == -1 - episode[i]
            step = int(obs[first, i, 3])
            kind = ENDS[int(env[i])][step]
            assert batch["terminated"][first, i] == (kind == "T")
            assert batch["truncated"][first, i] == (kind == "t")
    # every transition starts sequences, an episode's last one too: env 1's one-step
    # episode (step 3) and the terminations at steps 2 and 5 are sampled first
    firsts = {(int(e), int(s)) for e, s in zip(env, obs[0, :, 3], strict=True)}
    assert {(1, 2), (1, 3), (0, 5), (0, 11)} <= firsts
    assert len(firsts) == ENVS * (20 - H + 1)  # uniform over every complete window
    assert batch["terminated"][0].sum() > 0


def test_a_full_ring_never_samples_across_its_write_position():
    buf = SequenceReplay(capacity=3 * 7, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    assert buf.slots == 7
    _fill(buf, 20)  # wrapped almost three times
    assert len(buf) == 21
    batch = buf.sample(1000)
    steps = batch["obs"][:, :, 3]
    assert (steps[1:] - steps[:-1] == 1).all()
    assert (steps[0] >= 20 - 7).all()  # only what is still held
    # starts 13..16 (windows up to step 19) of every env
    assert buf.num_sequences == (7 - H + 1) * ENVS
    assert set(steps[0].tolist()) == {13.0, 14.0, 15.0, 16.0}


def test_state_dict_round_trip_samples_the_same_batches():
    a = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H, seed=3)
    _fill(a, 20)
    a.sample(5)
    b = SequenceReplay(capacity=300, num_envs=ENVS, obs_size=4, action_size=2, horizon=H)
    b.load_state_dict(a.state_dict())
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
