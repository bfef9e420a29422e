package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.PeerKey;
import dev.kvferry.actors.engine.TerminalIds;
import dev.kvferry.actors.plan.KvCacheGeometry;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.agrona.collections.IntHashSet;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;

/**
 * D's side of WRITE mode: tells P's workers which of our blocks to write into ({@link
 * PeerProtocol.RemoteBlocks}) and waits for each to say it is done ({@link PeerProtocol.WriteDone}
 * or the done word its transport stores behind its writes: cuda, cma, tcp). A receive's blocks go
 * back to the engine only once no P worker can still write into them: each has said WriteDone or
 * TransferFailed, or its engine left the cluster (DESIGN.md section 3, block lifetime).
 */
public final class ReceiverActor extends AbstractBehavior<ReceiverActor.Command> {

  public sealed interface Command extends LocalOnly
      permits Announce, WriterDone, DirectoryChanged, DoneWordSeen, ReceiveEnding {}

  /**
   * Tell P which of our blocks to write into, and expect its writes (from the scheduler; the
   * worker has told the tracker to expect the receive).
   */
  public record Announce(ReqMeta request) implements Command {}

  /** A P worker wrote every layer of a transfer. */
  public record WriterDone(PeerProtocol.WriteDone done) implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  /** From the {@link DoneWordWatcher}: every P worker's copies of a transfer landed. */
  private record DoneWordSeen(String transferId) implements Command {}

  private final EngineIdentity self;
  private final boolean mla;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final ClusterMessageLimit messageLimit;
  private final PeerOutbox outbox;
  private final Map<String, IncomingReceive> incoming = new HashMap<>();
  /**
   * Transfers that ended here, or that a P worker ended before this worker began them: an
   * announce of one begins nothing (the tracker refuses the id as a duplicate), so no P worker is
   * told blocks the engine was told are not being received.
   */
  private final TerminalIds ended;
  /** Done words P stores behind its last copy, reported to the engine on sight. */
  private final ReceiveDoneWords doneWords;
  private final int engineUid;

  /**
   * @param engineUid the actor uid of this worker's EngineActor (its listed incarnation), sent
   *     with our blocks so P writes into this incarnation's memory only
   */
  public static Behavior<Command> create(
      WorkerSetup setup, ActorRef<RequestTrackerActor.Command> tracker, int engineUid) {
    return Behaviors.setup(ctx -> new ReceiverActor(ctx, setup, tracker, engineUid));
  }

  private ReceiverActor(
      ActorContext<Command> ctx, WorkerSetup setup,
      ActorRef<RequestTrackerActor.Command> tracker, int engineUid) {
    super(ctx);
    this.engineUid = engineUid;
    this.self = setup.identity();
    this.mla = setup.geometry().layout() == KvCacheGeometry.Layout.MLA;
    this.tracker = tracker;
    this.messageLimit = ClusterMessageLimit.of(ctx.getSystem());
    this.outbox = new PeerOutbox(ctx.getLog(), setup.settings());
    outbox.onDelivery((to, message, worker) -> {
      if (message instanceof PeerProtocol.RemoteBlocks b) {
        IncomingReceive in = incoming.get(b.transferId());
        if (in != null) {
          in.toldWorkers.put(to.tpRank(), worker);
        }
      }
    });
    this.ended = new TerminalIds(setup.settings().terminalIdCapacity());
    ActorRef<Command> me = ctx.getSelf();
    // The same transport kind on both sides: ours tells what P's can do.
    this.doneWords = new ReceiveDoneWords(self.label(), setup.transport(), setup.sink(),
        id -> me.tell(new DoneWordSeen(id)));
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(Announce.class, this::onAnnounce)
        .onMessage(WriterDone.class, this::onWriterDone)
        .onMessage(DoneWordSeen.class, this::onDoneWordSeen)
        .onMessage(ReceiveEnding.PeerFailed.class, this::onPeerFailed)
        .onMessage(ReceiveEnding.Overdue.class, this::onOverdue)
        .onMessage(ReceiveEnding.Aborted.class, this::onAborted)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .onSignal(PostStop.class, this::onPostStop)
        .build();
  }

  private Behavior<Command> onAnnounce(Announce m) {
    ReqMeta r = m.request(); // the worker told the tracker to expect it
    if (ended.contains(r.transferId())) {
      // P gave up already, or the id is used again after its receive ended: nobody is told
      // these blocks, and the tracker fails the request (it ignores this if it did already).
      ReceiveEnding.endedBefore(tracker, r);
      return this;
    }
    if (incoming.containsKey(r.transferId())) {
      return this; // a duplicate of one in flight: the tracker refuses it, the first goes on
    }
    IncomingReceive in = new IncomingReceive(r);
    incoming.put(r.transferId(), in);
    // Dropped unrun (the receive ended before P was listed), it still owes P's workers the news:
    // P may wait for our blocks with its KV saved until its defer timeout.
    outbox.withTpSizeOf(r.remoteEngineId(), r.transferId(), prefillTp -> tellBlocks(in, prefillTp),
        () -> abandonWhenListed(r.remoteEngineId(), r.transferId(), in));
    return this;
  }

  /** Every P worker whose heads overlap ours writes its slice, and says when it is done. */
  private void tellBlocks(IncomingReceive in, int prefillTp) {
    ReqMeta r = in.request;
    if (incoming.get(r.transferId()) != in || in.failure != null) {
      return;
    }
    int[] sources = PeerPlanning.sourcesFor(self, prefillTp, mla); // never empty
    // One done word per P worker, each in its own slot: the receive is done once all landed.
    PeerProtocol.DoneWord[] words =
        doneWords.handOut(r.transferId(), r.requestId(), sources.length);
    PeerProtocol.RemoteBlocks[] told = new PeerProtocol.RemoteBlocks[sources.length];
    for (int i = 0; i < sources.length; i++) {
      told[i] = new PeerProtocol.RemoteBlocks(r.transferId(), r.requestId(), r.localBlockIds(),
          self.engineId(), self.dpRank(), self.tpRank(), words == null ? null : words[i],
          engineUid);
    }
    // The messages differ only in their words: the first stands for all in the size check.
    Optional<String> tooBig =
        messageLimit.whyNotSendable(told[0], r.localBlockIds().length,
            () -> "the list of " + r.localBlockIds().length + " block ids of request "
                + r.requestId());
    if (tooBig.isPresent()) {
      forgetDoneWord(r.transferId());
      // Artery would drop it and P would wait for its defer timeout: fail both sides now (P never
      // had our blocks, so nothing can land in them).
      endIncoming(r.transferId());
      tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(), tooBig.get()));
      for (int source : sources) {
        outbox.send(r.remoteEngineId(), source,
            new PeerProtocol.TransferFailed(r.transferId(), self.engineId(), tooBig.get(),
                self.tpRank()));
      }
      return;
    }
    in.told(sources, told);
    WriteStamps.mark(WriteStamps.Stage.BLOCKS_TOLD);
    for (int i = 0; i < sources.length; i++) {
      outbox.send(r.remoteEngineId(), sources[i], told[i]);
    }
  }

  /** A receive ends here: its id begins nothing again. */
  private void endIncoming(String transferId) {
    incoming.remove(transferId);
    ended.add(transferId);
  }

  private void forgetDoneWord(String transferId) {
    doneWords.forget(transferId);
  }

  /**
   * If the watcher already reported this receive done from its word (the engine may have acted
   * on it), ends it here as the word says before anything else is decided for it: its own
   * DoneWordSeen may still be queued behind the message at hand. Nothing may be sent to P for
   * it any more (the blocks are the engine's), and an abort the engine sends after that done is
   * then reported as for any ended receive, so the engine gets the report it waits for.
   */
  private void settleIfDoneByWord(String transferId) {
    if (doneWords.reportedDone(transferId)) {
      onDoneWordSeen(new DoneWordSeen(transferId));
    }
  }

  private Behavior<Command> onDoneWordSeen(DoneWordSeen m) {
    // Every P worker's word landed: each one still due is done (a worker whose WriteDone
    // overtook the words is not due any more).
    IncomingReceive in = incoming.get(m.transferId());
    if (in != null) {
      for (int rank : in.dueRanks()) { // writerDone takes each out of those due
        writerDone(m.transferId(), rank);
      }
    }
    return this;
  }

  private Behavior<Command> onWriterDone(WriterDone m) {
    writerDone(m.done().transferId(), m.done().producerTpRank());
    return this;
  }

  private void writerDone(String transferId, int producerTpRank) {
    IncomingReceive in = incoming.get(transferId);
    if (in == null) {
      forgetDoneWord(transferId);
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(transferId, 0)); // ignored if ended
      return;
    }
    if (in.mayWrite != null) {
      in.mayWrite.remove(producerTpRank);
      if (!in.mayWrite.isEmpty()) {
        // Other P workers still write their heads, and their words may still end the receive
        // first: a worker stores its word before it sends WriteDone, so this one's has landed.
        return;
      }
    }
    forgetDoneWord(transferId);
    WriteStamps.mark(WriteStamps.Stage.WRITER_DONE_SEEN);
    endIncoming(transferId);
    outbox.drop(transferId, peer -> {});
    String failure = in.failure;
    if (failure != null) {
      // Ending already (we asked P to abandon): the engine was promised a failure.
      tracker.tell(new RequestTrackerActor.TransferFailed(transferId, failure));
    } else {
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(transferId, 0));
    }
  }

  private Behavior<Command> onPeerFailed(ReceiveEnding.PeerFailed m) {
    PeerProtocol.TransferFailed f = m.failed();
    settleIfDoneByWord(f.transferId());
    String reason = "engine " + f.engineId() + ": " + f.reason();
    forgetDoneWord(f.transferId());
    IncomingReceive in = incoming.get(f.transferId());
    if (in != null) {
      if (in.mayWrite != null) {
        in.mayWrite.remove(f.senderTpRank()); // that P worker writes no more
      }
      endTransfer(f.transferId(), reason);
    } else if (outbox.holdsWorkFor(f.transferId())) {
      endTransfer(f.transferId(), reason);
    } else {
      // Not begun here (or over): it never begins.
      ended.add(f.transferId());
      tracker.tell(new RequestTrackerActor.TransferFailed(f.transferId(), reason));
    }
    return this;
  }

  private Behavior<Command> onOverdue(ReceiveEnding.Overdue m) {
    settleIfDoneByWord(m.transferId());
    endTransfer(m.transferId(), m.reason()); // a request to end it, not a licence to free
    return this;
  }

  private Behavior<Command> onAborted(ReceiveEnding.Aborted m) {
    settleIfDoneByWord(m.transferId());
    boolean receiving =
        incoming.containsKey(m.transferId()) || outbox.holdsWorkFor(m.transferId());
    if (!ReceiveEnding.reportedAtOnce(m, receiving, tracker)) {
      endTransfer(m.transferId(), m.reason());
    }
    return this;
  }

  /**
   * Ends a receive that will not complete (timeout, abort, P's failure, P gone). Work held for it
   * is dropped; P is asked to abandon; the failure (with the blocks as load errors) is reported
   * once every P worker told our blocks confirmed or left.
   */
  private void endTransfer(String transferId, String reason) {
    IncomingReceive in = incoming.get(transferId);
    if (in == null) {
      outbox.drop(transferId, peer -> abandonWhenListed(peer, transferId, reason));
      tracker.tell(new RequestTrackerActor.TransferFailed(transferId, reason));
      return;
    }
    String failure = in.failure;
    if (failure == null) {
      failure = reason;
      in.failure = reason;
      forgetDoneWord(transferId);
      IntHashSet due = in.mayWrite;
      // Blocks still held for P workers not listed: those can never write now, and hear that
      // the transfer is over once listed (else P keeps its blocks until its defer timeout).
      outbox.drop(transferId, peer -> {
        if (due != null) {
          due.remove(peer.tpRank());
        }
        abandonWhenListed(peer, transferId, reason);
      });
      if (due != null) {
        String p = in.request.remoteEngineId();
        due.forEachInt(source -> abandonWhenListed(new PeerKey(p, source), transferId, reason));
      }
    }
    if (in.nobodyMayWrite()) {
      endIncoming(transferId);
      tracker.tell(new RequestTrackerActor.TransferFailed(transferId, failure));
    }
  }

  /**
   * Our blocks were never told (P's TP size was not known when the receive ended): every P worker
   * whose heads we would have received hears that the transfer is over, once P is listed.
   */
  private void abandonWhenListed(String p, String transferId, IncomingReceive in) {
    String reason = in.failure != null ? in.failure
        : "receive of transfer " + transferId + " ended before " + p + " was listed";
    outbox.owedWhenListed(p, transferId, prefillTp -> {
      for (int source : PeerPlanning.sourcesFor(self, prefillTp, mla)) {
        abandonWhenListed(new PeerKey(p, source), transferId, reason);
      }
    });
  }

  /** Tells a P worker that the transfer is over (held until listed). */
  private void abandonWhenListed(PeerKey peer, String transferId, String reason) {
    outbox.send(peer.engineId(), peer.tpRank(),
        new PeerProtocol.TransferFailed(transferId, self.engineId(), reason, self.tpRank()));
  }

  /**
   * Receives from a P engine that was listed and is gone (downed) end: it writes no more. Then
   * what waited for a listing goes out.
   */
  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    EngineDirectory now = m.directory();
    EngineDirectory before = outbox.replaceDirectory(now);
    List<IncomingReceive> ending = new ArrayList<>();
    for (IncomingReceive in : incoming.values()) {
      String p = in.request.remoteEngineId();
      // Only receives whose blocks P was told: one still waiting for P's TP size told nobody,
      // so nothing can land in it, and P may be an engine attaching again (its old worker
      // dropped from the listing before the new one is in). Its deadline still bounds it.
      if (before.contains(p) && !now.contains(p) && in.mayWrite != null) {
        in.mayWrite.clear();
        ending.add(in);
      }
    }
    for (IncomingReceive in : ending) {
      String transferId = in.request.transferId();
      endTransfer(transferId, "prefill engine " + in.request.remoteEngineId()
          + " left the cluster during transfer " + transferId);
    }
    tellNewIncarnations(now);
    outbox.flush();
    return this;
  }

  /**
   * A P worker told our blocks that is no longer routed to while its engine is still listed has
   * stopped (its engine detached, maybe to attach again at once; the blocks may even have gone to
   * dead letters, sent before this node heard of the stop). The engine's next incarnation is told
   * them instead, at once or when it is listed; before, such a receive waited for its deadline.
   * Receives already ending are left to end.
   */
  private void tellNewIncarnations(EngineDirectory now) {
    for (IncomingReceive in : incoming.values()) {
      String p = in.request.remoteEngineId();
      if (in.failure != null || !now.contains(p)
          || doneWords.reportedDone(in.transferId())) { // the blocks are the engine's now
        continue;
      }
      for (int rank : in.stoppedTellers(now)) {
        PeerProtocol.RemoteBlocks blocks = in.blocksFor(rank);
        if (blocks == null) {
          continue; // never: a worker is listed in toldWorkers once its blocks went out
        }
        getContext().getLog().info("{}: P worker {} (rank {}) that was told transfer {}'s blocks"
            + " stopped; telling its engine's next incarnation", self.label(),
            in.toldWorkers.remove(rank).path(), rank, in.transferId());
        outbox.send(p, rank, blocks);
      }
    }
  }

  private Behavior<Command> onPostStop(PostStop signal) {
    doneWords.close();
    return this;
  }
}
