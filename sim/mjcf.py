"""Loading MJCF files with errors that say what is wrong and where.

`load_model` is for any task that simulates a file a user hands it (bring your own
robot); `require_names` checks that a model has the bodies, joints, actuators... a task
relies on, and names every one that is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import mujoco

_OBJ = {
    "body": mujoco.mjtObj.mjOBJ_BODY,
    "joint": mujoco.mjtObj.mjOBJ_JOINT,
    "actuator": mujoco.mjtObj.mjOBJ_ACTUATOR,
    "geom": mujoco.mjtObj.mjOBJ_GEOM,
    "site": mujoco.mjtObj.mjOBJ_SITE,
    "sensor": mujoco.mjtObj.mjOBJ_SENSOR,
    "keyframe": mujoco.mjtObj.mjOBJ_KEY,
}


def load_model(path: str | os.PathLike) -> mujoco.MjModel:
    """Compile the MJCF at `path`.

    Raises FileNotFoundError (naming the path) when there is no such file, and
    ValueError "could not load MJCF <path>: <mujoco's message>" when MuJoCo cannot
    parse or compile it.
    """
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        what = "is a directory, not an MJCF file" if os.path.isdir(path) else "not found"
        raise FileNotFoundError(f"MJCF file {path} {what}")
    try:
        return mujoco.MjModel.from_xml_path(path)
    except ValueError as e:
        msg = str(e).strip()
        raise ValueError(f"could not load MJCF {path}: {msg}") from e


def find_id(model: mujoco.MjModel, kind: str, name: str) -> int:
    """The id of the named object, or -1."""
    return mujoco.mj_name2id(model, _OBJ[kind], name)


def require_names(
    model: mujoco.MjModel, kind: str, names: Iterable[str], source: str = "the model"
) -> list[int]:
    """Ids of `names` (objects of `kind`: body, joint, actuator, geom, site, sensor,
    keyframe); ValueError naming all missing ones otherwise."""
    if kind not in _OBJ:
        raise ValueError(f"unknown MuJoCo object kind {kind!r}; known: {sorted(_OBJ)}")
    names = list(names)
    ids = [find_id(model, kind, n) for n in names]
    missing = [n for n, i in zip(names, ids, strict=True) if i < 0]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise ValueError(
            f"MJCF {source} lacks the {kind}{plural} {', '.join(repr(n) for n in missing)}"
        )
    return ids
