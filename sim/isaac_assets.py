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
- `Sim2real/Robots/Quadruped/quadruped-<digest>.usd`: not a stand-in but the project's
  own robot, the 12-joint quadruped of `sim/assets/quadruped.xml` (the `quadruped`
  task), for the Isaac Lab velocity task `sim.isaac_quadruped` defines. Everything in it
  is read from the compiled MJCF (`quadruped_model`), so the two cannot drift apart: a
  floating base, the links with the MJCF's masses, centres of mass and principal
  inertias, revolute joints on the MJCF's axes and ranges with angular drives (the
  MJCF's position actuators: kp, kv, force limit), and the MJCF's collision geoms (trunk
  box, thigh and calf capsules, foot spheres on the calves) as collision shapes. Bodies
  are laid out flat under the articulation root, as Isaac Lab's imported robots are (its
  contact sensors address `Robot/<body>`). The file's name carries a digest of the MJCF,
  so that an edited MJCF is written anew rather than read from an old cache. Left out:
  the visual-only geoms (motor housings, head) and the MJCF's contact parameters; the
  joints' armature, friction and passive damping travel in the task's actuator config
  (UsdPhysics has no attributes for them).

Nothing here imports Isaac Lab, so the files can be written (and checked) before its
asset paths are computed, which happens when `isaaclab.utils.assets` is first imported.
The quadruped's file needs `mujoco` to compile the MJCF (both venvs have it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "ASSET_ROOT_VARIABLE",
    "CARTPOLE_JOINTS",
    "QUADRUPED",
    "STANDIN_FILES",
    "QuadrupedModel",
    "default_cache_dir",
    "quadruped_file",
    "quadruped_model",
    "quadruped_usd",
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
QUADRUPED_MJCF = Path(__file__).resolve().parent / "assets" / "quadruped.xml"


def quadruped_file(xml: str | Path = QUADRUPED_MJCF) -> str:
    """The quadruped's USD path under the cache root, named by a digest of its MJCF: the
    cache's version covers the writers, the digest the robot they write from."""
    digest = hashlib.sha256(Path(xml).read_bytes()).hexdigest()[:12]
    return f"Sim2real/Robots/Quadruped/quadruped-{digest}.usd"


# the project's own robot, outside NVIDIA's layout (the task names it by path)
QUADRUPED = quadruped_file()
STANDIN_FILES = (GROUND, CARTPOLE, QUADRUPED)
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
    writers = {GROUND: _write_ground, CARTPOLE: _write_cartpole, QUADRUPED: _write_quadruped}
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


def quadruped_usd() -> Path:
    """The quadruped's USD file in the default cache, written if missing. Isaac Lab's
    task config names it by this path rather than under the asset root, so that the
    task builds with the user's own `ISAACSIM_ASSET_ROOT` too."""
    return write_standin_assets() / QUADRUPED


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


# ------------------------------------------------------------------ the quadruped


@dataclass(frozen=True)
class Link:
    """A rigid body: its frame in the base's frame at the zero joint pose (flat layout),
    its frame in its parent's (the joint frame), and its inertia about its centre of
    mass along the principal axes `inertia_quat` (w, x, y, z, in the body's frame)."""

    name: str
    parent: str | None
    pos: tuple[float, float, float]
    quat: tuple[float, float, float, float]
    local_pos: tuple[float, float, float]
    local_quat: tuple[float, float, float, float]
    mass: float
    com: tuple[float, float, float]
    inertia: tuple[float, float, float]
    inertia_quat: tuple[float, float, float, float]


@dataclass(frozen=True)
class Joint:
    """A revolute joint at its child's origin, about the child's `axis` ("X", "Y" or
    "Z"), with its range (rad), its position actuator (kp N m/rad, kd N m s/rad, force
    limit N m), armature (kg m^2), friction (N m), passive damping (N m s/rad) and
    standing angle (rad)."""

    name: str
    parent: str
    child: str
    axis: str
    lower: float
    upper: float
    kp: float
    kd: float
    effort: float
    armature: float
    friction: float
    damping: float
    default: float


@dataclass(frozen=True)
class Shape:
    """A collision geom: "box" (size: half extents), "capsule" (radius, half length of
    the segment, along its local z) or "sphere" (radius), posed in its body's frame."""

    name: str
    body: str
    kind: str
    pos: tuple[float, float, float]
    quat: tuple[float, float, float, float]
    size: tuple[float, ...]


@dataclass(frozen=True)
class QuadrupedModel:
    """What the quadruped's USD is written from, read from the compiled MJCF."""

    links: tuple[Link, ...]
    joints: tuple[Joint, ...]
    shapes: tuple[Shape, ...]
    standing_height: float  # the base's height in the MJCF's "home" keyframe, m


_AXES = {(1.0, 0.0, 0.0): "X", (0.0, 1.0, 0.0): "Y", (0.0, 0.0, 1.0): "Z"}


def _t(a) -> tuple[float, ...]:
    return tuple(float(x) for x in a)


def quadruped_model(xml: str | Path = QUADRUPED_MJCF) -> QuadrupedModel:
    """Compile the quadruped's MJCF and read what its USD needs. Raises ValueError for
    what the USD writer cannot express (a joint off its body's origin or off a body
    axis, a joint other than the free base and hinges, a joint without one actuator)."""
    import mujoco

    m = mujoco.MjModel.from_xml_path(str(xml))
    d = mujoco.MjData(m)
    # the zero joint pose, the base at the origin: the frames the USD bodies sit in
    d.qpos[:] = 0.0
    d.qpos[3] = 1.0
    mujoco.mj_kinematics(m, d)

    def name(kind, i: int) -> str:
        return mujoco.mj_id2name(m, kind, i)

    free = [j for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
    if len(free) != 1 or m.jnt_bodyid[free[0]] != 1:
        raise ValueError(f"{xml}: the first body must be the floating base (one free joint)")
    links = []
    for b in range(1, m.nbody):
        parent = int(m.body_parentid[b])
        links.append(Link(
            name=name(mujoco.mjtObj.mjOBJ_BODY, b),
            parent=name(mujoco.mjtObj.mjOBJ_BODY, parent) if parent else None,
            pos=_t(d.xpos[b]), quat=_t(d.xquat[b]),
            local_pos=_t(m.body_pos[b]), local_quat=_t(m.body_quat[b]),
            mass=float(m.body_mass[b]), com=_t(m.body_ipos[b]),
            inertia=_t(m.body_inertia[b]), inertia_quat=_t(m.body_iquat[b]),
        ))  # fmt: skip

    actuated = {}
    for a in range(m.nu):
        if m.actuator_trntype[a] != mujoco.mjtTrn.mjTRN_JOINT:
            raise ValueError(
                f"{xml}: actuator {name(mujoco.mjtObj.mjOBJ_ACTUATOR, a)} drives no joint"
            )
        actuated[int(m.actuator_trnid[a, 0])] = a
    key = m.key_qpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "home")]
    joints = []
    for j in range(m.njnt):
        if j == free[0]:
            continue
        jname = name(mujoco.mjtObj.mjOBJ_JOINT, j)
        axis = _AXES.get(_t(np.round(m.jnt_axis[j], 12)))
        if m.jnt_type[j] != mujoco.mjtJoint.mjJNT_HINGE or axis is None:
            raise ValueError(f"{xml}: joint {jname} must be a hinge about a body axis")
        if np.any(m.jnt_pos[j] != 0):
            raise ValueError(f"{xml}: joint {jname} must sit at its body's origin")
        if j not in actuated:
            raise ValueError(f"{xml}: joint {jname} has no actuator")
        a, dof, body = actuated[j], int(m.jnt_dofadr[j]), int(m.jnt_bodyid[j])
        force = np.abs(m.actuator_forcerange[a]).max() if m.actuator_forcelimited[a] else np.inf
        joints.append(Joint(
            name=jname,
            parent=name(mujoco.mjtObj.mjOBJ_BODY, int(m.body_parentid[body])),
            child=name(mujoco.mjtObj.mjOBJ_BODY, body),
            axis=axis,
            lower=float(m.jnt_range[j, 0]), upper=float(m.jnt_range[j, 1]),
            kp=float(m.actuator_gainprm[a, 0]), kd=float(-m.actuator_biasprm[a, 2]),
            effort=float(force),
            armature=float(m.dof_armature[dof]), friction=float(m.dof_frictionloss[dof]),
            damping=float(m.dof_damping[dof]),
            default=float(key[m.jnt_qposadr[j]]),
        ))  # fmt: skip

    kinds = {
        int(mujoco.mjtGeom.mjGEOM_BOX): ("box", 3),
        int(mujoco.mjtGeom.mjGEOM_CAPSULE): ("capsule", 2),
        int(mujoco.mjtGeom.mjGEOM_SPHERE): ("sphere", 1),
    }
    shapes = []
    for g in range(m.ngeom):
        # the robot's colliders: bodies past the world, contype or conaffinity set
        if m.geom_bodyid[g] == 0 or not (m.geom_contype[g] or m.geom_conaffinity[g]):
            continue
        gname = name(mujoco.mjtObj.mjOBJ_GEOM, g) or f"geom{g}"
        if int(m.geom_type[g]) not in kinds:
            raise ValueError(f"{xml}: collision geom {gname} is not a box, capsule or sphere")
        kind, n = kinds[int(m.geom_type[g])]
        shapes.append(Shape(
            name=gname, body=name(mujoco.mjtObj.mjOBJ_BODY, int(m.geom_bodyid[g])), kind=kind,
            pos=_t(m.geom_pos[g]), quat=_t(m.geom_quat[g]), size=_t(m.geom_size[g][:n]),
        ))  # fmt: skip
    return QuadrupedModel(tuple(links), tuple(joints), tuple(shapes), float(key[2]))


def _write_quadruped(path: str) -> None:
    Gf, Sdf, Usd, UsdGeom, UsdPhysics = _pxr()
    model = quadruped_model()
    stage = _new_stage(path, "quadruped")
    root = stage.GetPrimAtPath("/quadruped")
    # a floating base: no joint to the world, the articulation root above the bodies
    UsdPhysics.ArticulationRootAPI.Apply(root)

    def quat(q) -> Gf.Quatf:
        return Gf.Quatf(float(q[0]), Gf.Vec3f(*map(float, q[1:])))

    for link in model.links:
        xform = UsdGeom.Xform.Define(stage, f"/quadruped/{link.name}")
        xform.AddTranslateOp().Set(Gf.Vec3d(*link.pos))
        xform.AddOrientOp().Set(quat(link.quat))
        prim = xform.GetPrim()
        UsdPhysics.RigidBodyAPI.Apply(prim)
        mass = UsdPhysics.MassAPI.Apply(prim)
        mass.CreateMassAttr(link.mass)
        mass.CreateCenterOfMassAttr(Gf.Vec3f(*link.com))
        mass.CreateDiagonalInertiaAttr(Gf.Vec3f(*link.inertia))
        mass.CreatePrincipalAxesAttr(quat(link.inertia_quat))
    for shape in model.shapes:
        where = f"/quadruped/{shape.body}/{shape.name}"
        if shape.kind == "box":
            geom = UsdGeom.Cube.Define(stage, where)
            geom.CreateSizeAttr(1.0)
        elif shape.kind == "capsule":
            geom = UsdGeom.Capsule.Define(stage, where)
            geom.CreateAxisAttr(UsdGeom.Tokens.z)
            geom.CreateRadiusAttr(shape.size[0])
            geom.CreateHeightAttr(2.0 * shape.size[1])
        else:
            geom = UsdGeom.Sphere.Define(stage, where)
            geom.CreateRadiusAttr(shape.size[0])
        ops = UsdGeom.Xformable(geom)
        ops.AddTranslateOp().Set(Gf.Vec3d(*shape.pos))
        ops.AddOrientOp().Set(quat(shape.quat))
        if shape.kind == "box":
            ops.AddScaleOp().Set(Gf.Vec3f(*(2.0 * s for s in shape.size)))
        # the body's mass is authored: its colliders add none
        UsdPhysics.CollisionAPI.Apply(geom.GetPrim())

    by_name = {link.name: link for link in model.links}
    UsdGeom.Scope.Define(stage, "/quadruped/joints")
    for joint in model.joints:
        child = by_name[joint.child]
        hinge = UsdPhysics.RevoluteJoint.Define(stage, f"/quadruped/joints/{joint.name}")
        hinge.CreateBody0Rel().SetTargets([Sdf.Path(f"/quadruped/{joint.parent}")])
        hinge.CreateBody1Rel().SetTargets([Sdf.Path(f"/quadruped/{joint.child}")])
        hinge.CreateAxisAttr(joint.axis)
        # UsdPhysics measures revolute limits, and angular drive gains, in degrees
        hinge.CreateLowerLimitAttr(float(np.degrees(joint.lower)))
        hinge.CreateUpperLimitAttr(float(np.degrees(joint.upper)))
        hinge.CreateLocalPos0Attr(Gf.Vec3f(*child.local_pos))
        hinge.CreateLocalRot0Attr(quat(child.local_quat))
        hinge.CreateLocalPos1Attr(Gf.Vec3f(0.0, 0.0, 0.0))
        hinge.CreateLocalRot1Attr(Gf.Quatf(1.0, 0.0, 0.0, 0.0))
        drive = UsdPhysics.DriveAPI.Apply(hinge.GetPrim(), "angular")
        drive.CreateTypeAttr("force")
        drive.CreateStiffnessAttr(float(np.radians(joint.kp)))
        drive.CreateDampingAttr(float(np.radians(joint.kd)))
        drive.CreateMaxForceAttr(joint.effort)
        drive.CreateTargetPositionAttr(float(np.degrees(joint.default)))
    stage.GetRootLayer().Export(path)
