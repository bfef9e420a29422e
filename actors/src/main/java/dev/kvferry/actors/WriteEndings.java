package dev.kvferry.actors;

import dev.kvferry.actors.engine.EngineIdentity;
import java.util.OptionalInt;
import org.apache.pekko.actor.typed.ActorRef;

/**
 * Tells everyone who waits on P's writes of a transfer how they ended, for its {@link
 * WriterActor}: D's workers (WriteDone; or TransferFailed, sent only once no copy of ours can
 * land in D's blocks any more) and the tracker (SendFinished, which frees P's blocks). D's
 * workers not listed yet get theirs through the writer's {@link PeerOutbox}.
 */
final class WriteEndings {
  private final EngineIdentity self;
  private final boolean mla;
  private final PeerOutbox outbox;
  private final ActorRef<RequestTrackerActor.Command> tracker;

  WriteEndings(
      EngineIdentity self, boolean mla, PeerOutbox outbox,
      ActorRef<RequestTrackerActor.Command> tracker) {
    this.self = self;
    this.mla = mla;
    this.outbox = outbox;
    this.tracker = tracker;
  }

  /** Every layer was written to each of {@code ranks}: they hear WriteDone, the tracker Sent. */
  void written(WriteJob j, int[] ranks) {
    WriteStamps.mark(WriteStamps.Stage.WRITE_DONE_SENT);
    PeerProtocol.WriteDone done =
        new PeerProtocol.WriteDone(j.transferId, self.engineId(), self.tpRank());
    for (int rank : ranks) {
      WriteJob.Target t = j.targets.get(rank);
      ActorRef<EngineActor.Command> ref = t == null ? null : t.decodeRef;
      if (ref != null) {
        ref.tell(done);
      } else {
        outbox.directory().find(j.decodeEngineId, rank).ifPresent(d -> d.ref().tell(done));
      }
    }
    tracker.tell(new RequestTrackerActor.SendFinished(j.requestId, j.transferId,
        new SendOutcome.Sent(j.bytes)));
  }

  /** The job ended early and nothing of it is in flight: D is told, a saved request fails. */
  void failed(WriteJob j, String failure) {
    PeerProtocol.TransferFailed message =
        new PeerProtocol.TransferFailed(j.transferId, self.engineId(), failure, self.tpRank());
    int[] ranks = j.targetRanks;
    if (ranks != null) {
      for (int rank : ranks) { // each to the incarnation that sent its blocks, once known
        WriteJob.Target t = j.targets.get(rank);
        outbox.send(j.decodeEngineId, rank, t == null ? 0 : t.incarnation, message);
      }
    } else {
      tellDecode(j.decodeEngineId, message);
    }
    if (j.saved()) {
      // Only a saved request's free was delayed for this transfer; one the engine never handed
      // us for saving was freed by the engine already, and must not be reported done sending.
      tracker.tell(new RequestTrackerActor.SendFinished(j.requestId, j.transferId,
          new SendOutcome.Failed(failure)));
    }
  }

  /** A transfer this worker has no job for was abandoned: nothing is in flight, confirm now. */
  void abandonedWithoutJob(String transferId, String decodeEngineId, String reason) {
    tellDecode(decodeEngineId,
        new PeerProtocol.TransferFailed(transferId, self.engineId(), reason, self.tpRank()));
  }

  /** The engine saved a layer of a transfer that ended: its blocks must still be freed. */
  void alreadyEnded(String requestId, String transferId) {
    // The tracker ignores repeats for the same transfer.
    tracker.tell(new RequestTrackerActor.SendFinished(requestId, transferId,
        new SendOutcome.Failed("transfer " + transferId + " already ended")));
  }

  /**
   * Tells D's workers this worker writes into {@code message}: the ranks D's TP size gives. While
   * D is not listed here its TP size is unknown, and guessing (our own rank) is wrong whenever the
   * sizes differ: P rank 1 of TP 2 would confirm to a D rank 1 that a D of TP 1 does not have,
   * and D would wait for that confirmation forever. So the message waits in the outbox until D is
   * listed.
   */
  private void tellDecode(String decodeEngineId, PeerProtocol.TransferFailed message) {
    outbox.withTpSizeOf(decodeEngineId, message.transferId(), decodeTp -> {
      for (int rank : PeerPlanning.targetsFor(self, OptionalInt.of(decodeTp), mla)) {
        outbox.send(decodeEngineId, rank, message);
      }
    });
  }
}
