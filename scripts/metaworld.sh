#!/usr/bin/env bash
# Meta-World MT10 end to end (`make metaworld`): experts -> demonstrations -> training -> evaluation, into
# runs/metaworld/. Every stage reuses what an earlier run left behind, so re-running resumes.
# Settings differ from Meta-World's usual MT10 protocol (state-based RL on its 50 training variants): here a
# policy is cloned from scripted demos and sees 64x64 pixels + hand, gripper and goal, and it is evaluated on
# fresh seeds, i.e. object and goal positions it has not seen (envs/metaworld.py says how seeds map).
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL="${MUJOCO_GL:-egl}"

DATA="${DATA:-data/metaworld.hdf5}"
RUN="${RUN:-runs/metaworld}"
CONFIG="${CONFIG:-configs/metaworld.yaml}"
EPISODES_PER_TASK="${EPISODES_PER_TASK:-100}"   # demonstrations per task
EVAL_EPISODES="${EVAL_EPISODES:-50}"             # evaluation episodes per task (fresh seeds)
CURVE_EPISODES="${CURVE_EPISODES:-10}"           # per task, for each checkpoint train.keep_every kept
NOISE="${NOISE:-0.2}"                            # DART: std of the noise on the expert's motion
EVAL_SEED=100000
mkdir -p "$RUN" "$(dirname "$DATA")"

source scripts/stages.sh  # stage, timed

if ! python -c "import metaworld" 2>/dev/null; then
  echo "error: Meta-World is not installed; run: pip install -e '.[metaworld]' (make setup does)" >&2
  exit 2
fi

stage "1/6 scripted experts on the evaluation seeds (what the policy is measured against)"
if [ -f "$RUN/experts.json" ]; then
  echo "already measured ($RUN/experts.json)"
else
  timed experts python -m envs --tasks metaworld/mt10 --episodes "$EVAL_EPISODES" --seed "$EVAL_SEED" --physics-only \
    --json "$RUN/experts.json.tmp" --contact-sheet "$RUN/tasks.png"
  mv "$RUN/experts.json.tmp" "$RUN/experts.json"
fi

stage "2/6 collect $EPISODES_PER_TASK demonstrations per MT10 task into $DATA"
resume=""
if [ -e "$DATA" ] || [ -e "$DATA.parts" ]; then resume=--resume; fi   # complete what is there
timed collect vla-collect --tasks metaworld/mt10 --episodes-per-task "$EPISODES_PER_TASK" --workers 2 \
  --out "$DATA" --seed 0 --noise "$NOISE" $resume
vla-data validate "$DATA"

stage "3/6 train $CONFIG into $RUN"
if [ -f "$RUN/summary.json" ] && python -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['finished'] else 1)" "$RUN/summary.json"; then
  echo "already trained ($RUN/summary.json)"
elif [ -f "$RUN/latest/train_state.pt" ]; then
  timed train vla-train --data "$DATA" --out "$RUN" --resume
else
  timed train vla-train --config "$CONFIG" --data "$DATA" --out "$RUN"
fi

stage "4/6 evaluate: $EVAL_EPISODES fresh episodes per task, the expert's rate on the same seeds beside"
if [ -f "$RUN/eval.json" ]; then
  echo "already evaluated ($RUN/eval.json)"
else
  timed eval vla-eval --checkpoint "$RUN" --episodes-per-task "$EVAL_EPISODES" --seed "$EVAL_SEED" --workers 2 \
    --experts "$RUN/experts.json" --json "$RUN/eval.json.tmp" --video "$RUN/videos"
  mv "$RUN/eval.json.tmp" "$RUN/eval.json"
fi

stage "5/6 the learning curve: $CURVE_EPISODES episodes per task for each kept checkpoint (train.keep_every)"
curve "$CURVE_EPISODES" "$EVAL_SEED"

stage "6/6 summary"
python -m vla.cli.report "$RUN"
