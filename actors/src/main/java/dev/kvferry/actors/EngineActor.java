package dev.kvferry.actors;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.DispatcherSelector;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;

/**
 * One engine worker (one TP rank of one DP engine): owns its registered layer regions and its
 * transport, registers with the Receptionist so peers and routers find it, and is the entry point
 * for worker-side calls and for messages from remote engines ({@link PeerProtocol}). It keeps the
 * cluster's directory of workers and hands each message to the child whose job it is: writes
 * (WRITE, P) to its {@link WriterActor}, D's side of WRITE to its {@link ReceiverActor}, reads
 * (READ, D) to its {@link ReaderActor}, P's side of READ to its {@link ReleaseActor}, metadata to
 * its {@link HandshakeActor}; per-request state lives in its {@link RequestTrackerActor}. Replaces
 * MoRIIOConnectorWorker's state and locks.
 */
public final class EngineActor extends AbstractBehavior<EngineActor.Command> {

  /** Engines register under the key of their role; subscribers learn identities from names. */
  public static ServiceKey<Command> serviceKey(Role role) {
    return ServiceKey.create(Command.class, "kvferry-engine-" + role.clusterRole());
  }

  /** What a worker handles: calls from its own engine here, and messages from its peers. */
  public sealed interface Command
      permits PeerProtocol.Message, StartLoad, SaveLayer, SealWrites, AnnounceRemoteBlocks,
          AbortTransfer, AbortReceive, ReceiveOverdue, ReleaseOverdue, PeerGone, PeerIntroduced,
          GetTransfers, FenceSaves, Stop, ListingChanged, ListedWorkerStopped, ReattachGraceOver {}

  // ---- from the local engine (worker and scheduler side) ----

  /** Worker: start this step's loads (READ, D) and record pending sends (READ, P). */
  public record StartLoad(ConnectorMetadata metadata) implements Command, LocalOnly {}

  /**
   * Worker, P: layer {@code layer} of every request in {@code metadata.reqsToSave} is computed
   * when {@code event} fires.
   */
  public record SaveLayer(ConnectorMetadata metadata, int layer, LayerEvent event) implements Command, LocalOnly {}

  /** Worker, P: the forward pass is over; {@code layers} layers were saved for each request. */
  public record SealWrites(List<ReqMeta> requests, int layers) implements Command, LocalOnly {}

  /** Scheduler, D, WRITE: tell P which of our blocks to write into, and expect its writes. */
  public record AnnounceRemoteBlocks(ReqMeta request) implements Command, LocalOnly {}

  /** Scheduler, P: the request ended before its KV was sent (aborted): tell D, drop its writes. */
  public record AbortTransfer(String requestId, String transferId, String decodeEngineId, String reason)
      implements Command, LocalOnly {}

  /**
   * Scheduler, D: the request was aborted after it was scheduled. Its transfer ends like one that
   * timed out (P is asked to abandon); the request is reported in {@code getFinished} once no copy
   * can land in its blocks (at once if its transfer ended already).
   */
  public record AbortReceive(String requestId, String transferId, String reason)
      implements Command, LocalOnly {}

  /**
   * From this worker's tracker, D: a receive outlived the transfer timeout. A request to end it,
   * not a licence to free its blocks.
   */
  public record ReceiveOverdue(String transferId, String reason) implements Command, LocalOnly {}

  /**
   * From this worker's tracker, P, READ: the decode engine did not release a transfer's blocks by
   * the read-abort deadline; ask it to stop reading and release them.
   */
  public record ReleaseOverdue(String transferId, String decodeEngineId)
      implements Command, LocalOnly {}

  /**
   * From this worker's handshake actor: a peer worker incarnation left (or restarted); its
   * transport state (idle connections, IPC mappings, copy streams) is released.
   */
  public record PeerGone(AgentMetadata metadata) implements Command, LocalOnly {}

  /**
   * From this worker's handshake actor: a peer worker asked for our metadata (it is about to read
   * our blocks, or to write into its own); watched until it stops.
   */
  public record PeerIntroduced(String engineId, ActorRef<Command> worker)
      implements Command, LocalOnly {}

  /** Transfers in flight, for management endpoints. */
  public record GetTransfers(ActorRef<TransferSnapshot> replyTo) implements Command, LocalOnly {}

  /** Worker, P: preempted requests' saves stop reading; see {@link WriterActor.FenceSaves}. */
  public record FenceSaves(Set<String> requestIds, CompletableFuture<Void> done)
      implements Command, LocalOnly {}

  /** Stops the worker and its children. */
  public record Stop() implements Command, LocalOnly {}

  private record ListingChanged(Receptionist.Listing listing) implements Command, LocalOnly {}

  /**
   * A listed or introduced worker's actor terminated (death watch): the listing drops it only
   * after the Receptionist's gossip, up to seconds later (or never lists it), and until then a
   * message sent to it is lost.
   */
  private record ListedWorkerStopped(ActorRef<Command> ref) implements Command, LocalOnly {}

  /** A worker the listing dropped while its node stayed: its engine did not attach again in time. */
  private record ReattachGraceOver(ActorRef<Command> ref) implements Command, LocalOnly {}

  private final EngineIdentity self;
  private final ActorRef<HandshakeActor.Command> handshake;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final ActorRef<WriterActor.Command> writer;
  private final ActorRef<ReceiverActor.Command> receiver;
  private final ActorRef<ReaderActor.Command> reader;
  private final ActorRef<ReleaseActor.Command> releases;
  /** D: where a receive's early endings go, the reader (READ) or the receiver (WRITE). */
  private final ActorRef<ReceiveEnding> receiveSide;
  /** Who is listed, who of them stopped, and the directory the children route by. */
  private final ListedWorkers workers;
  private final DuplicateIdGuard duplicates;

  public static Behavior<Command> create(WorkerSetup setup) {
    return ReadStamps.watchEngine(Behaviors.setup(ctx -> new EngineActor(ctx, setup)));
  }

  private EngineActor(ActorContext<Command> ctx, WorkerSetup setup) {
    super(ctx);
    this.self = setup.identity();
    // Transports make blocking native calls: keep them off the actors' dispatcher.
    Executor io = ctx.getSystem().dispatchers().lookup(DispatcherSelector.blocking());
    List<RegionDescriptor> descriptors = new ArrayList<>();
    for (MemoryRegion r : setup.layerRegions()) {
      descriptors.add(setup.transport().describe(r));
    }
    AgentMetadata local =
        new AgentMetadata(
            self.engineId(), self.dpRank(), self.tpRank(), self.tpSize(),
            setup.transport().name(), setup.geometry(), descriptors);
    PeerMetadataCache peerMetadata = new PeerMetadataCache();
    this.handshake =
        ctx.spawn(HandshakeActor.create(local, setup.settings(), ctx.getSelf(), peerMetadata),
            "handshake");
    this.tracker =
        ctx.spawn(
            RequestTrackerActor.create(self.label(), setup.settings(), setup.sink(), ctx.getSelf()),
            "tracker");
    this.writer = ctx.spawn(WriterActor.create(setup, io, handshake, tracker), "writer");
    this.receiver = ctx.spawn(
        ReceiverActor.create(setup, tracker, ctx.getSelf().path().uid()), "receiver");
    this.reader =
        ctx.spawn(ReaderActor.create(setup, io, handshake, peerMetadata, tracker), "reader");
    this.releases = ctx.spawn(ReleaseActor.create(setup, tracker), "releases");
    this.receiveSide =
        self.mode() == TransferMode.READ ? reader.narrow() : receiver.narrow();
    this.duplicates = new DuplicateIdGuard(ctx, self);
    this.workers = new ListedWorkers(ctx, self.role(), ListedWorkerStopped::new,
        setup.settings().reattachGrace(), ReattachGraceOver::new);

    ActorRef<Receptionist.Listing> listingAdapter =
        ctx.messageAdapter(Receptionist.Listing.class, ListingChanged::new);
    ActorRef<Receptionist.Command> receptionist = ctx.getSystem().receptionist();
    receptionist.tell(Receptionist.register(serviceKey(self.role()), ctx.getSelf()));
    for (Role role : Role.values()) {
      receptionist.tell(Receptionist.subscribe(serviceKey(role), listingAdapter));
    }
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(StartLoad.class, this::onStartLoad)
        .onMessage(SaveLayer.class, this::onSaveLayer)
        .onMessage(SealWrites.class, this::onSealWrites)
        .onMessage(AnnounceRemoteBlocks.class, this::onAnnounceRemoteBlocks)
        .onMessage(PeerProtocol.RemoteBlocks.class, this::onRemoteBlocks)
        .onMessage(PeerProtocol.WriteDone.class, this::onWriteDone)
        .onMessage(PeerProtocol.TransferFailed.class, this::onTransferFailed)
        .onMessage(PeerProtocol.Release.class, this::onRelease)
        .onMessage(PeerProtocol.GetMetadata.class, this::onGetMetadata)
        .onMessage(ReceiveOverdue.class, this::onReceiveOverdue)
        .onMessage(ReleaseOverdue.class, this::onReleaseOverdue)
        .onMessage(AbortReceive.class, this::onAbortReceive)
        .onMessage(AbortTransfer.class, this::onAbortTransfer)
        .onMessage(PeerGone.class, this::onPeerGone)
        .onMessage(PeerIntroduced.class, this::onPeerIntroduced)
        .onMessage(GetTransfers.class, this::onGetTransfers)
        .onMessage(FenceSaves.class, this::onFenceSaves)
        .onMessage(ListingChanged.class, this::onListingChanged)
        .onMessage(ListedWorkerStopped.class, this::onListedWorkerStopped)
        .onMessage(ReattachGraceOver.class, this::onReattachGraceOver)
        .onMessage(Stop.class, this::onStop)
        .build();
  }

  /**
   * The tracker hears of every transfer here, before a child gets its work: whatever the child
   * later tells the tracker comes after, and a GetTransfers sent after this call lists it.
   */
  private Behavior<Command> onStartLoad(StartLoad m) {
    for (ConnectorMetadata.PendingSend s : m.metadata().reqsToSend()) {
      tracker.tell(
          new RequestTrackerActor.ExpectRelease(
              s.requestId(), s.transferId(), s.deadlineEpochMs(), s.consumerEngineId()));
    }
    if (!m.metadata().reqsToSend().isEmpty()) {
      releases.tell(new ReleaseActor.KeepForReaders(m.metadata().reqsToSend()));
    }
    for (ReqMeta r : m.metadata().reqsToRecv()) {
      if (r.localBlockIds().length > 0) { // none: aborted before it was scheduled, nothing to load
        ReadStamps.mark(r.transferId(), ReadStamps.Stage.ENGINE);
        tracker.tell(
            new RequestTrackerActor.ExpectReceive(
                r.requestId(), r.transferId(), r.remoteEngineId(), r.localBlockIds()));
      }
    }
    if (!m.metadata().reqsToRecv().isEmpty()) {
      reader.tell(new ReaderActor.StartLoad(m.metadata().reqsToRecv()));
    }
    return this;
  }

  private Behavior<Command> onSaveLayer(SaveLayer m) {
    for (ReqMeta r : m.metadata().reqsToSave()) {
      writer.tell(new WriterActor.SaveLayer(r, m.layer(), m.event()));
    }
    return this;
  }

  private Behavior<Command> onSealWrites(SealWrites m) {
    writer.tell(new WriterActor.Seal(m.requests(), m.layers()));
    return this;
  }

  private Behavior<Command> onAnnounceRemoteBlocks(AnnounceRemoteBlocks m) {
    ReqMeta r = m.request();
    tracker.tell(
        new RequestTrackerActor.ExpectReceive(
            r.requestId(), r.transferId(), r.remoteEngineId(), r.localBlockIds()));
    receiver.tell(new ReceiverActor.Announce(r));
    return this;
  }

  private Behavior<Command> onRemoteBlocks(PeerProtocol.RemoteBlocks m) {
    WriteStamps.mark(WriteStamps.Stage.BLOCKS_ARRIVED);
    writer.tell(new WriterActor.RemoteBlocksArrived(m));
    return this;
  }

  private Behavior<Command> onWriteDone(PeerProtocol.WriteDone m) {
    receiver.tell(new ReceiverActor.WriterDone(m));
    return this;
  }

  private Behavior<Command> onTransferFailed(PeerProtocol.TransferFailed m) {
    if (self.role() == Role.PREFILL) {
      // P, WRITE: D gave up (maybe before P finished prefill): no write may start; once those in
      // flight landed the writer confirms to D, and the request's blocks are freed then or as
      // soon as its layers are saved.
      String reason = "engine " + m.engineId() + ": " + m.reason();
      tracker.tell(new RequestTrackerActor.TransferFailed(m.transferId(), reason));
      writer.tell(new WriterActor.Abandon(m.transferId(), reason, m.engineId()));
    } else {
      receiveSide.tell(new ReceiveEnding.PeerFailed(m));
    }
    return this;
  }

  private Behavior<Command> onRelease(PeerProtocol.Release m) {
    releases.tell(new ReleaseActor.Released(m));
    // WRITE mode: D gave up before P wrote (aborted); pending writes must not land.
    writer.tell(
        new WriterActor.Abandon(
            m.transferId(), "decode engine " + m.decodeEngineId() + " released it", null));
    return this;
  }

  private Behavior<Command> onGetMetadata(PeerProtocol.GetMetadata m) {
    handshake.tell(new HandshakeActor.Serve(m));
    return this;
  }

  private Behavior<Command> onReceiveOverdue(ReceiveOverdue m) {
    receiveSide.tell(new ReceiveEnding.Overdue(m.transferId(), m.reason()));
    return this;
  }

  private Behavior<Command> onAbortReceive(AbortReceive m) {
    receiveSide.tell(new ReceiveEnding.Aborted(m.requestId(), m.transferId(), m.reason()));
    return this;
  }

  private Behavior<Command> onReleaseOverdue(ReleaseOverdue m) {
    releases.tell(new ReleaseActor.ReleaseOverdue(m.transferId(), m.decodeEngineId()));
    return this;
  }

  private Behavior<Command> onAbortTransfer(AbortTransfer m) {
    // The writer tells D once none of its writes can still land in D's blocks.
    writer.tell(new WriterActor.Abandon(m.transferId(), m.reason(), m.decodeEngineId()));
    return this;
  }

  private Behavior<Command> onFenceSaves(FenceSaves m) {
    // Behind this step's SaveLayer messages, which came this way first.
    writer.tell(new WriterActor.FenceSaves(m.requestIds(), m.done()));
    return this;
  }

  private Behavior<Command> onPeerGone(PeerGone m) {
    // The writer owns what is mapped for a decode peer (its done words): it releases both.
    writer.tell(new WriterActor.PeerGone(m.metadata()));
    return this;
  }

  private Behavior<Command> onGetTransfers(GetTransfers m) {
    // The writer adds P's writes in progress and asks the tracker for the rest.
    writer.tell(new WriterActor.ListWrites(tracker, m.replyTo()));
    return this;
  }

  private Behavior<Command> onStop(Stop m) {
    return Behaviors.stopped(); // the children stop with it; reads and writes still queued skip
  }

  // ---- membership ----

  private Behavior<Command> onListingChanged(ListingChanged m) {
    publishDirectory(workers.take(m.listing()));
    return this;
  }

  /**
   * A worker still listed stopped (its engine detached, maybe to attach again at once): routing
   * skips it from now on, so messages reach the new incarnation or wait for one.
   */
  private Behavior<Command> onListedWorkerStopped(ListedWorkerStopped m) {
    ListedWorkers.Stopped stopped = workers.stopped(m.ref());
    if (stopped.directoryChanged()) {
      publishDirectory(true);
    }
    if (stopped.introducedChanged()) {
      // An engine no listing shows may have gone with it: no listing change would say so.
      tracker.tell(new RequestTrackerActor.IntroducedChanged(workers.introducedEngines()));
    }
    return this;
  }

  /** The engine of a worker the listing dropped did not attach again in time: it has left. */
  private Behavior<Command> onReattachGraceOver(ReattachGraceOver m) {
    Role role = workers.graceOver(m.ref());
    if (role != null) {
      publishDirectory(role == self.role());
    }
    return this;
  }

  private Behavior<Command> onPeerIntroduced(PeerIntroduced m) {
    if (workers.introduced(m.engineId(), m.worker())) {
      tracker.tell(new RequestTrackerActor.IntroducedChanged(workers.introducedEngines()));
    }
    return this;
  }

  /** Tells every child the directory made of the last listings, less the stopped workers. */
  private void publishDirectory(boolean ownRoleChanged) {
    EngineDirectory merged = workers.directory();
    handshake.tell(new HandshakeActor.DirectoryChanged(merged));
    writer.tell(new WriterActor.DirectoryChanged(merged));
    tracker.tell(new RequestTrackerActor.DirectoryChanged(merged));
    // Each ends its transfers with engines that left, then sends what waited for a listing.
    receiver.tell(new ReceiverActor.DirectoryChanged(merged));
    reader.tell(new ReaderActor.DirectoryChanged(merged));
    releases.tell(new ReleaseActor.DirectoryChanged(merged));
    duplicates.report(merged);
    if (ownRoleChanged) {
      duplicates.refuseOrResume(workers.reachableOwnRole(), workers.ownRole());
    }
  }
}
