# Sourced by the end-to-end scripts (demo.sh, metaworld.sh): stage banners and per-stage wall clock,
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
