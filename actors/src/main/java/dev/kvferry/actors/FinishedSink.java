package dev.kvferry.actors;

import dev.kvferry.actors.connector.Finished;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
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
  /**
   * D: receives that may be reported done at once, by transfer id, by whichever thread sees their
   * bytes land: in WRITE D's watcher on seeing the done word stored behind P's last copy, in READ
   * the thread that completes the last of its reads. Either reports here directly instead of
   * through two mailboxes (the receiver's or reader's, then the tracker's: 100-150 us on the GPU
   * host). Whoever settles a receive first, that thread or the tracker, decides what the engine
   * hears; the other reports nothing.
   */
  private final Map<String, EarlyClaim> earlyClaims = new ConcurrentHashMap<>();

  /** One receive's claim: open, reported done at once, or settled by the tracker. */
  private static final class EarlyClaim {
    static final int OPEN = 0;
    static final int DONE_EARLY = 1;
    static final int SETTLED = 2;
    final String requestId;
    final long startedNanos = System.nanoTime();
    final AtomicInteger state = new AtomicInteger(OPEN);

    EarlyClaim(String requestId) {
      this.requestId = requestId;
    }
  }
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

  private synchronized void doneReceiving(String requestId) {
    doneReceiving.add(requestId);
  }

  /** D: receive {@code transferId} of {@code requestId} is done; the engine's next drain has it. */
  void received(String transferId, String requestId) {
    doneReceiving(requestId);
    ReadStamps.mark(transferId, ReadStamps.Stage.REPORTED); // READ: the engine can drain it now
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

  /**
   * D: receive {@code transferId} of {@code requestId} may be reported done at once (a done word
   * was handed out for it, or its reads are watched by the threads completing them).
   */
  void expectEarlyDone(String transferId, String requestId) {
    earlyClaims.putIfAbsent(transferId, new EarlyClaim(requestId));
  }

  /**
   * Every byte of receive {@code transferId} landed (its done word was seen, {@code byWord}, or its
   * last read completed; {@code bytes} as far as known here, 0 for a word): reports its request
   * done, and tells the observer, unless the tracker settled the receive first. Returns whether it
   * did. The duration observed runs from when the claim was made (WRITE: when D's blocks went out;
   * READ: when the reads were set up), a little after the tracker's start for other endings.
   */
  boolean landedEarly(String transferId, boolean byWord, long bytes) {
    EarlyClaim c = earlyClaims.get(transferId);
    if (c == null || !c.state.compareAndSet(EarlyClaim.OPEN, EarlyClaim.DONE_EARLY)) {
      return false;
    }
    received(transferId, c.requestId);
    // After the report, not before: in a node that has moved only a few hundred transfers the
    // metrics call takes tens of microseconds (docs/results/2026-12-05-read-stamps-host-done-at-once.txt).
    observer.transferEnded(
        TransferObserver.Outcome.RECEIVED, bytes, System.nanoTime() - c.startedNanos);
    if (byWord) {
      observer.receiveDoneByWord();
    }
    return true;
  }

  /**
   * The tracker settles receive {@code transferId} (success or failure) and forgets its claim.
   * Returns true when it was reported done at once already: the tracker then reports and
   * observes nothing, since the engine has its answer (every copy landed before).
   */
  boolean settleReceive(String transferId) {
    EarlyClaim c = earlyClaims.remove(transferId);
    return c != null && !c.state.compareAndSet(EarlyClaim.OPEN, EarlyClaim.SETTLED);
  }

  /** Whether {@code transferId} was reported done at once and the tracker has not settled it. */
  boolean doneEarly(String transferId) {
    EarlyClaim c = earlyClaims.get(transferId);
    return c != null && c.state.get() == EarlyClaim.DONE_EARLY;
  }

  /** Claims the tracker has not settled yet, reported done at once or not (tests: no leak). */
  int unsettledEarlyClaims() {
    return earlyClaims.size();
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
