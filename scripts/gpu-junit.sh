#!/usr/bin/env bash
# Runs kvferry's GPU JUnit classes (the ones CI, which has no GPU, skips with the reason) on a host
# with NVIDIA GPUs and CUDA but no Java or Maven, through JUnit's console launcher: the CUDA data
# plane, the layer events, tcp staging, the simulated engine's kernels and every simulated-engine
# case with its caches on GPU 0. A skipped class here means CUDA was not found: read the reason.
#
# usage: scripts/gpu-junit.sh [extra console-launcher flags, e.g. --select-method ...]
#
# Needs the bundle scripts/gpu-bundle.sh makes (.device/, with its tests/ folder). Reports land in
# $OUT/junit/ when $OUT is set. Exit status: the launcher's (0 when every selected test passed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$here/gpu-env.sh"
tests=$gpu_env_bundle/tests
[ -d "$tests" ] || { echo "no $tests: make the bundle with scripts/gpu-bundle.sh" >&2; exit 2; }
nvidia-smi -L 2>/dev/null || true
classpath=$CP
for j in "$tests"/*.jar; do
  case $j in *junit-platform-console-standalone*) ;; *) classpath=$classpath:$j ;; esac
done
reports=()
[ -n "${OUT:-}" ] && reports=(--reports-dir "$OUT/junit")
"$JAVA" -Xmx4g "${CUDA_PROPS[@]}" -jar "$tests"/junit-platform-console-standalone-*.jar execute \
  --class-path "$classpath" --disable-banner --disable-ansi-colors --details=tree "${reports[@]}" \
  --select-class dev.kvferry.rdma.cuda.CudaProbeTest \
  --select-class dev.kvferry.rdma.cuda.SharedDoneWordsTest \
  --select-class dev.kvferry.rdma.CudaTransportTest \
  --select-class dev.kvferry.rdma.TcpStagingGpuTest \
  --select-class dev.kvferry.rdma.TransportsTest \
  --select-class dev.kvferry.actors.connector.CudaLayerEventTest \
  --select-class dev.kvferry.sim.GpuKvCacheTest \
  --select-class dev.kvferry.sim.GpuSimulatedEngineTest \
  --select-class dev.kvferry.node.GpuNodeSettingsTest \
  --select-class dev.kvferry.cli.GpuCommandsTest \
  "$@"
