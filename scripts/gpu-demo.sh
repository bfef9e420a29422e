#!/usr/bin/env bash
# kvferry's GPU data path, end to end, on one host with NVIDIA GPUs, CUDA, Python and PyTorch but
# no Java: P and D as two JVM processes (P on GPU P_GPU, D on GPU D_GPU; the same id puts both on
# one GPU), WRITE and READ, contiguous and scattered 16-token blocks of a Llama-3-8B-like KV cache,
# every byte checked on D, then PyTorch copying the same bytes between the same devices, and the
# ratios against the goals.
#
# usage: scripts/gpu-demo.sh P_GPU D_GPU [GpuTransferBench flags, e.g. --layers 4 --blocks 64]
#
# Java comes from jre.tgz beside this script (../shared/tools/device-bundle.sh packs it with the
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
if [ -f "$here/jre.tgz" ]; then
  [ -x /tmp/jre/bin/java ] || tar xzf "$here/jre.tgz" -C /tmp
  JAVA=/tmp/jre/bin/java
  CP="$here/app/*"
else
  JAVA=java
  CP=${KVFERRY_CP:?set KVFERRY_CP to the rdma-jni jar and its dependencies}
fi
# Where the CUDA runtime and driver libraries are: the loader's cache first, then the usual places.
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
"$JAVA" -Xmx2g "${props[@]}" -cp "$CP" dev.kvferry.rdma.cuda.bench.GpuTransferBench \
  --p-gpu "$P" --d-gpu "$D" --out "$work" "$@" 2>&1 | tee "$out/kvferry.log"
PYTHONUNBUFFERED=1 python3 "$here/gpu_torch_peer.py" "$P" "$D" "$work" "$out"
rm -rf "$work"
