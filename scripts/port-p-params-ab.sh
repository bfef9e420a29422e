#!/usr/bin/env bash
# The engine port's time in a prefill engine's step when its new requests carry the params a
# router gives P: get_num_new_matched_tokens sent one-way (P's client, engine role prefill, the
# default) against a round trip per new request (--matched-round-trip), on this machine. For each
# round, one fresh prefill node and kvferry.bench_port --p-params over 256 requests per step with
# 16 and 256 new, the two variants alternated on the same node. One JSON line per run, tagged.
# usage: scripts/port-p-params-ab.sh ROUNDS
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=${1:?usage: $0 ROUNDS}
for r in $(seq 1 "$rounds"); do
  port_node_start p-params-ab
  for new in 16 256; do
    for variant in one-way round-trip; do
      flag=()
      [ "$variant" = round-trip ] && flag=(--matched-round-trip)
      echo -n "round $r new $new $variant "
      port_bench --requests 256 --new "$new" --steps 200 --round-trips 500 --p-params "${flag[@]}"
    done
  done
  port_node_stop
done
