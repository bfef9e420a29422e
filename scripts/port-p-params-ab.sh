#!/usr/bin/env bash
# The engine port's time in a prefill engine's step when its new requests carry the params a
# router gives P and finish length capped: get_num_new_matched_tokens and request_finished
# answered by P's client and sent one-way (engine role prefill, the default; request_finished
# once the node's first answer showed D's params) against a round trip each per new request
# (--matched-round-trip: the client's local answers off), on this machine. For each
# round, one fresh prefill node and kvferry.bench_port --p-params over 256 requests per step with
# 16 and 256 new, the two variants alternated on the same node. One JSON line per run, tagged.
# usage: scripts/port-p-params-ab.sh ROUNDS
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=${1:?usage: $0 ROUNDS}
port_flag_ab "$rounds" p-params-ab "16 256" one-way round-trip --matched-round-trip --p-params
