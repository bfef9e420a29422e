#!/usr/bin/env bash
# The engine port's time in a step with build_connector_meta built a step ahead (the scheduler's
# client names the step and makes the handle; the default) against a round trip each step, on
# this machine: for each round, one fresh prefill node and kvferry.bench_port over 256 requests
# per step with 0, 16 and 256 new ones carrying P's params, the two variants alternated on the
# same node. One JSON line per run, tagged.
# usage: scripts/port-build-ahead-ab.sh ROUNDS
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=${1:?usage: $0 ROUNDS}
port_flag_ab "$rounds" build-ab "0 16 256" ahead round-trip --build-round-trip --p-params
