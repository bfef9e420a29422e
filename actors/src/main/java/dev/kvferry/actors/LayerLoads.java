package dev.kvferry.actors;

import java.util.BitSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;

/**
 * D, READ: which layers of which transfers have landed, shared between a worker's actor (which
 * records) and the engine's thread (which waits in {@code waitForLayerLoad}): the per-layer wait
 * of vLLM's connector contract, so a layer never runs before its KV is in place. A transfer that
 * ended (read, failed or given up) counts as landed for every layer: its failure is reported by
 * {@code getFinished}, and nothing of it is still copying.
 */
public final class LayerLoads {

  private final Map<String, BitSet> landed = new HashMap<>();
  private final Map<String, Boolean> ended = new HashMap<>();

  /** A step's load of {@code transferId} begins. */
  public synchronized void begin(String transferId) {
    landed.putIfAbsent(transferId, new BitSet());
  }

  /** Every read of {@code layer} of the transfer has landed. */
  public synchronized void layerLanded(String transferId, int layer) {
    BitSet b = landed.get(transferId);
    if (b != null) {
      b.set(layer);
      notifyAll();
    }
  }

  /** The transfer ended: no copy of it is in flight any more. */
  public synchronized void ended(String transferId) {
    if (landed.remove(transferId) != null) {
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

  /** Forgets transfers a finished step waited on. */
  public synchronized void forget(Set<String> transferIds) {
    for (String id : transferIds) {
      ended.remove(id);
    }
  }

  private boolean allLanded(Set<String> transferIds, int layer) {
    for (String id : transferIds) {
      BitSet b = landed.get(id);
      if (b != null ? !b.get(layer) : !ended.containsKey(id)) {
        return false;
      }
    }
    return true;
  }
}
