package dev.kvferry.actors;

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

  TrackedTransfer(
      String requestId, String transferId, State state, String peerEngineId, int[] localBlockIds) {
    this.requestId = requestId;
    this.transferId = transferId;
    this.state = state;
    this.peerEngineId = peerEngineId;
    this.localBlockIds = localBlockIds;
  }

  /** How it looks to /kvferry/transfers. */
  RequestTrackerActor.TransferView view(long nowMs) {
    String shown = overdue ? "ending" : state.name().toLowerCase(Locale.ROOT);
    return new RequestTrackerActor.TransferView(
        requestId, transferId, shown, peerEngineId, nowMs - startedMs, null);
  }
}
