#!/usr/bin/env bash
# The real connector path on GPUs: P's and D's ConnectorWorker (WriterActor, RequestTracker,
# handshake) in two actor systems clustered over Artery on loopback, KV caches on GPU P_GPU and
# D_GPU, moved by CudaTransport behind CudaLayerEvents; every word checked on D by a kernel.
#
# usage: scripts/gpu-actors.sh P_GPU D_GPU [GpuConnectorRun flags: --layers --blocks --capacity
#        --requests --spin-us]
# Java and jars as for gpu-demo.sh (jre.txz and app/ beside this script, from device-bundle.sh;
# the app/ jars must include kvferry-actors and its runtime dependencies).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$here/gpu-env.sh"
# KVFERRY_JAVA_OPTS: extra JVM flags (e.g. -Dkvferry.done-words.spin-us=...) for experiments.
"$JAVA" -Xmx2g ${KVFERRY_JAVA_OPTS:-} "${CUDA_PROPS[@]}" -cp "$CP" dev.kvferry.bench.gpu.GpuConnectorRun \
  --p-gpu "$P" --d-gpu "$D" "$@"
