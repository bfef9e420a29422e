package dev.kvferry.actors;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

/**
 * D, READ: which layers of which transfers have landed, shared between a worker's actor (which
 * records) and the engine's thread (which waits in {@code waitForLayerLoad}): the per-layer wait
 * of vLLM's connector contract, so a layer never runs before its KV is in place. A transfer that
 * ended (read, failed or given up) counts as landed for every layer: its failure is reported by
 * {@code getFinished}, and nothing of it is still copying.
 *
 * <p>With a transport that orders copies on the GPU it also records which reads of a layer are
 * queued on the copy streams (not yet landed), so the engine's stream can wait for an event
 * recorded behind them instead of the engine's CPU waiting for them to land.
 */
public final class LayerLoads {

  /** One read handed to the transport: into {@code local} from {@code remote}'s owner. */
  public record QueuedRead(MemoryRegion local, RegionDescriptor remote) {}

  /** One transfer being loaded: landed layers, and per layer the reads queued so far. */
  private static final class Loading {
    final BitSet landed = new BitSet();
    /** Reads per layer (one per P worker read from); 0 until the reader knows. */
    int sources;
    final Map<Integer, List<QueuedRead>> queued = new HashMap<>();
  }

  private final Map<String, Loading> loading = new HashMap<>();
  private final Map<String, Boolean> ended = new HashMap<>();

  /** A step's load of {@code transferId} begins. */
  public synchronized void begin(String transferId) {
    loading.computeIfAbsent(transferId, k -> new Loading());
  }

  /** Each layer of the transfer is read from {@code sources} P workers. */
  public synchronized void readsPerLayer(String transferId, int sources) {
    Loading l = loading.get(transferId);
    if (l != null) {
      l.sources = sources;
      notifyAll();
    }
  }

  /** A read of {@code layer} is queued on the transport's copy stream (it has not landed yet). */
  public synchronized void readQueued(String transferId, int layer, QueuedRead read) {
    Loading l = loading.get(transferId);
    if (l != null) {
      l.queued.computeIfAbsent(layer, k -> new ArrayList<>(1)).add(read);
      notifyAll();
    }
  }

  /** Every read of {@code layer} of the transfer has landed. */
  public synchronized void layerLanded(String transferId, int layer) {
    Loading l = loading.get(transferId);
    if (l != null) {
      l.landed.set(layer);
      l.queued.remove(layer);
      notifyAll();
    }
  }

  /** The transfer ended: no copy of it is in flight any more. */
  public synchronized void ended(String transferId) {
    if (loading.remove(transferId) != null) {
      ended.put(transferId, Boolean.TRUE);
      if (ended.size() > 65_536) {
        ended.clear(); // only waiters of the current step ask; old entries need not stay
      }
    }
    notifyAll();
  }

  /**
   * Waits until {@code layer} of every transfer in {@code transferIds} has landed or its transfer
   * ended; whether that happened within {@code timeoutNanos}.
   */
  public synchronized boolean await(Set<String> transferIds, int layer, long timeoutNanos)
      throws InterruptedException {
    long deadline = System.nanoTime() + timeoutNanos;
    while (!allLanded(transferIds, layer)) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return false;
      }
      wait(Math.max(1, left / 1_000_000), 0);
    }
    return true;
  }

  /**
   * Waits until every read of {@code layer} of every transfer in {@code transferIds} is queued
   * on a copy stream, or the layer landed, or its transfer ended; returns the reads still in
   * flight (empty when none is), or empty if that did not happen within {@code timeoutNanos}.
   */
  public synchronized Optional<List<QueuedRead>> awaitQueued(
      Set<String> transferIds, int layer, long timeoutNanos) throws InterruptedException {
    long deadline = System.nanoTime() + timeoutNanos;
    while (!allQueued(transferIds, layer)) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return Optional.empty();
      }
      wait(Math.max(1, left / 1_000_000), 0);
    }
    List<QueuedRead> inFlight = new ArrayList<>();
    for (String id : transferIds) {
      Loading l = loading.get(id);
      if (l != null && !l.landed.get(layer)) {
        inFlight.addAll(l.queued.getOrDefault(layer, List.of()));
      }
    }
    return Optional.of(inFlight);
  }

  /** Forgets transfers a finished step waited on. */
  public synchronized void forget(Set<String> transferIds) {
    for (String id : transferIds) {
      ended.remove(id);
    }
  }

  private boolean allLanded(Set<String> transferIds, int layer) {
    for (String id : transferIds) {
      Loading l = loading.get(id);
      if (l != null ? !l.landed.get(layer) : !ended.containsKey(id)) {
        return false;
      }
    }
    return true;
  }

  private boolean allQueued(Set<String> transferIds, int layer) {
    for (String id : transferIds) {
      Loading l = loading.get(id);
      if (l == null) {
        if (!ended.containsKey(id)) {
          return false;
        }
      } else if (!l.landed.get(layer)
          && (l.sources == 0 || l.queued.getOrDefault(layer, List.of()).size() < l.sources)) {
        return false;
      }
    }
    return true;
  }
}
