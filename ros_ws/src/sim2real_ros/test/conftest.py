"""pytest setup of this package's tests, the same under `colcon test` and the repository's run.

`colcon test` (ament_python) runs ``python -m pytest`` in the package directory; the
repository's ``pytest`` collects this directory through its ``testpaths``. Either way the
tests import the package from its source (``sim2real_ros``), the repository's ``deploy``
and ``sim``, and ``tests/ros_support.py`` (the exporter of untrained test policies, which
needs torch and ``sim`` and so stays out of the package): all three go on ``sys.path``
here, once, rather than in every test file.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
REPO = PACKAGE.parents[2]  # ros_ws/src/sim2real_ros -> the sim2real repository

for path in (REPO, REPO / "tests", PACKAGE):  # the package first: its source, not a build
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
