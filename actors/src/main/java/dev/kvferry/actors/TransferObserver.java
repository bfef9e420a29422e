package dev.kvferry.actors;

/**
 * Told about every transfer that ends on a worker, for metrics. Called from actor threads, from
 * D's done-word watcher (a receive its word completed) and from the transport's thread that
 * completes a READ's last read: an implementation must be thread-safe and cheap (count, observe,
 * return).
 */
public interface TransferObserver {

  /** How a transfer ended. */
  enum Outcome {
    SENT,
    RECEIVED,
    FAILED,
    /** P, READ: D never came, blocks freed at the deadline. */
    EXPIRED
  }

  /**
   * @param bytes bytes moved by this worker for the transfer (0 when unknown or failed)
   * @param durationNanos from when this worker learned of the transfer to its end, or -1
   */
  void transferEnded(Outcome outcome, long bytes, long durationNanos);

  /**
   * D, WRITE: a receive was reported done from P's done words, ahead of P's WriteDone messages
   * (also counted as {@link Outcome#RECEIVED} through {@link #transferEnded}).
   */
  default void receiveDoneByWord() {}

  TransferObserver NONE = (outcome, bytes, durationNanos) -> {};
}
