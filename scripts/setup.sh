#!/usr/bin/env bash
# Create .venv at the repository root and install sim2real with its extras.
# torch is pinned first: the CPU build on this machine's disk; a bare `torch`
# requirement would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${SIM2REAL_EXTRAS:-dev,sb3,llm,ros,gpu}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
# robot models other packages ship (the Unitree Go1, from mjlab's wheel): fetched now, by
# pip from the same index, so that nothing downloads at run time; a failure stops setup
.venv/bin/python -m sim.robot_assets install
echo "setup: .venv ready with extras [${EXTRAS}]"
