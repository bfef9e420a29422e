#!/usr/bin/env bash
# Runs one command and keeps its raw output under docs/results/ with the date, commit, machine
# and load around it, so every figure quoted in the docs points at the run it came from.
#
# usage: scripts/record-run.sh NAME COMMAND [ARGS...]
#   e.g. scripts/record-run.sh demo-python ./kvferry demo --engine python --tp-p 2 --tp-d 1 --json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/lib/run-header.sh
[ $# -ge 2 ] || { echo "usage: $0 NAME COMMAND [ARGS...]" >&2; exit 2; }
name=$1
shift
out=docs/results/$(date -u +%F)-$name.txt
write_run_header "$out" "raw output (stdout and stderr) of one run" "$*"
start=$(date +%s)
set +e
"$@" >> "$out" 2>&1
rc=$?
set -e
{
  echo "# exit: $rc after $(( $(date +%s) - start )) s"
  echo "# load average after: $(cat /proc/loadavg)"
} >> "$out"
echo "$out (exit $rc)"
exit $rc
