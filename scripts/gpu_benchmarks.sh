#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks_gpu.md in one run, so that a lent GPU's time
# goes to measuring (issue 23's targets):
#   1. the Warp backend's and the torch hooks' tests on CUDA (agreement, resets, resume)
#   2. env steps/s at 4096 envs: C backend, Warp with numpy hooks, Warp with torch hooks
#      (target: quadruped >= 250k env steps/s on one H200)
#   3. the time to a walking Go1: PPO on the go1 task (Warp, torch hooks) for
#      TRAIN_SECONDS of wall time (target: walking in under 10 minutes), stopped by
#      SIGTERM (the runner finishes the iteration and checkpoints), exported, and its
#      velocity tracking measured in sim2sim against a robot that stands still
#   4. our PPO against mjlab's runner (rsl_rl) on mjlab's Go1 flat task, where
#      .venv-mjlab exists
#
#   bash scripts/gpu_benchmarks.sh [OUT_DIR]          # default runs/gpu-<time>
#
# DEVICE, ENVS, TRAIN_SECONDS and MJLAB_ITERATIONS override the defaults (cuda, 4096,
# 600, 10) and TESTS=0 leaves out step 1, e.g. to rehearse it on a CPU:
#   DEVICE=cpu ENVS=8 TRAIN_SECONDS=60 MJLAB_ITERATIONS=1 TESTS=0 bash scripts/gpu_benchmarks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/gpu-$(date +%Y%m%d-%H%M%S)}"
DEVICE="${DEVICE:-cuda}"
ENVS="${ENVS:-4096}"
TRAIN_SECONDS="${TRAIN_SECONDS:-600}"
MJLAB_ITERATIONS="${MJLAB_ITERATIONS:-10}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ -e "$OUT" ]; then
    echo "gpu_benchmarks: $OUT exists; name a new directory (no run's files are overwritten)" >&2
    exit 2
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "== $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"; }
step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, warp; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'warp', warp.__version__)"
} | tee "$OUT/machine.txt"

if [ "${TESTS:-1}" != 0 ]; then
    step "1. Warp backend and torch hooks tests on $DEVICE"
    SIM2REAL_TEST_WARP_DEVICE="$DEVICE" "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_sim_warp.py tests/test_sim_device_step.py 2>&1 | tee "$OUT/tests.log" || status=1
fi

step "2. env steps/s at $ENVS envs"
"$PY" benchmarks/warp_backend.py --device "$DEVICE" --tasks quadruped halfcheetah ant \
    --envs "$ENVS" --json "$OUT/warp_backend.json" 2>&1 | tee "$OUT/warp_backend.log" || status=1

step "3. go1 PPO for ${TRAIN_SECONDS}s of wall time, $ENVS envs"
timeout --signal=TERM --kill-after=120 "$TRAIN_SECONDS" "$PY" -m training.cli train ppo \
    --task go1 --steps 1000000000 --run-dir "$OUT/go1" run.device="$DEVICE" \
    env.backend=warp env.hooks=torch env.num_envs="$ENVS" run.progress=false run.video=false \
    2>&1 | tee "$OUT/go1_train.log"
"$PY" -m training.cli export "$OUT/go1" --out "$OUT/go1_policy.onnx" 2>&1 | tee -a "$OUT/go1_train.log" \
    && "$PY" benchmarks/quadruped_tracking.py "$OUT/go1_policy.onnx" --json "$OUT/go1_tracking.json" \
        2>&1 | tee "$OUT/go1_tracking.log" || status=1

if [ -x .venv-mjlab/bin/python ]; then
    step "4. our PPO vs mjlab's runner, mjlab Go1 flat, $ENVS envs"
    .venv-mjlab/bin/python benchmarks/mjlab_ppo.py --device "$DEVICE" --envs "$ENVS" \
        --iterations "$MJLAB_ITERATIONS" --out "$OUT/mjlab_ppo.json" 2>&1 | tee "$OUT/mjlab_ppo.log" \
        || status=1
else
    step "4. skipped: no .venv-mjlab (bash scripts/setup_mjlab.sh)"
fi
step "done: $OUT (status $status)"
exit $status
