#!/usr/bin/env bash
# The re-attach race on the CPU (docs/results/2026-12-04-reattach-race/): kvferry.gpu_check runs
# the check (1 prompt) and then the TTFT path; between the two both engines detach and attach
# again, and the first TTFT warm-up transfer starts at once. Two busy loops hold the 2 CPUs, which
# widens the moment a node lists neither of an engine's workers. Per run: the exit status and the
# console's lines naming "left the cluster" (gpu_check of c657129 and before retried such a
# warm-up transfer and said "failed, tried again"; since, the run fails).
#
# With STRESS_CYCLES=N, each run is scripts/reattach_stress.py instead: N cycles of both engines
# detaching and attaching again with one transfer started at once.
#
# usage: scripts/reattach-race-ab.sh RUNS LABEL=JAR [LABEL=JAR ...]   (runs alternate by label)
set -u
runs=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
hogs=()
for _ in 1 2; do (while :; do :; done) & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
for r in $(seq 1 "$runs"); do
  for variant in "$@"; do
    label=${variant%%=*} jar=${variant#*=}
    t=$(mktemp -d) base=$((20000 + (RANDOM % 400) * 10))
    java -cp "$jar" dev.kvferry.cli.KvferryCli router --port $base --management-port $((base + 1)) \
      --seed-nodes 127.0.0.1:$base > "$t/router.log" 2>&1 &
    pids=($!)
    i=2
    for role in prefill decode; do
      java -cp "$jar" dev.kvferry.cli.KvferryCli node --role $role --engine-id $role-0 \
        --mode write,read --engine port --engine-socket "$t/$role.sock" --tp-size 1 \
        --port $((base + i)) --management-port $((base + i + 1)) --seed-nodes 127.0.0.1:$base \
        --transport cma > "$t/$role.log" 2>&1 &
      pids+=($!)
      i=$((i + 2))
    done
    began=$(date +%s.%N)
    if [ -n "${STRESS_CYCLES:-}" ]; then
      PYTHONPATH="$here/python" PYTHONDONTWRITEBYTECODE=1 timeout 600 "${PYTHON:-/usr/bin/python3}" \
        "$here/scripts/reattach_stress.py" "$t/prefill.sock" "$t/decode.sock" "$STRESS_CYCLES" > "$t/console.txt" 2>&1
      echo "run $r $label rc=$? $(tail -1 "$t/console.txt")"
      grep "^cycle [0-9]" "$t/console.txt" | head -3 | sed 's/^/    /'
      kill "${pids[@]}" 2>/dev/null
      wait "${pids[@]}" 2>/dev/null
      rm -rf "$t"
      continue
    fi
    (cd "$here/python" && PYTHONPATH=. PYTHONDONTWRITEBYTECODE=1 timeout 300 "${PYTHON:-/usr/bin/python3}" -m kvferry.gpu_check \
      --p-socket "$t/prefill.sock" --d-socket "$t/decode.sock" --p-device cpu --d-device cpu \
      --prompts 1 --max-prompt-tokens 64 --decode-steps 2 --num-blocks 256 --layers 2 \
      --modes write --ttft-lengths 64 --ttft-reps 2 --ttft-warmup 1 --no-generate \
      --no-mla-probe) > "$t/console.txt" 2>&1
    rc=$?
    wall=$(echo "$(date +%s.%N) - $began" | bc)
    retried=$(grep -c "failed, tried again" "$t/console.txt")
    left=$(grep -c "left the cluster" "$t/console.txt")
    printf 'run %d %s rc=%d retried=%d left_lines=%d wall_s=%.1f\n' "$r" "$label" "$rc" \
      "$retried" "$left" "$wall"
    grep "left the cluster" "$t/console.txt" | head -2 | sed 's/^/    /'
    kill "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
    [ $rc -eq 0 ] || tail -5 "$t/console.txt" | sed "s/^/    /"
    rm -rf "$t"
  done
done
