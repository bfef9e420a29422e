#!/usr/bin/env bash
# kvferry's GPU data path, end to end, on one host with NVIDIA GPUs, CUDA, Python and PyTorch but
# no Java: P and D as two JVM processes (P on GPU P_GPU, D on GPU D_GPU; the same id puts both on
# one GPU), WRITE and READ, contiguous and scattered 16-token blocks of a Llama-3-8B-like KV cache,
# every byte checked on D, then PyTorch copying the same bytes between the same devices, and the
# ratios against the goals.
#
# usage: scripts/gpu-demo.sh P_GPU D_GPU [GpuTransferBench flags, e.g. --layers 4 --blocks 64]
#
# Java comes from jre.txz beside this script (scripts/gpu-bundle.sh packs it with the
# jars into .device/; copy this script and gpu_torch_peer.py there too), else from PATH with the
# classpath in KVFERRY_CP. Results land in $OUT/p<P>-d<D>/ (or ./gpu-demo-out/ without $OUT).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 P_GPU D_GPU [bench flags]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
P=$1 D=$2
shift 2
out=${OUT:-$PWD/gpu-demo-out}/p$P-d$D
work=$(mktemp -d)
mkdir -p "$out"
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$here/gpu-env.sh"
"$JAVA" -Xmx2g "${CUDA_PROPS[@]}" -cp "$CP" dev.kvferry.bench.gpu.GpuTransferBench \
  --p-gpu "$P" --d-gpu "$D" --out "$work" "$@" 2>&1 | tee "$out/kvferry.log"
PYTHONUNBUFFERED=1 python3 "$here/gpu_torch_peer.py" "$P" "$D" "$work" "$out"
rm -rf "$work"
