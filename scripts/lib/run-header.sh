# Sourced by scripts/bench-run.sh and scripts/record-run.sh: the header of a recorded run's file
# under docs/results/, saying when, on which commit and on which machine it ran.

# write_run_header OUT TITLE COMMAND [LINE...]: writes (truncating) OUT with "# TITLE", the start
# time, commit, machine, each LINE (tool versions, say), the load average and "# command: COMMAND".
write_run_header() {
  local out=$1 title=$2 command=$3
  shift 3
  # Counted before OUT is truncated: a rerun on the same day rewrites a tracked file.
  local dirty
  dirty=$(git status --porcelain --untracked-files=no | wc -l)
  {
    echo "# $title"
    echo "# started: $(date -u '+%F %T') UTC"
    echo "# commit: $(git rev-parse HEAD) (branch $(git rev-parse --abbrev-ref HEAD)); uncommitted changes: $dirty"
    echo "# machine: nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem:/ {print $2}') GiB RAM; kernel $(uname -r)"
    local line
    for line in "$@"; do
      echo "# $line"
    done
    echo "# load average before: $(cat /proc/loadavg)"
    echo "# command: $command"
  } > "$out"
}
