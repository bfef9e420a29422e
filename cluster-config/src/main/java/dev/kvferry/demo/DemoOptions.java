package dev.kvferry.demo;

import java.util.List;

/**
 * What the demo runs: geometry, transport, modes and workload. Defaults are a Llama-3-8B-like
 * geometry and a workload that finishes in well under a minute on 2 cores.
 *
 * <p>{@code kvHeads} are the model's KV heads, split over each side's TP ranks; {@code blockSize}
 * is the default block size, {@code blockSizeP} and {@code blockSizeD} what each side runs.
 */
public record DemoOptions(
    String transport,
    List<String> modes,
    int layers,
    int kvHeads,
    int headDim,
    int blockSize,
    int dtypeBytes,
    boolean mla,
    int latent,
    int numBlocksP,
    int numBlocksD,
    int requests,
    int promptMin,
    int promptMax,
    double abortRate,
    double prefixHitRate,
    int concurrency,
    long seed,
    boolean progress,
    int tpP,
    int tpD,
    int blockSizeP,
    int blockSizeD) {

  public static DemoOptions defaults() {
    return new DemoOptions(
        "cma", List.of("write", "read"), 32, 8, 128, 16, 2, false, 576, 512, 640, 48, 128, 2048,
        0.1, 0.25, 8, 42, true);
  }

  /** Both sides with TP 1 and the same block size. */
  public DemoOptions(
      String transport, List<String> modes, int layers, int kvHeads, int headDim, int blockSize,
      int dtypeBytes, boolean mla, int latent, int numBlocksP, int numBlocksD, int requests,
      int promptMin, int promptMax, double abortRate, double prefixHitRate, int concurrency,
      long seed, boolean progress) {
    this(transport, modes, layers, kvHeads, headDim, blockSize, dtypeBytes, mla, latent,
        numBlocksP, numBlocksD, requests, promptMin, promptMax, abortRate, prefixHitRate,
        concurrency, seed, progress, 1, 1, blockSize, blockSize);
  }

  /** The same options with P and D shaped differently. */
  public DemoOptions withShapes(int tpP, int tpD, int blockSizeP, int blockSizeD) {
    return new DemoOptions(transport, modes, layers, kvHeads, headDim, blockSize, dtypeBytes, mla,
        latent, numBlocksP, numBlocksD, requests, promptMin, promptMax, abortRate, prefixHitRate,
        concurrency, seed, progress, tpP, tpD, blockSizeP, blockSizeD);
  }

  public DemoOptions {
    if (tpP < 1 || tpD < 1 || blockSizeP < 1 || blockSizeD < 1) {
      throw new IllegalArgumentException(
          "--tp-p, --tp-d, --block-size-p and --block-size-d must be >= 1, got " + tpP + ", " + tpD
              + ", " + blockSizeP + ", " + blockSizeD);
    }
    if (!mla && (kvHeads % tpP != 0 || kvHeads % tpD != 0)) {
      throw new IllegalArgumentException(
          kvHeads + " KV heads cannot be split evenly over --tp-p " + tpP + " and --tp-d " + tpD);
    }
    if (promptMin < 1 || promptMax < promptMin) {
      throw new IllegalArgumentException(
          "--prompt-tokens MIN:MAX needs 1 <= MIN <= MAX, got " + promptMin + ":" + promptMax);
    }
    if (abortRate < 0 || abortRate > 1 || prefixHitRate < 0 || prefixHitRate > 1) {
      throw new IllegalArgumentException("--abort-rate must lie in [0, 1], got " + abortRate);
    }
    if (requests < 1 || concurrency < 1) {
      throw new IllegalArgumentException("--requests and concurrency must be >= 1");
    }
    long maxBlocks = (promptMax + Math.min(blockSizeP, blockSizeD) - 1)
        / Math.min(blockSizeP, blockSizeD);
    if (maxBlocks > Math.min(numBlocksP, numBlocksD)) {
      throw new IllegalArgumentException(
          "a " + promptMax + "-token prompt needs " + maxBlocks + " blocks but P has " + numBlocksP
              + " and D " + numBlocksD + ": raise --num-blocks-p/-d or lower --prompt-tokens");
    }
    for (String m : modes) {
      if (!m.equals("write") && !m.equals("read")) {
        throw new IllegalArgumentException("unknown mode '" + m + "': expected write or read");
      }
    }
  }

  /**
   * The node flags that give a node this geometry with {@code numBlocks} blocks of {@code
   * nodeBlockSize} tokens over {@code tp} ranks (each rank holding its share of the heads).
   */
  List<String> geometryFlags(int numBlocks, int tp, int nodeBlockSize) {
    List<String> f = new java.util.ArrayList<>(List.of(
        "--layers", Integer.toString(layers),
        "--tp-size", Integer.toString(tp),
        "--block-size", Integer.toString(nodeBlockSize),
        "--dtype-bytes", Integer.toString(dtypeBytes),
        "--num-blocks", Integer.toString(numBlocks)));
    if (mla) {
      f.addAll(List.of("--mla", "--latent", Integer.toString(latent)));
    } else {
      f.addAll(List.of("--kv-heads", Integer.toString(kvHeads / tp), "--head-dim",
          Integer.toString(headDim)));
    }
    return f;
  }
}
