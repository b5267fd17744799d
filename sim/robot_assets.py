"""Robot models that other packages ship, copied out of their wheels once, at setup time.

The Unitree Go1 MJCF and meshes come in the wheel of `mjlab` (Apache-2.0), which
cannot be installed next to our MuJoCo (it pins another major version). So setup
downloads the wheel with pip itself (the same index and offline rules as every other
package), copies only the model, its meshes and the licence into a local asset
directory, and writes a manifest with the source and a sha256 of every file. Nothing
downloads at run time: a task that needs a model it cannot find says which command
installs it.

    python -m sim.robot_assets install    # idempotent; --force to reinstall
    python -m sim.robot_assets verify     # check every file against the manifest
    python -m sim.robot_assets path       # where the Go1 model lives

The asset root is `<repo>/.assets/` (gitignored), or `$SIM2REAL_ASSETS` when set.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ASSETS_ENV = "SIM2REAL_ASSETS"
INSTALL_COMMAND = "python -m sim.robot_assets install"
MANIFEST = "manifest.json"
_REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RobotAsset:
    """Where one robot model lives inside a published wheel, and what to keep of it."""

    name: str
    """Directory under the asset root."""
    package: str
    version: str
    model_root: str
    """Folder inside the wheel that holds the model; its layout is kept below `name`."""
    members: tuple[str, ...]
    """Glob patterns, relative to `model_root`, of the files to copy."""
    licence_member: str
    """Path inside the wheel of the licence file, copied as LICENSE."""
    model_file: str
    """The MJCF, relative to the asset directory."""
    provenance: str
    """Where the model comes from and under which terms (written to the manifest)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


GO1 = RobotAsset(
    name="unitree_go1",
    package="mjlab",
    version="1.6.0",
    model_root="mjlab/asset_zoo/robots/unitree_go1/xmls/",
    members=("go1.xml", "assets/*.stl"),
    licence_member="mjlab-1.6.0.dist-info/licenses/LICENSE",
    model_file="go1.xml",
    # the wheel carries one licence file, mjlab's Apache-2.0, and go1.xml has no header of
    # its own; the model is mujoco_menagerie's unitree_go1 (whose README releases it under
    # BSD-3-Clause), derived from Unitree's public go1_description URDF
    provenance=(
        "Unitree Go1 MJCF and meshes as shipped in the mjlab 1.6.0 wheel (PyPI, Apache-2.0; "
        "its LICENSE is copied here). The model originates from google-deepmind/"
        "mujoco_menagerie unitree_go1 (BSD-3-Clause, per that directory's README), derived "
        "from Unitree Robotics' go1_description URDF (unitreerobotics/unitree_ros)."
    ),
)


class AssetsNotInstalledError(FileNotFoundError):
    """A robot model that setup installs is not in the asset directory."""


def assets_root() -> Path:
    """`$SIM2REAL_ASSETS` when set, else `.assets/` at the repository root."""
    env = os.environ.get(ASSETS_ENV)
    return Path(env).expanduser() if env else _REPO_ROOT / ".assets"


def asset_dir(asset: RobotAsset = GO1, root: str | os.PathLike | None = None) -> Path:
    return (Path(root) if root is not None else assets_root()) / asset.name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(directory: Path) -> dict | None:
    try:
        with open(directory / MANIFEST) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def verify(asset: RobotAsset = GO1, root: str | os.PathLike | None = None) -> list[str]:
    """What is wrong with the installed copy of `asset` (empty when it is complete and
    every file matches the manifest's sha256)."""
    d = asset_dir(asset, root)
    manifest = read_manifest(d)
    if manifest is None:
        return [f"no readable {MANIFEST} in {d}"]
    src = manifest.get("source", {})
    if (src.get("package"), src.get("version")) != (asset.package, asset.version):
        return [
            f"{d} holds {src.get('package')}=={src.get('version')}, expected {asset.requirement}"
        ]
    problems = []
    files = manifest.get("files", {})
    if asset.model_file not in files:
        problems.append(f"the manifest lists no {asset.model_file}")
    for rel, digest in sorted(files.items()):
        p = d / rel
        if not p.is_file():
            problems.append(f"missing {p}")
        elif _sha256(p) != digest:
            problems.append(f"{p} differs from the manifest's sha256")
    return problems


def extract_wheel(
    wheel: str | os.PathLike, asset: RobotAsset = GO1, root: str | os.PathLike | None = None
) -> Path:
    """Copy `asset`'s files out of `wheel` into its asset directory; returns that directory.

    The copy is assembled next to the destination and moved into place whole, so an
    interrupted install never leaves a half-written model that looks installed.
    """
    wheel = Path(wheel)
    dest = asset_dir(asset, root)
    meta = f"{asset.package}-{asset.version}.dist-info/METADATA"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        if meta not in names:
            raise ValueError(f"{wheel} is not the wheel of {asset.requirement} (no {meta})")
        picked: dict[str, str] = {}  # path in the asset dir -> member
        for pattern in asset.members:
            hits = sorted(
                n
                for n in names
                if n.startswith(asset.model_root)
                and not n.endswith("/")
                and fnmatch.fnmatchcase(n[len(asset.model_root) :], pattern)
            )
            if not hits:
                raise ValueError(f"{wheel} has no {asset.model_root}{pattern}")
            picked.update({n[len(asset.model_root) :]: n for n in hits})
        if asset.licence_member not in names:
            raise ValueError(f"{wheel} has no licence file {asset.licence_member}")
        picked["LICENSE"] = asset.licence_member
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{asset.name}-", dir=dest.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users
        try:
            files = {}
            for rel, member in sorted(picked.items()):
                out = tmp / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                files[rel] = _sha256(out)
            manifest = {
                "asset": asset.name,
                "model_file": asset.model_file,
                "source": {
                    "package": asset.package,
                    "version": asset.version,
                    "wheel": wheel.name,
                    "wheel_sha256": _sha256(wheel),
                    "model_root": asset.model_root,
                },
                "provenance": asset.provenance,
                "files": files,
            }
            with open(tmp / MANIFEST, "w") as f:
                json.dump(manifest, f, indent=2, sort_keys=True)
                f.write("\n")
            if dest.exists():
                old = dest.with_name(f".{asset.name}-old")
                shutil.rmtree(old, ignore_errors=True)
                dest.rename(old)
                tmp.rename(dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def download_wheel(asset: RobotAsset, into: str | os.PathLike) -> Path:
    """`pip download` the asset's wheel (no dependencies) into `into`; its path.

    pip runs as this interpreter's module, so it uses the index, find-links and
    offline settings every other install on this machine uses.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        asset.requirement,
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        os.fspath(into),
        "--quiet",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not download {asset.requirement} with pip (exit {done.returncode}):\n"
            f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}"
        )
    wheels = sorted(Path(into).glob(f"{asset.package}-{asset.version}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip reported success but left no {asset.requirement} wheel in {into}")
    return wheels[0]


def install(
    asset: RobotAsset = GO1,
    root: str | os.PathLike | None = None,
    *,
    force: bool = False,
    wheel: str | os.PathLike | None = None,
) -> Path:
    """Install `asset` (idempotent: a complete, verified copy is kept); its directory.

    `wheel` takes the model from a wheel already on disk instead of downloading it.
    """
    if not force and not verify(asset, root):
        return asset_dir(asset, root)
    if wheel is not None:
        return extract_wheel(wheel, asset, root)
    with tempfile.TemporaryDirectory(prefix="sim2real-wheel-") as tmp:
        return extract_wheel(download_wheel(asset, tmp), asset, root)


def model_dir(asset: RobotAsset = GO1, root: str | os.PathLike | None = None) -> Path:
    """The installed asset's directory; AssetsNotInstalledError naming the install command.

    Checks the manifest and that the model file is there, not every checksum
    (`verify` does that), so that building an env stays fast.
    """
    d = asset_dir(asset, root)
    manifest = read_manifest(d)
    ok = (
        manifest is not None
        and manifest.get("source", {}).get("version") == asset.version
        and (d / asset.model_file).is_file()
    )
    if not ok:
        env = os.environ.get(ASSETS_ENV)
        where = f" (${ASSETS_ENV}={env})" if env and root is None else ""
        raise AssetsNotInstalledError(
            f"the {asset.name} robot model ({asset.requirement}) is not installed in {d}{where}; "
            f"install it with `{INSTALL_COMMAND}` (scripts/setup.sh runs it)"
        )
    return d


def go1_model_dir() -> Path:
    """Directory of the installed Unitree Go1 model (go1.xml and assets/)."""
    return model_dir(GO1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sim.robot_assets", description=__doc__.split("\n")[0]
    )
    p.add_argument("command", choices=("install", "verify", "path"))
    p.add_argument(
        "--force", action="store_true", help="reinstall even when a verified copy exists"
    )
    p.add_argument("--wheel", help="take the model from this wheel instead of downloading it")
    p.add_argument("--root", help=f"asset root (default: ${ASSETS_ENV} or <repo>/.assets)")
    args = p.parse_args(argv)
    if args.command == "install":
        try:
            d = install(GO1, args.root, force=args.force, wheel=args.wheel)
        except (OSError, RuntimeError, ValueError, zipfile.BadZipFile) as e:
            print(f"python -m sim.robot_assets install: error: {e}", file=sys.stderr)
            return 1
        print(f"{GO1.name}: {GO1.requirement} installed in {d}")
        return 0
    if args.command == "verify":
        problems = verify(GO1, args.root)
        for line in problems:
            print(f"{GO1.name}: {line}", file=sys.stderr)
        if not problems:
            print(f"{GO1.name}: ok ({asset_dir(GO1, args.root)})")
        return 1 if problems else 0
    print(model_dir(GO1, args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
