#!/usr/bin/env bash
# One published `kvferry bench` run: its raw stdout under docs/results/ with the date, commit,
# machine and load around it (progress beside it), ready for scripts/bench_table.py.
#
# usage: scripts/bench-run.sh NAME [kvferry bench flags]   e.g. scripts/bench-run.sh host-bench \
#          --only cma,tcp,planner,notify --json --chart docs/performance.png
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/lib/run-header.sh
[ $# -ge 1 ] || { echo "usage: $0 NAME [bench flags]" >&2; exit 2; }
name=$1
shift
out=docs/results/$(date -u +%F)-$name.txt
progress=docs/results/$(date -u +%F)-$name.progress.txt
write_run_header "$out" "kvferry bench: raw stdout of one run (progress on stderr: $(basename "$progress"))" \
  "./kvferry bench $*" \
  "java: $(java -version 2>&1 | head -1); gcc: $(gcc --version | head -1); iperf3: $(iperf3 --version 2>/dev/null | head -1)"
start=$(date +%s)
set +e
./kvferry bench "$@" >> "$out" 2> "$progress"
rc=$?
set -e
{
  echo "# exit code: $rc; wall time $(( $(date +%s) - start )) s; finished: $(date -u '+%F %T') UTC"
  echo "# load average after: $(cat /proc/loadavg)"
} >> "$out"
echo "$out"
exit $rc
