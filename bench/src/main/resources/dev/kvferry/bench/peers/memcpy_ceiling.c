// kvferry bench peer: the host-memory ceiling of a KV transfer, a single thread's memcpy of the
// same bytes inside one process.
//
//   cc -O2 -o memcpy_ceiling memcpy_ceiling.c
//   ./memcpy_ceiling BLOCK_BYTES NUM_BLOCKS ROUNDS [POOL_BLOCKS]
//
// contiguous: one memcpy of NUM_BLOCKS * BLOCK_BYTES.
// scattered:  one memcpy per block; source and destination blocks are NUM_BLOCKS distinct ids drawn
//             at random from pools of POOL_BLOCKS blocks (default NUM_BLOCKS: a permutation), so
//             neither side is one run, as on a real P and D whose blocks are a subset of a pool.
// Both figures are medians over ROUNDS, after the buffers were touched once. One JSON line out.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_random(void) {  // xorshift64*: reproducible across libcs
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

// The first n entries of a shuffled 0..pool-1: n distinct block ids in random order.
static void draw_ids(size_t *ids, size_t *scratch, size_t n, size_t pool) {
    for (size_t i = 0; i < pool; i++) scratch[i] = i;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + (size_t)(next_random() % (pool - i));
        size_t t = scratch[i];
        scratch[i] = scratch[j];
        scratch[j] = t;
        ids[i] = scratch[i];
    }
}

static double median_gbps(double *t, int rounds, size_t bytes) {
    qsort(t, (size_t)rounds, sizeof *t, by_value);
    return (double)bytes / t[rounds / 2] / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s BLOCK_BYTES NUM_BLOCKS ROUNDS [POOL_BLOCKS]\n", argv[0]);
        return 2;
    }
    size_t block = strtoull(argv[1], NULL, 10), n = strtoull(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    size_t pool = argc == 5 ? strtoull(argv[4], NULL, 10) : n;
    if (block == 0 || n == 0 || rounds < 1 || pool < n) {
        fprintf(stderr, "need BLOCK_BYTES, NUM_BLOCKS, ROUNDS >= 1 and POOL_BLOCKS >= NUM_BLOCKS\n");
        return 2;
    }
    size_t bytes = block * n, pool_bytes = block * pool;
    char *src = aligned_alloc(4096, (pool_bytes + 4095) / 4096 * 4096);
    char *dst = aligned_alloc(4096, (pool_bytes + 4095) / 4096 * 4096);
    size_t *from = malloc(n * sizeof *from), *to = malloc(n * sizeof *to);
    size_t *scratch = malloc(pool * sizeof *scratch);
    double *t = malloc((size_t)rounds * sizeof *t);
    if (!src || !dst || !from || !to || !scratch || !t) {
        fprintf(stderr, "out of memory for %zu-byte pools\n", pool_bytes);
        return 1;
    }
    for (size_t i = 0; i < pool_bytes; i++) src[i] = (char)(i * 131 + 7);
    memset(dst, 1, pool_bytes);
    draw_ids(from, scratch, n, pool);
    draw_ids(to, scratch, n, pool);

    for (int r = 0; r < rounds; r++) {
        double s = seconds();
        memcpy(dst, src, bytes);
        t[r] = seconds() - s;
    }
    double contiguous = median_gbps(t, rounds, bytes);
    for (int r = 0; r < rounds; r++) {
        double s = seconds();
        for (size_t i = 0; i < n; i++) memcpy(dst + to[i] * block, src + from[i] * block, block);
        t[r] = seconds() - s;
    }
    double scattered = median_gbps(t, rounds, bytes);
    // Read the destination back, so the copies cannot be optimised away.
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) sum += (unsigned char)dst[to[i] * block];
    printf("{\"block_bytes\": %zu, \"num_blocks\": %zu, \"pool_blocks\": %zu, "
           "\"contiguous_gbps\": %.3f, \"scattered_gbps\": %.3f, \"check\": %u}\n",
           block, n, pool, contiguous, scattered, sum);
    return 0;
}
