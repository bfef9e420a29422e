#!/usr/bin/env bash
# Loads UCX into a JVM with a compiled hot loop and a safepoint storm (Repro.java), N times, with
# the classes given as CLASSES (before the fix: the jar of the commit before; after: rdma-jni's
# classes ahead of it). Prints each run's outcome and a count.
set -u
N=${N:-10}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
javac -d "$work" "$here/Repro.java"
ok=0
for i in $(seq 1 "$N"); do
  if java -cp "$CLASSES:$work" Repro > "$work/out$i.txt" 2>&1 && grep -q alive "$work/out$i.txt"; then
    ok=$((ok + 1)); echo "run $i: alive"
  else
    echo "run $i: died: $(grep -m1 -E 'Caught signal|SIGSEGV' "$work/out$i.txt")"
  fi
done
echo "alive in $ok of $N runs"
