"""The instructed-reach task: images of every env, the instruction's bookkeeping, the
train/eval split, the scripted expert, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.registry import make, task_options
from sim.tasks.instructed_reach import (
    COLOURS,
    HELD_OUT,
    LINK0,
    LINK1,
    fingertip_xy,
    parse_instruction,
    quadrant_of,
)

# the top camera's half-width at the balls' height: 0.59 m below it, fovy 42 degrees
HALF_VIEW = 0.59 * np.tan(np.radians(21.0))


def _colour_mask(img: np.ndarray, colour: str) -> np.ndarray:
    """Pixels of one of the balls' colours (the table is grey, the arm white)."""
    r, g, b = (img[..., c].astype(np.int32) for c in range(3))
    return {
        "red": (r > 100) & (r > 2 * g) & (r > 2 * b),
        "green": (g > 100) & (g > 2 * r) & (g > 2 * b),
        "blue": (b > 100) & (b > 2 * r) & (b > g + 40),
        "yellow": (r > 100) & (g > 100) & (b < 0.4 * np.minimum(r, g)),
    }[colour]


def _step_expert(env):
    return env.step(torch.as_tensor(env.expert_action(), dtype=torch.float32))


def _ik(xy: np.ndarray) -> np.ndarray:
    """Joint angles that put the fingertip on ``xy`` (elbow up)."""
    c = (np.sum(xy**2) - LINK0**2 - LINK1**2) / (2 * LINK0 * LINK1)
    elbow = np.arccos(np.clip(c, -1, 1))
    shoulder = np.arctan2(xy[1], xy[0]) - np.arctan2(
        LINK1 * np.sin(elbow), LINK0 + LINK1 * np.cos(elbow)
    )
    return np.array([shoulder, elbow])


def test_images_render_per_env_with_the_named_colour_where_the_named_ball_is():
    env = make("instructed_reach", 6, seed=0)
    obs = env.reset()
    img = obs["image"]
    assert img.shape == (6, 64, 64, 3) and img.dtype == torch.uint8
    assert env.image_spec.shape == (64, 64, 3)
    frames = img.numpy()
    # different layouts, different images
    assert all(not np.array_equal(frames[0], frames[i]) for i in range(1, 6))
    goals = env.goal_positions()
    for i, text in enumerate(env.instructions):
        colour = COLOURS[parse_instruction(text)]
        assert obs["critic"][i, 8].item() == COLOURS.index(colour)  # instruction_id
        mask = _colour_mask(frames[i], colour)
        assert mask.sum() >= 6, f"env {i}: no {colour} pixels for {text!r}"
        rows, cols = np.nonzero(mask)
        # +x to the image's right, +y up: the blob sits where the named ball is
        want_col = (goals[i, 0] / HALF_VIEW + 1) / 2 * 64
        want_row = (1 - goals[i, 1] / HALF_VIEW) / 2 * 64
        assert abs(cols.mean() + 0.5 - want_col) < 3 and abs(rows.mean() + 0.5 - want_row) < 3
    env.close()


def test_128_px_and_rectangular_images_work():
    env = make("instructed_reach", 2, seed=1, image_size=128)
    assert env.reset()["image"].shape == (2, 128, 128, 3)
    env.close()
    env = make("instructed_reach", 2, seed=1, image_size=(48, 80))
    assert env.reset()["image"].shape == (2, 48, 80, 3)
    env.close()


def test_same_seed_same_trajectory_and_images_across_instances():
    runs = []
    for _ in range(2):
        env = make("instructed_reach", 3, seed=7, max_episode_steps=10)
        obs = env.reset()
        rows = [obs["image"].clone()]
        for _ in range(14):  # through one auto-reset at least
            obs, rew, term, trunc, info = _step_expert(env)
            rows += [obs["policy"], obs["image"], rew, info["final_obs"]["image"]]
        rows.append(env.instructions)
        runs.append(rows)
        env.close()
    a, b = runs
    for x, y in zip(a[:-1], b[:-1]):
        assert torch.equal(x, y)
    assert a[-1] == b[-1]


def test_final_obs_holds_the_last_frame_of_the_ended_episode():
    # twin envs, one cut off after 5 steps: its final observation must be what the
    # other, still running, observes at step 5; its observation the new episode's
    kw = {"seed": 2, "terminate_on_success": False}
    short = make("instructed_reach", 2, max_episode_steps=5, **kw)
    long = make("instructed_reach", 2, max_episode_steps=100, **kw)
    short.reset(), long.reset()
    for _ in range(5):
        actions = torch.as_tensor(long.expert_action(), dtype=torch.float32)
        obs, _, _, trunc, info = short.step(actions)
        twin, *_ = long.step(actions)
    assert trunc.all()
    final = info["final_obs"]
    assert final["image"].shape == (2, 64, 64, 3)
    now = torch.from_numpy(long.render_images())  # rendered afresh from the state
    assert torch.equal(twin["image"], now)
    assert torch.equal(final["image"], now)
    assert torch.equal(final["policy"], twin["policy"])
    assert not torch.equal(obs["image"][0], twin["image"][0])


def test_reward_is_the_distance_to_the_named_ball_not_another():
    env = make("instructed_reach", 1, seed=4, images=False)
    env.reset()
    balls = env.ball_positions()[0]
    named = int(env.named_slot[0])
    other = (named + 1) % 3
    state = env.get_state()
    qpos = state["qpos"].copy()
    qpos[0, :2] = _ik(balls[other])
    env.set_state(qpos, np.zeros_like(state["qvel"]))
    assert np.linalg.norm(env.fingertip()[0] - balls[other]) < 1e-9
    _, rew, term, _, info = env.step(torch.zeros(1, 2))
    gap = np.linalg.norm(balls[other] - balls[named])
    assert info["success"].item() == 0.0 and not term.item()
    assert info["distance"].item() == pytest.approx(gap, abs=2e-3)
    assert rew.item() == pytest.approx(-info["distance"].item(), abs=1e-6)
    # on the named ball but sweeping through it: no success (reach *and stop*)
    qpos[0, :2] = _ik(balls[named])
    fast = np.zeros_like(state["qvel"])
    fast[0, 0] = 2.0  # rad/s at the shoulder: ~0.4 m/s at the fingertip
    env.set_state(qpos, fast)
    _, rew, term, _, info = env.step(torch.zeros(1, 2))
    assert info["distance"].item() < env.success_radius and info["speed"].item() > 0.1
    assert info["success"].item() == 0.0 and not term.item()
    # on the named ball and still: success, the bonus, and the episode ends
    env.set_state(qpos, np.zeros_like(state["qvel"]))
    _, rew, term, _, info = env.step(torch.zeros(1, 2))
    assert info["success"].item() == 1.0 and term.item()
    assert rew.item() == pytest.approx(1.0 - info["distance"].item(), abs=1e-6)


def test_instruct_renames_the_target_and_refuses_unknown_or_absent_colours():
    env = make("instructed_reach", 2, seed=5, images=False)
    env.reset()
    present = [COLOURS[c] for c in env.ball_colour[0]]
    other = next(c for c in present if f"reach the {c} ball" != env.instructions[0])
    obs = env.instruct([f"reach the {other} ball"], ids=[0])
    assert env.instructions[0] == f"reach the {other} ball"
    assert obs["critic"][0, 8].item() == COLOURS.index(other)  # instruction_id
    np.testing.assert_allclose(
        env.goal_positions()[0], env.ball_positions()[0, present.index(other)]
    )
    with pytest.raises(ValueError, match="unknown colour 'purple'"):
        env.instruct(["reach the purple ball"], ids=[0])
    absent = next(c for c in COLOURS if c not in present)
    with pytest.raises(ValueError, match=f"env 0 has no {absent} ball"):
        env.instruct([f"reach the {absent} ball"], ids=[0])
    with pytest.raises(ValueError, match="does not read"):
        parse_instruction("touch something red")


def _named_pairs(split: str, resets: int = 25, n: int = 64) -> set[tuple[str, int]]:
    env = make("instructed_reach", n, seed=11, split=split, images=False)
    pairs = set()
    for _ in range(resets):
        env.reset()
        goal_quadrant = quadrant_of(env.goal_positions())
        pairs |= {(COLOURS[c], int(q)) for c, q in zip(env.instruction_ids, goal_quadrant)}
    return pairs


def test_held_out_pairs_never_named_in_train_and_only_in_eval():
    train = _named_pairs("train")
    evaluation = _named_pairs("eval")
    every = {(c, q) for c in COLOURS for q in range(4)}
    assert train == every - HELD_OUT  # all 12 training pairs, and no held-out one
    assert evaluation == set(HELD_OUT)


def _expert_success(split: str, episodes: int = 32) -> float:
    env = make("instructed_reach", episodes, seed=3, split=split, images=False)
    env.reset()
    first = np.full(episodes, -1)  # each env's first episode: 1 success, 0 failure
    while (first < 0).any():
        _, _, term, trunc, _ = _step_expert(env)
        ended = (term | trunc).numpy() & (first < 0)
        first[ended] = term.numpy()[ended]
    return float(first.mean())


@pytest.mark.parametrize("split", ["train", "eval"])
def test_scripted_expert_succeeds(split):
    assert _expert_success(split) >= 0.95


def test_checkpoint_continues_the_same_layouts_and_images():
    env = make("instructed_reach", 2, seed=9)
    env.reset()
    for _ in range(3):
        _step_expert(env)
    state = env.state_dict()
    a = [_step_expert(env)[0]["image"] for _ in range(12)]
    other = make("instructed_reach", 2, seed=123)
    other.reset()
    other.load_state_dict(state)
    b = [_step_expert(other)[0]["image"] for _ in range(12)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"image_size": 0}, "image height must be between 1 and 1024 pixels, got 0"),
        ({"image_size": -64}, "image height must be between 1 and 1024"),
        ({"image_size": (64, 2048)}, "image width must be between 1 and 1024 pixels, got 2048"),
        ({"image_size": 63.5}, "image_size must be an int or a \\(height, width\\) pair"),
        ({"image_size": (64, 64.0)}, "image width must be an integer"),
        ({"split": "test"}, "split must be one of \\('train', 'eval'\\)"),
        ({"success_radius": 0.5}, "success_radius must be in"),
    ],
)
def test_bad_options_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make("instructed_reach", 1, **kwargs)


def test_options_are_task_options_and_the_fingertip_is_forward_kinematics():
    assert {"split", "images", "image_size", "terminate_on_success"} <= task_options(
        "instructed_reach"
    )
    env = make("instructed_reach", 1, seed=0, images=False)
    env.reset()
    env.step(torch.zeros(1, 2))
    site = env.engine.get_data(0).xpos[env.model.body("fingertip").id][:2]
    np.testing.assert_allclose(env.fingertip()[0], site, atol=1e-9)
    np.testing.assert_allclose(fingertip_xy(np.zeros((1, 2)))[0], [LINK0 + LINK1, 0.0])


def test_the_robot_description_carries_the_control_period():
    """What an export writes as control_period_s: one env step (frame_skip physics steps),
    not one physics step (a policy node would otherwise run at twice the trained rate)."""
    env = make("instructed_reach", 1, images=False)
    try:
        assert env.robot.control_dt == pytest.approx(env.model.opt.timestep * env.frame_skip)
        assert env.robot.control_dt == pytest.approx(0.02)
    finally:
        env.close()
