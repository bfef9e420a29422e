package dev.kvferry.cli;

import java.util.HashMap;
import java.util.Map;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Option;

/** KV cache shape flags; unset flags keep the config's (Llama-3-8B-like) defaults. */
public final class GeometryOptions {

  @Option(names = "--layers", description = "Layers (default: 32).")
  @Nullable Integer layers;

  @Option(names = "--kv-heads", description = "KV heads of each TP rank (default: 8).")
  @Nullable Integer kvHeads;

  @Option(names = "--head-dim", description = "Head dimension (default: 128).")
  @Nullable Integer headDim;

  @Option(names = "--block-size", description = "Tokens per block (default: 16).")
  @Nullable Integer blockSize;

  @Option(names = "--dtype-bytes", description = "Bytes per element (default: 2).")
  @Nullable Integer dtypeBytes;

  @Option(names = "--num-blocks", description = "Blocks per layer (default: 512).")
  @Nullable Integer numBlocks;

  @Option(names = "--mla", description = "MLA layout [num_blocks, block_size, latent].")
  boolean mla;

  @Option(names = "--latent", description = "MLA latent size (default: 576).")
  @Nullable Integer latent;

  Map<String, Object> toConfigMap(String prefix) {
    Map<String, Object> m = new HashMap<>();
    put(m, prefix + ".layers", layers);
    put(m, prefix + ".kv-heads", kvHeads);
    put(m, prefix + ".head-dim", headDim);
    put(m, prefix + ".block-size", blockSize);
    put(m, prefix + ".dtype-bytes", dtypeBytes);
    put(m, prefix + ".num-blocks", numBlocks);
    put(m, prefix + ".latent", latent);
    if (mla) {
      m.put(prefix + ".mla", true);
    }
    return m;
  }

  private static void put(Map<String, Object> m, String key, @Nullable Integer v) {
    if (v != null) {
      m.put(key, v);
    }
  }
}
