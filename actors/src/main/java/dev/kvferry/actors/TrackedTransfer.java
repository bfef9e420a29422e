package dev.kvferry.actors;

import dev.kvferry.actors.engine.EngineDirectory;
import java.time.Duration;
import java.util.Locale;

/** One transfer a {@link RequestTrackerActor} tracks, on either side, until it ends. */
final class TrackedTransfer {

  enum State {
    /** D: P writes into our blocks, or we read P's. */
    RECEIVING,
    /** P, READ: our blocks are kept for D until it releases them. */
    AWAITING_RELEASE
  }

  final String requestId;
  final String transferId;
  final State state;
  final String peerEngineId;
  final int[] localBlockIds;
  final long startedMs = System.currentTimeMillis();
  final long startedNanos = System.nanoTime();
  /** The deadline passed and the owner was asked to end the transfer; it still holds blocks. */
  boolean overdue;
  /** P, READ: its reader left; a timer ({@link #absenceKey}) frees it unless the reader is back. */
  boolean readerAbsent;

  TrackedTransfer(
      String requestId, String transferId, State state, String peerEngineId, int[] localBlockIds) {
    this.requestId = requestId;
    this.transferId = transferId;
    this.state = state;
    this.peerEngineId = peerEngineId;
    this.localBlockIds = localBlockIds;
  }

  /** D: a receive begins. */
  static TrackedTransfer receiving(RequestTrackerActor.ExpectReceive m) {
    return new TrackedTransfer(
        m.requestId(), m.transferId(), State.RECEIVING, m.producerEngineId(), m.localBlockIds());
  }

  /** P, READ: our blocks are kept for D. */
  static TrackedTransfer awaitingRelease(RequestTrackerActor.ExpectRelease m) {
    return new TrackedTransfer(
        m.requestId(), m.transferId(), State.AWAITING_RELEASE, m.consumerEngineId(), new int[0]);
  }

  /** How it looks to /kvferry/transfers. */
  TransferView view(long nowMs) {
    String shown = overdue ? "ending" : state.name().toLowerCase(Locale.ROOT);
    return new TransferView(requestId, transferId, shown, peerEngineId, nowMs - startedMs, null);
  }

  /**
   * P, READ: the decode engine that would read our blocks was listed in {@code before} and is not
   * in {@code now}, so it left; one not listed yet may still join.
   */
  boolean readerLeft(EngineDirectory before, EngineDirectory now) {
    return state == State.AWAITING_RELEASE
        && !peerEngineId.isEmpty()
        && before.contains(peerEngineId)
        && !now.contains(peerEngineId);
  }

  /** The key of the {@link #readerAbsent} timer (the deadline's is the transfer id). */
  String absenceKey() {
    return "absent " + transferId;
  }

  /** P, READ: our blocks are kept for {@code reader}. */
  boolean keptFor(String reader) {
    return state == State.AWAITING_RELEASE && peerEngineId.equals(reader);
  }

  /** D: why a receive is being ended when its deadline passed. */
  String overdue(Duration transferTimeout) {
    return "transfer " + transferId + " from " + peerEngineId + " did not finish within "
        + transferTimeout.toMillis() + " ms";
  }
}
