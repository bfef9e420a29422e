#!/usr/bin/env bash
# GPU memory over the tcp transport (staged through pinned host buffers), on one GPU host over
# loopback: first the checks (gpu->gpu, gpu->host, host->gpu; contiguous and 4096 x 32 KiB
# scattered; WRITE and READ; out-of-bounds refusals; every byte compared), PASS/FAIL per case;
# then the bench: GB/s of gpu->gpu beside host->host over the same tcp path in the same run, with
# 1 and 2 staging buffers.
#
# usage: scripts/gpu-tcp.sh P_GPU D_GPU [TcpGpuBench flags: --blocks 16384 --block-bytes 32768
#        --reps 5 --depths 1,2 --buffer-bytes 4194304]
#
# Java and jars as for gpu-demo.sh: jre.tgz and app/ beside this script (device-bundle.sh with the
# kvferry-rdma-jni jar, jna, msgpack-core and slf4j-api), else java from PATH and KVFERRY_CP.
# Output also lands in $OUT/gpu-tcp-p<P>-d<D>.txt when $OUT is set. Exit status: 1 when a check
# failed (the bench still runs), 2 without CUDA.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [bench flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
if [ -f "$here/jre.tgz" ]; then
  [ -x /tmp/jre/bin/java ] || tar xzf "$here/jre.tgz" -C /tmp
  JAVA=/tmp/jre/bin/java
  CP="$here/app/*"
else
  JAVA=java
  CP=${KVFERRY_CP:?set KVFERRY_CP to the rdma-jni jar and its dependencies}
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
echo "libcudart: ${cudart:-not found}; libcuda: ${libcuda:-not found}"
props=()
[ -n "$cudart" ] && props+=("-Dkvferry.cuda.cudart=$cudart")
[ -n "$libcuda" ] && props+=("-Dkvferry.cuda.libcuda=$libcuda")
log=/dev/null
if [ -n "${OUT:-}" ]; then log="$OUT/gpu-tcp-p$P-d$D.txt"; fi
{
  "$JAVA" -Xmx4g "${props[@]}" -cp "$CP" dev.kvferry.rdma.cuda.bench.TcpGpuChecks --p-gpu "$P" --d-gpu "$D"
  checks=$?
  [ $checks -eq 2 ] && exit 2
  "$JAVA" -Xmx4g "${props[@]}" -cp "$CP" dev.kvferry.rdma.cuda.bench.TcpGpuBench --p-gpu "$P" --d-gpu "$D" "$@"
  bench=$?
  [ $checks -eq 0 ] && [ $bench -eq 0 ]
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
