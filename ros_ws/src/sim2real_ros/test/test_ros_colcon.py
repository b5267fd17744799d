"""`colcon test` finds and runs this package's tests (colcon itself is not installed here).

colcon's ament_python test step (colcon_core.task.python.test.pytest) runs when the
package's setup.py declares pytest as a test dependency (``tests_require`` or
``extras_require["test"]``): it starts ``python -m pytest`` with no path, in the package
directory, passing its options (JUnit file, test-name prefix, cache directory) through
``PYTEST_ADDOPTS``. rosdep reads the test dependency from package.xml. The checks below
read those files as colcon does, then run pytest the way colcon does.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent  # ros_ws/src/sim2real_ros
TEST_DIR = PKG / "test"


def _setup_keywords() -> dict[str, ast.expr]:
    tree = ast.parse((PKG / "setup.py").read_text())
    (call,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setup"
    ]
    return {k.arg: k.value for k in call.keywords if k.arg}


def _declares(requirements: list[str], name: str) -> bool:
    # colcon's has_test_dependency: the name, optionally followed by a version spec
    return any(re.split(r" |<|=|>|!", r)[0] == name for r in requirements)


def test_package_layout_is_what_colcon_ament_python_expects():
    assert TEST_DIR.is_dir()
    tests = sorted(p.name for p in TEST_DIR.glob("test_*.py"))
    assert {"test_ros_launch.py", "test_ros_nodes.py", "test_ros_observation.py"} <= set(tests)
    # no __init__.py: test/ would become the package `test` and shadow the standard
    # library's, and find_packages would install it
    assert not (TEST_DIR / "__init__.py").exists()

    kw = _setup_keywords()
    assert _declares(ast.literal_eval(kw["tests_require"]), "pytest")
    assert _declares(ast.literal_eval(kw["extras_require"])["test"], "pytest")
    # the tests stay out of the installed package
    packages = kw["packages"]
    assert isinstance(packages, ast.Call) and ast.unparse(packages.func) == "find_packages"
    excluded = ast.literal_eval(next(k.value for k in packages.keywords if k.arg == "exclude"))
    assert {"test", "test.*"} <= set(excluded)

    root = ET.parse(PKG / "package.xml").getroot()
    assert root.get("format") == "3"
    assert "python3-pytest" in [e.text for e in root.findall("test_depend")]
    assert root.findtext("export/build_type") == "ament_python"


def test_pytest_in_the_package_directory_collects_every_test_and_runs_them(tmp_path):
    """``colcon test --packages-select sim2real_ros --pytest-args -k test_ros_launch``,
    as colcon runs it: every test file must import from the package directory (a
    collection error fails the run), and the selected fast subset must pass."""
    junit = tmp_path / "pytest.xml"
    addopts = [
        "--tb=short",
        f"--junit-xml={junit}",
        "--junit-prefix=sim2real_ros",
        "-o",
        f"cache_dir={tmp_path / '.pytest_cache'}",
        "-k",
        "test_ros_launch",  # colcon's --pytest-args; leaves this test out (no recursion)
    ]
    env = dict(os.environ, PYTEST_ADDOPTS=" ".join(addopts), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        [sys.executable, "-m", "pytest"],
        cwd=PKG,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("errors")) == 0 and int(suite.get("failures")) == 0
    cases = suite.findall("testcase")
    # colcon's prefix, then the module's path from pytest's rootdir (in this repository the
    # repository root, whose pyproject.toml holds the pytest settings)
    names = {c.get("classname") for c in cases}
    assert all(n.startswith("sim2real_ros.") for n in names), names
    assert {n.rsplit(".", 2)[-2:] == ["test", "test_ros_launch"] for n in names} == {True}
    launch_tests = (TEST_DIR / "test_ros_launch.py").read_text().count("\ndef test_")
    assert len(cases) >= launch_tests > 0
    # every test file of the package was collected, the selection only deselected them
    collected = re.search(r"(\d+) deselected", out.stdout)
    assert collected and int(collected.group(1)) > len(cases), out.stdout[-2000:]
