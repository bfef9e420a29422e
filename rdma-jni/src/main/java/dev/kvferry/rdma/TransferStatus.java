package dev.kvferry.rdma;

import java.util.Arrays;
import java.util.concurrent.CompletableFuture;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The asynchronous outcome of one {@link Transport} call: pending, then succeeded or failed with a
 * message. {@link #completion()} never completes exceptionally; it completes with this status once
 * it is terminal, so callers can chain on it without try/catch.
 */
public final class TransferStatus {
  private static final Logger log = LoggerFactory.getLogger(TransferStatus.class);
  private static final Runnable[] NONE = new Runnable[0];

  public enum State {
    PENDING,
    SUCCEEDED,
    FAILED
  }

  private final CompletableFuture<TransferStatus> completion = new CompletableFuture<>();
  /** Run by the ending thread before {@link #completion}'s dependents; null once ended. */
  private Runnable @Nullable [] firstActions = NONE;
  private volatile State state = State.PENDING;
  private volatile @Nullable String failureMessage;
  private volatile long bytesMoved;

  public static TransferStatus pending() {
    return new TransferStatus();
  }

  public static TransferStatus succeeded(long bytesMoved) {
    TransferStatus s = new TransferStatus();
    s.succeed(bytesMoved);
    return s;
  }

  public static TransferStatus failed(String message) {
    TransferStatus s = new TransferStatus();
    s.fail(message);
    return s;
  }

  /** Marks success; a second terminal transition is ignored (first outcome wins). */
  public boolean succeed(long bytes) {
    return end(State.SUCCEEDED, bytes, null);
  }

  /** Marks failure with a message for the user; a second terminal transition is ignored. */
  public boolean fail(String message) {
    return end(State.FAILED, 0, message);
  }

  private boolean end(State outcome, long bytes, @Nullable String message) {
    Runnable[] first;
    synchronized (this) {
      if (state != State.PENDING) {
        return false;
      }
      bytesMoved = bytes;
      failureMessage = message;
      state = outcome;
      first = takeFirstActions();
    }
    runFirstThenComplete(first);
    return true;
  }

  /**
   * Runs {@code action} in the thread that ends this status, before anything chained on {@link
   * #completion()} (those run in no promised order, and one may wake a thread, tens of
   * microseconds on a VM); at once, here, when it has ended already. For what a peer waits on
   * right behind the bytes: a done word. The action must be short; one that throws is logged.
   */
  public void whenEndedFirst(Runnable action) {
    synchronized (this) {
      Runnable @Nullable [] first = firstActions;
      if (first != null) {
        Runnable[] more = Arrays.copyOf(first, first.length + 1);
        more[first.length] = action;
        firstActions = more;
        return;
      }
    }
    runLogged(action);
  }

  private Runnable[] takeFirstActions() {
    Runnable @Nullable [] first = firstActions;
    firstActions = null;
    return first == null ? NONE : first;
  }

  private void runFirstThenComplete(Runnable[] first) {
    try {
      for (Runnable action : first) {
        runLogged(action);
      }
    } finally {
      completion.complete(this); // also past an Error: whoever waits on the status must wake
    }
  }

  private void runLogged(Runnable action) {
    try {
      action.run();
    } catch (RuntimeException e) {
      // A bug in the action: the other actions and the completion must still run.
      log.warn("an action on the end of {} failed", this, e);
    }
  }

  public State state() {
    return state;
  }

  public boolean isDone() {
    return state != State.PENDING;
  }

  public boolean succeeded() {
    return state == State.SUCCEEDED;
  }

  /** The failure reason, or null unless {@link #state()} is FAILED. */
  public @Nullable String failureMessage() {
    return failureMessage;
  }

  /** Bytes moved, known once succeeded. */
  public long bytesMoved() {
    return bytesMoved;
  }

  public CompletableFuture<TransferStatus> completion() {
    return completion;
  }

  @Override
  public String toString() {
    return switch (state) {
      case PENDING -> "TransferStatus[PENDING]";
      case SUCCEEDED -> "TransferStatus[SUCCEEDED, " + bytesMoved + " bytes]";
      case FAILED -> "TransferStatus[FAILED: " + failureMessage + "]";
    };
  }
}
