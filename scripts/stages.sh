# Sourced by the end-to-end scripts (demo.sh, metaworld.sh): stage banners and per-stage wall clock,
# recorded in $RUN/stage_times.txt (which the caller creates).
stage() { printf '\n== %s ==\n' "$*"; }
timed() {  # timed NAME CMD...: run, print and record the stage's wall-clock time
  local name=$1; shift
  local t0=$SECONDS
  "$@"
  echo "$name $((SECONDS - t0))" >> "$RUN/stage_times.txt"
  echo "($name took $((SECONDS - t0)) s)"
}
