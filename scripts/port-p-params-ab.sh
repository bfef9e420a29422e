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
port_flag_ab "$rounds" p-params-ab "16 256" one-way round-trip --matched-round-trip --p-params
