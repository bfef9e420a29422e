package dev.kvferry.actors;

import dev.kvferry.actors.connector.Finished;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Where the actors drop finished requests for the engine's next {@code getFinished} call. The
 * actors add, the engine thread drains; this is the one place they share state, so that
 * getFinished returns at once instead of asking an actor.
 */
public final class FinishedSink {
  private Set<String> doneSending = new HashSet<>();
  private Set<String> doneReceiving = new HashSet<>();
  private Map<String, String> failed = new HashMap<>();
  private Set<Integer> loadErrors = new HashSet<>();
  private final AtomicLong bytesMoved = new AtomicLong();
  private final LayerLoads layerLoads = new LayerLoads();
  private final TransferObserver observer;

  public FinishedSink() {
    this(TransferObserver.NONE);
  }

  public FinishedSink(TransferObserver observer) {
    this.observer = observer;
  }

  /** D, READ: the layers landed so far, for {@code waitForLayerLoad}. */
  public LayerLoads layerLoads() {
    return layerLoads;
  }

  public TransferObserver observer() {
    return observer;
  }

  public synchronized void doneSending(String requestId) {
    doneSending.add(requestId);
  }

  public synchronized void doneReceiving(String requestId) {
    doneReceiving.add(requestId);
  }

  /** A failed transfer; on P the request is also reported done sending so its blocks are freed. */
  public synchronized void failed(String requestId, String reason, boolean alsoDoneSending) {
    failed.put(requestId, reason);
    if (alsoDoneSending) {
      doneSending.add(requestId);
    }
  }

  /**
   * D: a failed load; its blocks are reported as load errors in the same drain as the request, so
   * the engine never sees the request without them.
   */
  public synchronized void failedLoad(String requestId, String reason, int[] blockIds) {
    failed.put(requestId, reason);
    for (int b : blockIds) {
      loadErrors.add(b);
    }
  }

  public void addBytes(long bytes) {
    bytesMoved.addAndGet(bytes);
  }

  public synchronized Finished drain() {
    if (doneSending.isEmpty() && doneReceiving.isEmpty() && failed.isEmpty()
        && loadErrors.isEmpty()) {
      return Finished.NONE;
    }
    Finished f =
        new Finished(Set.copyOf(doneSending), Set.copyOf(doneReceiving), Map.copyOf(failed),
            Set.copyOf(loadErrors));
    doneSending = new HashSet<>();
    doneReceiving = new HashSet<>();
    failed = new HashMap<>();
    loadErrors = new HashSet<>();
    return f;
  }

  public long bytesMoved() {
    return bytesMoved.get();
  }
}
