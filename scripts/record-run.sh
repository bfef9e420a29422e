#!/usr/bin/env bash
# Runs one command and keeps its raw output under docs/results/ with the date, commit, machine
# and load around it, so every figure quoted in the docs points at the run it came from.
#
# usage: scripts/record-run.sh NAME COMMAND [ARGS...]
#   e.g. scripts/record-run.sh demo-python ./kvferry demo --engine python --tp-p 2 --tp-d 1 --json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 2 ] || { echo "usage: $0 NAME COMMAND [ARGS...]" >&2; exit 2; }
name=$1
shift
out=docs/results/$(date -u +%F)-$name.txt
dirty=$(git status --porcelain --untracked-files=no | wc -l)
{
  echo "# raw output (stdout and stderr) of one run"
  echo "# started: $(date -u '+%F %T') UTC"
  echo "# commit: $(git rev-parse HEAD) (branch $(git rev-parse --abbrev-ref HEAD)); uncommitted changes: $dirty"
  echo "# machine: nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem:/ {print $2}') GiB RAM; kernel $(uname -r)"
  echo "# load average before: $(cat /proc/loadavg)"
  echo "# command: $*"
} > "$out"
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
