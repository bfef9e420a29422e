#!/usr/bin/env bash
# What limits the tcp rows: kvferry's tcp transfer (HostTransferBench, contiguous, 512 tokens'
# 64 MiB) beside iperf3 (128 KiB per write) and the same work in C (scripts/peers/
# tcp_equal_work.c: one region written and read per round) with one call per round and with
# iperf3's 128 KiB per call, ROUNDS times alternated. Needs the built jar, gcc and iperf3.
# usage: scripts/tcp-equal-work.sh ROUNDS
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:?usage: $0 ROUNDS}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
gcc -O2 -pthread -o "$bin/tcp_equal_work" "$root/scripts/peers/tcp_equal_work.c"
size=$((64 << 20))
echo "# $(date -u '+%F %T') UTC; commit $(git -C "$root" rev-parse --short HEAD); kernel $(uname -r); nproc $(nproc)"
for r in $(seq 1 "$rounds"); do
  echo "round $r"
  echo -n "  kvferry tcp contiguous 64 MiB: "
  java -cp "$root/cli/target/kvferry.jar" dev.kvferry.bench.host.HostTransferBench 32768 2048 30 tcp contiguous \
    | tail -1
  echo -n "  C, one call per round: "
  "$bin/tcp_equal_work" "$size" 30
  echo -n "  C, 128 KiB per call: "
  "$bin/tcp_equal_work" "$size" 30 131072
  port=$((40000 + RANDOM % 10000))
  iperf3 -s -1 -p "$port" > /dev/null 2>&1 &
  sleep 0.5
  echo -n "  iperf3 (128 KiB per write): "
  iperf3 -c 127.0.0.1 -p "$port" -t 3 -O 1 -f g | grep receiver
  wait
done
