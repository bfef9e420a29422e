package dev.kvferry.sim;

import java.util.BitSet;
import org.jspecify.annotations.Nullable;

/**
 * The paged KV cache's block allocator of a simulated engine: a free list of block ids with a free
 * count you can query. Not thread-safe: owned by the engine loop (reads of the free count from
 * other threads see a recent value).
 */
public final class BlockAllocator {
  private final int numBlocks;
  private final int[] freeList;
  private final BitSet allocated;
  private int freeTop;
  private volatile int freeCount;

  public BlockAllocator(int numBlocks) {
    if (numBlocks < 1) {
      throw new IllegalArgumentException("num blocks must be positive, got " + numBlocks);
    }
    this.numBlocks = numBlocks;
    this.freeList = new int[numBlocks];
    this.allocated = new BitSet(numBlocks);
    // Hand out low ids first, like vLLM's free block queue on a fresh cache.
    for (int i = 0; i < numBlocks; i++) {
      freeList[i] = numBlocks - 1 - i;
    }
    freeTop = numBlocks;
    freeCount = numBlocks;
  }

  public int numBlocks() {
    return numBlocks;
  }

  public int freeCount() {
    return freeCount;
  }

  /** {@code n} blocks, or null (nothing taken) when fewer are free. */
  public int @Nullable [] allocate(int n) {
    if (n < 0) {
      throw new IllegalArgumentException("cannot allocate " + n + " blocks");
    }
    if (n > freeTop) {
      return null;
    }
    int[] out = new int[n];
    for (int i = 0; i < n; i++) {
      int id = freeList[--freeTop];
      allocated.set(id);
      out[i] = id;
    }
    freeCount = freeTop;
    return out;
  }

  /** Returns blocks to the free list; freeing a block that is not allocated is a bug. */
  public void free(int[] ids) {
    for (int id : ids) {
      if (id < 0 || id >= numBlocks || !allocated.get(id)) {
        throw new IllegalStateException("block " + id + " freed but not allocated");
      }
      allocated.clear(id);
      freeList[freeTop++] = id;
    }
    freeCount = freeTop;
  }

  /** Shuffles the free list so later allocations are scattered (deterministic for a seed). */
  public void shuffleFree(long seed) {
    java.util.Random r = new java.util.Random(seed);
    for (int i = freeTop - 1; i > 0; i--) {
      int j = r.nextInt(i + 1);
      int t = freeList[i];
      freeList[i] = freeList[j];
      freeList[j] = t;
    }
  }
}
