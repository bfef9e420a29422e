package dev.kvferry.rdma;

import java.util.concurrent.CompletableFuture;
import org.jspecify.annotations.Nullable;

/**
 * The asynchronous outcome of one {@link Transport} call: pending, then succeeded or failed with a
 * message. {@link #completion()} never completes exceptionally; it completes with this status once
 * it is terminal, so callers can chain on it without try/catch.
 */
public final class TransferStatus {

  public enum State {
    PENDING,
    SUCCEEDED,
    FAILED
  }

  private final CompletableFuture<TransferStatus> completion = new CompletableFuture<>();
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
    synchronized (this) {
      if (state != State.PENDING) {
        return false;
      }
      bytesMoved = bytes;
      state = State.SUCCEEDED;
    }
    completion.complete(this);
    return true;
  }

  /** Marks failure with a message for the user; a second terminal transition is ignored. */
  public boolean fail(String message) {
    synchronized (this) {
      if (state != State.PENDING) {
        return false;
      }
      failureMessage = message;
      state = State.FAILED;
    }
    completion.complete(this);
    return true;
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
