#!/usr/bin/env bash
# The end-to-end demo (`make demo`). Each stage reuses what an earlier run left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL="${MUJOCO_GL:-egl}"

stage() { printf '\n== %s ==\n' "$*"; }
timed() { local t0=$SECONDS; "$@"; echo "(${1##*/} took $((SECONDS - t0)) s)"; }

stage "1. the scripted experts on every task (seeded episodes, success rate, env speed)"
mkdir -p runs && timed python -m envs --episodes 20 --contact-sheet runs/tasks.png
echo "first frames of each task: runs/tasks.png"
