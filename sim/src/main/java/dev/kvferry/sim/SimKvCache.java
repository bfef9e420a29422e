package dev.kvferry.sim;

import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.rdma.MemoryRegion;
import java.util.List;
import org.jspecify.annotations.Nullable;

/**
 * The simulated engine's KV cache, one set of layers per TP rank, and how it is computed and
 * checked: in host memory by the CPU ({@link HostKvCache}) or in GPU memory by kernels on the
 * engine's compute stream ({@link GpuKvCache}). Both write exactly the bytes of {@link
 * KvPattern}. Called from the engine's loop thread only; nothing here blocks that thread on the
 * GPU: work is queued, and its end is learnt by polling a {@link Fence} or a {@link Check}.
 */
public interface SimKvCache extends AutoCloseable {

  int ranks();

  int layers();

  /** Rank {@code rank}'s layer regions, to register with its worker. */
  List<MemoryRegion> layerRegions(int rank);

  /** P: one step's forward pass over {@code ranges}; the caller walks it layer by layer. */
  ForwardPass forward(List<TokenRange> ranges);

  /** D: writes the pattern of {@code range} into every layer of every rank (a local prefix hit). */
  void fill(TokenRange range);

  /** D: compares every byte of {@code range} in every layer of every rank with the pattern. */
  Check check(TokenRange range);

  /** A point behind everything queued so far. */
  Fence fence();

  @Override
  void close();

  /** One step's forward pass. */
  interface ForwardPass {
    /**
     * Computes layer {@code layer} of TP rank {@code rank} for the step's tokens; the event says
     * when its KV is in place (GPU: a CUDA event recorded behind the fill kernel).
     */
    LayerEvent layer(int rank, int layer);

    /** Ends the pass: the fence completes once every layer's KV is in place. */
    Fence end();
  }

  /** Completes once the work queued before it is done. */
  interface Fence {
    Fence DONE = () -> true;

    /** Polls; never blocks. */
    boolean isComplete();
  }

  /** A check in progress. */
  interface Check {
    /** Polls; never blocks. */
    boolean isDone();

    /** Once done: the first mismatch (in rank, layer, token, K|V, byte order), or null. */
    KvPattern.@Nullable Mismatch firstMismatch();
  }
}
