package dev.kvferry.actors;

import org.apache.pekko.actor.typed.ActorRef;

/**
 * D: how a receive ends early, whatever the mode. The worker hands these to the actor of its
 * mode, its {@link ReaderActor} (READ) or its {@link ReceiverActor} (WRITE), which ends the
 * transfer once no copy can land in its blocks any more.
 */
sealed interface ReceiveEnding extends ReaderActor.Command, ReceiverActor.Command {

  /** From the tracker: the receive outlived the transfer timeout. */
  record Overdue(String transferId, String reason) implements ReceiveEnding {}

  /** From the scheduler: the request was aborted after it was scheduled. */
  record Aborted(String requestId, String transferId, String reason) implements ReceiveEnding {}

  /** A P worker ended the transfer (it writes no more, or wants its blocks back). */
  record PeerFailed(PeerProtocol.TransferFailed failed) implements ReceiveEnding {}

  /**
   * An abort of a transfer that nothing here works on (it ended, or never began) is reported to
   * the tracker at once: true if so; false: the caller must end the transfer.
   */
  static boolean reportedAtOnce(
      Aborted m, boolean working, ActorRef<RequestTrackerActor.Command> tracker) {
    if (working) {
      return false;
    }
    tracker.tell(new RequestTrackerActor.ReportAborted(m.requestId(), m.transferId(), m.reason()));
    return true;
  }
}
