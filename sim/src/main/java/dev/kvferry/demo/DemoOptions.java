package dev.kvferry.demo;

import java.util.List;

/**
 * What the demo runs: geometry, transport, modes and workload. Defaults are a Llama-3-8B-like
 * geometry and a workload that finishes in well under a minute on 2 cores.
 *
 * <p>{@code kvHeads} are the model's KV heads, split over each side's TP ranks; {@code blockSize}
 * is the default block size, {@code blockSizeP} and {@code blockSizeD} what each side runs.
 * {@code pGpu} and {@code dGpu} are the CUDA devices holding each side's KV cache (both -1: host
 * memory; the same id: one GPU); GPU caches are moved by the cuda transport, or by tcp.
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
    int blockSizeD,
    int pGpu,
    int dGpu) {

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
        concurrency, seed, progress, 1, 1, blockSize, blockSize, -1, -1);
  }

  /** The same options with P and D shaped differently. */
  /** The same options, moved by {@code otherTransport} (cma, tcp, cuda). */
  public DemoOptions withTransport(String otherTransport) {
    return new DemoOptions(otherTransport, modes, layers, kvHeads, headDim, blockSize, dtypeBytes,
        mla, latent, numBlocksP, numBlocksD, requests, promptMin, promptMax, abortRate,
        prefixHitRate, concurrency, seed, progress, tpP, tpD, blockSizeP, blockSizeD, pGpu, dGpu);
  }

  public DemoOptions withShapes(int tpP, int tpD, int blockSizeP, int blockSizeD) {
    return new DemoOptions(transport, modes, layers, kvHeads, headDim, blockSize, dtypeBytes, mla,
        latent, numBlocksP, numBlocksD, requests, promptMin, promptMax, abortRate, prefixHitRate,
        concurrency, seed, progress, tpP, tpD, blockSizeP, blockSizeD, pGpu, dGpu);
  }

  /**
   * The same options with P's KV cache on CUDA device {@code pGpu} and D's on {@code dGpu}, and
   * the cuda transport (tcp if it was chosen: staged through pinned buffers); -1 and -1 put both
   * back in host memory (cma unless tcp was chosen).
   */
  public DemoOptions withGpus(int pGpu, int dGpu) {
    String moves =
        pGpu >= 0 ? (transport.equals("tcp") ? "tcp" : "cuda")
            : transport.equals("cuda") ? "cma" : transport;
    return new DemoOptions(moves, modes, layers, kvHeads, headDim,
        blockSize, dtypeBytes, mla, latent, numBlocksP, numBlocksD, requests, promptMin,
        promptMax, abortRate, prefixHitRate, concurrency, seed, progress, tpP, tpD, blockSizeP,
        blockSizeD, pGpu, dGpu);
  }

  /** Whether P's and D's KV caches are on GPUs. */
  public boolean onGpus() {
    return pGpu >= 0;
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
    if (pGpu < -1 || dGpu < -1 || (pGpu >= 0) != (dGpu >= 0)) {
      throw new IllegalArgumentException("--p-gpu and --d-gpu go together (both CUDA device ids;"
          + " the same id puts P and D on one GPU), got " + gpuName(pGpu) + " and "
          + gpuName(dGpu));
    }
    if (pGpu >= 0 && !transport.equals("cuda") && !transport.equals("tcp")) {
      throw new IllegalArgumentException("KV caches on GPUs are moved by the cuda transport (CUDA"
          + " IPC) or by tcp (staged through pinned host buffers), not " + transport
          + ": drop --transport or give --transport cuda or tcp");
    }
    if (pGpu < 0 && transport.equals("cuda")) {
      throw new IllegalArgumentException(
          "--transport cuda moves GPU memory: give --p-gpu and --d-gpu");
    }
    for (String m : modes) {
      if (!m.equals("write") && !m.equals("read")) {
        throw new IllegalArgumentException("unknown mode '" + m + "': expected write or read");
      }
    }
  }

  private static String gpuName(int gpu) {
    return gpu < 0 ? "none" : Integer.toString(gpu);
  }

  /**
   * Bytes of host memory the KV caches of P's ({@code prefill}) or D's node take: every layer of
   * every TP rank of each mode's engine (a node runs one engine per mode); 0 when they are on a
   * GPU.
   */
  public long hostKvCacheBytes(boolean prefill) {
    if (onGpus()) {
      return 0;
    }
    int tp = prefill ? tpP : tpD;
    int numBlocks = prefill ? numBlocksP : numBlocksD;
    int nodeBlockSize = prefill ? blockSizeP : blockSizeD;
    dev.kvferry.actors.plan.KvCacheGeometry rank =
        mla
            ? dev.kvferry.actors.plan.KvCacheGeometry.mla(numBlocks, nodeBlockSize, latent,
                dtypeBytes)
            : dev.kvferry.actors.plan.KvCacheGeometry.standard(numBlocks, nodeBlockSize,
                kvHeads / tp, headDim, dtypeBytes);
    return Math.multiplyExact(rank.layerRegionBytes(), (long) layers * tp * modes.size());
  }

  /** The node flags that put P's ({@code prefill}) or D's KV cache where these options say. */
  List<String> kvCacheFlags(boolean prefill) {
    List<String> f = new java.util.ArrayList<>(List.of("--transport", transport));
    if (onGpus()) {
      f.addAll(List.of("--gpu", Integer.toString(prefill ? pGpu : dGpu)));
    }
    return f;
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
