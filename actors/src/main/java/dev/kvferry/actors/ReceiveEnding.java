package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
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
   * The engine announced a transfer id that ended here: the tracker fails the request, unless it
   * did so itself (it keeps ended ids in a bounded set of its own, which may have let this one go
   * already). Never for an id in flight: the tracker would end that transfer.
   */
  static void endedBefore(ActorRef<RequestTrackerActor.Command> tracker, ReqMeta r) {
    tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(),
        "transfer id " + r.transferId() + " of request " + r.requestId()
            + " was used before on this worker: refused"));
  }

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
