#!/usr/bin/env bash
# The engine port's time in a step with get_finished asked a step ahead (a prefill engine's
# worker, the default of kvferry.bench_port) against a round trip each step, on this machine: for
# each round, one fresh prefill node and kvferry.bench_port over 256 requests per step with 0, 16
# and 256 new, the two variants alternated on the same node. One JSON line per run, tagged.
# usage: scripts/port-finished-ahead-ab.sh ROUNDS
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=${1:?usage: $0 ROUNDS}
for r in $(seq 1 "$rounds"); do
  port_node_start ahead-ab
  for new in 0 16 256; do
    for variant in ahead round-trip; do
      flag=()
      [ "$variant" = round-trip ] && flag=(--finished-round-trip)
      echo -n "round $r new $new $variant "
      port_bench --requests 256 --new "$new" --steps 200 --round-trips 500 "${flag[@]}"
    done
  done
  port_node_stop
done
