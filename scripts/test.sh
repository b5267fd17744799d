#!/usr/bin/env bash
# Set up (idempotent) and run the test suite; heavy learning runs are benchmarks, not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# mjlab's tasks run in their own venv (MuJoCo 3.11); SIM2REAL_MJLAB=0 leaves it out
if [ "${SIM2REAL_MJLAB:-1}" != 0 ]; then
  bash scripts/setup_mjlab.sh
fi
export MUJOCO_GL="${MUJOCO_GL:-egl}"
.venv/bin/ruff check .
.venv/bin/python -m pytest -m "not benchmark" "$@"
