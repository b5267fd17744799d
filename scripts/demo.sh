#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MUJOCO_GL="${MUJOCO_GL:-egl}"
.venv/bin/sim2real demo "$@"
