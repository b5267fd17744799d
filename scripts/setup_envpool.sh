#!/usr/bin/env bash
# Create .venv-envpool: EnvPool, the C++ vector-environment library, as the simulator
# benchmark's peer (`sim2real bench sim --envpool`). Its own environment: EnvPool
# bundles its own MuJoCo and pins its own numpy range, and nothing of ours imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv-envpool/bin/python ]; then
  "$PY" -m venv .venv-envpool
fi
.venv-envpool/bin/python -m pip install -q --upgrade pip
.venv-envpool/bin/python -m pip install -q "envpool==1.2.5" numpy
.venv-envpool/bin/python -c "import envpool; print('setup: .venv-envpool ready, envpool', envpool.__version__)"
