package dev.kvferry.demo;

import java.util.List;

/**
 * What the demo runs: geometry, transport, modes and workload. Defaults are a Llama-3-8B-like
 * geometry and a workload that finishes in well under a minute on 2 cores.
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
    boolean progress) {

  public static DemoOptions defaults() {
    return new DemoOptions(
        "cma", List.of("write", "read"), 32, 8, 128, 16, 2, false, 576, 512, 640, 48, 128, 2048,
        0.1, 0.25, 8, 42, true);
  }

  public DemoOptions {
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
    long maxBlocks = (promptMax + blockSize - 1) / blockSize;
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

  /** The node flags that give a node this geometry with {@code numBlocks} blocks. */
  List<String> geometryFlags(int numBlocks) {
    List<String> f = new java.util.ArrayList<>(List.of(
        "--layers", Integer.toString(layers),
        "--block-size", Integer.toString(blockSize),
        "--dtype-bytes", Integer.toString(dtypeBytes),
        "--num-blocks", Integer.toString(numBlocks)));
    if (mla) {
      f.addAll(List.of("--mla", "--latent", Integer.toString(latent)));
    } else {
      f.addAll(List.of("--kv-heads", Integer.toString(kvHeads), "--head-dim", Integer.toString(headDim)));
    }
    return f;
  }
}
