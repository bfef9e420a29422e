#!/usr/bin/env bash
# A/B of node classes, node JVM options or CPU placement on the GPU in one device call:
# scripts/gpu-model.sh run ROUNDS times per variant, the variants alternated. A variant is
# NAME=[JAR][@JVM_OPTIONS][+P_CPUS:D_CPUS:NODE_CPUS][%VAR=VALUE,...]: JAR's classes go first on the nodes' classpath
# (KVFERRY_CP_FIRST; e.g. the changed classes as an earlier commit compiled them, since the bundle
# holds one kvferry.jar and a second would not fit the device machine's carry limit), JVM_OPTIONS
# are added to the nodes' (KVFERRY_NODE_JAVA_OPTS), and the CPU sets (taskset lists such as 0-3)
# pin P's engine process, D's, and the router and nodes (gpu_check --pin-cpus, KVFERRY_NODE_CPUS),
# and the VAR=VALUE pairs go to that variant's environment, the engines' included (e.g.
# KVFERRY_PORT_SPIN_US=500: the engines' port clients poll for replies). KVFERRY_MPS=1 among them
# runs that variant under an MPS control daemon of the user's own (started before the run, its
# pipe and log folders under /tmp, quit after it; the GPU's compute mode is left as it is), so
# the engines' and nodes' work on one GPU shares one context instead of time-slicing.
#
# usage: OUT=DIR scripts/gpu-model-ab.sh ROUNDS P_GPU D_GPU NAME=[JAR][@OPTS][+CPUS]... -- [gpu_check flags]
#   e.g. OUT=$OUT/ab scripts/gpu-model-ab.sh 2 0 0 before=.device/ab/old.jar after= -- --modes read
#        OUT=$OUT/ab scripts/gpu-model-ab.sh 2 0 0 shared= isolated=+0-3:4-7:8-15 -- --prompts 0
#        OUT=$OUT/ab scripts/gpu-model-ab.sh 2 0 0 sleep= poll=@-Dkvferry.port.spin-us=20000%KVFERRY_PORT_SPIN_US=500
# env:   AB_TIMEOUT   seconds per run (default 150); a run past it is cut, what it wrote stays
#        KVFERRY_PORT_BASE  the first run's base port; each later run adds 100
#        KVFERRY_NODE_JAVA_OPTS  options of every variant (e.g. -Dkvferry.stamps=true)
#        MPS_QUIT_S   seconds an MPS daemon gets to quit after its run (default 30), then killed
# Output: $OUT/<NAME>-<round>/ (console.txt, and stamps.txt, the READ start stamps' medians per
# kind of transfer, when the nodes stamped), each run's node logs as logs.tgz there, and all of
# it as $OUT/../<basename of OUT>.tgz (a device call returns at most 8 files), rewritten after
# each run and when the script is stopped.
set -uo pipefail
usage="usage: OUT=DIR $0 ROUNDS P_GPU D_GPU NAME=[JAR][@OPTS][+P_CPUS:D_CPUS:NODE_CPUS][%VAR=VALUE,...]... -- [gpu_check flags]"
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
: "${OUT:?set OUT to the output folder}"
here=$(cd "$(dirname "$0")" && pwd)
rounds=$1 P=$2 D=$3
shift 3
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case $1 in *=*) variants+=("$1") ;; *) echo "not NAME=[JAR][@OPTS][+CPUS]: $1; $usage" >&2; exit 2 ;; esac
  shift
done
[ "${1:-}" = -- ] && shift
[ ${#variants[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
base_opts=${KVFERRY_NODE_JAVA_OPTS:-}
port=${KVFERRY_PORT_BASE:-27000}
mkdir -p "$OUT"
# The MPS control daemon of the variant running now, if any: its folder (pipe and log under it).
mps=
mps_start() {  # NAME: starts a daemon of the user's own with a fresh pipe folder
  command -v nvidia-cuda-mps-control > /dev/null \
    || { echo "KVFERRY_MPS=1 in $1, but no nvidia-cuda-mps-control on PATH" >&2; exit 2; }
  mps=$(mktemp -d /tmp/kvferry-mps.XXXXXX)
  mkdir -p "$mps/pipe" "$mps/log"
  if ! CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log nvidia-cuda-mps-control -d; then
    echo "the MPS control daemon of $1 did not start" >&2; rm -rf "$mps"; mps=; exit 2
  fi
}
mps_ctl() {  # COMMAND: one command to this run's daemon, its answer on stdout
  echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log \
    timeout "${2:-10}" nvidia-cuda-mps-control 2>&1
}
mps_stop() {  # [RUN_DIR]: reports the daemon's servers and their clients there, quits it, cleans up
  [ -n "$mps" ] || return 0
  local dir=${1:-} servers clients p
  if [ -n "$dir" ]; then
    # The run's processes are gone (gpu-model.sh stops its own), so the server can shut down.
    servers=$(mps_ctl get_server_list | tr '\n' ' ')
    echo "   MPS servers during the run: ${servers:-none}" | tee -a "$dir/console.txt"
    for server in $servers; do
      clients=$(mps_ctl "get_client_list $server" | tr '\n' ' ')
      echo "   MPS server $server's clients after the run: ${clients:-none}" | tee -a "$dir/console.txt"
      for c in $clients; do [[ $c =~ ^[0-9]+$ ]] && ps -o pid=,etime=,args= -p "$c" | cut -c1-160; done | tee -a "$dir/console.txt"
    done
  fi
  if ! mps_ctl quit "${MPS_QUIT_S:-30}" > /dev/null; then
    # Only this run's daemon and server: the processes whose environment names its pipe folder.
    echo "   the MPS daemon did not quit in ${MPS_QUIT_S:-30} s; killed"
    for p in $(pgrep -u "$(id -u)" -f nvidia-cuda-mps); do
      tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "CUDA_MPS_PIPE_DIRECTORY=$mps/pipe" \
        && kill -KILL "$p" 2>/dev/null
    done
  fi
  [ -z "$dir" ] || cp "$mps/log/control.log" "$dir/mps-control.log" 2>/dev/null
  rm -rf "$mps"
  mps=
}
# Everything under OUT as one file beside it, rewritten after each run: a device call returns at
# most 8 files, and one cut by its time limit still brings back every run that finished.
archive() { tar czf "$OUT/../$(basename "$OUT").tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"; }
# A daemon is quit and the output archived however the script ends (an outer timeout's TERM included).
trap 'mps_stop; archive' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for round in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    name=${v%%=*} spec=${v#*=} opts= cpus= envs=()
    case $spec in *%*) IFS=, read -r -a envs <<< "${spec#*%}"; spec=${spec%%\%*} ;; esac
    for e in "${envs[@]}"; do
      [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "not VAR=VALUE in $name: $e" >&2; exit 2; }
    done
    case $spec in *+*) cpus=${spec#*+}; spec=${spec%%+*} ;; esac
    case $spec in *@*) opts=${spec#*@}; spec=${spec%%@*} ;; esac
    pin=() node_cpus=
    if [ -n "$cpus" ]; then
      IFS=: read -r p_cpus d_cpus node_cpus <<< "$cpus"
      [ -n "$p_cpus" ] && [ -n "$d_cpus" ] && [ -n "$node_cpus" ] \
        || { echo "CPU sets of $name are not P_CPUS:D_CPUS:NODE_CPUS: $cpus" >&2; exit 2; }
      pin=(--pin-cpus "$p_cpus:$d_cpus")
    fi
    first=
    if [ -n "$spec" ]; then
      [ -f "$spec" ] || { echo "no such jar: $spec" >&2; exit 2; }
      first=$(cd "$(dirname "$spec")" && pwd)/$(basename "$spec")
    fi
    dir=$OUT/$name-$round
    mkdir -p "$dir"
    for e in "${envs[@]}"; do [ "$e" = KVFERRY_MPS=1 ] && [ -z "$mps" ] && mps_start "$name"; done
    [ -z "$mps" ] || envs+=("CUDA_MPS_PIPE_DIRECTORY=$mps/pipe" "CUDA_MPS_LOG_DIRECTORY=$mps/log")
    echo "== $name, round $round, port base $port, $(date -u +%H:%M:%S)${first:+, classes first: $first}${opts:+, options: $opts}${cpus:+, CPUs P:D:nodes $cpus}${envs[*]:+, environment: ${envs[*]}}"
    start=$SECONDS
    env "${envs[@]}" OUT=$dir KVFERRY_PORT_BASE=$port KVFERRY_CP_FIRST=$first KVFERRY_NODE_JAVA_OPTS="$base_opts $opts" \
      KVFERRY_NODE_CPUS=$node_cpus \
      timeout "${AB_TIMEOUT:-150}" bash "$here/gpu-model.sh" "$P" "$D" "$@" "${pin[@]}" > "$dir/console.txt" 2>&1
    echo "   rc=$? wall $((SECONDS - start)) s"
    mps_stop "$dir"
    grep -E "^TTFT read n|^TTFT write n|paired, added|checks|FAIL" "$dir/console.txt" | head -20
    run=$dir/gpu-model-p$P-d$D
    if [ -f "$run/decode.log" ] && grep -q "read start stamps" "$run/decode.log"; then
      for m in ttft-warm ttft-read-1024- ttft-read-4096- ""; do
        python3 "$here/read-stamps.py" ${m:+--match "$m"} "$run/decode.log"
      done > "$dir/stamps.txt"
      grep -E "transfers:|layer0_queued|last_queued" "$dir/stamps.txt"
    fi
    [ -d "$run" ] && tar czf "$dir/logs.tgz" -C "$dir" "$(basename "$run")" && rm -rf "$run"
    port=$((port + 100))
    archive
  done
done
