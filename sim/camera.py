"""Camera images of every env of a batch, rendered offscreen by MuJoCo.

One GL context and one scratch MjData serve the whole batch: each env's positions are
copied into the scratch data, its kinematics recomputed, and the frame rendered into a
row of one uint8 [N, H, W, 3] buffer. On a headless machine MuJoCo needs
``MUJOCO_GL=egl`` (``import sim`` sets it when no display is named).

Why kinematics only: a frame shows where bodies are, nothing that needs velocities or
forces, so ``mj_kinematics`` + ``mj_comPos`` + ``mj_camlight`` is all the scene needs,
and it works whatever engine holds the state (C batch, pool, Warp): the caller hands
``qpos`` rows, never an engine.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

# Far above any policy's input (VLA encoders take 64..448 px) and below the 2048 px
# framebuffer every GL implementation offers; the buffer is allocated at this size once
# per camera, so the bound also caps the memory one camera holds.
MAX_IMAGE_SIZE = 1024

__all__ = ["MAX_IMAGE_SIZE", "BatchCamera", "ImageSpec", "image_size_of"]


@dataclass(frozen=True)
class ImageSpec:
    """What an image observation group holds: uint8 [num_envs, height, width, channels],
    rendered from the model camera ``camera``."""

    height: int
    width: int
    camera: str
    channels: int = 3
    dtype: str = "uint8"

    @property
    def shape(self) -> tuple[int, int, int]:
        """One frame's shape, (height, width, channels)."""
        return (self.height, self.width, self.channels)


def image_size_of(size: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) of ``size``: one int for a square image, or a (height, width) pair.

    ValueError naming the problem for a size that is not a positive integer up to
    MAX_IMAGE_SIZE (MuJoCo renders any size in that range; zero, negative or fractional
    sizes have no frame, and larger ones exceed the offscreen buffer we allocate).
    """
    if isinstance(size, int | np.integer) and not isinstance(size, bool):
        pair = (size, size)
    elif isinstance(size, Sequence) and not isinstance(size, str) and len(size) == 2:
        pair = tuple(size)
    else:
        raise ValueError(f"image_size must be an int or a (height, width) pair, got {size!r}")
    for what, v in zip(("height", "width"), pair):
        if not isinstance(v, int | np.integer) or isinstance(v, bool):
            raise ValueError(f"image {what} must be an integer, got {v!r}")
        if not 1 <= v <= MAX_IMAGE_SIZE:
            raise ValueError(f"image {what} must be between 1 and {MAX_IMAGE_SIZE} pixels, got {v}")
    return int(pair[0]), int(pair[1])


class BatchCamera:
    """Frames of many envs of one model from one named camera.

    ``paint(env_id, model)`` (optional) is called before each env's frame to set what
    differs per env in the model's look (a task whose objects change colour per episode
    writes ``model.geom_rgba`` there); it writes into the camera's own copy of the model,
    never into the simulated one.
    """

    def __init__(
        self, model: mujoco.MjModel, num_envs: int, size: int | Sequence[int], camera: str
    ):
        self.height, self.width = image_size_of(size)
        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera) < 0:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"the model has no camera {camera!r}; cameras: {names}")
        self.camera = camera
        self.spec = ImageSpec(self.height, self.width, camera)
        m = copy.copy(model)
        m.vis.global_.offwidth = max(int(m.vis.global_.offwidth), self.width)
        m.vis.global_.offheight = max(int(m.vis.global_.offheight), self.height)
        # Measured with llvmpipe (EGL without a GPU), one 64 px frame: 37 ms with the
        # default 4096 px shadow map, 0.8 ms without; a fixed top-down camera gains
        # nothing from shadows. No multisampling either: edges keep the objects' own
        # colours, so colour is a clean cue in the image.
        m.light_castshadow[:] = 0
        m.vis.quality.offsamples = 0
        self.model = m
        self._data = mujoco.MjData(m)
        self._renderer: mujoco.Renderer | None = None
        self.frames = np.zeros((int(num_envs), self.height, self.width, 3), dtype=np.uint8)

    def _ensure_renderer(self) -> mujoco.Renderer:
        if self._renderer is None:
            try:
                self._renderer = mujoco.Renderer(self.model, self.height, self.width)
            except Exception as e:  # the GL backend's own errors name no fix
                raise RuntimeError(
                    f"could not start MuJoCo's offscreen renderer ({e}); on a machine "
                    "without a display set MUJOCO_GL=egl (or osmesa) before importing mujoco"
                ) from e
        return self._renderer

    def render(
        self,
        qpos: np.ndarray,
        ids: Sequence[int] | np.ndarray,
        paint: Callable[[int, mujoco.MjModel], None] | None = None,
    ) -> np.ndarray:
        """Render envs ``ids`` (their positions are ``qpos[ids]``) into ``self.frames``
        and return the whole buffer; rows of other envs keep their last frame."""
        renderer = self._ensure_renderer()
        m, d = self.model, self._data
        for i in np.asarray(ids, dtype=np.int64):
            d.qpos[:] = qpos[i]
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            mujoco.mj_camlight(m, d)
            if paint is not None:
                paint(int(i), m)
            renderer.update_scene(d, camera=self.camera)
            renderer.render(out=self.frames[i])
        return self.frames

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
