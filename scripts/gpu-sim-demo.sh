#!/usr/bin/env bash
# `kvferry demo` with P's and D's KV caches on GPUs, on a host with NVIDIA GPUs, CUDA and Python
# but no Java: router, P and D as separate JVMs; P fills each layer with a kernel on its compute
# stream, the cuda transport (CUDA IPC) moves the blocks behind the layer's event, D checks every
# byte with a kernel; both modes, the same report as the host demo.
#
# usage: scripts/gpu-sim-demo.sh P_GPU D_GPU [kvferry demo flags, e.g. --requests 96 --tp-p 2]
#        (the same id for both puts P and D on one GPU)
#
# Java and kvferry come from the bundle scripts/gpu-bundle.sh makes: .device/ at the repository
# root (or beside this script when it is copied there); without one, java from PATH runs
# $KVFERRY_CP or cli/target/kvferry.jar. Output goes to the console and, with $OUT
# set, to $OUT/gpu-sim-demo-p<P>-d<D>/ (console.txt and every process's log).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [kvferry demo flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
GPU_ENV_WORK=$work
source "$here/gpu-env.sh"
nvidia-smi -L 2>/dev/null || true
flags=("$@")
[[ " ${flags[*]-} " == *" --json "* ]] || flags+=(--json)
out=${OUT:+$OUT/gpu-sim-demo-p$P-d$D}
[ -z "$out" ] || mkdir -p "$out"
set +e
"$JAVA" "${CUDA_PROPS[@]}" -cp "$CP" dev.kvferry.cli.KvferryCli demo --p-gpu "$P" --d-gpu "$D" \
  "${flags[@]}" 2>&1 | tee "$work/console.txt"
rc=${PIPESTATUS[0]}
set -e
if [ -n "$out" ]; then
  cp "$work/console.txt" "$out/"
  logs=$(sed -n 's/^process logs: //p' "$work/console.txt" | head -1)
  [ -n "$logs" ] && [ -d "$logs" ] && cp "$logs"/*.log "$out/" 2>/dev/null || true
fi
exit "$rc"
