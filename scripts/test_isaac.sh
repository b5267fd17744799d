#!/usr/bin/env bash
# The Isaac Lab checks end to end: set up .venv-isaac (scripts/setup_isaac.sh; idempotent,
# ~3-8 min the first time, ~8 GB), then run tests/test_sim_isaac.py from the main venv with
# SIM2REAL_ISAAC=1, which runs tests/isaac_checks.py in .venv-isaac and asserts on it.
# Not part of scripts/test.sh: CI does not install Isaac Lab.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup_isaac.sh
status=0
SIM2REAL_ISAAC=1 .venv/bin/python -m pytest -q tests/test_sim_isaac.py "$@" || status=$?
echo "test_isaac: done in $((SECONDS - start)) s (pytest exit status $status)"
exit "$status"
