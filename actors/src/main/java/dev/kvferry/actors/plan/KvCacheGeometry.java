package dev.kvferry.actors.plan;

/**
 * The shape of one layer's KV cache tensor on one engine, as the planner needs it.
 *
 * <ul>
 *   <li>{@link Layout#STANDARD}: {@code [2, numBlocks, blockSize, kvHeads, headDim]}, a K region
 *       followed by a V region of the same size;
 *   <li>{@link Layout#MLA}: {@code [numBlocks, blockSize, latent]}, one region.
 * </ul>
 *
 * <p>Fields a layout does not use must be 0 ({@code latent} for standard, {@code kvHeads} and
 * {@code headDim} for MLA). The tensor is contiguous, so one block's stride equals its size. Every
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
    MLA
  }

  public KvCacheGeometry {
    if (layout == null) {
      throw new IllegalArgumentException("KV cache layout is missing: use STANDARD or MLA");
    }
    requirePositive("numBlocks", numBlocks);
    requirePositive("blockSize", blockSize);
    requirePositive("elementBytes", elementBytes);
    if (layout == Layout.STANDARD) {
      requirePositive("kvHeads", kvHeads);
      requirePositive("headDim", headDim);
      if (latent != 0) {
        throw new IllegalArgumentException(
            "latent is only used by the MLA layout; it must be 0 for STANDARD, got " + latent);
      }
    } else {
      requirePositive("latent", latent);
      if (kvHeads != 0 || headDim != 0) {
        throw new IllegalArgumentException(
            "kvHeads and headDim are only used by the STANDARD layout; they must be 0 for MLA, got"
                + " kvHeads="
                + kvHeads
                + " headDim="
                + headDim);
      }
    }
    try {
      long elementsPerBlock =
          layout == Layout.STANDARD
              ? Math.multiplyExact((long) blockSize * kvHeads, (long) headDim)
              : (long) blockSize * latent;
      long blockBytes = Math.multiplyExact(elementsPerBlock, (long) elementBytes);
      Math.multiplyExact(blockBytes, (long) numBlocks * (layout == Layout.STANDARD ? 2 : 1));
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

  /** {@code [numBlocks, blockSize, latent]} with {@code elementBytes} per element. */
  public static KvCacheGeometry mla(int numBlocks, int blockSize, int latent, int elementBytes) {
    return new KvCacheGeometry(Layout.MLA, numBlocks, blockSize, 0, 0, latent, elementBytes);
  }

  /** 2 for STANDARD (K and V), 1 for MLA. */
  public int regionsPerLayer() {
    return layout == Layout.STANDARD ? 2 : 1;
  }

  /** Bytes of one block of K (or of V, or of the latent for MLA); one copy moves this much. */
  public long blockBytes() {
    // All products in long and checked: the constructor proved they fit, so these never throw.
    long elements =
        layout == Layout.STANDARD
            ? Math.multiplyExact((long) blockSize * kvHeads, (long) headDim)
            : (long) blockSize * latent;
    return Math.multiplyExact(elements, (long) elementBytes);
  }

  /** Bytes from one block to the next within a region; the tensor is contiguous. */
  public long blockStrideBytes() {
    return blockBytes();
  }

  /** Bytes from a block's K to its V: {@code numBlocks * blockStrideBytes}; 0 for MLA. */
  public long kToVStrideBytes() {
    return layout == Layout.STANDARD ? Math.multiplyExact((long) numBlocks, blockStrideBytes()) : 0L;
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
