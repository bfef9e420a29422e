package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.PeerKey;
import dev.kvferry.actors.engine.TerminalIds;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.EventOrderedTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;

/**
 * D's side of READ mode: once P's metadata is in (through the {@link HandshakeActor}), reads every
 * layer of P's blocks ({@link LayerReadIssue}: host copies on the I/O dispatcher, GPU copies
 * queued here), reports each layer to {@code waitForLayerLoad}, and releases P's blocks when done
 * or failed ({@link ReleaseActor} counts the releases on P). A read that ends early waits for its
 * reads in flight before the blocks go back.
 */
public final class ReaderActor extends AbstractBehavior<ReaderActor.Command> {

  public sealed interface Command extends LocalOnly
      permits StartLoad, DirectoryChanged, PeerReady, LayerRead, ReceiveEnding {}

  /** Start this step's reads (the worker's StartLoad; it told the tracker to expect them). */
  public record StartLoad(List<ReqMeta> requests) implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  private record PeerReady(HandshakeActor.Result result) implements Command {}

  private record LayerRead(String transferId, int prefillTpRank, int layer, TransferStatus status)
      implements Command {}

  private final WorkerSetup setup;
  private final EngineIdentity self;
  private final boolean mla;
  private final Executor io;
  /**
   * The transport orders copies on the GPU: queued reads are told to {@link LayerLoads}, so the
   * engine's stream can wait behind them (the node's exported event ring).
   */
  private final boolean gpuOrdered;
  private final ActorRef<HandshakeActor.Command> handshake;
  /** What the handshake actor fetched: a peer met before is read from at once, no Fetch. */
  private final PeerMetadataCache peerMetadata;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final ActorRef<HandshakeActor.Result> handshakeAdapter;
  private final PeerOutbox outbox;
  private final TransferPlanner planner = new TransferPlanner(); // not thread-safe: one per actor
  private final Map<String, ReadJob> reads = new HashMap<>();
  private final Map<PeerKey, List<ReqMeta>> readsAwaitingPeer = new HashMap<>();
  /**
   * D: transfers that ended here, or that a P worker ended before this worker began them: an
   * announce of one reads nothing (the tracker refuses the id as a duplicate), so nothing is read
   * into blocks the engine was told are not being received, from blocks P may have freed.
   */
  private final TerminalIds ended;
  /**
   * D: transfers aborted before their load reached this worker. Through the engine port the
   * scheduler (which aborts) and the worker (which starts loads) are two connections, so a
   * handed-over request's abort can overtake the step's start_load_kv. The abort was reported at
   * once (the engine frees the blocks), so the late load must read nothing into them.
   */
  private final TerminalIds abortedBeforeBegun;
  private final ReadEndings endings;

  public static Behavior<Command> create(
      WorkerSetup setup,
      Executor io,
      ActorRef<HandshakeActor.Command> handshake,
      PeerMetadataCache peerMetadata,
      ActorRef<RequestTrackerActor.Command> tracker) {
    return Behaviors.setup(ctx -> new ReaderActor(ctx, setup, io, handshake, peerMetadata, tracker));
  }

  private ReaderActor(
      ActorContext<Command> ctx,
      WorkerSetup setup,
      Executor io,
      ActorRef<HandshakeActor.Command> handshake,
      PeerMetadataCache peerMetadata,
      ActorRef<RequestTrackerActor.Command> tracker) {
    super(ctx);
    this.peerMetadata = peerMetadata;
    this.setup = setup;
    this.self = setup.identity();
    this.mla = setup.geometry().layout() == KvCacheGeometry.Layout.MLA;
    this.io = io;
    this.gpuOrdered = setup.transport() instanceof EventOrderedTransport;
    this.handshake = handshake;
    this.tracker = tracker;
    this.outbox = new PeerOutbox(ctx.getLog(), setup.settings());
    this.ended = new TerminalIds(setup.settings().terminalIdCapacity());
    this.abortedBeforeBegun = new TerminalIds(setup.settings().terminalIdCapacity());
    this.handshakeAdapter = ctx.messageAdapter(HandshakeActor.Result.class, PeerReady::new);
    this.endings = new ReadEndings(self, reads, ended, tracker, outbox, setup.sink());
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(StartLoad.class, this::onStartLoad)
        .onMessage(PeerReady.class, this::onPeerReady)
        .onMessage(LayerRead.class, this::onLayerRead)
        .onMessage(ReceiveEnding.PeerFailed.class, this::onPeerFailed)
        .onMessage(ReceiveEnding.Overdue.class, this::onOverdue)
        .onMessage(ReceiveEnding.Aborted.class, this::onAborted)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .onSignal(PostStop.class, this::onPostStop)
        .build();
  }

  private Behavior<Command> onStartLoad(StartLoad m) {
    for (ReqMeta r : m.requests()) {
      if (r.localBlockIds().length == 0) {
        releaseWhenListed(r); // aborted before it was scheduled: read nothing, still free P's blocks
        continue;
      }
      if (abortedBeforeBegun.contains(r.transferId())) {
        // Its abort came here before its load. The worker told the tracker to expect this receive,
        // and may have done so before the abort's report reached the tracker, which then let that
        // report go as live: end it now, or the engine hears of it only at the transfer timeout.
        releaseWhenListed(r);
        tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(),
            "request " + r.requestId() + " aborted before its load began"));
        continue;
      }
      // The worker told the tracker to expect it.
      if (ended.contains(r.transferId())) {
        ReceiveEnding.endedBefore(tracker, r); // P gave up already, or the id was used before
        continue; // nothing is read
      }
      if (reads.containsKey(r.transferId()) || outbox.holdsWorkFor(r.transferId())) {
        continue; // a duplicate of one in flight: the tracker refuses it, the first goes on
      }
      ReadStamps.mark(r.transferId(), ReadStamps.Stage.READER);
      // Held until P is listed (its TP size says which P workers to read). Ended meanwhile, it
      // still owes those workers a release, or P keeps its blocks until its read-abort timeout.
      outbox.withTpSizeOf(r.remoteEngineId(), r.transferId(), prefillTp -> {
        int[] sources = PeerPlanning.sourcesFor(self, prefillTp, mla);
        ReadJob job = new ReadJob(r, sources, setup.layerRegions().size());
        reads.put(r.transferId(), job);
        setup.sink().expectEarlyDone(r.transferId(), r.requestId()); // before any read can land
        setup.sink().layerLoads().readsPerLayer(r.transferId(), sources.length);
        for (int source : sources) {
          if (job.failure != null) {
            break; // an earlier P worker's reads were refused (its plan): the read is ending
          }
          PeerKey peer = new PeerKey(r.remoteEngineId(), source);
          int incarnation = r.remoteWorkerUid(source); // 0: whichever is listed
          AgentMetadata known = peerMetadata.listed(peer, outbox.directory(), incarnation);
          if (known != null) {
            startReads(job, known);
            continue;
          }
          readsAwaitingPeer.computeIfAbsent(peer, k -> new ArrayList<>()).add(r);
          handshake.tell(new HandshakeActor.Fetch(r.remoteEngineId(), source, incarnation,
              handshakeAdapter));
        }
      }, () -> releaseWhenListed(r));
    }
    return this;
  }

  /**
   * Tells P's workers of {@code r} to free its blocks, once P's TP size says which they are; owed
   * to P whatever else ends the transfer here.
   */
  private void releaseWhenListed(ReqMeta r) {
    outbox.owedWhenListed(r.remoteEngineId(), r.transferId(),
        prefillTp -> endings.releaseAt(r, PeerPlanning.sourcesFor(self, prefillTp, mla)));
  }

  private Behavior<Command> onPeerReady(PeerReady m) {
    HandshakeActor.Result result = m.result();
    List<ReqMeta> waiting = readsAwaitingPeer.remove(new PeerKey(result.engineId(), result.tpRank()));
    if (waiting == null) {
      return this;
    }
    for (ReqMeta r : waiting) {
      ReadJob job = reads.get(r.transferId());
      if (job == null) {
        continue; // failed already through another P worker
      }
      if (result instanceof HandshakeActor.Failed f) {
        endings.endRead(job, f.reason());
      } else if (result instanceof HandshakeActor.Ready ready) {
        startReads(job, ready.metadata());
      }
    }
    return this;
  }

  private void startReads(ReadJob job, AgentMetadata peer) {
    ReqMeta r = job.request;
    if (job.failure != null) {
      return; // ending: nothing new starts
    }
    ReadStamps.mark(r.transferId(), ReadStamps.Stage.PEER_READY);
    TransferBatch plan;
    try {
      // A prefix-cache hit on D leaves fewer local blocks: read the tail of P's list.
      plan =
          PeerPlanning.plan(
              planner, setup.geometry(), self.tpRank(), self.tpSize(), peer, r.localBlockIds(),
              r.remoteBlockIds(), true);
    } catch (InvalidBlockIdsException e) {
      endings.endRead(job, "request " + r.requestId() + ": " + e.getMessage());
      return;
    }
    List<MemoryRegion> regions = setup.layerRegions();
    int source = peer.tpRank();
    String transferId = r.transferId();
    int layers = regions.size();
    ReadStamps.mark(transferId, ReadStamps.Stage.ISSUED);
    List<CompletableFuture<TransferStatus>> issued = LayerReadIssue.start(setup.transport(), io,
        gpuOrdered, regions, peer.layers(), plan, job.cancelled, transferId,
        l -> setup.sink().layerLoads().readQueued(
            transferId, l, new LayerLoads.QueuedRead(regions.get(l), peer.layers().get(l))));
    for (int layer = 0; layer < layers; layer++) {
      int l = layer;
      job.inFlight++;
      getContext()
          .pipeToSelf(
              issued.get(l).thenCompose(TransferStatus::completion)
                  .whenComplete((status, error) -> job.landed(setup.sink(), status, error)),
              (status, error) ->
                  new LayerRead(
                      transferId,
                      source,
                      l,
                      error != null ? TransferStatus.failed("read raised " + error) : status));
    }
  }

  private Behavior<Command> onLayerRead(LayerRead m) {
    ReadJob job = reads.get(m.transferId());
    if (job == null) {
      return this;
    }
    job.inFlight--;
    if (job.failure != null) {
      endings.endRead(job, job.failure);
      return this;
    }
    if (!m.status().succeeded()) {
      String from =
          m.prefillTpRank() == self.tpRank()
              ? job.request.remoteEngineId()
              : new PeerKey(job.request.remoteEngineId(), m.prefillTpRank()).toString();
      endings.endRead(job, "reading layer " + m.layer() + " from " + from + " failed: "
          + m.status().failureMessage());
      return this;
    }
    if (--job.layerRemaining[m.layer()] == 0) {
      setup.sink().layerLoads().layerLanded(m.transferId(), m.layer()); // waitForLayerLoad
    }
    if (--job.remaining == 0) {
      endings.succeeded(job);
    }
    return this;
  }

  private Behavior<Command> onPeerFailed(ReceiveEnding.PeerFailed m) {
    PeerProtocol.TransferFailed f = m.failed();
    String reason = "engine " + f.engineId() + ": " + f.reason();
    if (reads.containsKey(f.transferId()) || outbox.holdsWorkFor(f.transferId())) {
      endings.endTransfer(f.transferId(), reason); // P wants its blocks back: stop reading, then release
    } else {
      // Not begun here (or over): it never begins, and P, if it waits for a release, gets one.
      ended.add(f.transferId());
      tracker.tell(new RequestTrackerActor.TransferFailed(f.transferId(), reason));
      outbox.send(f.engineId(), f.senderTpRank(), endings.release(f.transferId()));
    }
    return this;
  }

  private Behavior<Command> onOverdue(ReceiveEnding.Overdue m) {
    endings.endTransfer(m.transferId(), m.reason()); // a request to end it, not a licence to free
    return this;
  }

  private Behavior<Command> onAborted(ReceiveEnding.Aborted m) {
    // Before deciding whether it is still reading: an abort after the engine heard done is
    // reported as for any ended receive, so the engine gets the report it waits for.
    endings.settleIfDoneEarly(reads.get(m.transferId()));
    boolean reading = reads.containsKey(m.transferId()) || outbox.holdsWorkFor(m.transferId());
    if (!reading) {
      abortedBeforeBegun.add(m.transferId());
    }
    if (!ReceiveEnding.reportedAtOnce(m, reading, tracker)) {
      endings.endTransfer(m.transferId(), m.reason());
    }
    return this;
  }

  /**
   * D: reads from a P engine that was listed and is gone (downed) end; they still wait for the
   * copies in flight before the blocks go back. Then what waited for a listing goes out.
   */
  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    EngineDirectory now = m.directory();
    EngineDirectory before = outbox.replaceDirectory(now);
    List<ReadJob> ending = new ArrayList<>();
    for (ReadJob job : reads.values()) {
      String p = job.request.remoteEngineId();
      if (before.contains(p) && !now.contains(p)) {
        ending.add(job);
      }
    }
    for (ReadJob job : ending) {
      endings.endTransfer(job.request.transferId(),
          "prefill engine " + job.request.remoteEngineId() + " left the cluster during transfer "
              + job.request.transferId());
    }
    outbox.flush();
    return this;
  }

  private Behavior<Command> onPostStop(PostStop signal) {
    reads.values().forEach(j -> j.cancelled.set(true)); // queued reads skip their copies
    return this;
  }
}
