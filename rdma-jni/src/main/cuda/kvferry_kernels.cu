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

// The 32-bit word expected at word `word` of logical block `block` of layer `layer`: a hash, so a
// block copied to the wrong place, a stale block or a torn copy all show as mismatches.
__device__ __forceinline__ uint32_t kvf_pattern(uint32_t seed, uint32_t layer, uint32_t block,
                                                uint32_t word) {
  uint32_t x = seed ^ (layer * 0x9E3779B1u) ^ (block * 0x85EBCA77u) ^ (word * 0xC2B2AE3Du);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The simulated engine's "compute" of one layer: writes the pattern into nblocks blocks of
// block_bytes (a multiple of 4) at base + block_off[b], then, if spin_ns > 0, keeps every CTA busy
// until spin_ns have passed since it started, standing in for the layer's attention and MLP time.
extern "C" __global__ void kvferry_fill_pattern(char* base, const long long* __restrict__ block_off,
                                                int nblocks, long long block_bytes, uint32_t layer,
                                                uint32_t seed, long long spin_ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  const long long words = block_bytes >> 2;
  for (int b = blockIdx.x; b < nblocks; b += gridDim.x) {
    uint32_t* p = (uint32_t*)(base + block_off[b]);
    for (long long w = threadIdx.x; w < words; w += blockDim.x) {
      p[w] = kvf_pattern(seed, layer, (uint32_t)b, (uint32_t)w);
    }
  }
  if (spin_ns > 0) {
    unsigned long long now;
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)spin_ns);
  }
}

// D's check: counts the 32-bit words of the nblocks blocks at base + block_off[b] that differ
// from the pattern P wrote for logical block b of this layer; adds the count to *mismatches.
extern "C" __global__ void kvferry_verify_pattern(const char* base,
                                                  const long long* __restrict__ block_off,
                                                  int nblocks, long long block_bytes,
                                                  uint32_t layer, uint32_t seed,
                                                  unsigned long long* mismatches) {
  const long long words = block_bytes >> 2;
  unsigned long long bad = 0;
  for (int b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const uint32_t* p = (const uint32_t*)(base + block_off[b]);
    for (long long w = threadIdx.x; w < words; w += blockDim.x) {
      bad += p[w] != kvf_pattern(seed, layer, (uint32_t)b, (uint32_t)w);
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}
