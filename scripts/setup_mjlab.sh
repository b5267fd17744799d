#!/usr/bin/env bash
# Create .venv-mjlab: mjlab 1.6 (its tasks, its MuJoCo Warp physics, the Unitree Go1/G1
# assets in its wheel) with sim2real installed beside it, so that our learners train
# mjlab's tasks (`.venv-mjlab/bin/sim2real train ppo --task mjlab:Velocity-Flat-Unitree-Go1`).
# Its own environment: mjlab pins MuJoCo 3.11, our C backend needs MuJoCo 4 (DESIGN.md).
# torch stays the CPU build on this machine's disk: the constraint keeps torchvision (which
# rsl-rl-lib pulls in and nothing here imports) from bringing a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=.venv-mjlab
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIN="$(mktemp)"
trap 'rm -f "$PIN"' EXIT
printf 'torch==2.13.0\nmujoco==3.11.0\n' > "$PIN"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "mjlab==1.6.0" -c "$PIN"
# sim2real itself (its `mjlab` entry point) and what its tests need there
"$VENV/bin/python" -m pip install -q -e . "pytest>=8" "pytest-timeout>=2.3" -c "$PIN"
"$VENV/bin/python" -c "import mjlab, mujoco, torch; print(f'setup: $VENV ready, mjlab 1.6.0, mujoco {mujoco.__version__}, torch {torch.__version__}')"
