# Sourced by the scripts/gpu-*.sh (never run alone): finds Java, kvferry's classes and the CUDA
# libraries on a GPU host that has CUDA and Python but no Java. Sets:
#   JAVA        the bundled runtime (/tmp/jre/bin/java, unpacked once), else java from PATH
#   CP          kvferry's classpath: the bundle's app/kvferry.jar.xz unpacked into GPU_ENV_WORK,
#               else the bundle's app/*.jar, else $KVFERRY_CP or cli/target/kvferry.jar
#   CUDA_PROPS  -Dkvferry.cuda.cudart=... -Dkvferry.cuda.libcuda=... for every JVM (the demo hands
#               them on to the JVMs it starts)
# The bundle is .device/ made by scripts/gpu-bundle.sh: beside the calling script when that was
# copied into it, else at the repository root. The caller sets GPU_ENV_WORK (a temporary folder).
gpu_env_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The runtime is jre.txz (xz: the bundle must fit the device run's 64 MiB with the working tree),
# or jre.tgz from an older bundle.
gpu_env_jre() {  # DIR: its runtime archive's path, or nothing
  local f
  for f in "$1/jre.txz" "$1/jre.tgz"; do
    if [ -f "$f" ]; then echo "$f"; return 0; fi
  done
}
if [ -n "$(gpu_env_jre "$gpu_env_here")" ]; then
  gpu_env_bundle=$gpu_env_here
else
  gpu_env_bundle=$(cd "$gpu_env_here/.." && pwd)/.device
fi
gpu_env_jre_file=$(gpu_env_jre "$gpu_env_bundle")
if [ -n "$gpu_env_jre_file" ]; then
  if [ ! -x /tmp/jre/bin/java ]; then
    if [ "${gpu_env_jre_file##*.}" = tgz ] || command -v xz >/dev/null; then
      tar xf "$gpu_env_jre_file" -C /tmp
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$gpu_env_jre_file" /tmp
    fi
  fi
  JAVA=/tmp/jre/bin/java
  if [ -f "$gpu_env_bundle/app/kvferry.jar.xz" ]; then
    CP=${GPU_ENV_WORK:?set GPU_ENV_WORK before sourcing gpu-env.sh}/kvferry.jar
    if command -v xz >/dev/null; then
      xz -dc "$gpu_env_bundle/app/kvferry.jar.xz" > "$CP"
    else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$gpu_env_bundle/app/kvferry.jar.xz" "$CP"
    fi
  else
    CP="$gpu_env_bundle/app/*"
  fi
else
  JAVA=java
  CP=${KVFERRY_CP:-$(cd "$gpu_env_here/.." && pwd)/cli/target/kvferry.jar}
fi
# KVFERRY_CP_FIRST: classes put before kvferry's on the classpath, e.g. a jar of a few classes as
# an earlier commit built them, to A/B them in one device call (the bundle holds one kvferry.jar).
[ -n "${KVFERRY_CP_FIRST:-}" ] && CP="$KVFERRY_CP_FIRST:$CP"

# The CUDA runtime and driver: the loader's cache first, then the usual places (PyTorch's pip
# wheels bring libcudart).
gpu_env_find_lib() {
  local name=$1; shift
  local hit
  hit=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 ~ "^"n {print $NF; exit}')
  [ -n "$hit" ] || hit=$(ls "$@" 2>/dev/null | head -1 || true)
  echo "$hit"
}
gpu_env_cudart=$(gpu_env_find_lib libcudart.so /usr/local/cuda/lib64/libcudart.so* \
  /usr/local/cuda/targets/*/lib/libcudart.so* \
  "$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__))' 2>/dev/null)"/lib/libcudart.so*)
gpu_env_libcuda=$(gpu_env_find_lib libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 \
  /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1)
CUDA_PROPS=()
[ -n "$gpu_env_cudart" ] && CUDA_PROPS+=("-Dkvferry.cuda.cudart=$gpu_env_cudart")
[ -n "$gpu_env_libcuda" ] && CUDA_PROPS+=("-Dkvferry.cuda.libcuda=$gpu_env_libcuda")
echo "java: $JAVA; libcudart: ${gpu_env_cudart:-not found}; libcuda: ${gpu_env_libcuda:-not found}"
