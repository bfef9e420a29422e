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
# $KVFERRY_CP or cluster-config/target/kvferry.jar. Output goes to the console and, with $OUT
# set, to $OUT/gpu-sim-demo-p<P>-d<D>/ (console.txt and every process's log).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [kvferry demo flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
if [ -f "$here/jre.tgz" ]; then bundle=$here; else bundle=$(cd "$here/.." && pwd)/.device; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -f "$bundle/jre.tgz" ]; then
  [ -x /tmp/jre/bin/java ] || tar xzf "$bundle/jre.tgz" -C /tmp
  JAVA=/tmp/jre/bin/java
  CP=$work/kvferry.jar
  if command -v xz >/dev/null; then
    xz -dc "$bundle/app/kvferry.jar.xz" > "$CP"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$bundle/app/kvferry.jar.xz" "$CP"
  fi
else
  JAVA=java
  CP=${KVFERRY_CP:-$(cd "$here/.." && pwd)/cluster-config/target/kvferry.jar}
fi
# Where the CUDA runtime and driver libraries are: the loader's cache first, then the usual places
# (PyTorch's pip wheels bring libcudart). The demo hands these to every JVM it starts.
find_lib() {
  local name=$1; shift
  local hit
  hit=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 ~ "^"n {print $NF; exit}')
  [ -n "$hit" ] || hit=$(ls "$@" 2>/dev/null | head -1 || true)
  echo "$hit"
}
cudart=$(find_lib libcudart.so /usr/local/cuda/lib64/libcudart.so* /usr/local/cuda/targets/*/lib/libcudart.so* \
  "$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__))' 2>/dev/null)"/lib/libcudart.so*)
libcuda=$(find_lib libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1)
echo "java: $JAVA; libcudart: ${cudart:-not found}; libcuda: ${libcuda:-not found}"
nvidia-smi -L 2>/dev/null || true
props=()
[ -n "$cudart" ] && props+=("-Dkvferry.cuda.cudart=$cudart")
[ -n "$libcuda" ] && props+=("-Dkvferry.cuda.libcuda=$libcuda")
flags=("$@")
[[ " ${flags[*]-} " == *" --json "* ]] || flags+=(--json)
out=${OUT:+$OUT/gpu-sim-demo-p$P-d$D}
[ -z "$out" ] || mkdir -p "$out"
set +e
"$JAVA" "${props[@]}" -cp "$CP" dev.kvferry.cli.KvferryCli demo --p-gpu "$P" --d-gpu "$D" \
  "${flags[@]}" 2>&1 | tee "$work/console.txt"
rc=${PIPESTATUS[0]}
set -e
if [ -n "$out" ]; then
  cp "$work/console.txt" "$out/"
  logs=$(sed -n 's/^process logs: //p' "$work/console.txt" | head -1)
  [ -n "$logs" ] && [ -d "$logs" ] && cp "$logs"/*.log "$out/" 2>/dev/null || true
fi
exit "$rc"
