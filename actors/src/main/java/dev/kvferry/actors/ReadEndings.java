package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.TerminalIds;
import java.util.Map;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;

/**
 * How a {@link ReaderActor}'s reads end, on its thread: a success or a failure is told to the
 * tracker once no read of ours can still land, the transfer's id reads nothing again, and P's
 * workers are released so they free the blocks they kept for us. A request already reported done
 * at once (its last read landed) ends as a success whatever ends it afterwards.
 */
final class ReadEndings {
  private final EngineIdentity self;
  private final Map<String, ReadJob> reads;
  private final TerminalIds ended;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final PeerOutbox outbox;
  private final FinishedSink sink;

  /** {@code reads} and {@code ended} are the reader's own; this changes them on its thread. */
  ReadEndings(
      EngineIdentity self, Map<String, ReadJob> reads, TerminalIds ended,
      ActorRef<RequestTrackerActor.Command> tracker, PeerOutbox outbox, FinishedSink sink) {
    this.self = self;
    this.reads = reads;
    this.ended = ended;
    this.tracker = tracker;
    this.outbox = outbox;
    this.sink = sink;
  }

  /**
   * If {@code job}'s request was reported done at once (the engine may have acted on it), settles
   * it as a success before anything else is decided for it: its last reads' messages may still be
   * queued behind the one at hand. Returns whether it did.
   */
  boolean settleIfDoneEarly(@Nullable ReadJob job) {
    if (job == null || job.failure != null || !sink.doneEarly(job.request.transferId())) {
      return false;
    }
    succeeded(job);
    return true;
  }

  /** Every read of {@code job} landed: the tracker hears of it and P may free its blocks. */
  void succeeded(ReadJob job) {
    String transferId = job.request.transferId();
    endJob(job, new RequestTrackerActor.ReceiveSucceeded(transferId, job.landedBytes.get()));
  }

  /**
   * Ends a read that will not complete. Reads already handed to the transport may still land in
   * our blocks (and read P's), so the failure is reported and P released only once every one of
   * them has finished.
   */
  void endRead(ReadJob job, String reason) {
    if (settleIfDoneEarly(job)) {
      return; // every byte landed before this ending (P failing, overdue, P gone): a success
    }
    String failure = job.failure;
    if (failure == null) {
      failure = reason;
      job.failure = reason;
      job.cancelled.set(true);
    }
    if (job.inFlight > 0) {
      return;
    }
    // P keeps the blocks for us until released: let them go now rather than at its deadline.
    endJob(job, new RequestTrackerActor.TransferFailed(job.request.transferId(), failure));
  }

  /** D: ends a receive that will not complete; with no read of ours in flight, at once. */
  void endTransfer(String transferId, String reason) {
    ReadJob job = reads.get(transferId);
    if (job != null) {
      endRead(job, reason);
    } else {
      if (outbox.holdsWorkFor(transferId)) {
        ended.add(transferId); // it waited for P's listing: it never begins now
      }
      outbox.drop(transferId, peer -> {}); // a held load's drop owes P its release
      tracker.tell(new RequestTrackerActor.TransferFailed(transferId, reason));
    }
  }

  /**
   * A read ends here, every read of it finished: its id reads nothing again, the tracker hears
   * {@code outcome}, and P's workers may free the blocks they kept for it.
   */
  private void endJob(ReadJob job, RequestTrackerActor.Command outcome) {
    ReqMeta r = job.request;
    reads.remove(r.transferId());
    ended.add(r.transferId());
    tracker.tell(outcome);
    releaseAt(r, job.sources);
  }

  /** P's workers of ranks {@code sources} may free the blocks they kept for {@code r}. */
  void releaseAt(ReqMeta r, int[] sources) {
    for (int source : sources) {
      outbox.send(r.remoteEngineId(), source, r.remoteWorkerUid(source), release(r.transferId()));
    }
  }

  PeerProtocol.Release release(String transferId) {
    return new PeerProtocol.Release(transferId, self.engineId(), self.tpRank(), self.tpSize());
  }
}
