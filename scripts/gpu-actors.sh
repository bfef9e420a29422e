#!/usr/bin/env bash
# The real connector path on GPUs: P's and D's ConnectorWorker (WriterActor, RequestTracker,
# handshake) in two actor systems clustered over Artery on loopback, KV caches on GPU P_GPU and
# D_GPU, moved by CudaTransport behind CudaLayerEvents; every word checked on D by a kernel.
#
# usage: scripts/gpu-actors.sh P_GPU D_GPU [GpuConnectorRun flags: --layers --blocks --capacity
#        --requests --spin-us]
# Java and jars as for gpu-demo.sh (jre.tgz and app/ beside this script, from device-bundle.sh;
# the app/ jars must include kvferry-actors and its runtime dependencies).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
if [ -f "$here/jre.tgz" ]; then
  [ -x /tmp/jre/bin/java ] || tar xzf "$here/jre.tgz" -C /tmp
  JAVA=/tmp/jre/bin/java
  CP="$here/app/*"
else
  JAVA=java
  CP=${KVFERRY_CP:?set KVFERRY_CP to the kvferry-actors jar and its dependencies}
fi
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
props=()
[ -n "$cudart" ] && props+=("-Dkvferry.cuda.cudart=$cudart")
[ -n "$libcuda" ] && props+=("-Dkvferry.cuda.libcuda=$libcuda")
"$JAVA" -Xmx2g "${props[@]}" -cp "$CP" dev.kvferry.actors.bench.GpuConnectorRun \
  --p-gpu "$P" --d-gpu "$D" "$@"
