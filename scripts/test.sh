#!/usr/bin/env bash
# Set up (idempotent) and run the test suite; heavy learning runs are benchmarks, not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MUJOCO_GL="${MUJOCO_GL:-egl}"
.venv/bin/ruff check .
.venv/bin/python -m pytest -m "not benchmark" "$@"
