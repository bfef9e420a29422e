package dev.kvferry.bench;

/**
 * The Llama-3-8B-like model the bench moves: 32 layers, 8 KV heads of 128 dims in 2-byte
 * elements, 16-token blocks, so one K or V block of one layer is 32 KiB.
 */
public final class Geometry {
  public static final int LAYERS = 32;
  public static final int BLOCK_TOKENS = 16;
  public static final int KV_HEADS = 8;
  public static final int HEAD_DIM = 128;
  public static final int ELEMENT_BYTES = 2;
  /** One K (or V) block of one layer. */
  public static final long BLOCK_BYTES = (long) BLOCK_TOKENS * KV_HEADS * HEAD_DIM * ELEMENT_BYTES;
  /** The prompt lengths every size-dependent row is measured at. */
  public static final int[] PROMPT_TOKENS = {512, 2048, 8192};

  private Geometry() {}

  /** KV blocks of one request per layer and per K or V. */
  public static int blocksPerLayer(int promptTokens) {
    return (promptTokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
  }

  /** 32 KiB copies in one request's transfer: every layer's K and V blocks. */
  public static int transferBlocks(int promptTokens) {
    return blocksPerLayer(promptTokens) * 2 * LAYERS;
  }

  /** Bytes of one layer of one request (K and V). */
  public static long layerBytes(int promptTokens) {
    return blocksPerLayer(promptTokens) * 2L * BLOCK_BYTES;
  }

  /** "2,048 tok" */
  public static String tokens(int promptTokens) {
    return String.format(java.util.Locale.ROOT, "%,d tok", promptTokens);
  }
}
