#!/usr/bin/env bash
# The engine port's round trip after an engine's thread and the node's have slept (as after a
# forward pass), with and without spinning, on this machine: for each round and each setting, a
# fresh node (`-Dkvferry.port.spin-us=NODE`) and `python -m kvferry.bench_port --gap-ms 2
# --gap-ms 10` with KVFERRY_PORT_SPIN_US=CLIENT. One JSON line per run, tagged.
# usage: scripts/port-spin-ab.sh ROUNDS NODE_US:CLIENT_US...   (e.g. 3 0:0 0:200 20000:200)
# On a GPU host without Java, Java and the classes come from the bundle (scripts/gpu-env.sh).
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib/port-node.sh"
rounds=$1; shift
for r in $(seq 1 "$rounds"); do
  for setting in "$@"; do
    node_us=${setting%%:*} client_us=${setting##*:}
    port_node_start spin-ab -XX:+UseSerialGC -Dkvferry.port.spin-us="$node_us"
    echo -n "round $r node_spin_us=$node_us client_spin_us=$client_us "
    KVFERRY_PORT_SPIN_US=$client_us port_bench --requests 16 --steps 50 --round-trips 2000 --gap-ms 2 --gap-ms 10
    port_node_stop
  done
done
