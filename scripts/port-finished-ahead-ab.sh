#!/usr/bin/env bash
# The engine port's time in a step with get_finished asked a step ahead (a prefill engine's
# worker, the default of kvferry.bench_port) against a round trip each step, on this machine: for
# each round, one fresh prefill node and kvferry.bench_port over 256 requests per step with 0, 16
# and 256 new, the two variants alternated on the same node. One JSON line per run, tagged.
# usage: scripts/port-finished-ahead-ab.sh ROUNDS
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$root/scripts/gpu-env.sh" > /dev/null
py=${KVFERRY_PYTHON:-}
for c in /usr/bin/python3 python3; do  # the first with msgpack
  [ -n "$py" ] || ! "$c" -c 'import msgpack' 2>/dev/null || py=$c
done
rounds=${1:?usage: $0 ROUNDS}
for r in $(seq 1 "$rounds"); do
  d=$(mktemp -d) port=$((30000 + RANDOM % 20000))
  "$JAVA" -Xmx384m -cp "$CP" dev.kvferry.cli.KvferryCli node --role prefill --engine-id ahead-ab \
    --mode write --engine port --engine-socket "$d/port.sock" --port "$port" \
    --management-port $((port + 1)) --seed-nodes "127.0.0.1:$port" > "$d/node.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 150); do [ -S "$d/port.sock" ] && break; sleep 0.2; done
  for new in 0 16 256; do
    for variant in ahead round-trip; do
      flag=()
      [ "$variant" = round-trip ] && flag=(--finished-round-trip)
      echo -n "round $r new $new $variant "
      (cd "$root/python" && PYTHONPATH=$PWD "$py" -m kvferry.bench_port --socket "$d/port.sock" \
         --requests 256 --new "$new" --steps 200 --round-trips 500 "${flag[@]}")
    done
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$d"
done
