package dev.kvferry.rdma;

import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import org.jspecify.annotations.Nullable;

/**
 * A peer's done words as one transport reaches them. D owns a file of 64-bit words ({@link
 * dev.kvferry.rdma.cuda.SharedDoneWords}) and watches one word per transfer instead of waiting
 * for P's WriteDone message; P stores the value D chose there once its writes of the transfer
 * have landed. How the value gets there is the transport's: cuda queues the store on the copy
 * stream behind the copies, cma stores into its own mapping of D's file, tcp sends it in band
 * behind the data and D's listener stores it. Opened once per file ({@link
 * Transport#openPeerDoneWords}) and closed when the peer leaves.
 */
public interface PeerDoneWords extends AutoCloseable {

  /**
   * Stores {@code value} into word {@code slot} for the owner of {@code remote} once every one of
   * {@code writes} (this transfer's writes to that peer, all submitted already) has landed, so
   * the peer sees the value only after their bytes. Stores nothing when one of them failed: the
   * peer then learns from its messages. Returns at once; the status completes when the value is
   * stored, or fails with the reason it was not.
   */
  TransferStatus storeAfter(
      List<TransferStatus> writes, MemoryRegion local, RegionDescriptor remote, int slot,
      long value);

  /**
   * Queues a hint, not a completion: {@code value} ({@link
   * dev.kvferry.rdma.cuda.SharedDoneWords#progressValue}) into word {@code slot} behind the copies
   * to the owner of {@code remote} queued so far, where the transport stores words in the copies'
   * order (cuda: on the copy stream), so D's watcher, which polls GPU-stored words, knows the
   * transfer's end is near and stops parking between looks. Elsewhere it does nothing: host
   * transports ring a bell instead.
   */
  default void hintAfterQueued(MemoryRegion local, RegionDescriptor remote, int slot, long value) {}

  /** Releases what the transport keeps for these words (a mapping); a later store fails. */
  @Override
  void close();

  /**
   * The store of {@link #storeAfter} once {@code writes} landed, for every transport: the
   * returned status fails with the first failed write's reason, or {@code store} ends it (it is
   * handed the status, in the thread that ended the last write, see {@link #whenLanded}). A store
   * that throws fails the status, so no transfer waits on a word that was never stored.
   */
  static TransferStatus storeWhenLanded(
      List<TransferStatus> writes, Consumer<TransferStatus> store) {
    TransferStatus stored = TransferStatus.pending();
    whenLanded(writes, failure -> {
      if (failure != null) {
        stored.fail("done word not stored: " + failure);
        return;
      }
      try {
        store.accept(stored);
      } catch (RuntimeException e) {
        stored.fail("done word not stored: " + e);
      }
    });
    return stored;
  }

  /**
   * Runs {@code then} once each of {@code writes} is terminal, with null when all succeeded, else
   * with the first failure's reason (for host transports, whose writes are done when their status
   * is). It runs in the thread that ended the last write, before anything else chained on that
   * write ({@link TransferStatus#whenEndedFirst}), and with no future between: a store there is
   * the first thing that thread does once the bytes are in place. At once, here, when all have.
   */
  static void whenLanded(List<TransferStatus> writes, Consumer<@Nullable String> then) {
    if (writes.isEmpty()) {
      then.accept(null);
      return;
    }
    AtomicInteger left = new AtomicInteger(writes.size());
    Runnable countDown = () -> {
      if (left.decrementAndGet() == 0) {
        then.accept(firstFailure(writes));
      }
    };
    for (TransferStatus w : writes) {
      w.whenEndedFirst(countDown);
    }
  }

  private static @Nullable String firstFailure(List<TransferStatus> writes) {
    for (TransferStatus w : writes) {
      if (!w.succeeded()) {
        return "a write of the transfer failed (" + w.failureMessage() + ")";
      }
    }
    return null;
  }
}
