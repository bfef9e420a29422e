// The simulated engine's and the GPU benches' kernels: a pattern fill and check per block, and the
// KV fill and check of the simulated engine (dev.kvferry.sim.SimKernels loads them). Like the
// transport's kernels (rdma-jni/src/main/cuda/kvferry_kernels.cu) the PTX is committed, as
// sim/src/main/resources/dev/kvferry/sim/sim_kernels.ptx; regenerate it, from the repository root,
// with:
//
//   nvcc -ptx -O3 -arch=compute_80 -o sim/src/main/resources/dev/kvferry/sim/sim_kernels.ptx sim/src/main/cuda/sim_kernels.cu
#include <stdint.h>

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

// ---- The simulated engine's KV cache (module sim, dev.kvferry.sim) ----------------------
// These write and check EXACTLY the bytes KvPattern (Java) writes: the same 64-bit function of
// (request key, token position, layer, K|V, word index), the word index counting from the
// token's first word of global KV head 0, each head's words numbered from wordsPerHead x head.
// A head of head_bytes takes ceil(head_bytes / 8) words, the last one cut to the head's end,
// stored little endian (as Java's native-order ByteBuffer on x86-64 and aarch64).

// KvPattern.mix: the splitmix64 finalizer.
__device__ __forceinline__ unsigned long long kvf_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// KvPattern.word, with Java's long arithmetic (wrapping multiply, logical shifts).
__device__ __forceinline__ unsigned long long kvf_kv_word(unsigned long long key, long long position,
                                                          int layer, int kv, int word) {
  unsigned long long x = key;
  x ^= ((unsigned long long)position << 32) | ((unsigned long long)(long long)layer << 16) |
       ((unsigned long long)(long long)kv << 15) | (unsigned long long)(long long)word;
  return kvf_mix(x + 0x9e3779b97f4a7c15ULL * (unsigned long long)(long long)(word + 1));
}

// One step of the simulated prefill for one layer of one TP rank: for every token of the table
// (3 longs per token: byte offset of its K slot in the layer, request key, token position) and
// each of K and V (kvs = 2; 1 for MLA, whose latent is one slot), writes `heads` heads of
// head_bytes, head h holding the words of global head first_head + h. V slots lie kv_stride
// bytes after K slots. CTAs grid-stride over (token, K|V) slots, threads over a slot's words.
extern "C" __global__ void kvferry_kv_fill(char* layer_base, const long long* __restrict__ tokens,
                                           int token_count, int kvs, long long kv_stride,
                                           int heads, int head_bytes, int first_head, int layer) {
  const int wph = (head_bytes + 7) >> 3;
  const int slot_words = heads * wph;
  for (long long s = blockIdx.x; s < (long long)token_count * kvs; s += gridDim.x) {
    const long long t = s / kvs;
    const int kv = (int)(s - t * kvs);
    const long long slot = tokens[3 * t] + kv * kv_stride;
    const unsigned long long key = (unsigned long long)tokens[3 * t + 1];
    const long long position = tokens[3 * t + 2];
    for (int i = threadIdx.x; i < slot_words; i += blockDim.x) {
      const int h = i / wph;
      const int w = i - h * wph;
      const unsigned long long v =
          kvf_kv_word(key, position, layer, kv, wph * (first_head + h) + w);
      char* p = layer_base + slot + (long long)h * head_bytes + 8 * w;
      const int n = min(8, head_bytes - 8 * w);
      if (n == 8 && ((uintptr_t)p & 7) == 0) {
        *(unsigned long long*)p = v;
      } else {
        for (int b = 0; b < n; b++) p[b] = (char)(v >> (8 * b));
      }
    }
  }
}

// D's check of one TP rank over all its layers (layers[l] = layer l's base): compares every slot
// of the token table (as kvferry_kv_fill) with the pattern. result[0] += words that differ (a
// head's cut last word counts as one); result[1] = min over mismatches of the location key
// ((((l * token_count + t) * kvs + kv) * slot_words + h * wph + w) * 8 + b), b being the first
// differing byte of a cut word and 0 for a whole word: the smallest key is the mismatch KvPattern's
// host check, which walks layers, tokens, K|V, heads, words and bytes in that order, finds first.
// The host sets result[1] to ~0 before the launch.
extern "C" __global__ void kvferry_kv_verify(const char* const* __restrict__ layers,
                                             int layer_count, const long long* __restrict__ tokens,
                                             int token_count, int kvs, long long kv_stride,
                                             int heads, int head_bytes, int first_head,
                                             unsigned long long* result) {
  const int wph = (head_bytes + 7) >> 3;
  const int slot_words = heads * wph;
  const long long slots = (long long)layer_count * token_count * kvs;
  unsigned long long bad = 0;
  unsigned long long first = ~0ULL;
  for (long long s = blockIdx.x; s < slots; s += gridDim.x) {
    const long long lt = s / kvs;
    const int kv = (int)(s - lt * kvs);
    const int l = (int)(lt / token_count);
    const long long t = lt - (long long)l * token_count;
    const long long slot = tokens[3 * t] + kv * kv_stride;
    const unsigned long long key = (unsigned long long)tokens[3 * t + 1];
    const long long position = tokens[3 * t + 2];
    for (int i = threadIdx.x; i < slot_words; i += blockDim.x) {
      const int h = i / wph;
      const int w = i - h * wph;
      const unsigned long long v =
          kvf_kv_word(key, position, l, kv, wph * (first_head + h) + w);
      const char* p = layers[l] + slot + (long long)h * head_bytes + 8 * w;
      const int n = min(8, head_bytes - 8 * w);
      int differs = -1;
      if (n == 8) {
        unsigned long long got;
        if (((uintptr_t)p & 7) == 0) {
          got = *(const unsigned long long*)p;
        } else {
          got = 0;
          for (int b = 0; b < 8; b++) got |= (unsigned long long)(unsigned char)p[b] << (8 * b);
        }
        if (got != v) differs = 0;
      } else {
        for (int b = 0; b < n && differs < 0; b++) {
          if ((unsigned char)p[b] != (unsigned char)(v >> (8 * b))) differs = b;
        }
      }
      if (differs >= 0) {
        bad++;
        const unsigned long long where =
            ((unsigned long long)s * slot_words + (unsigned long long)i) * 8 + differs;
        if (where < first) first = where;
      }
    }
  }
  if (bad) {
    atomicAdd(&result[0], bad);
    atomicMin(&result[1], first);
  }
}
