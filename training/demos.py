"""Demonstrations: stored as HDF5 laid out as robomimic
does, loaded back with a validated schema, and cut into training windows (training.collect
records them from a policy).

Why HDF5 in robomimic's layout (and not Minari): the layout is a plain, documented
convention (one group per demo, one dataset per observation key) that robomimic,
Diffusion Policy, DPPO's preprocessing and LeRobot's converters already read; a file is
self-contained and readable with h5py alone (one small dependency, no dataset registry,
no download service, no Gymnasium env spec to re-register: our environments are batched
simulators, not Gymnasium ids). Minari would add its own storage directory, a remote
dataset namespace and an env-spec round trip that buys nothing here.

Schema (``SCHEMA = "sim2real.demos"``, ``SCHEMA_VERSION = 1``)::

    /data                           group
        attrs  total                int: transitions in all demos (sum of num_samples)
               env_args             JSON {"env_name": task, "type": "sim2real",
                                          "env_kwargs": {"obs_history": 1, ...}}
               sim2real_schema      "sim2real.demos"
               schema_version       1
               obs_keys             JSON [[term, size], ...]: the policy frame, in order
               action_joint_names   JSON [name, ...]
               action_low/high      float64 [A]: the task's action bounds
               control_period_s     float
               source, action_noise, seed   how the demos were made (informational)
    /data/demo_<i>                  group, i = 0 .. num_demos - 1
        attrs  num_samples          int T >= 1
               return               float: sum of rewards
        obs/<term>                  float32 [T, size]: the observation frame at step t
        next_obs/<term>             float32 [T, size]: the frame after step t (at the last
                                    step: the true final observation, before any reset)
        actions                     float32 [T, A]: the executed action (noise included,
                                    clipped to the bounds), in env units
        rewards                     float32 [T]
        dones                       uint8 [T]: 1 at the episode's last step (robomimic)
        terminals                   uint8 [T]: 1 where the episode terminated rather than
                                    timed out (what offline RL needs for bootstrapping)

Optional, for tasks that observe camera images and take language instructions (e.g.
"instructed_reach"); files without them are the files above, and readers that know only
the above read files with them unchanged (image keys are not in ``obs_keys``)::

    /data   attrs  image_keys       JSON [[key, [H, W, C]], ...]: the image groups
    /data/demo_<i>
            attrs  instruction      str: the language instruction the demo follows
            obs/<key>               uint8 [T, H, W, C]: the frame at step t
            next_obs/<key>          uint8 [T, H, W, C]: the frame after step t (at the last
                                    step: the true final frame, before any reset)

Image datasets are gzip-compressed in chunks of one frame, so a loader reads any frame
without inflating its neighbours, and any HDF5 tool reads them (gzip, unlike lzf, is in
every HDF5 build).

Observations are stored one frame per step (no history); loaders stack history as the
simulator does at a reset (the first frame repeated). :func:`load_demos` checks all of
the above and raises :class:`DatasetError` naming the demo, key and problem.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.files import atomic_write

SCHEMA = "sim2real.demos"
SCHEMA_VERSION = 1

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "DatasetError",
    "DemoDataset",
    "Episode",
    "load_demos",
    "save_demos",
]


class DatasetError(ValueError):
    """A demonstration file that is not in the documented schema (or not for this task)."""


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("demonstration files are HDF5; install h5py (pip install h5py)") from e
    return h5py


@dataclass
class Episode:
    """One demonstration: frames [T, F], next frames [T, F], actions [T, A], rewards [T];
    optionally camera frames and the instruction it follows."""

    obs: np.ndarray
    next_obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool
    images: dict[str, np.ndarray] = field(default_factory=dict)
    """Image key -> uint8 [T, H, W, C]: the camera frame at step t."""
    next_images: dict[str, np.ndarray] = field(default_factory=dict)
    """Image key -> uint8 [T, H, W, C]: the frame after step t (the same keys as images)."""
    instruction: str | None = None
    """The language instruction the episode follows (None: the task takes none)."""

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def ret(self) -> float:
        return float(np.sum(self.rewards, dtype=np.float64))


@dataclass
class DemoDataset:
    """Episodes plus what the schema records about them."""

    task: str
    obs_terms: list[tuple[str, int]]
    action_joint_names: list[str]
    action_low: np.ndarray
    action_high: np.ndarray
    control_period_s: float
    episodes: list[Episode]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def frame_size(self) -> int:
        return sum(s for _, s in self.obs_terms)

    @property
    def action_size(self) -> int:
        return len(self.action_joint_names)

    @property
    def num_samples(self) -> int:
        return sum(len(e) for e in self.episodes)

    @property
    def returns(self) -> np.ndarray:
        return np.array([e.ret for e in self.episodes])

    @property
    def image_keys(self) -> dict[str, tuple[int, int, int]]:
        """Image key -> frame shape (H, W, C), as the first episode has them ({}: none)."""
        if not self.episodes:
            return {}
        return {k: tuple(int(d) for d in v.shape[1:]) for k, v in self.episodes[0].images.items()}

    @property
    def instructions(self) -> list[str | None]:
        """Each episode's instruction, in episode order."""
        return [e.instruction for e in self.episodes]

    def windows(self, obs_history: int, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training pairs for every step t of every episode.

        obs [M, obs_history * F]: frames t-H+1 .. t, oldest first, the first frame
        repeated before the episode's start (as the simulator fills its history at a
        reset); actions [M, horizon, A]: actions t .. t+horizon-1, the last action
        repeated past the episode's end.
        """
        if obs_history < 1 or horizon < 1:
            raise ValueError(f"obs_history and horizon must be >= 1, got {obs_history}, {horizon}")
        obs_out, act_out = [], []
        for ep in self.episodes:
            n = len(ep)
            t = np.arange(n)
            oi = np.clip(t[:, None] - obs_history + 1 + np.arange(obs_history)[None], 0, n - 1)
            ai = np.clip(t[:, None] + np.arange(horizon)[None], 0, n - 1)
            obs_out.append(ep.obs[oi].reshape(n, -1))
            act_out.append(ep.actions[ai])
        return (
            torch.as_tensor(np.concatenate(obs_out), dtype=torch.float32),
            torch.as_tensor(np.concatenate(act_out), dtype=torch.float32),
        )

    def summary(self) -> dict[str, Any]:
        r = self.returns
        return {
            "task": self.task,
            "episodes": len(self.episodes),
            "transitions": self.num_samples,
            "return_mean": float(r.mean()) if len(r) else float("nan"),
            "return_std": float(r.std()) if len(r) else float("nan"),
            **{k: v for k, v in self.info.items() if k in ("source", "action_noise", "seed")},
            **(
                {"images": {k: list(v) for k, v in self.image_keys.items()}}
                if self.image_keys
                else {}
            ),
        }


# ---------------------------------------------------------------------- writing
def save_demos(path: str | os.PathLike, data: DemoDataset) -> Path:
    """Write ``data`` in the schema above, atomically (a temp file, then a rename)."""
    h5py = _h5py()
    image_keys = _check_images(data)

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            g = f.create_group("data")
            g.attrs["total"] = int(data.num_samples)
            env_kwargs = {"obs_history": 1, **data.info.get("env_kwargs", {})}
            g.attrs["env_args"] = json.dumps(
                {"env_name": data.task, "type": "sim2real", "env_kwargs": env_kwargs}
            )
            g.attrs["sim2real_schema"] = SCHEMA
            g.attrs["schema_version"] = SCHEMA_VERSION
            g.attrs["obs_keys"] = json.dumps([[n, int(s)] for n, s in data.obs_terms])
            g.attrs["action_joint_names"] = json.dumps(list(data.action_joint_names))
            g.attrs["action_low"] = np.asarray(data.action_low, dtype=np.float64)
            g.attrs["action_high"] = np.asarray(data.action_high, dtype=np.float64)
            g.attrs["control_period_s"] = float(data.control_period_s)
            for key in ("source", "action_noise", "seed"):
                if key in data.info:
                    g.attrs[key] = data.info[key]
            if image_keys:
                g.attrs["image_keys"] = json.dumps([[k, list(v)] for k, v in image_keys.items()])
            for i, ep in enumerate(data.episodes):
                d = g.create_group(f"demo_{i}")
                n = len(ep)
                d.attrs["num_samples"] = n
                d.attrs["return"] = ep.ret
                start = 0
                for name, size in data.obs_terms:
                    sl = slice(start, start + size)
                    d.create_dataset(f"obs/{name}", data=ep.obs[:, sl].astype(np.float32))
                    d.create_dataset(f"next_obs/{name}", data=ep.next_obs[:, sl].astype(np.float32))
                    start += size
                d.create_dataset("actions", data=ep.actions.astype(np.float32))
                d.create_dataset("rewards", data=ep.rewards.astype(np.float32))
                dones = np.zeros(n, dtype=np.uint8)
                dones[-1] = 1
                d.create_dataset("dones", data=dones)
                terminals = np.zeros(n, dtype=np.uint8)
                terminals[-1] = 1 if ep.terminated else 0
                d.create_dataset("terminals", data=terminals)
                if ep.instruction is not None:
                    d.attrs["instruction"] = str(ep.instruction)
                for key, shape in image_keys.items():
                    for where, frames in (("obs", ep.images), ("next_obs", ep.next_images)):
                        d.create_dataset(
                            f"{where}/{key}",
                            data=frames[key],
                            chunks=(1, *shape),
                            compression="gzip",
                            compression_opts=4,
                        )

    return atomic_write(path, write)


def _check_images(data: DemoDataset) -> dict[str, tuple[int, int, int]]:
    """The image keys of ``data``; ValueError naming the episode and key where an
    episode's frames differ from the first episode's keys and shapes, are not uint8, do
    not have one frame per step, or where a key is also an observation term."""
    keys = data.image_keys
    clash = sorted(set(keys) & {n for n, _ in data.obs_terms})
    if clash:
        raise ValueError(f"image keys {clash} are also observation terms; names must differ")
    for i, ep in enumerate(data.episodes):
        n = len(ep)
        if ep.instruction is not None and not isinstance(ep.instruction, str):
            raise ValueError(f"episode {i}: instruction must be a string, got {ep.instruction!r}")
        for what, frames in (("images", ep.images), ("next_images", ep.next_images)):
            if set(frames) != set(keys):
                raise ValueError(
                    f"episode {i}: {what} has keys {sorted(frames)}, the dataset's image keys "
                    f"are {sorted(keys)}"
                )
            for key, shape in keys.items():
                a = frames[key]
                if not isinstance(a, np.ndarray) or a.dtype != np.uint8:
                    raise ValueError(
                        f"episode {i}: {what}[{key!r}] must be a uint8 array, got "
                        f"{getattr(a, 'dtype', type(a).__name__)}"
                    )
                if a.shape != (n, *shape):
                    raise ValueError(
                        f"episode {i}: {what}[{key!r}] has shape {list(a.shape)}, expected "
                        f"{[n, *shape]} (one {list(shape)} frame per step)"
                    )
    return keys


# ---------------------------------------------------------------------- loading
def _attr(group, name: str, where: str) -> Any:
    if name not in group.attrs:
        raise DatasetError(f"{where}: attribute {name!r} is missing")
    v = group.attrs[name]
    return v.decode() if isinstance(v, bytes) else v


def _json_attr(group, name: str, where: str) -> Any:
    raw = _attr(group, name, where)
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{where}: attribute {name!r} is not valid JSON ({e})") from None


def _array(group, key: str, where: str, shape: tuple[int | None, ...]) -> np.ndarray:
    if key not in group:
        raise DatasetError(f"{where}: dataset {key!r} is missing")
    obj = group[key]
    if not hasattr(obj, "shape") or not hasattr(obj, "dtype"):
        raise DatasetError(f"{where}: {key!r} is a group, expected a dataset")
    if obj.dtype.kind not in "fiub":
        raise DatasetError(f"{where}/{key}: expected numbers, got dtype {obj.dtype}")
    arr = np.asarray(obj[()])
    if arr.ndim != len(shape) or any(w is not None and w != s for w, s in zip(shape, arr.shape)):
        want = "[" + ", ".join("?" if w is None else str(w) for w in shape) + "]"
        raise DatasetError(f"{where}/{key}: expected shape {want}, got {list(arr.shape)}")
    if not np.isfinite(arr.astype(np.float64)).all():
        raise DatasetError(f"{where}/{key}: contains NaN or inf")
    return arr


def _image_keys(group, where: str, obs_terms: list[tuple[str, int]]) -> dict:
    """The file's ``image_keys`` attribute as {key: (H, W, C)} ({} when absent)."""
    if "image_keys" not in group.attrs:
        return {}
    raw = _json_attr(group, "image_keys", where)
    try:
        keys = {str(k): tuple(int(d) for d in shape) for k, shape in raw}
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: image_keys must be [[key, [H, W, C]], ...]") from None
    for key, shape in keys.items():
        if len(shape) != 3 or min(shape) < 1:
            raise DatasetError(
                f"{where}: image key {key!r} has frame shape {list(shape)}; expected "
                "[height, width, channels], all positive"
            )
    clash = sorted(set(keys) & {n for n, _ in obs_terms})
    if clash:
        raise DatasetError(f"{where}: image keys {clash} are also observation terms")
    return keys


def _frames(group, key: str, where: str, shape: tuple[int, ...]) -> np.ndarray:
    """An image dataset, checked for dtype and shape before it is read."""
    if key not in group:
        raise DatasetError(f"{where}: image dataset {key!r} is missing")
    obj = group[key]
    if not hasattr(obj, "shape") or not hasattr(obj, "dtype"):
        raise DatasetError(f"{where}: {key!r} is a group, expected an image dataset")
    if obj.dtype != np.uint8:
        raise DatasetError(f"{where}/{key}: image frames must be uint8, got dtype {obj.dtype}")
    if tuple(obj.shape) != shape:
        raise DatasetError(
            f"{where}/{key}: image dataset has shape {list(obj.shape)}, expected "
            f"{list(shape)} (one frame of image_keys' shape per step)"
        )
    return np.asarray(obj[()])


def load_demos(
    path: str | os.PathLike, task: str | None = None, images: bool = True
) -> DemoDataset:
    """Read and validate a demonstration file; ``task`` (if given) must match its task.

    ``images=False`` leaves a file's camera frames unread (a state-only learner needs
    none, and they are most of the file); the instructions are read either way.

    Raises FileNotFoundError for a missing file and :class:`DatasetError` for a file that
    is not HDF5, lacks a group, attribute or dataset of the schema, has inconsistent
    shapes or lengths, non-finite values, actions outside the action bounds, image frames
    of another dtype or shape than ``image_keys`` declares, or another schema version or
    task.
    """
    h5py = _h5py()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"demonstration file {path} does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path} is not a readable HDF5 file ({e})") from None
    with f:
        if "data" not in f:
            raise DatasetError(
                f"{path}: no '/data' group; expected robomimic's layout (/data/demo_<i>/...)"
            )
        g = f["data"]
        where = f"{path}:/data"
        schema = _attr(g, "sim2real_schema", where)
        if schema != SCHEMA:
            raise DatasetError(f"{where}: sim2real_schema is {schema!r}, expected {SCHEMA!r}")
        version = int(_attr(g, "schema_version", where))
        if version != SCHEMA_VERSION:
            raise DatasetError(
                f"{where}: schema_version {version} is not supported (this reader reads "
                f"{SCHEMA_VERSION})"
            )
        env_args = _json_attr(g, "env_args", where)
        if not isinstance(env_args, dict) or "env_name" not in env_args:
            raise DatasetError(f"{where}: env_args must be a JSON object with 'env_name'")
        file_task = str(env_args["env_name"])
        if task is not None and task != file_task:
            raise DatasetError(f"{path} holds demonstrations of task {file_task!r}, not {task!r}")
        obs_keys = _json_attr(g, "obs_keys", where)
        try:
            obs_terms = [(str(n), int(s)) for n, s in obs_keys]
        except (TypeError, ValueError):
            raise DatasetError(f"{where}: obs_keys must be [[name, size], ...]") from None
        if not obs_terms or any(s < 1 for _, s in obs_terms):
            raise DatasetError(f"{where}: obs_keys must list terms of positive size")
        joints = [str(j) for j in _json_attr(g, "action_joint_names", where)]
        low = np.asarray(_attr(g, "action_low", where), dtype=np.float64).reshape(-1)
        high = np.asarray(_attr(g, "action_high", where), dtype=np.float64).reshape(-1)
        a = len(joints)
        if a < 1 or low.shape != (a,) or high.shape != (a,):
            raise DatasetError(
                f"{where}: action_low/high must have one entry per joint ({a}), got "
                f"{low.shape} and {high.shape}"
            )
        image_keys = _image_keys(g, where, obs_terms)
        demos = sorted(
            (k for k in g.keys() if k.startswith("demo_")),
            key=lambda k: int(k[5:]) if k[5:].isdigit() else -1,
        )
        if not demos:
            raise DatasetError(f"{where}: no demo_<i> groups")
        episodes = []
        for name in demos:
            d = g[name]
            w = f"{where}/{name}"
            if not name[5:].isdigit():
                raise DatasetError(f"{w}: demo groups must be named demo_<integer>")
            n = int(_attr(d, "num_samples", w))
            if n < 1:
                raise DatasetError(f"{w}: num_samples must be >= 1, got {n}")
            frames, next_frames = [], []
            for term, size in obs_terms:
                frames.append(_array(d, f"obs/{term}", w, (n, size)))
                next_frames.append(_array(d, f"next_obs/{term}", w, (n, size)))
            actions = _array(d, "actions", w, (n, a))
            # the schema promises executed actions, so within the bounds (float32 slack)
            slack = 1e-5 * np.maximum(1.0, np.abs(np.concatenate([low, high])).max())
            outside = (actions < low - slack) | (actions > high + slack)
            if outside.any():
                t, j = map(int, np.argwhere(outside)[0])
                raise DatasetError(
                    f"{w}/actions: step {t}, joint {joints[j]!r} is {float(actions[t, j]):.6g}, "
                    f"outside the action bounds [{low[j]:g}, {high[j]:g}] "
                    f"({int(outside.sum())} values outside in this demo)"
                )
            rewards = _array(d, "rewards", w, (n,))
            dones = _array(d, "dones", w, (n,))
            if dones[-1] != 1 or (dones[:-1] != 0).any():
                raise DatasetError(f"{w}/dones: must be 1 at the last step only")
            terminals = _array(d, "terminals", w, (n,))
            if (terminals[:-1] != 0).any():
                raise DatasetError(f"{w}/terminals: only the last step may be terminal")
            instruction = _attr(d, "instruction", w) if "instruction" in d.attrs else None
            if instruction is not None and not isinstance(instruction, str):
                raise DatasetError(f"{w}: attribute 'instruction' must be a string")
            shown, shown_next = {}, {}
            if images:
                for key, shape in image_keys.items():
                    shown[key] = _frames(d, f"obs/{key}", w, (n, *shape))
                    shown_next[key] = _frames(d, f"next_obs/{key}", w, (n, *shape))
            episodes.append(
                Episode(
                    np.concatenate(frames, axis=1).astype(np.float32),
                    np.concatenate(next_frames, axis=1).astype(np.float32),
                    actions.astype(np.float32),
                    rewards.astype(np.float32),
                    bool(terminals[-1]),
                    shown,
                    shown_next,
                    instruction,
                )
            )
        total = int(_attr(g, "total", where))
        if total != sum(len(e) for e in episodes):
            raise DatasetError(
                f"{where}: total is {total} but the demos hold {sum(len(e) for e in episodes)} "
                f"transitions"
            )
        info = {k: _attr(g, k, where) for k in ("source", "action_noise", "seed") if k in g.attrs}
        info = {k: (v.item() if hasattr(v, "item") else v) for k, v in info.items()}
        info["env_kwargs"] = dict(env_args.get("env_kwargs", {}))
        return DemoDataset(
            task=file_task,
            obs_terms=obs_terms,
            action_joint_names=joints,
            action_low=low,
            action_high=high,
            control_period_s=float(_attr(g, "control_period_s", where)),
            episodes=episodes,
            info=info,
        )
