"""Demonstrations with camera frames and instructions: the scripted expert's episodes
round trip bit for bit, files without images still load, and bad image data is named."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from sim.tasks.instructed_reach import parse_instruction
from training.collect import collect_demos
from training.demos import DatasetError, load_demos, save_demos


@pytest.fixture(scope="module")
def expert_demos():
    return collect_demos(
        "expert",
        "instructed_reach",
        episodes=4,
        num_envs=2,
        seed=0,
        env_kwargs={"split": "eval", "image_size": 32},
    )


def test_expert_demos_round_trip_images_and_instructions_bit_for_bit(expert_demos, tmp_path):
    data = expert_demos
    assert len(data.episodes) == 4 and all(e.terminated for e in data.episodes)
    assert data.image_keys == {"image": (32, 32, 3)}
    for ep in data.episodes:
        assert ep.images["image"].shape == (len(ep), 32, 32, 3)
        assert ep.images["image"].dtype == np.uint8
        assert ep.instruction.startswith("reach the ")
        # the instruction names a colour the task knows, and only the words carry it:
        # the policy frames are the arm's 8 numbers (no instruction_id)
        parse_instruction(ep.instruction)
        assert ep.obs.shape[1] == 8
        # the frame after step t is the frame at step t + 1 within an episode
        np.testing.assert_array_equal(ep.next_images["image"][:-1], ep.images["image"][1:])
    path = save_demos(tmp_path / "reach.hdf5", data)
    back = load_demos(path, task="instructed_reach")
    assert back.instructions == data.instructions
    assert back.info["env_kwargs"]["split"] == "eval"
    for a, b in zip(data.episodes, back.episodes):
        np.testing.assert_array_equal(a.images["image"], b.images["image"])
        np.testing.assert_array_equal(a.next_images["image"], b.next_images["image"])
        assert b.images["image"].dtype == np.uint8
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.actions, b.actions)
    with h5py.File(path) as f:
        g = f["data"]
        # what a reader of the image-less schema reads is unchanged: images are not terms
        assert "image" not in [n for n, _ in json.loads(g.attrs["obs_keys"])]
        ds = g["demo_0/obs/image"]
        assert ds.compression == "gzip" and ds.chunks == (1, 32, 32, 3)
        assert g["demo_0/obs/fingertip"].dtype == np.float32
    lean = load_demos(path, images=False)
    assert lean.image_keys == {} and lean.instructions == data.instructions


def _write_old_file(path) -> None:
    """A file as the writer before images wrote it (schema v1, no image attributes)."""
    with h5py.File(path, "w") as f:
        g = f.create_group("data")
        g.attrs["total"] = 3
        g.attrs["env_args"] = json.dumps(
            {"env_name": "hopper", "type": "sim2real", "env_kwargs": {"obs_history": 1}}
        )
        g.attrs["sim2real_schema"] = "sim2real.demos"
        g.attrs["schema_version"] = 1
        g.attrs["obs_keys"] = json.dumps([["qpos", 2]])
        g.attrs["action_joint_names"] = json.dumps(["a"])
        g.attrs["action_low"] = np.array([-1.0])
        g.attrs["action_high"] = np.array([1.0])
        g.attrs["control_period_s"] = 0.008
        d = g.create_group("demo_0")
        d.attrs["num_samples"] = 3
        d.attrs["return"] = 3.0
        d.create_dataset("obs/qpos", data=np.zeros((3, 2), np.float32))
        d.create_dataset("next_obs/qpos", data=np.ones((3, 2), np.float32))
        d.create_dataset("actions", data=np.zeros((3, 1), np.float32))
        d.create_dataset("rewards", data=np.ones(3, np.float32))
        d.create_dataset("dones", data=np.array([0, 0, 1], np.uint8))
        d.create_dataset("terminals", data=np.array([0, 0, 1], np.uint8))


def test_an_old_file_without_images_still_loads(tmp_path):
    path = tmp_path / "old.hdf5"
    _write_old_file(path)
    data = load_demos(path, task="hopper")
    assert data.num_samples == 3 and data.image_keys == {}
    assert data.episodes[0].images == {} and data.instructions == [None]
    assert "images" not in data.summary()
    # and written back, it stays an image-less file
    again = save_demos(tmp_path / "again.hdf5", data)
    with h5py.File(again) as f:
        assert "image_keys" not in f["data"].attrs
        assert "instruction" not in f["data/demo_0"].attrs


def _corrupt(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


def _replace(key, value):
    def fn(f):
        del f[key]
        f.create_dataset(key, data=value)

    return fn


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            _replace("data/demo_1/obs/image", np.zeros((2, 32, 32, 3), np.uint8)),
            r"demo_1/obs/image: image dataset has shape \[2, 32, 32, 3\], expected \[\d+, 32, 32, 3\]",
        ),
        (
            _replace("data/demo_0/next_obs/image", np.zeros((20, 16, 32, 3), np.uint8)),
            r"demo_0/next_obs/image: image dataset has shape",
        ),
        (
            lambda f: (lambda ds: _replace("data/demo_0/obs/image", ds[()].astype(np.float32))(f))(
                f["data/demo_0/obs/image"]
            ),
            "demo_0/obs/image: image frames must be uint8, got dtype float32",
        ),
        (
            lambda f: f["data/demo_2/obs"].__delitem__("image"),
            "image dataset 'obs/image' is missing",
        ),
        (
            lambda f: f["data"].attrs.__setitem__("image_keys", json.dumps([["image", [32, 32]]])),
            r"image key 'image' has frame shape \[32, 32\]",
        ),
        (
            lambda f: f["data"].attrs.__setitem__("image_keys", "[1, 2]"),
            r"image_keys must be \[\[key, \[H, W, C\]\], ...\]",
        ),
    ],
)
def test_bad_image_data_gives_errors_naming_the_problem(expert_demos, tmp_path, mutate, message):
    path = save_demos(tmp_path / "d.hdf5", expert_demos)
    _corrupt(path, mutate)
    with pytest.raises(DatasetError, match=message):
        load_demos(path)


def test_saving_frames_that_do_not_fit_is_refused(expert_demos, tmp_path):
    import copy

    data = copy.deepcopy(expert_demos)
    ep = data.episodes[1]
    ep.images["image"] = ep.images["image"][:, :16]
    with pytest.raises(ValueError, match=r"episode 1: images\['image'\] has shape"):
        save_demos(tmp_path / "bad.hdf5", data)
    ep.images["image"] = ep.next_images["image"].astype(np.float32)
    with pytest.raises(ValueError, match=r"episode 1: images\['image'\] must be a uint8 array"):
        save_demos(tmp_path / "bad.hdf5", data)
    assert not (tmp_path / "bad.hdf5").exists()


def test_the_expert_source_needs_a_task_that_has_an_expert():
    with pytest.raises(ValueError, match="task 'cartpole' has no scripted expert"):
        collect_demos("expert", "cartpole", episodes=1)
    with pytest.raises(ValueError, match="needs a task"):
        collect_demos("expert", None, episodes=1)
