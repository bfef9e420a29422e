#!/usr/bin/env bash
# The tcp bench's peer, iperf3 on loopback, with its default 128 KiB buffer against 1 MiB (its
# largest), alternated: how much of the peer's figure is its buffer size (one cache-resident buffer
# read and written over and over; kvferry's rows move distinct blocks). docs/performance.md.
#
# usage: scripts/iperf3-buffers.sh [ROUNDS]   (default 3; 3 s per run, 1 s omitted)
set -euo pipefail
rounds=${1:-3}
port=$((20000 + RANDOM % 20000))
echo "$(date -u '+%F %T') UTC, $(nproc) CPUs, $(iperf3 --version | head -1)"
for r in $(seq 1 "$rounds"); do
  for len in 128K 1M; do
    iperf3 -s -1 -p "$port" > /dev/null 2>&1 &
    server=$!
    sleep 0.5
    gbps=$(iperf3 -c 127.0.0.1 -p "$port" -t 3 -O 1 -l "$len" -J \
      | /usr/bin/python3 -c 'import json, sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9, 3))')
    wait "$server" || true
    echo "round $r: iperf3 -l $len: $gbps GB/s"
  done
done
