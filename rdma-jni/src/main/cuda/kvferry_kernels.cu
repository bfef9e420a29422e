// kvferry's GPU kernels. The Maven build needs no nvcc: the PTX this compiles to is committed as
// rdma-jni/src/main/resources/dev/kvferry/rdma/cuda/kvferry_kernels.ptx and loaded at run time with
// cuModuleLoadData (the driver JIT-compiles it for the GPU at hand). Regenerate it, from the
// repository root, with:
//
//   nvcc -ptx -O3 -arch=compute_80 -o rdma-jni/src/main/resources/dev/kvferry/rdma/cuda/kvferry_kernels.ptx rdma-jni/src/main/cuda/kvferry_kernels.cu
//
// compute_80 PTX runs on Ampere, Hopper and later; nothing here needs Hopper-only instructions.
#include <stdint.h>

// Bytes one CTA copies per step of the scatter copy; the host splits every entry into chunks of
// this size (CudaScatterCopy.CHUNK_BYTES must match).
#define KVF_CHUNK_BYTES 65536
// Threads per CTA of the scatter copy (CudaScatterCopy.THREADS must match).
#define KVF_COPY_THREADS 512

// Moves many (possibly small, possibly scattered) byte ranges with one launch: entry e moves
// sizes[e] bytes from src_base + src_off[e] to dst_base + dst_off[e]. The host cuts the entries
// into chunks of KVF_CHUNK_BYTES and lists, per chunk, its entry (chunk_entry) and its first byte
// within the entry (chunk_within); CTAs take chunks grid-stride, so one 32 KiB block and one
// 1 GiB run are spread over the whole GPU alike. Either base may be peer memory opened through
// CUDA IPC (reads and writes then cross NVLink).
extern "C" __global__ void __launch_bounds__(KVF_COPY_THREADS)
kvferry_scatter_copy(char* __restrict__ dst_base, const char* __restrict__ src_base,
                     const long long* __restrict__ dst_off, const long long* __restrict__ src_off,
                     const long long* __restrict__ sizes, const int* __restrict__ chunk_entry,
                     const long long* __restrict__ chunk_within, long long total_chunks) {
  for (long long c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const int e = chunk_entry[c];
    const long long within = chunk_within[c];
    long long n = sizes[e] - within;
    if (n > KVF_CHUNK_BYTES) n = KVF_CHUNK_BYTES;
    char* d = dst_base + dst_off[e] + within;
    const char* s = src_base + src_off[e] + within;
    if ((((uintptr_t)d | (uintptr_t)s | (uintptr_t)n) & 15) == 0) {
      const uint4* __restrict__ s4 = (const uint4*)s;
      uint4* __restrict__ d4 = (uint4*)d;
      const long long nv = n >> 4;
      long long i = threadIdx.x;
      // Four independent 16-byte loads in flight per thread before the first store.
      for (; i + 3 * KVF_COPY_THREADS < nv; i += 4 * KVF_COPY_THREADS) {
        uint4 r0 = s4[i];
        uint4 r1 = s4[i + KVF_COPY_THREADS];
        uint4 r2 = s4[i + 2 * KVF_COPY_THREADS];
        uint4 r3 = s4[i + 3 * KVF_COPY_THREADS];
        d4[i] = r0;
        d4[i + KVF_COPY_THREADS] = r1;
        d4[i + 2 * KVF_COPY_THREADS] = r2;
        d4[i + 3 * KVF_COPY_THREADS] = r3;
      }
      for (; i < nv; i += KVF_COPY_THREADS) d4[i] = s4[i];
    } else {
      for (long long i = threadIdx.x; i < n; i += KVF_COPY_THREADS) d[i] = s[i];
    }
  }
}
