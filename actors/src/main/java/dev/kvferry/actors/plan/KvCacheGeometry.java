package dev.kvferry.actors.plan;

/**
 * The shape of one layer's KV cache tensor on one engine, as the planner needs it.
 *
 * <ul>
 *   <li>{@link Layout#STANDARD}: {@code [2, numBlocks, blockSize, kvHeads, headDim]}, a K region
 *       followed by a V region of the same size;
 *   <li>{@link Layout#BLOCKS_FIRST}: {@code [numBlocks, 2, blockSize, kvHeads, headDim]}, one region
 *       whose blocks each hold their K then their V (FlashInfer's layout in vLLM);
 *   <li>{@link Layout#MLA}: {@code [numBlocks, blockSize, latent]}, one region.
 * </ul>
 *
 * <p>Fields a layout does not use must be 0 ({@code latent} for standard and blocks-first,
 * {@code kvHeads} and {@code headDim} for MLA). The tensor is contiguous, so one block's stride equals its size. Every
 * derived size is checked to fit in a {@code long} at construction, so the accessors never
 * overflow.
 */
public record KvCacheGeometry(
    Layout layout,
    int numBlocks,
    int blockSize,
    int kvHeads,
    int headDim,
    int latent,
    int elementBytes) {

  /** How a layer's cache is laid out in memory. */
  public enum Layout {
    /** {@code [2, num_blocks, block_size, kv_heads, head_dim]}: K region, then V region. */
    STANDARD,
    /** {@code [num_blocks, block_size, latent]}: one region (multi-head latent attention). */
    MLA,
    /** {@code [num_blocks, 2, block_size, kv_heads, head_dim]}: each block's K, then its V. */
    BLOCKS_FIRST;

    /** Whether a token holds KV heads (K and V of each), not MLA's latent. */
    public boolean hasHeads() {
      return this != MLA;
    }
  }

  public KvCacheGeometry {
    if (layout == null) {
      throw new IllegalArgumentException(
          "KV cache layout is missing: use STANDARD, BLOCKS_FIRST or MLA");
    }
    requirePositive("numBlocks", numBlocks);
    requirePositive("blockSize", blockSize);
    requirePositive("elementBytes", elementBytes);
    if (layout.hasHeads()) {
      requirePositive("kvHeads", kvHeads);
      requirePositive("headDim", headDim);
      if (latent != 0) {
        throw new IllegalArgumentException(
            "latent is only used by the MLA layout; it must be 0 for " + layout + ", got "
                + latent);
      }
    } else {
      requirePositive("latent", latent);
      if (kvHeads != 0 || headDim != 0) {
        throw new IllegalArgumentException(
            "kvHeads and headDim are not used by the MLA layout; they must be 0 for MLA, got"
                + " kvHeads="
                + kvHeads
                + " headDim="
                + headDim);
      }
    }
    try {
      long elementsPerToken =
          layout.hasHeads() ? Math.multiplyExact((long) kvHeads, (long) headDim) : latent;
      long tokenBytes = Math.multiplyExact(elementsPerToken, (long) elementBytes);
      long slotBytes = Math.multiplyExact(tokenBytes, (long) blockSize);
      Math.multiplyExact(slotBytes, (long) numBlocks * (layout.hasHeads() ? 2 : 1));
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException(
          "a KV cache layer of "
              + numBlocks
              + " blocks of "
              + blockSize
              + " tokens would exceed 2^63 bytes; check the shape",
          e);
    }
  }

  /** {@code [2, numBlocks, blockSize, kvHeads, headDim]} with {@code elementBytes} per element. */
  public static KvCacheGeometry standard(
      int numBlocks, int blockSize, int kvHeads, int headDim, int elementBytes) {
    return new KvCacheGeometry(
        Layout.STANDARD, numBlocks, blockSize, kvHeads, headDim, 0, elementBytes);
  }

  /** {@code [numBlocks, 2, blockSize, kvHeads, headDim]} with {@code elementBytes} per element. */
  public static KvCacheGeometry blocksFirst(
      int numBlocks, int blockSize, int kvHeads, int headDim, int elementBytes) {
    return new KvCacheGeometry(
        Layout.BLOCKS_FIRST, numBlocks, blockSize, kvHeads, headDim, 0, elementBytes);
  }

  /** {@code [numBlocks, blockSize, latent]} with {@code elementBytes} per element. */
  public static KvCacheGeometry mla(int numBlocks, int blockSize, int latent, int elementBytes) {
    return new KvCacheGeometry(Layout.MLA, numBlocks, blockSize, 0, 0, latent, elementBytes);
  }

  /**
   * Regions a block id names in a layer: 2 for STANDARD (its K block and its V block, far apart),
   * 1 for BLOCKS_FIRST (K and V of a block are one run) and MLA.
   */
  public int regionsPerLayer() {
    return layout == Layout.STANDARD ? 2 : 1;
  }

  /** Regions a token occupies in a layer: 2 (K and V) for STANDARD and BLOCKS_FIRST, 1 for MLA. */
  public int tokenRegions() {
    return layout.hasHeads() ? 2 : 1;
  }

  /** Bytes of one token in one of its regions: its K (or V) heads, or its latent. */
  public long tokenBytes() {
    // All products in long and checked: the constructor proved they fit, so these never throw.
    long elements = layout.hasHeads() ? (long) kvHeads * headDim : latent;
    return Math.multiplyExact(elements, (long) elementBytes);
  }

  /**
   * Bytes of one block in one of its {@link #regionsPerLayer() regions}; one copy of a block id
   * moves this much. STANDARD: its K (or V); BLOCKS_FIRST: its K and V; MLA: its latent.
   */
  public long blockBytes() {
    return Math.multiplyExact(tokenBytes() * blockSize, (long) tokenRegions() / regionsPerLayer());
  }

  /** Bytes from one block to the next within a region; the tensor is contiguous. */
  public long blockStrideBytes() {
    return blockBytes();
  }

  /**
   * Bytes from a token's K to its V: {@code numBlocks * blockStrideBytes} for STANDARD, half a
   * block for BLOCKS_FIRST; 0 for MLA.
   */
  public long kToVStrideBytes() {
    return switch (layout) {
      case STANDARD -> Math.multiplyExact((long) numBlocks, blockStrideBytes());
      case BLOCKS_FIRST -> tokenBytes() * blockSize;
      case MLA -> 0L;
    };
  }

  /** Bytes of one layer's whole tensor: {@code regionsPerLayer * numBlocks * blockBytes}. */
  public long layerRegionBytes() {
    // (long) first: 2 * 2^30 blocks overflows an int and gave a negative size.
    return Math.multiplyExact((long) regionsPerLayer() * numBlocks, blockBytes());
  }

  private static void requirePositive(String name, int value) {
    if (value <= 0) {
      throw new IllegalArgumentException(name + " must be at least 1, got " + value);
    }
  }
}
