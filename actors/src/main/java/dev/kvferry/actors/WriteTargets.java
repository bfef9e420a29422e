package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.PeerKey;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.TransferBatch;
import java.util.Optional;
import java.util.OptionalInt;
import org.apache.pekko.actor.typed.ActorRef;
import org.slf4j.Logger;

/**
 * Which of D's workers a P worker writes a transfer into, and what it must know of each before a
 * layer can go (WRITE mode), for its {@link WriterActor}: D's TP size (from the directory when D
 * is listed, else from the metadata of D's worker 0), each target's metadata (one fetch through
 * the {@link HandshakeActor} per target), its address, and the copy plan between our blocks and
 * its. Used from the writer's thread only.
 */
final class WriteTargets {

  /** Whether a target can be written now. */
  sealed interface Check {}

  /** Yes: with this metadata and plan. */
  record Writable(AgentMetadata peer, TransferBatch plan) implements Check {}

  /** Not yet: its blocks or its metadata have not come. */
  record NotYet() implements Check {}

  /** Never: the job fails with the reason. */
  record Unwritable(String reason) implements Check {}

  private static final NotYet NOT_YET = new NotYet();

  private final EngineIdentity self;
  private final KvCacheGeometry geometry;
  private final PeerOutbox outbox;
  private final ActorRef<HandshakeActor.Command> handshake;
  private final ActorRef<HandshakeActor.Result> replies;
  private final Logger log;
  private final TransferPlanner planner = new TransferPlanner(); // not thread-safe: one per actor

  /**
   * @param outbox whose directory tells which of D's workers are listed
   * @param replies where handshake results go (the writer fans them out to its jobs)
   */
  WriteTargets(
      EngineIdentity self, KvCacheGeometry geometry, PeerOutbox outbox,
      ActorRef<HandshakeActor.Command> handshake, ActorRef<HandshakeActor.Result> replies,
      Logger log) {
    this.self = self;
    this.geometry = geometry;
    this.outbox = outbox;
    this.handshake = handshake;
    this.replies = replies;
    this.log = log;
  }

  /**
   * Learns D's TP size from the directory if D is listed, else asks D's worker 0 for its metadata
   * (every engine has one; the handshake waits for D to be listed or fails clearly). True when the
   * job's targets became known just now.
   */
  boolean learn(WriteJob j) {
    if (j.targetRanks != null) {
      return false;
    }
    OptionalInt tp = PeerPlanning.tpSizeOf(outbox.directory(), j.decodeEngineId);
    if (tp.isPresent()) {
      set(j, tp.getAsInt());
      return true;
    }
    if (!j.probeRequested) {
      j.probeRequested = true;
      handshake.tell(new HandshakeActor.Fetch(j.decodeEngineId, 0, replies));
    }
    return false;
  }

  /**
   * A D worker's metadata came: it tells D's TP size if that was not known, and is kept for the
   * target of its rank. True when the job's targets became known just now.
   */
  boolean ready(WriteJob j, HandshakeActor.Ready ready) {
    boolean learned = false;
    if (j.targetRanks == null) {
      set(j, ready.metadata().tpSize());
      learned = true;
    }
    WriteJob.Target t = j.targets.get(ready.tpRank());
    if (t != null && t.peer == null && j.isTarget(ready.tpRank()) && takes(t, ready)) {
      t.peer = ready.metadata();
      if (ready.from() != null) {
        t.decodeRef = ready.from(); // where WriteDone goes: the incarnation we write into
      }
    }
    return learned;
  }

  private static boolean takes(WriteJob.Target t, HandshakeActor.Ready ready) {
    ActorRef<EngineActor.Command> from = ready.from();
    return t.incarnation == 0 || (from != null && from.path().uid() == t.incarnation);
  }

  /**
   * After D's blocks came for {@code rank}: asks for the metadata of the incarnation that sent
   * them if the job's targets are known and none is on its way.
   */
  void blocksArrived(WriteJob j, int rank) {
    WriteJob.Target t = j.targets.get(rank);
    if (t != null && j.targetRanks != null && j.isTarget(rank)) {
      requestMetadata(j, rank, t);
    }
  }

  /** Asks for the metadata of {@code t}'s incarnation (any, if not known) unless a fetch is out. */
  private void requestMetadata(WriteJob j, int rank, WriteJob.Target t) {
    if (!t.handshakeRequested) {
      t.handshakeRequested = true;
      handshake.tell(new HandshakeActor.Fetch(j.decodeEngineId, rank, t.incarnation, replies));
    }
  }

  private void set(WriteJob j, int decodeTpSize) {
    boolean mla = geometry.layout() == KvCacheGeometry.Layout.MLA;
    int[] ranks = PeerPlanning.targetsFor(self, OptionalInt.of(decodeTpSize), mla);
    j.targetRanks = ranks;
    for (int rank : ranks) {
      requestMetadata(j, rank, j.target(rank));
    }
    j.dropNonTargets().forEachInt(rank -> log.warn(
        "transfer {}: remote blocks from {} ignored: its heads do not overlap ours",
        j.transferId, new PeerKey(j.decodeEngineId, rank)));
  }

  /** Whether {@code t} can be written now; its address and plan are found once and kept. */
  Check check(WriteJob j, WriteJob.Target t, int[] localBlockIds) {
    int[] remote = t.remoteBlockIds;
    AgentMetadata peer = t.peer;
    if (remote == null || peer == null) {
      return NOT_YET;
    }
    if (t.decodeRef == null) {
      Optional<EngineDirectory.Entry> d = outbox.directory().find(j.decodeEngineId, t.tpRank);
      if (d.isEmpty()) {
        return new Unwritable(
            "decode engine " + j.decodeEngineId + " is not a member of the cluster");
      }
      t.decodeRef = d.get().ref();
    }
    TransferBatch plan = t.plan;
    if (plan == null) {
      try {
        plan = PeerPlanning.plan(
            planner, geometry, self.tpRank(), self.tpSize(), peer, localBlockIds, remote, false);
      } catch (InvalidBlockIdsException e) {
        return new Unwritable(
            "transfer " + j.transferId + " (request " + j.requestId + "): " + e.getMessage());
      }
      t.plan = plan;
    }
    return new Writable(peer, plan);
  }
}
