#!/usr/bin/env bash
# The engine port's round trip after an engine's thread and the node's have slept (as after a
# forward pass), with and without spinning, on this machine: for each round and each setting, a
# fresh node (`-Dkvferry.port.spin-us=NODE`) and `python -m kvferry.bench_port --gap-ms 2
# --gap-ms 10` with KVFERRY_PORT_SPIN_US=CLIENT. One JSON line per run, tagged.
# usage: scripts/port-spin-ab.sh ROUNDS NODE_US:CLIENT_US...   (e.g. 3 0:0 0:200 20000:200)
# On a GPU host without Java, Java and the classes come from the bundle (scripts/gpu-env.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$root/scripts/gpu-env.sh" > /dev/null
py=${KVFERRY_PYTHON:-}
for c in /usr/bin/python3 python3; do  # the first with msgpack (Debian's here, the GPU host's there)
  [ -n "$py" ] || ! "$c" -c 'import msgpack' 2>/dev/null || py=$c
done
rounds=$1; shift
for r in $(seq 1 "$rounds"); do
  for setting in "$@"; do
    node_us=${setting%%:*} client_us=${setting##*:}
    d=$(mktemp -d) port=$((30000 + RANDOM % 20000))
    "$JAVA" -Xmx384m -XX:+UseSerialGC -Dkvferry.port.spin-us="$node_us" -cp "$CP" dev.kvferry.cli.KvferryCli node --role prefill \
      --engine-id spin-ab --mode write --engine port --engine-socket "$d/port.sock" --port "$port" \
      --management-port $((port + 1)) --seed-nodes "127.0.0.1:$port" > "$d/node.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 150); do [ -S "$d/port.sock" ] && break; sleep 0.2; done
    echo -n "round $r node_spin_us=$node_us client_spin_us=$client_us "
    (cd "$root/python" && KVFERRY_PORT_SPIN_US=$client_us PYTHONPATH=$PWD "$py" -m kvferry.bench_port \
       --socket "$d/port.sock" --requests 16 --steps 50 --round-trips 2000 --gap-ms 2 --gap-ms 10)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$d"
  done
done
