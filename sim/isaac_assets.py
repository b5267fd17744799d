"""Stand-in USD assets for Isaac Lab's classic tasks, written here, fetched from nowhere.

Isaac Lab's task configs name their robots and ground by path under an asset root
(`ISAACSIM_ASSET_ROOT`, by default NVIDIA's asset server). A machine without access to
that server (CI, an air-gapped cluster, this project's test machines) cannot build even
Isaac-Cartpole. `write_standin_assets()` writes, with `pxr` (usd-core, which Isaac Lab
installs), the few files those configs ask for into a local cache folder laid out like
the server, and `use_standin_assets()` points Isaac Lab at it:

- `Isaac/IsaacLab/Environments/Grid/default_ground_plane_checker_v1/default_ground_plane.usda`:
  an infinite collision plane (a `UsdGeom.Plane`, which Isaac Lab's ground spawner binds
  its physics material to), no textures.
- `Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd`: a fixed rail, a cart on the
  prismatic joint `slider_to_cart` (x, +-4 m) and a 1 m pole on the revolute joint
  `cart_to_pole` (about y, unlimited), the joint and body names Isaac Lab's cartpole
  tasks address. Masses and sizes are a plausible cart-pole, not NVIDIA's file: a policy
  trained on the stand-in is not one for the original asset.

Nothing here imports Isaac Lab, so the files can be written (and checked) before its
asset paths are computed, which happens when `isaaclab.utils.assets` is first imported.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = [
    "ASSET_ROOT_VARIABLE",
    "CARTPOLE_JOINTS",
    "STANDIN_FILES",
    "default_cache_dir",
    "use_standin_assets",
    "write_standin_assets",
]

ASSET_ROOT_VARIABLE = "ISAACSIM_ASSET_ROOT"
# bump when the files' content changes, so an old cache is never read as a new one
_VERSION = "v1"
GROUND = (
    "Isaac/IsaacLab/Environments/Grid/default_ground_plane_checker_v1/default_ground_plane.usda"
)
CARTPOLE = "Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd"
STANDIN_FILES = (GROUND, CARTPOLE)
CARTPOLE_JOINTS = ("slider_to_cart", "cart_to_pole")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sim2real" / "isaac_assets" / _VERSION


def _pxr():
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdPhysics
    except ImportError as e:
        raise ImportError(
            f"writing Isaac Lab's stand-in assets needs pxr (usd-core), not importable here "
            f"({e}); it comes with Isaac Lab in .venv-isaac: run `bash scripts/setup_isaac.sh`"
        ) from e
    return Gf, Sdf, Usd, UsdGeom, UsdPhysics


def write_standin_assets(root: str | Path | None = None) -> Path:
    """Write the stand-in files under `root` (default: `default_cache_dir()`) where they
    are missing, and return `root`. Each file is written under a temporary name and
    renamed, so that concurrent writers (parallel tests) never read half a file."""
    _pxr()  # before any folder is made: without pxr, nothing is written
    root = Path(root) if root is not None else default_cache_dir()
    writers = {GROUND: _write_ground, CARTPOLE: _write_cartpole}
    for rel in STANDIN_FILES:
        path = root / rel
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
        os.close(fd)
        try:
            writers[rel](tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return root


def use_standin_assets(root: str | Path | None = None) -> Path:
    """Write the stand-ins and make Isaac Lab read its assets from them. Must run before
    `isaaclab.utils.assets` is imported: it turns the root into path constants then."""
    root = write_standin_assets(root)
    os.environ[ASSET_ROOT_VARIABLE] = str(root)
    return root


def _new_stage(path: str, default: str):
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    # a fresh in-memory layer exported at the end: CreateNew refuses an existing file
    # (the empty temporary file mkstemp made)
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.SetStageKilogramsPerUnit(stage, 1.0)
    prim = UsdGeom.Xform.Define(stage, f"/{default}").GetPrim()
    stage.SetDefaultPrim(prim)
    return stage


def _write_ground(path: str) -> None:
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    stage = _new_stage(path, "GroundPlane")
    plane = UsdGeom.Plane.Define(stage, "/GroundPlane/CollisionPlane")
    plane.CreateAxisAttr(UsdGeom.Tokens.z)
    plane.CreateWidthAttr(100.0)
    plane.CreateLengthAttr(100.0)
    UsdPhysics.CollisionAPI.Apply(plane.GetPrim())
    stage.GetRootLayer().Export(path)


def _body(stage, path: str, pos, mass: float, inertia, shape: str, size) -> None:
    """A rigid body at `pos` with explicit mass and inertia (the importer must not have
    to derive them from geometry) and a visual shape without collision: the cart-pole
    only needs its joints, and contacts would cost the small contact budget of the task's
    MuJoCo Warp settings."""
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    xform = UsdGeom.Xform.Define(stage, path)
    xform.AddTranslateOp().Set(Gf.Vec3d(*pos))
    prim = xform.GetPrim()
    UsdPhysics.RigidBodyAPI.Apply(prim)
    mass_api = UsdPhysics.MassAPI.Apply(prim)
    mass_api.CreateMassAttr(mass)
    mass_api.CreateDiagonalInertiaAttr(Gf.Vec3f(*inertia))
    mass_api.CreateCenterOfMassAttr(Gf.Vec3f(0.0, 0.0, 0.0))
    if shape == "box":
        geom = UsdGeom.Cube.Define(stage, f"{path}/visual")
        geom.CreateSizeAttr(1.0)
        UsdGeom.Xformable(geom).AddScaleOp().Set(Gf.Vec3f(*size))
    else:
        geom = UsdGeom.Cylinder.Define(stage, f"{path}/visual")
        geom.CreateAxisAttr(UsdGeom.Tokens.z)
        geom.CreateRadiusAttr(size[0])
        geom.CreateHeightAttr(size[1])


def _box_inertia(m: float, x: float, y: float, z: float) -> tuple[float, float, float]:
    return (m * (y * y + z * z) / 12, m * (x * x + z * z) / 12, m * (x * x + y * y) / 12)


def _write_cartpole(path: str) -> None:
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    stage = _new_stage(path, "cartpole")
    root = stage.GetPrimAtPath("/cartpole")
    # the articulation root sits above the fixed joint: a fixed-base articulation
    UsdPhysics.ArticulationRootAPI.Apply(root)
    _body(stage, "/cartpole/rail", (0, 0, 0), 5.0, _box_inertia(5.0, 8.0, 0.03, 0.03),
          "box", (8.0, 0.03, 0.03))  # fmt: skip
    _body(stage, "/cartpole/cart", (0, 0, 0), 1.0, _box_inertia(1.0, 0.2, 0.25, 0.2),
          "box", (0.2, 0.25, 0.2))  # fmt: skip
    # the pole's frame at its middle, 0.5 m above the hinge at the cart's front face
    pole_mass, length, radius = 0.1, 1.0, 0.02
    pole_i = pole_mass * length * length / 12
    _body(stage, "/cartpole/pole", (0, 0.15, 0.5), pole_mass, (pole_i, pole_i, 1e-5),
          "cylinder", (radius, length))  # fmt: skip

    fixed = UsdPhysics.FixedJoint.Define(stage, "/cartpole/root_joint")
    fixed.CreateBody1Rel().SetTargets([Sdf.Path("/cartpole/rail")])  # body0 unset: the world

    slider = UsdPhysics.PrismaticJoint.Define(stage, "/cartpole/slider_to_cart")
    slider.CreateBody0Rel().SetTargets([Sdf.Path("/cartpole/rail")])
    slider.CreateBody1Rel().SetTargets([Sdf.Path("/cartpole/cart")])
    slider.CreateAxisAttr(UsdPhysics.Tokens.x)
    slider.CreateLowerLimitAttr(-4.0)
    slider.CreateUpperLimitAttr(4.0)
    _frames(slider, (0, 0, 0), (0, 0, 0))

    hinge = UsdPhysics.RevoluteJoint.Define(stage, "/cartpole/cart_to_pole")
    hinge.CreateBody0Rel().SetTargets([Sdf.Path("/cartpole/cart")])
    hinge.CreateBody1Rel().SetTargets([Sdf.Path("/cartpole/pole")])
    hinge.CreateAxisAttr(UsdPhysics.Tokens.y)
    _frames(hinge, (0, 0.15, 0), (0, 0, -0.5 * length))
    stage.GetRootLayer().Export(path)


def _frames(joint, pos0, pos1) -> None:
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    joint.CreateLocalPos0Attr(Gf.Vec3f(*pos0))
    joint.CreateLocalPos1Attr(Gf.Vec3f(*pos1))
    joint.CreateLocalRot0Attr(Gf.Quatf(1.0, 0.0, 0.0, 0.0))
    joint.CreateLocalRot1Attr(Gf.Quatf(1.0, 0.0, 0.0, 0.0))
