# Sourced by the engine port A/B scripts (scripts/port-*-ab.sh), from the repository's scripts/:
# Java and kvferry's classes (scripts/gpu-env.sh: the bundle on a GPU host, else the built jar), a
# Python with msgpack as $py (Debian's here, the GPU host's there), and one prefill node on an
# engine socket at a time.
port_node_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GPU_ENV_WORK=$(mktemp -d)
port_node_pid=
# A script cut short (a closed pipe, ^C) leaves no node running.
trap '[ -z "$port_node_pid" ] || kill "$port_node_pid" 2>/dev/null; rm -rf "$GPU_ENV_WORK"' EXIT
source "$port_node_root/scripts/gpu-env.sh" > /dev/null
py=${KVFERRY_PYTHON:-}
for c in /usr/bin/python3 python3; do
  [ -n "$py" ] || ! "$c" -c 'import msgpack' 2>/dev/null || py=$c
done

# port_node_start ENGINE_ID [JVM options...]: a prefill node (write mode) on $port_node_dir/port.sock;
# returns once the socket is there (or after 30 s).
port_node_start() {
  local engine_id=$1 port=$((30000 + RANDOM % 20000))
  shift
  port_node_dir=$(mktemp -d)
  "$JAVA" -Xmx384m "$@" -cp "$CP" dev.kvferry.cli.KvferryCli node --role prefill --engine-id "$engine_id" \
    --mode write --engine port --engine-socket "$port_node_dir/port.sock" --port "$port" \
    --management-port $((port + 1)) --seed-nodes "127.0.0.1:$port" > "$port_node_dir/node.log" 2>&1 &
  port_node_pid=$!
  for _ in $(seq 1 150); do [ -S "$port_node_dir/port.sock" ] && break; sleep 0.2; done
}

port_node_stop() {
  kill "$port_node_pid"
  wait "$port_node_pid" 2>/dev/null || true
  port_node_pid=
  rm -rf "$port_node_dir"
}

# port_bench [kvferry.bench_port flags...]: one JSON line, against the running node.
port_bench() {
  (cd "$port_node_root/python" && PYTHONPATH=$PWD "$py" -m kvferry.bench_port --socket "$port_node_dir/port.sock" "$@")
}

# port_flag_ab ROUNDS ENGINE_ID "NEW..." NAME_A NAME_B FLAG_B [bench flags...]: for each round one
# fresh node and, for each count of new requests per step (of 256), kvferry.bench_port without
# FLAG_B (variant NAME_A) then with it (NAME_B), each run's JSON line tagged.
port_flag_ab() {
  local rounds=$1 engine_id=$2 news=$3 name_a=$4 name_b=$5 flag_b=$6
  shift 6
  local r new variant flag
  for r in $(seq 1 "$rounds"); do
    port_node_start "$engine_id"
    for new in $news; do
      for variant in "$name_a" "$name_b"; do
        flag=()
        [ "$variant" = "$name_b" ] && flag=("$flag_b")
        echo -n "round $r new $new $variant "
        port_bench --requests 256 --new "$new" --steps 200 --round-trips 500 "$@" "${flag[@]}"
      done
    done
    port_node_stop
  done
}
