#!/usr/bin/env bash
# Create .venv-isaac: Isaac Lab 3.0 (its tasks, its rsl_rl wrapper, Newton / MuJoCo Warp
# physics, which runs without Omniverse Kit and on the CPU) with sim2real installed beside
# it, so that our learners train Isaac Lab's tasks
# (`.venv-isaac/bin/sim2real train ppo --task isaac:Isaac-Cartpole`).
# Its own environment (DESIGN.md): Isaac Lab needs Python 3.12 and pins torch 2.11,
# MuJoCo 3.x and warp-lang 1.17; the main venv has Python 3.11, torch 2.13 and MuJoCo 4.
# Idempotent: a second run finds everything installed and only checks it (~20 s).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-isaac
ISAACLAB=3.0.0
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python"; do
    # a pyenv shim exists for versions it does not select: run it to know
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      PYTHON="$candidate"; break
    fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  echo "setup_isaac: Isaac Lab $ISAACLAB needs Python 3.12; none found (set PYTHON=...)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  echo "setup_isaac: $VENV is not Python 3.12 ($("$VENV/bin/python" -V)); remove it and rerun" >&2
  exit 1
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# Isaac Lab's own pins decide torch, torchvision and MuJoCo (~190 packages, ~8 GB)
"$VENV/bin/python" -m pip install -q "isaaclab==$ISAACLAB"
# sim2real and its tests must not move what Isaac Lab pinned: constrain to what it installed
PIN="$(mktemp)"
trap 'rm -f "$PIN"' EXIT
"$VENV/bin/python" - "$PIN" <<'EOF'
import sys
from importlib.metadata import version

with open(sys.argv[1], "w") as f:
    for dist in ("torch", "torchvision", "mujoco", "mujoco-warp", "warp-lang", "numpy"):
        f.write(f"{dist}=={version(dist)}\n")
EOF
"$VENV/bin/python" -m pip install -q -e . "pytest>=8" "pytest-timeout>=2.3" -c "$PIN"
"$VENV/bin/python" -c "
from importlib.metadata import version as v
print(f'setup: $VENV ready, isaaclab {v(\"isaaclab\")}, newton {v(\"newton\")}, '
      f'mujoco {v(\"mujoco\")}, torch {v(\"torch\")}')"
