#!/usr/bin/env bash
# A real transformer's KV through kvferry on GPUs, checked bit for bit (docs/gpu.md, "A real
# model"): a router and a P and a D node (JVMs, --engine port --transport cuda), and two Python
# engine processes (kvferry.gpu_check) with a transformers Llama over paged GPU caches shared with
# their nodes by CUDA IPC; WRITE and READ, then time to first token with and without kvferry.
#
# usage: scripts/gpu-model.sh P_GPU D_GPU [kvferry.gpu_check flags, e.g. --prompts 20]
#        (the same id for both puts P and D on one GPU)
#
# Java and kvferry come from the bundle (scripts/gpu-bundle.sh; jre.txz beside this script or
# .device/ at the repository root), as for the other scripts/gpu-*.sh. The Python package is
# python/ at the repository root or beside this script. Output: the console, and with $OUT set
# $OUT/gpu-model-p<P>-d<D>/ (console.txt, report.json, the nodes' logs). Exit status: the
# check's (0 every check passed, 1 one failed), or 3 when the router or a node exited during it.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [kvferry.gpu_check flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
# MPS is started by scripts/gpu-model-ab.sh (KVFERRY_MPS=1 in a variant), not here: say so rather
# than let a run that asked for it pass for one under MPS.
if [ -n "${KVFERRY_MPS:-}" ] && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
  echo "note: KVFERRY_MPS is acted on by scripts/gpu-model-ab.sh only; this run starts no MPS daemon" >&2
fi
work=$(mktemp -d)
pids=()
watched=()  # NAME:PID of the router and the nodes, watched while the check runs
check=""
# The check runs in a session of its own, out of reach of a `timeout` that signals this script's
# process group: SIGTERM lets it stop its engine processes, and after 20 s its whole session goes.
await_exit() {  # SECONDS PID...: returns once every PID has exited or SECONDS have passed
  local tenths=$(($1 * 10)) pid alive
  shift
  while [ $tenths -gt 0 ]; do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
    tenths=$((tenths - 1))
  done
}
stop_check() {
  [ -n "$check" ] || return 0
  kill -TERM "$check" 2>/dev/null || true
  await_exit 20 "$check"
  kill -KILL -- "-$check" 2>/dev/null || true
  wait "$check" 2>/dev/null || true
  check=""
}
cleanup() {
  stop_check
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # A JVM's shutdown (leaving the cluster, closing its CUDA contexts) takes a moment; one still
  # running after 15 s is killed, so no node of this run outlives it into the next.
  await_exit 15 "${pids[@]}"
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
GPU_ENV_WORK=$work
source "$here/gpu-env.sh"
if [ -d "$here/python/kvferry" ]; then py=$here/python; else py=$(cd "$here/.." && pwd)/python; fi
nvidia-smi -L 2>/dev/null || true
# The CPU topology, for reading the run's CPU placement (cpu_sets.py picks whole cores per set).
PYTHONPATH=$py${PYTHONPATH:+:$PYTHONPATH} python3 -m kvferry.cpu_sets --describe || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda)'
out=${OUT:+$OUT/gpu-model-p$P-d$D}
[ -z "$out" ] || mkdir -p "$out"
logs=${out:-$work}

# KVFERRY_GC_LOG (per JVM): where its garbage collections are logged, with their pauses.
# KVFERRY_NODE_JAVA_OPTS: more JVM options for the two nodes, e.g.
# -Dkvferry.cuda.copy-method=memcpy-batch (auto, kernel or memcpy-batch; docs/gpu.md).
# KVFERRY_NODE_CPUS (e.g. 4-15): the router and nodes run only on these CPUs (taskset), away from
# engines pinned with --pin-cpus.
# Run in the background only: exec makes the background job the JVM itself, so its pid ($!) is
# the JVM's and a signal to it reaches the JVM (without exec the JVM was the job's child, and
# stopping the job left every node running after the script).
kvferry() {
  exec ${KVFERRY_NODE_CPUS:+taskset -c "$KVFERRY_NODE_CPUS"} "$JAVA" -Xmx2g -XX:+UseSerialGC ${KVFERRY_GC_LOG:+"-Xlog:gc:file=$KVFERRY_GC_LOG"} "${CUDA_PROPS[@]}" \
    ${KVFERRY_JVM_OPTS:-} -cp "$CP" dev.kvferry.cli.KvferryCli "$@"
}
# KVFERRY_PORT_BASE (default 25520): the router's cluster port; P, D and the management ports are
# the next ones. Back-to-back runs take different bases: a JVM of the last run may still hold its
# port for a moment, and a node that cannot bind leaves the engines waiting for it.
base=${KVFERRY_PORT_BASE:-25520}
router_port=$base
kvferry router --port $router_port --management-port $((base + 10)) --seed-nodes 127.0.0.1:$router_port \
  > "$logs/router.log" 2>&1 &
pids+=($!)
watched+=("router:$!")
node() {  # role gpu port mgmt
  KVFERRY_GC_LOG=$logs/$1-gc.log KVFERRY_JVM_OPTS=${KVFERRY_NODE_JAVA_OPTS:-} kvferry node --role "$1" --engine-id "$1-0" --mode write,read --engine port \
    --engine-socket "$work/$1.sock" --tp-size 1 --gpu "$2" --transport cuda --port "$3" \
    --management-port "$4" --seed-nodes 127.0.0.1:$router_port > "$logs/$1.log" 2>&1 &
  pids+=($!)
  watched+=("$1:$!")
}
node prefill "$P" $((base + 1)) $((base + 11))
node decode "$D" $((base + 2)) $((base + 12))
if command -v top >/dev/null; then
  # Every 20 s, the busiest threads of the machine: a thread spinning beside the engines shows here.
  (while sleep 20; do
     date +%T; top -b -H -n 1 -w 200 | head -30; nvidia-smi pmon -c 1 -s u 2>/dev/null || true
   done) > "$logs/top.txt" 2>&1 &
  pids+=($!)
fi

set +e
# The check in a session of its own (setsid), so its engine processes can be stopped with it.
PYTHONPATH=$py${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 setsid python3 -c \
  'import sys; from kvferry.gpu_check import main; sys.exit(main(sys.argv[1:]))' \
  --p-socket "$work/prefill.sock" --d-socket "$work/decode.sock" \
  --p-device "cuda:$P" --d-device "cuda:$D" --json "$logs/report.json" "$@" \
  > >(tee "$logs/console.txt") 2>&1 &
check=$!
# A JVM that exits during the check (a port taken, a crash) fails the run at once, with its log's
# tail, instead of leaving the engines to wait out their timeouts.
died=""
while kill -0 "$check" 2>/dev/null && [ -z "$died" ]; do
  for w in "${watched[@]}"; do
    if ! kill -0 "${w#*:}" 2>/dev/null; then died=${w%%:*}; break; fi
  done
  [ -n "$died" ] || sleep 1
done
if [ -n "$died" ]; then
  echo "gpu-model: the $died JVM exited during the check; the last lines of $died.log:" \
    | tee -a "$logs/console.txt" >&2
  tail -20 "$logs/$died.log" | tee -a "$logs/console.txt" >&2
  stop_check
  rc=3
else
  wait "$check"
  rc=$?
  check=""
fi
set -e
for f in router prefill decode; do
  grep -E "ERROR|WARN|Exception" "$logs/$f.log" | head -20 | sed "s/^/[$f] /" || true
done
exit "$rc"
