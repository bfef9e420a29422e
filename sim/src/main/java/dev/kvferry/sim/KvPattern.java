package dev.kvferry.sim;

import dev.kvferry.actors.plan.KvCacheGeometry;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.jspecify.annotations.Nullable;

/**
 * The deterministic content a simulated prefill writes into its KV cache: every 8-byte word is a
 * function of (request, token position, layer, K|V, word index), where the word index counts from
 * the token's first word of global KV head 0, so it covers head and element and does not depend
 * on how the heads are split over TP ranks. D recomputes it to check every byte it received: a direct
 * comparison, not a checksum, so a mismatch names the exact offset.
 */
public final class KvPattern {

  private KvPattern() {}

  /** A mismatch found by {@link #verify}. */
  public record Mismatch(
      int layer, int block, int tokenPosition, int kv, long offsetBytes, int tpRank) {
    public Mismatch(int layer, int block, int tokenPosition, int kv, long offsetBytes) {
      this(layer, block, tokenPosition, kv, offsetBytes, -1);
    }

    /** This mismatch as found on TP rank {@code rank} of an engine with several. */
    public Mismatch onRank(int rank) {
      return new Mismatch(layer, block, tokenPosition, kv, offsetBytes, rank);
    }

    @Override
    public String toString() {
      return (tpRank < 0 ? "" : "TP rank " + tpRank + ", ") + "layer " + layer + ", block "
          + block + ", token " + tokenPosition + ", " + (kv == 0 ? "K" : "V") + ", byte offset "
          + offsetBytes + " in the layer";
    }
  }

  /** Stable 64-bit key of a request id. */
  public static long requestKey(String requestId) {
    long h = 0xcbf29ce484222325L;
    for (int i = 0; i < requestId.length(); i++) {
      h = (h ^ requestId.charAt(i)) * 0x100000001b3L;
    }
    return mix(h);
  }

  static long word(long requestKey, int position, int layer, int kv, int wordIndex) {
    long x = requestKey;
    x ^= ((long) position << 32) | ((long) layer << 16) | ((long) kv << 15) | wordIndex;
    return mix(x + 0x9e3779b97f4a7c15L * (wordIndex + 1));
  }

  private static long mix(long z) {
    z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
    z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
    return z ^ (z >>> 31);
  }

  /** Bytes of one token's slot in one of K, V (or the latent). */
  public static int tokenBytes(KvCacheGeometry g) {
    return Math.toIntExact(g.tokenBytes());
  }

  /** The layer region as a buffer in native order, for {@link #fill} and {@link #verify}. */
  public static ByteBuffer view(ByteBuffer layer) {
    return layer.duplicate().order(ByteOrder.nativeOrder());
  }

  /** Writes the pattern of token positions {@code [from, to)} of one layer into its blocks. */
  public static void fill(
      ByteBuffer layer, KvCacheGeometry g, long requestKey, int layerIndex, int[] blockIds,
      int from, int to) {
    fill(layer, g, 0, requestKey, layerIndex, blockIds, from, to);
  }

  /**
   * Writes the pattern of token positions {@code [from, to)} of one layer of a TP rank whose first
   * KV head is global head {@code firstHead}: each head's bytes depend on its global index, so a
   * rank of another TP size computes the same bytes for the same head.
   */
  public static void fill(
      ByteBuffer layer, KvCacheGeometry g, int firstHead, long requestKey, int layerIndex,
      int[] blockIds, int from, int to) {
    int heads = headsPerSlot(g);
    int headBytes = headBytes(g);
    int kvs = slotsPerToken(g);
    for (int pos = from; pos < to; pos++) {
      int block = blockIds[pos / g.blockSize()];
      for (int kv = 0; kv < kvs; kv++) {
        long base = slotOffset(g, block, pos, kv);
        for (int h = 0; h < heads; h++) {
          writeHead(layer, (int) base + h * headBytes, headBytes, requestKey, pos, layerIndex, kv,
              firstHead + h);
        }
      }
    }
  }

  /**
   * Checks token positions {@code [from, to)} of one layer; the first mismatch, or null when every
   * byte is as P wrote it.
   */
  public static @Nullable Mismatch verify(
      ByteBuffer layer, KvCacheGeometry g, long requestKey, int layerIndex, int[] blockIds,
      int from, int to) {
    return verify(layer, g, 0, requestKey, layerIndex, blockIds, from, to);
  }

  /** {@link #verify} for a TP rank whose first KV head is global head {@code firstHead}. */
  public static @Nullable Mismatch verify(
      ByteBuffer layer, KvCacheGeometry g, int firstHead, long requestKey, int layerIndex,
      int[] blockIds, int from, int to) {
    int heads = headsPerSlot(g);
    int headBytes = headBytes(g);
    int kvs = slotsPerToken(g);
    int words = headBytes >>> 3;
    int tail = headBytes & 7;
    for (int pos = from; pos < to; pos++) {
      int block = blockIds[pos / g.blockSize()];
      for (int kv = 0; kv < kvs; kv++) {
        int slot = (int) slotOffset(g, block, pos, kv);
        for (int h = 0; h < heads; h++) {
          int base = slot + h * headBytes;
          int first = wordsPerHead(headBytes) * (firstHead + h);
          for (int w = 0; w < words; w++) {
            if (layer.getLong(base + (w << 3)) != word(requestKey, pos, layerIndex, kv, first + w)) {
              return new Mismatch(layerIndex, block, pos, kv, base + ((long) w << 3));
            }
          }
          if (tail != 0) {
            long expected = word(requestKey, pos, layerIndex, kv, first + words);
            for (int b = 0; b < tail; b++) {
              if (layer.get(base + (words << 3) + b) != (byte) (expected >>> (8 * b))) {
                return new Mismatch(layerIndex, block, pos, kv, base + ((long) words << 3) + b);
              }
            }
          }
        }
      }
    }
    return null;
  }

  /** K and V, or the latent alone. */
  static int slotsPerToken(KvCacheGeometry g) {
    return g.tokenRegions();
  }

  /** The first global KV head of TP rank {@code rank} (0 for MLA, whose latent each rank holds whole). */
  static int firstHead(KvCacheGeometry g, int rank) {
    return g.layout() == KvCacheGeometry.Layout.MLA ? 0 : rank * g.kvHeads();
  }

  /** Heads in one token's slot: the rank's KV heads, or 1 for MLA (the latent is one piece). */
  static int headsPerSlot(KvCacheGeometry g) {
    return g.layout() == KvCacheGeometry.Layout.MLA ? 1 : g.kvHeads();
  }

  static int headBytes(KvCacheGeometry g) {
    return tokenBytes(g) / headsPerSlot(g);
  }

  /** Pattern words per head; with whole words per head, a token's words number 0, 1, 2, ... */
  static int wordsPerHead(int headBytes) {
    return (headBytes + 7) >>> 3;
  }

  static long slotOffset(KvCacheGeometry g, int block, int pos, int kv) {
    return kv * g.kToVStrideBytes()
        + (long) block * g.blockStrideBytes()
        + (long) (pos % g.blockSize()) * tokenBytes(g);
  }

  private static void writeHead(
      ByteBuffer layer, int base, int headBytes, long key, int pos, int layerIndex, int kv,
      int globalHead) {
    int words = headBytes >>> 3;
    int first = wordsPerHead(headBytes) * globalHead;
    for (int w = 0; w < words; w++) {
      layer.putLong(base + (w << 3), word(key, pos, layerIndex, kv, first + w));
    }
    int tail = headBytes & 7;
    if (tail != 0) {
      long v = word(key, pos, layerIndex, kv, first + words);
      for (int b = 0; b < tail; b++) {
        layer.put(base + (words << 3) + b, (byte) (v >>> (8 * b)));
      }
    }
  }
}
