#!/usr/bin/env bash
# The engine port's time in a step with get_finished asked a step ahead (a prefill engine's
# worker, the default of kvferry.bench_port) against a round trip each step, on this machine: for
# each round, one fresh prefill node and kvferry.bench_port over 256 requests per step with 0, 16
# and 256 new, the two variants alternated on the same node. One JSON line per run, tagged.
# usage: scripts/port-finished-ahead-ab.sh ROUNDS
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=${1:?usage: $0 ROUNDS}
port_flag_ab "$rounds" ahead-ab "0 16 256" ahead round-trip --finished-round-trip
