# Sourced by the end-to-end scripts (demo.sh, metaworld.sh, metaworld_mt50.sh): stage banners, per-stage wall clock,
# recorded in $RUN/stage_times.txt. A stage that runs again replaces its line (for a resumed stage: the last
# invocation's time); stages a re-run skips keep theirs.
stage() { printf '\n== %s ==\n' "$*"; }
timed() {  # timed NAME CMD...: run, print and record the stage's wall-clock time
  local name=$1; shift
  local t0=$SECONDS
  "$@"
  local times="$RUN/stage_times.txt"
  touch "$times"
  awk -v n="$name" -v s=$((SECONDS - t0)) '$1 != n { print } END { print n, s }' "$times" > "$times.tmp"
  mv "$times.tmp" "$times"
  echo "($name took $((SECONDS - t0)) s)"
}
curve() {  # curve EPISODES SEED: vla-eval every checkpoint train.keep_every kept (not the final one) into $RUN/curve/
  local episodes=$1 seed=$2 final kept ckpt name
  mkdir -p "$RUN/curve"
  final=$(basename "$(readlink -f "$RUN/latest")")
  for kept in "$RUN"/checkpoints/step_*/KEEP; do
    [ -e "$kept" ] || continue
    ckpt=$(dirname "$kept"); name=$(basename "$ckpt")
    if [ "$name" = "$final" ] || [ -f "$RUN/curve/$name.json" ]; then continue; fi
    timed "curve_$name" vla-eval --checkpoint "$ckpt" --episodes-per-task "$episodes" --seed "$seed" \
      --workers 2 --json "$RUN/curve/$name.json.tmp"
    mv "$RUN/curve/$name.json.tmp" "$RUN/curve/$name.json"
  done
}
