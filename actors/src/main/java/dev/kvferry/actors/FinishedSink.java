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
   * D, WRITE: receives whose done word was handed out, by transfer id. The word is stored behind
   * P's last copy, so when D's watcher sees it the request is done; the watcher reports it here at
   * once instead of through two mailboxes (the receiver's, then the tracker's: 100-150 us on the
   * GPU host). Whoever settles a receive first, the watcher or the tracker, decides what the
   * engine hears; the other reports nothing.
   */
  private final Map<String, WordClaim> wordClaims = new ConcurrentHashMap<>();

  /** One receive's claim: open, reported done by its word, or settled by the tracker. */
  private static final class WordClaim {
    static final int OPEN = 0;
    static final int DONE_BY_WORD = 1;
    static final int SETTLED = 2;
    final String requestId;
    final long startedNanos = System.nanoTime();
    final AtomicInteger state = new AtomicInteger(OPEN);

    WordClaim(String requestId) {
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

  /** D: a done word was handed out for receive {@code transferId} of {@code requestId}. */
  void expectWord(String transferId, String requestId) {
    wordClaims.putIfAbsent(transferId, new WordClaim(requestId));
  }

  /**
   * D's watcher saw the done word of {@code transferId}: reports its request done, and tells the
   * observer, unless the tracker settled the receive first. Returns whether it did. The duration
   * observed runs from when the word was handed out (with D's blocks), a little after the
   * tracker's start for other endings.
   */
  boolean wordLanded(String transferId) {
    WordClaim c = wordClaims.get(transferId);
    if (c == null || !c.state.compareAndSet(WordClaim.OPEN, WordClaim.DONE_BY_WORD)) {
      return false;
    }
    doneReceiving(c.requestId);
    observer.transferEnded(
        TransferObserver.Outcome.RECEIVED, 0, System.nanoTime() - c.startedNanos);
    observer.receiveDoneByWord();
    return true;
  }

  /**
   * The tracker settles receive {@code transferId} (success or failure) and forgets its claim.
   * Returns true when its word reported the request done already: the tracker then reports and
   * observes nothing, since the engine has its answer (every copy landed before the word).
   */
  boolean settleReceive(String transferId) {
    WordClaim c = wordClaims.remove(transferId);
    return c != null && !c.state.compareAndSet(WordClaim.OPEN, WordClaim.SETTLED);
  }

  /** Whether the word of {@code transferId} reported it done and the tracker has not settled it. */
  boolean doneByWord(String transferId) {
    WordClaim c = wordClaims.get(transferId);
    return c != null && c.state.get() == WordClaim.DONE_BY_WORD;
  }

  /** Claims the tracker has not settled yet, reported by their word or not (tests: no leak). */
  int unsettledWordClaims() {
    return wordClaims.size();
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
