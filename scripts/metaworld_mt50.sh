#!/usr/bin/env bash
# Meta-World MT50 on LeRobot's published protocol, beside SmolVLA and pi0 (`make metaworld-mt50`, issue 44):
# experts -> demonstrations -> training -> evaluation -> the SmolVLA paper's table, into runs/metaworld_mt50/.
# Every stage skips what an earlier run finished (collection and training resume with --resume), so the job
# may be interrupted and re-run, in another session too. `bash scripts/metaworld_mt50.sh --help` prints this.
#
# The protocol (docs/metaworld_mt50.md): the 50 `metaworld-lerobot/<task>-v3` ids, the moved corner2 camera and
# the state obs[:4] (hand xyz, gripper), LeRobot's task sentences, 500 steps, success at any step; 10 episodes
# per task (500 in all, LeRobot's count) and 50 per task (our tighter figure), on seeds 100000+, which no
# demonstration used (the collector's start at 0). Splits: easy 28, medium 11, hard 6, very hard 5; the
# table's Average is the mean of the four splits, as the paper's.
#
# Sizes, and why:
#   demonstrations  EPISODES_PER_TASK=50 per task (LeRobot's dataset has 50), successes of Meta-World's scripted
#                   experts with DART noise 0.2 (the clean action is the label); 10% held out per task for the
#                   validation loss, so 45 per task train (2250 in all, about 210k steps).
#   image           IMAGE_SIZE=128: corner2 sits far from the table; a puck is 2-3 px at 64, about 4 at 96 and
#                   5 at 128, and half the table's weight (hard + very hard) is pucks, nuts and pegs. 128 px
#                   costs about 10 GB of preloaded frames and 1.6-1.8x 96's training time, for a higher figure on 50
#                   episodes a task (docs/metaworld_mt50.md); IMAGE_SIZE=96 is the cheaper job (about 6 GB).
#   model/steps     configs/metaworld_mt50.yaml: MT10's architecture (about 1.2M parameters), 9000 steps of 32.
#   rows            (1) no privileged information (the default): waypoint targets from proprio + gripper only;
#                   (2) MT50_PRIVILEGED=1 adds a run with the simulator's training-time targets (object xyz and
#                   image position; MT10's full recipe) in runs/metaworld_mt50/privileged/.
#
# Stages: 1 experts (10 + 50 seeds per task, physics only), 2 collect, 3 train row 1, 4 evaluate 10 per task and
# print the table, 5 row 2 (MT50_PRIVILEGED=1), 6 40 more per task in parts of 10, 7 the curve (CURVE_EPISODES>0),
# 8 report. Wall clock per stage: docs/metaworld_mt50.md (measured for experts, collection and the training pace; the
# evaluation stages estimated there); stage_times.txt records each run's own figures.
#
# Settings (environment variables): DATA, RUN, CONFIG, EPISODES_PER_TASK, IMAGE_SIZE, NOISE, TRAIN_STEPS (overrides
# the config's train.steps), TIGHT_EPISODES (50: per task, the 10 of the protocol included; 10 or less skips the
# 40 more), MT50_PRIVILEGED (0/1), CURVE_EPISODES (0 = no curve).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
export MUJOCO_GL="${MUJOCO_GL:-egl}"

DATA="${DATA:-data/metaworld_mt50.hdf5}"
RUN="${RUN:-runs/metaworld_mt50}"
CONFIG="${CONFIG:-configs/metaworld_mt50.yaml}"
EPISODES_PER_TASK="${EPISODES_PER_TASK:-50}"   # demonstrations per task (45 train + 5 valid)
IMAGE_SIZE="${IMAGE_SIZE:-128}"                 # corner2 frames, pixels square
NOISE="${NOISE:-0.2}"                           # DART: std of the noise on the expert's motion
TRAIN_STEPS="${TRAIN_STEPS:-}"                  # empty: the config's train.steps
TIGHT_EPISODES="${TIGHT_EPISODES:-50}"          # per task for the tighter figure (the first 10 are the protocol's)
MT50_PRIVILEGED="${MT50_PRIVILEGED:-0}"         # 1: also row 2, the simulator's training-time targets
CURVE_EPISODES="${CURVE_EPISODES:-0}"           # per task, for each checkpoint train.keep_every kept
PROTOCOL_EPISODES=10                            # LeRobot's: 10 per task
EVAL_SEED=100000
MORE=$((TIGHT_EPISODES - PROTOCOL_EPISODES))
PRIVILEGED_OVERRIDES=(data.aux_key=object data.keypoint_key=object_px data.waypoint_targets=false)
STEPS_OVERRIDE=()
if [ -n "$TRAIN_STEPS" ]; then STEPS_OVERRIDE=("train.steps=$TRAIN_STEPS"); fi
mkdir -p "$RUN" "$(dirname "$DATA")"

source scripts/stages.sh  # stage, timed

if ! python -c "import metaworld" 2>/dev/null; then
  echo "error: Meta-World is not installed; run: pip install -e '.[metaworld]' (make setup does)" >&2
  exit 2
fi

# Each stage's skip check stays outside `timed`, so a re-run that skips it keeps its recorded time.
measure_experts() {  # measure_experts NAME FILE EPISODES: the scripted experts on the evaluation seeds
  local name=$1 out=$2 episodes=$3
  if [ -f "$out" ]; then echo "already measured ($out)"; return; fi
  timed "$name" python -m envs --tasks metaworld-lerobot/mt50 --episodes "$episodes" --seed "$EVAL_SEED" \
    --physics-only --json "$out.tmp"
  mv "$out.tmp" "$out"
}

train_run() {  # train_run NAME OUT [OVERRIDE...]: train, or resume, or skip a finished run
  local name=$1 out=$2; shift 2
  if [ -f "$out/summary.json" ] && python -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['finished'] else 1)" "$out/summary.json"; then
    echo "already trained ($out/summary.json)"
  elif [ -f "$out/latest/train_state.pt" ]; then  # the resumed part's time replaces the line (stages.sh)
    timed "$name" vla-train --data "$DATA" --out "$out" --resume "${STEPS_OVERRIDE[@]}"
  else
    timed "$name" vla-train --config "$CONFIG" --data "$DATA" --out "$out" "$@" "${STEPS_OVERRIDE[@]}"
  fi
}

evaluate_protocol() {  # evaluate_protocol NAME OUT: LeRobot's 10 episodes per task, the expert beside each task
  local name=$1 out=$2
  if [ -f "$out/eval.json" ]; then echo "already evaluated ($out/eval.json)"; return; fi
  timed "${name}_eval10" vla-eval --checkpoint "$out" --episodes-per-task "$PROTOCOL_EPISODES" --seed "$EVAL_SEED" \
    --workers 2 --experts "$RUN/experts.json" --json "$out/eval.json.tmp" --video "$out/videos"
  mv "$out/eval.json.tmp" "$out/eval.json"
}

evaluate_more() {  # evaluate_more NAME OUT: the next seeds, 10 per task per part (each part resumes on its own),
  local name=$1 out=$2 start n part           # so eval.json + eval_more/*.json are TIGHT_EPISODES per task
  if [ ! -f "$out/latest/config.json" ]; then return; fi   # (row 2 when it was not trained)
  mkdir -p "$out/eval_more"
  for ((start = EVAL_SEED + PROTOCOL_EPISODES; start < EVAL_SEED + TIGHT_EPISODES; start += PROTOCOL_EPISODES)); do
    n=$((EVAL_SEED + TIGHT_EPISODES - start < PROTOCOL_EPISODES ? EVAL_SEED + TIGHT_EPISODES - start : PROTOCOL_EPISODES))
    part="$out/eval_more/seeds_$start.json"
    if [ -f "$part" ]; then echo "already evaluated ($part)"; continue; fi
    timed "${name}_eval_$start" vla-eval --checkpoint "$out" --episodes-per-task "$n" --seed "$start" --workers 2 \
      --json "$part.tmp"
    mv "$part.tmp" "$part"
  done
}

stage "1/8 scripted experts on the evaluation seeds: $PROTOCOL_EPISODES and $TIGHT_EPISODES per task"
measure_experts experts "$RUN/experts.json" "$PROTOCOL_EPISODES"
measure_experts experts50 "$RUN/experts50.json" "$TIGHT_EPISODES"

stage "2/8 collect $EPISODES_PER_TASK demonstrations per MT50 task at ${IMAGE_SIZE}px into $DATA"
if [ -f "$RUN/mt50_job.json" ] && [ -e "$DATA" ] && [ ! -e "$DATA.parts" ]; then
  read -r size demos < <(python -c "import json, sys; j = json.load(open(sys.argv[1]))
print(j['image_size'], j['demos_per_task'])" "$RUN/mt50_job.json")
  if [ "$size" != "$IMAGE_SIZE" ] || [ "$demos" != "$EPISODES_PER_TASK" ]; then  # never train one job as another
    echo "error: $DATA was collected at ${size}px with $demos demos per task, not IMAGE_SIZE=$IMAGE_SIZE" \
      "EPISODES_PER_TASK=$EPISODES_PER_TASK; set those or give another DATA and RUN" >&2
    exit 2
  fi
  echo "already collected ($DATA; $RUN/mt50_job.json)"
else
  resume=""
  if [ -e "$DATA" ] || [ -e "$DATA.parts" ]; then resume=--resume; fi   # complete what is there
  timed collect vla-collect --tasks metaworld-lerobot/mt50 --episodes-per-task "$EPISODES_PER_TASK" --workers 2 \
    --image-size "$IMAGE_SIZE" --out "$DATA" --seed 0 --noise "$NOISE" $resume
  vla-data validate "$DATA"
  printf '{"demos_per_task": %d, "valid_fraction": 0.1, "noise": %s, "image_size": %d, "data": "%s"}\n' \
    "$EPISODES_PER_TASK" "$NOISE" "$IMAGE_SIZE" "$DATA" > "$RUN/mt50_job.json"   # what the report's table names
fi

stage "3/8 train row 1, no privileged information ($CONFIG) into $RUN"
train_run train "$RUN"

stage "4/8 evaluate row 1 on the published protocol: $PROTOCOL_EPISODES episodes per task"
evaluate_protocol row1 "$RUN"
python -m vla.cli.report "$RUN" | sed -n '/^## Meta-World MT50/,/^Settings that differ/p'   # the headline, early

stage "5/8 row 2, the simulator's training-time targets (MT50_PRIVILEGED=$MT50_PRIVILEGED)"
if [ "$MT50_PRIVILEGED" = 1 ]; then
  mkdir -p "$RUN/privileged"
  train_run train_privileged "$RUN/privileged" "${PRIVILEGED_OVERRIDES[@]}"
  evaluate_protocol row2 "$RUN/privileged"
else
  echo "skipped (MT50_PRIVILEGED=1 trains it: $CONFIG with ${PRIVILEGED_OVERRIDES[*]})"
fi

stage "6/8 the tighter figure: $MORE more episodes per task (seeds from $((EVAL_SEED + PROTOCOL_EPISODES))), $TIGHT_EPISODES in all"
evaluate_more row1 "$RUN"
evaluate_more row2 "$RUN/privileged"   # when row 2 was trained

stage "7/8 the learning curve: $CURVE_EPISODES episodes per task for each kept checkpoint (CURVE_EPISODES>0)"
if [ "$CURVE_EPISODES" -gt 0 ]; then curve "$CURVE_EPISODES" "$EVAL_SEED"; fi

stage "8/8 report: the SmolVLA paper's MT50 table, our rows beside the published ones"
python -m vla.cli.report "$RUN"
