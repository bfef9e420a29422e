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
# Java and jars as for gpu-demo.sh: jre.txz and app/ beside this script (device-bundle.sh with the
# kvferry-rdma-jni jar, jna, msgpack-core and slf4j-api), else java from PATH and KVFERRY_CP.
# Output also lands in $OUT/gpu-tcp-p<P>-d<D>.txt when $OUT is set. Exit status: 1 when a check
# failed (the bench still runs), 2 without CUDA.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [bench flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$here/gpu-env.sh"
log=/dev/null
if [ -n "${OUT:-}" ]; then log="$OUT/gpu-tcp-p$P-d$D.txt"; fi
{
  "$JAVA" -Xmx4g "${CUDA_PROPS[@]}" -cp "$CP" dev.kvferry.rdma.testing.TcpGpuChecks --p-gpu "$P" --d-gpu "$D"
  checks=$?
  [ $checks -eq 2 ] && exit 2
  "$JAVA" -Xmx4g "${CUDA_PROPS[@]}" -cp "$CP" dev.kvferry.bench.gpu.TcpGpuBench --p-gpu "$P" --d-gpu "$D" "$@"
  bench=$?
  [ $checks -eq 0 ] && [ $bench -eq 0 ]
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
