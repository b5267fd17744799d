"""Demonstration files: round trip, history/chunk windows, and clear errors for bad files."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from training.demos import DatasetError, DemoDataset, Episode, load_demos, save_demos


def _dataset(lengths=(4, 3)) -> DemoDataset:
    rng = np.random.default_rng(0)
    eps = []
    for i, n in enumerate(lengths):
        obs = rng.standard_normal((n, 3)).astype(np.float32)
        obs[:, 0] = np.arange(n) + 10 * i  # recognisable frames
        act = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32) / 10 + i
        eps.append(Episode(obs, obs + 1, act, np.ones(n, np.float32), terminated=bool(i % 2 == 0)))
    return DemoDataset(
        task="hopper",
        obs_terms=[("qpos", 2), ("qvel", 1)],
        action_joint_names=["a", "b"],
        action_low=np.array([-2.0, -2.0]),
        action_high=np.array([2.0, 2.0]),
        control_period_s=0.008,
        episodes=eps,
        info={"source": "test", "action_noise": 0.1, "seed": 3},
    )


def test_round_trip_in_robomimic_layout(tmp_path):
    data = _dataset()
    path = save_demos(tmp_path / "d.hdf5", data)
    with h5py.File(path) as f:
        assert f["data"].attrs["total"] == 7
        assert f["data/demo_0/obs/qpos"].shape == (4, 2)
        assert f["data/demo_1/actions"].shape == (3, 2)
        assert list(f["data/demo_0/dones"][()]) == [0, 0, 0, 1]
        assert list(f["data/demo_1/terminals"][()]) == [0, 0, 0]
    back = load_demos(path, task="hopper")
    assert back.num_samples == 7 and len(back.episodes) == 2
    for a, b in zip(data.episodes, back.episodes):
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.next_obs, b.next_obs)
        np.testing.assert_array_equal(a.actions, b.actions)
        assert a.terminated == b.terminated
    assert back.info["action_noise"] == pytest.approx(0.1)


def test_windows_pad_history_with_the_first_frame_and_chunks_with_the_last_action():
    data = _dataset(lengths=(4,))
    obs, act = data.windows(obs_history=2, horizon=3)
    assert obs.shape == (4, 6) and act.shape == (4, 3, 2)
    frames = data.episodes[0].obs
    np.testing.assert_array_equal(obs[0].numpy(), np.concatenate([frames[0], frames[0]]))
    np.testing.assert_array_equal(obs[2].numpy(), np.concatenate([frames[1], frames[2]]))
    a = data.episodes[0].actions
    np.testing.assert_array_equal(act[3].numpy(), np.stack([a[3], a[3], a[3]]))
    np.testing.assert_array_equal(act[1].numpy(), a[1:4])


def _corrupt(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda f: f.move("data", "stuff"), "no '/data' group"),
        (lambda f: f["data"].attrs.__delitem__("env_args"), "'env_args' is missing"),
        (lambda f: f["data"].attrs.__setitem__("schema_version", 99), "schema_version 99"),
        (lambda f: f["data/demo_1"].__delitem__("actions"), "demo_1: dataset 'actions' is missing"),
        (lambda f: f["data/demo_0/obs"].__delitem__("qvel"), "demo_0: dataset 'obs/qvel'"),
        (
            lambda f: (
                f["data/demo_0"].__delitem__("rewards"),
                f["data/demo_0"].create_dataset("rewards", data=np.ones(2)),
            ),
            r"demo_0/rewards: expected shape \[4\], got \[2\]",
        ),
        (
            lambda f: f["data/demo_1/actions"].__setitem__((0, 0), np.nan),
            "demo_1/actions: contains NaN",
        ),
        (lambda f: f["data"].attrs.__setitem__("total", 8), "total is 8"),
        (
            lambda f: f["data/demo_0/dones"].__setitem__(1, 1),
            "dones: must be 1 at the last step only",
        ),
        (lambda f: f["data"].attrs.__setitem__("obs_keys", "not json"), "not valid JSON"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path, mutate, message):
    path = save_demos(tmp_path / "d.hdf5", _dataset())
    _corrupt(path, mutate)
    with pytest.raises(DatasetError, match=message):
        load_demos(path)


def test_not_hdf5_missing_file_and_wrong_task(tmp_path):
    junk = tmp_path / "junk.hdf5"
    junk.write_text("this is not HDF5")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        load_demos(junk)
    with pytest.raises(FileNotFoundError):
        load_demos(tmp_path / "missing.hdf5")
    path = save_demos(tmp_path / "d.hdf5", _dataset())
    with pytest.raises(DatasetError, match="task 'hopper', not 'walker2d'"):
        load_demos(path, task="walker2d")


def test_cli_reports_a_bad_dataset_cleanly(tmp_path, capsys):
    from training.cli import main

    junk = tmp_path / "junk.hdf5"
    junk.write_text("nope")
    rc = main(
        ["train", "bc", "--task", "hopper", "--data", str(junk), "--run-dir", str(tmp_path / "r")]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "not a readable HDF5 file" in err
