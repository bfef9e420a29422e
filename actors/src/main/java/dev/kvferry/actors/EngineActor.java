package dev.kvferry.actors;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TensorParallelSplit;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.function.IntConsumer;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
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
 * for worker-side calls and for messages from remote engines. Reads (READ mode) are run here;
 * writes are queued in its {@link WriterActor}; metadata goes through its {@link HandshakeActor};
 * per-request state lives in its {@link RequestTrackerActor}. Replaces MoRIIOConnectorWorker's
 * state and locks.
 */
public final class EngineActor extends AbstractBehavior<EngineActor.Command> {

  /** Engines register under the key of their role; subscribers learn identities from names. */
  public static ServiceKey<Command> serviceKey(Role role) {
    return ServiceKey.create(Command.class, "kvferry-engine-" + role.clusterRole());
  }

  public sealed interface Command {}

  // ---- from the local engine (worker and scheduler side) ----

  /** Worker: start this step's loads (READ, D) and record pending sends (READ, P). */
  public record StartLoad(ConnectorMetadata metadata) implements Command, LocalOnly {}

  /** Worker, P: layer {@code layer} of every request in {@code metadata.reqsToSave} is computed when {@code event} fires. */
  public record SaveLayer(ConnectorMetadata metadata, int layer, LayerEvent event) implements Command, LocalOnly {}

  /** Worker, P: the forward pass is over; {@code layers} layers were saved for each request. */
  public record SealWrites(List<ReqMeta> requests, int layers) implements Command, LocalOnly {}

  /** Scheduler, D, WRITE: tell P which of our blocks to write into, and expect its writes. */
  public record AnnounceRemoteBlocks(ReqMeta request) implements Command, LocalOnly {}

  /** Scheduler, P: the request ended before its KV was sent (aborted): tell D, drop its writes. */
  public record AbortTransfer(String requestId, String transferId, String decodeEngineId, String reason)
      implements Command, LocalOnly {}

  /** Transfers in flight, for management endpoints. */
  public record GetTransfers(ActorRef<RequestTrackerActor.Snapshot> replyTo) implements Command, LocalOnly {}

  /** Stops the worker and its children. */
  public record Stop() implements Command, LocalOnly {}

  // ---- between engines, over the network ----

  /**
   * D to P, WRITE: D's blocks for a transfer (the seed's "remote_blocks" notification), from D's
   * worker {@code decodeTpRank} (-1: the worker of the receiver's own rank).
   */
  public record RemoteBlocks(
      String transferId,
      String requestId,
      int[] blockIds,
      String decodeEngineId,
      int decodeDpRank,
      int decodeTpRank,
      String doneWords,
      int doneSlots,
      int doneSlot,
      long doneValue)
      implements Command, CborSerializable {
    /**
     * {@code doneWords} (cuda transport, same host): the file of D's done words; P's copy stream
     * stores {@code doneValue} into word {@code doneSlot} of {@code doneSlots} behind the
     * transfer's last copy, so D learns before WriteDone arrives. Empty: messages only.
     */
    public RemoteBlocks {
      doneWords = doneWords == null ? "" : doneWords;
    }

    public RemoteBlocks(
        String transferId, String requestId, int[] blockIds, String decodeEngineId,
        int decodeDpRank, int decodeTpRank) {
      this(transferId, requestId, blockIds, decodeEngineId, decodeDpRank, decodeTpRank, "", 0, -1,
          0);
    }

    public RemoteBlocks(
        String transferId, String requestId, int[] blockIds, String decodeEngineId,
        int decodeDpRank) {
      this(transferId, requestId, blockIds, decodeEngineId, decodeDpRank, -1);
    }

    boolean hasDoneWord() {
      return !doneWords.isEmpty() && doneSlot >= 0 && doneSlot < doneSlots;
    }
  }

  /** D, from its {@link DoneWordWatcher}: the one P worker's copies of a transfer landed. */
  private record DoneWordSeen(String transferId) implements Command, LocalOnly {}

  /**
   * P to D, WRITE: every layer of a transfer has been written by P's worker {@code
   * producerTpRank} (-1: the worker of the receiver's own rank).
   */
  public record WriteDone(String transferId, String producerEngineId, int producerTpRank)
      implements Command, CborSerializable {
    public WriteDone(String transferId, String producerEngineId) {
      this(transferId, producerEngineId, -1);
    }
  }

  /** Either way: a transfer failed on the sender's side, with the reason. */
  public record TransferFailed(String transferId, String engineId, String reason)
      implements Command, CborSerializable {}

  /**
   * D to P, READ: D's worker {@code decodeTpRank} of {@code decodeTpSize} is done with a
   * transfer's blocks (read, failed or aborted); P frees them once every D worker that reads from
   * it has released them (-1: same TP size, one release).
   */
  public record Release(
      String transferId, String decodeEngineId, int decodeTpRank, int decodeTpSize)
      implements Command, CborSerializable {
    public Release(String transferId, String decodeEngineId) {
      this(transferId, decodeEngineId, -1, -1);
    }
  }

  /** Handshake: send me your metadata. */
  public record GetMetadata(ActorRef<MetadataReply> replyTo) implements Command, CborSerializable {}

  /** Handshake answer: the msgpack-packed {@link AgentMetadata} of one worker. */
  public record MetadataReply(String engineId, int tpRank, byte[] blob) implements CborSerializable {}

  // ---- internal ----

  private record ListingChanged(Receptionist.Listing listing) implements Command, LocalOnly {}

  private record ReadPeerReady(ReqMeta request, HandshakeActor.Result result) implements Command, LocalOnly {}

  private record LayerRead(String transferId, int prefillTpRank, int layer, TransferStatus status)
      implements Command, LocalOnly {}

  /** Everything needed to start a worker. */
  public record Setup(
      EngineIdentity identity,
      KvCacheGeometry geometry,
      List<MemoryRegion> layerRegions,
      Transport transport,
      ConnectorSettings settings,
      FinishedSink sink) {
    public Setup {
      layerRegions = List.copyOf(layerRegions);
      long need = geometry.layerRegionBytes();
      for (MemoryRegion r : layerRegions) {
        if (r.lengthBytes() < need) {
          throw new IllegalArgumentException(
              "layer region " + r.id() + " has " + r.lengthBytes() + " bytes; geometry needs "
                  + need);
        }
      }
    }
  }

  private static final class ReadJob {
    final ReqMeta request;
    /** P's workers this worker reads from (one, unless the TP sizes differ). */
    final int[] sources;
    int remaining;
    long bytes;

    ReadJob(ReqMeta request, int[] sources, int layers) {
      this.request = request;
      this.sources = sources;
      this.remaining = layers * sources.length;
    }
  }

  private final Setup setup;
  private final EngineIdentity self;
  private final Executor io;
  private final ActorRef<HandshakeActor.Command> handshake;
  private final ActorRef<WriterActor.Command> writer;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final ClusterMessageLimit messageLimit;
  /** D, cuda transport: done words P's copy streams store into (null until first needed). */
  private DoneWordWatcher doneWords;
  private boolean doneWordsUnavailable;
  private final ActorRef<HandshakeActor.Result> readHandshakeAdapter;
  private final Map<String, ReadJob> reads = new HashMap<>();
  private final Map<String, List<ReqMeta>> readsAwaitingPeer = new HashMap<>();
  /** Messages to peers not listed yet, flushed when they appear (or dropped after the transfer timeout). */
  private final ArrayDeque<Outgoing> awaitingPeer = new ArrayDeque<>();
  private final Map<Role, EngineDirectory> listings = new HashMap<>();
  private EngineDirectory directory = EngineDirectory.EMPTY;
  private final TransferPlanner planner = new TransferPlanner(); // not thread-safe: one per actor

  private record Outgoing(String engineId, int tpRank, Command message, long heldSinceNanos) {}

  /** Work that needs a peer engine's TP size, held until one of its workers is listed. */
  private record AwaitingTpSize(String engineId, IntConsumer action) {}

  private final List<AwaitingTpSize> awaitingTpSize = new ArrayList<>();
  /**
   * D, WRITE: the P workers whose WriteDone is still due, by transfer id. Bounded like the
   * terminal ids: an entry whose transfer timed out is dropped eventually.
   */
  private final Map<String, Set<Integer>> writeDonesDue;
  /** P, READ, D with another TP size: the D workers that released so far, by transfer id. */
  private final Map<String, Set<Integer>> releasesSeen;

  public static Behavior<Command> create(Setup setup) {
    return Behaviors.setup(ctx -> new EngineActor(ctx, setup));
  }

  private EngineActor(ActorContext<Command> ctx, Setup setup) {
    super(ctx);
    this.setup = setup;
    this.self = setup.identity();
    this.writeDonesDue = bounded(setup.settings().terminalIdCapacity());
    this.releasesSeen = bounded(setup.settings().terminalIdCapacity());
    // Transports make blocking native calls: keep them off the actors' dispatcher.
    this.io = ctx.getSystem().dispatchers().lookup(DispatcherSelector.blocking());
    this.messageLimit = ClusterMessageLimit.of(ctx.getSystem());
    List<RegionDescriptor> descriptors = new ArrayList<>();
    for (MemoryRegion r : setup.layerRegions()) {
      descriptors.add(setup.transport().describe(r));
    }
    AgentMetadata local =
        new AgentMetadata(
            self.engineId(), self.dpRank(), self.tpRank(), self.tpSize(),
            setup.transport().name(), setup.geometry(), descriptors);
    this.handshake = ctx.spawn(HandshakeActor.create(local, setup.settings()), "handshake");
    this.tracker =
        ctx.spawn(
            RequestTrackerActor.create(self.label(), setup.settings(), setup.sink()), "tracker");
    this.writer =
        ctx.spawn(
            WriterActor.create(
                self, setup.geometry(), setup.layerRegions(), setup.transport(), io,
                setup.settings(), handshake, tracker),
            "writer");
    this.readHandshakeAdapter =
        ctx.messageAdapter(HandshakeActor.Result.class, r -> new ReadPeerReady(null, r));

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
        .onMessage(
            SaveLayer.class,
            m -> {
              for (ReqMeta r : m.metadata().reqsToSave()) {
                writer.tell(new WriterActor.SaveLayer(r, m.layer(), m.event()));
              }
              return this;
            })
        .onMessage(
            SealWrites.class,
            m -> {
              writer.tell(new WriterActor.Seal(m.requests(), m.layers()));
              return this;
            })
        .onMessage(AnnounceRemoteBlocks.class, this::onAnnounceRemoteBlocks)
        .onMessage(
            RemoteBlocks.class,
            m -> {
              writer.tell(new WriterActor.RemoteBlocksArrived(m));
              return this;
            })
        .onMessage(WriteDone.class, this::onWriteDone)
        .onMessage(
            TransferFailed.class,
            m -> {
              String reason = "engine " + m.engineId() + ": " + m.reason();
              writeDonesDue.remove(m.transferId());
              forgetDoneWord(m.transferId());
              tracker.tell(new RequestTrackerActor.TransferFailed(m.transferId(), reason));
              // P, WRITE: D gave up (maybe before P finished prefill): no write may land, and the
              // request's blocks are freed now or as soon as its layers are saved.
              writer.tell(new WriterActor.Abandon(m.transferId(), reason));
              return this;
            })
        .onMessage(
            Release.class,
            m -> {
              if (allReleased(m)) {
                tracker.tell(new RequestTrackerActor.Released(m.transferId()));
              }
              // WRITE mode: D gave up before P wrote (aborted); pending writes must not land.
              writer.tell(
                  new WriterActor.Abandon(
                      m.transferId(), "decode engine " + m.decodeEngineId() + " released it"));
              return this;
            })
        .onMessage(
            AbortTransfer.class,
            m -> {
              writer.tell(new WriterActor.Abandon(m.transferId(), m.reason()));
              sendTo(
                  m.decodeEngineId(),
                  self.tpRank(),
                  new TransferFailed(m.transferId(), self.engineId(), m.reason()));
              return this;
            })
        .onMessage(
            GetMetadata.class,
            m -> {
              handshake.tell(new HandshakeActor.Serve(m));
              return this;
            })
        .onMessage(
            GetTransfers.class,
            m -> {
              // The writer adds P's writes in progress and asks the tracker for the rest.
              writer.tell(new WriterActor.ListWrites(tracker, m.replyTo()));
              return this;
            })
        .onMessage(DoneWordSeen.class, this::onDoneWordSeen)
        .onSignal(PostStop.class, sig -> {
          if (doneWords != null) {
            doneWords.close();
          }
          return this;
        })
        .onMessage(ListingChanged.class, this::onListingChanged)
        .onMessage(ReadPeerReady.class, this::onReadPeerReady)
        .onMessage(LayerRead.class, this::onLayerRead)
        .onMessage(Stop.class, m -> Behaviors.stopped())
        .build();
  }

  // ---- D, WRITE ----

  private Behavior<Command> onAnnounceRemoteBlocks(AnnounceRemoteBlocks m) {
    ReqMeta r = m.request();
    tracker.tell(
        new RequestTrackerActor.ExpectReceive(r.requestId(), r.transferId(), r.remoteEngineId()));
    withTpSizeOf(
        r.remoteEngineId(),
        prefillTp -> {
          // Every P worker whose heads overlap ours writes its slice, and says when it is done.
          int[] sources = sourcesFor(prefillTp);
          Set<Integer> due = new HashSet<>();
          for (int source : sources) {
            due.add(source);
          }
          DoneWordWatcher.Ticket ticket =
              sources.length == 1 ? doneWordTicket(r.transferId()) : null;
          RemoteBlocks blocks =
              ticket == null
                  ? new RemoteBlocks(
                      r.transferId(), r.requestId(), r.localBlockIds(), self.engineId(),
                      self.dpRank(), self.tpRank())
                  : new RemoteBlocks(
                      r.transferId(), r.requestId(), r.localBlockIds(), self.engineId(),
                      self.dpRank(), self.tpRank(), ticket.path(), ticket.slots(), ticket.slot(),
                      ticket.value());
          Optional<String> tooBig =
              messageLimit.whyNotSendable(blocks, r.localBlockIds().length,
                  "the list of " + r.localBlockIds().length + " block ids of request "
                      + r.requestId());
          if (tooBig.isPresent()) {
            forgetDoneWord(r.transferId());
            // Artery would drop it and P would wait for its defer timeout: fail both sides now.
            tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(), tooBig.get()));
            for (int source : sources) {
              sendTo(r.remoteEngineId(), source,
                  new TransferFailed(r.transferId(), self.engineId(), tooBig.get()));
            }
            return;
          }
          writeDonesDue.put(r.transferId(), due);
          for (int source : sources) {
            sendTo(r.remoteEngineId(), source, blocks);
          }
        });
    return this;
  }

  /**
   * A done word for a transfer written by one P worker over the cuda transport; null (messages
   * only) otherwise.
   */
  private DoneWordWatcher.Ticket doneWordTicket(String transferId) {
    if (!(setup.transport() instanceof CudaTransport)) {
      return null;
    }
    if (doneWords == null && !doneWordsUnavailable) {
      ActorRef<Command> me = getContext().getSelf();
      doneWords = DoneWordWatcher.tryCreate(self.label(), id -> me.tell(new DoneWordSeen(id)));
      doneWordsUnavailable = doneWords == null;
    }
    if (doneWords == null) {
      return null;
    }
    return doneWords.register(transferId);
  }

  private void forgetDoneWord(String transferId) {
    if (doneWords != null) {
      doneWords.forget(transferId);
    }
  }

  private Behavior<Command> onDoneWordSeen(DoneWordSeen m) {
    // Words are handed out only for one writer, so its rank is the one still due; nothing is due
    // once its WriteDone overtook the word.
    Set<Integer> due = writeDonesDue.get(m.transferId());
    if (due != null && due.size() == 1) {
      onWriteDone(new WriteDone(m.transferId(), "", due.iterator().next()));
    }
    return this;
  }

  private Behavior<Command> onWriteDone(WriteDone m) {
    forgetDoneWord(m.transferId());
    Set<Integer> due = writeDonesDue.get(m.transferId());
    if (due != null) {
      due.remove(m.producerTpRank() < 0 ? self.tpRank() : m.producerTpRank());
      if (!due.isEmpty()) {
        return this; // other P workers still write their heads
      }
      writeDonesDue.remove(m.transferId());
    }
    tracker.tell(new RequestTrackerActor.ReceiveSucceeded(m.transferId(), 0));
    return this;
  }

  /** P: whether every D worker that reads from this worker has now released the transfer. */
  private boolean allReleased(Release m) {
    if (m.decodeTpSize() < 1 || m.decodeTpSize() == self.tpSize()) {
      return true;
    }
    int need = TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), m.decodeTpSize(), mla())
        .length;
    if (need <= 1) {
      return true;
    }
    Set<Integer> seen = releasesSeen.computeIfAbsent(m.transferId(), k -> new HashSet<>());
    seen.add(m.decodeTpRank());
    if (seen.size() < need) {
      return false;
    }
    releasesSeen.remove(m.transferId());
    return true;
  }

  private static Map<String, Set<Integer>> bounded(int capacity) {
    return new LinkedHashMap<>() {
      @Override
      protected boolean removeEldestEntry(Map.Entry<String, Set<Integer>> eldest) {
        return size() > capacity;
      }
    };
  }

  private boolean mla() {
    return setup.geometry().layout() == KvCacheGeometry.Layout.MLA;
  }

  /** The P workers this D worker receives from, given P's TP size. */
  private int[] sourcesFor(int prefillTp) {
    return prefillTp == self.tpSize()
        ? new int[] {self.tpRank()}
        : TensorParallelSplit.sourcesOf(self.tpRank(), self.tpSize(), prefillTp, mla());
  }

  private Release release(String transferId) {
    return new Release(transferId, self.engineId(), self.tpRank(), self.tpSize());
  }

  /** Runs {@code action} with the TP size of {@code engineId} now if it is listed, else later. */
  private void withTpSizeOf(String engineId, IntConsumer action) {
    OptionalInt tp = PeerPlanning.tpSizeOf(directory, engineId);
    if (tp.isPresent()) {
      action.accept(tp.getAsInt());
    } else {
      // Not listed yet (it may have just joined); the tracker's deadline bounds the wait.
      getContext().getLog().debug("{} not listed yet; holding work that needs its TP size", engineId);
      awaitingTpSize.add(new AwaitingTpSize(engineId, action));
    }
  }

  // ---- READ ----

  private Behavior<Command> onStartLoad(StartLoad m) {
    for (ConnectorMetadata.PendingSend s : m.metadata().reqsToSend()) {
      tracker.tell(
          new RequestTrackerActor.ExpectRelease(
              s.requestId(), s.transferId(), s.deadlineEpochMs(), s.consumerEngineId()));
      if (mla()) {
        // MLA, D with fewer workers: some P workers have no reader; they free at once.
        withTpSizeOf(
            s.consumerEngineId(),
            decodeTp -> {
              if (TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), decodeTp, true)
                  .length == 0) {
                tracker.tell(new RequestTrackerActor.Released(s.transferId()));
              }
            });
      }
    }
    for (ReqMeta r : m.metadata().reqsToRecv()) {
      if (r.localBlockIds().length == 0) {
        // Aborted before it was scheduled (or nothing to load): still tell P to free its blocks.
        withTpSizeOf(
            r.remoteEngineId(),
            prefillTp -> {
              for (int source : sourcesFor(prefillTp)) {
                sendTo(r.remoteEngineId(), source, release(r.transferId()));
              }
            });
        continue;
      }
      tracker.tell(
          new RequestTrackerActor.ExpectReceive(r.requestId(), r.transferId(), r.remoteEngineId()));
      withTpSizeOf(
          r.remoteEngineId(),
          prefillTp -> {
            int[] sources = sourcesFor(prefillTp);
            reads.put(r.transferId(), new ReadJob(r, sources, setup.layerRegions().size()));
            for (int source : sources) {
              readsAwaitingPeer
                  .computeIfAbsent(r.remoteEngineId() + "/tp" + source, k -> new ArrayList<>())
                  .add(r);
              handshake.tell(
                  new HandshakeActor.Fetch(r.remoteEngineId(), source, readHandshakeAdapter));
            }
          });
    }
    return this;
  }

  private Behavior<Command> onReadPeerReady(ReadPeerReady m) {
    HandshakeActor.Result result = m.result();
    List<ReqMeta> waiting =
        readsAwaitingPeer.remove(result.engineId() + "/tp" + result.tpRank());
    if (waiting == null) {
      return this;
    }
    for (ReqMeta r : waiting) {
      ReadJob job = reads.get(r.transferId());
      if (job == null) {
        continue; // failed already through another P worker
      }
      if (result instanceof HandshakeActor.Failed f) {
        failRead(job, f.reason());
      } else if (result instanceof HandshakeActor.Ready ready) {
        startReads(job, ready.metadata());
      }
    }
    return this;
  }

  private void startReads(ReadJob job, AgentMetadata peer) {
    ReqMeta r = job.request;
    TransferBatch plan;
    try {
      // A prefix-cache hit on D leaves fewer local blocks: read the tail of P's list.
      plan =
          PeerPlanning.plan(
              planner, setup.geometry(), self.tpRank(), self.tpSize(), peer, r.localBlockIds(),
              r.remoteBlockIds(), true);
    } catch (InvalidBlockIdsException e) {
      failRead(job, "request " + r.requestId() + ": " + e.getMessage());
      return;
    }
    List<MemoryRegion> regions = setup.layerRegions();
    int source = peer.tpRank();
    for (int layer = 0; layer < regions.size(); layer++) {
      MemoryRegion local = regions.get(layer);
      RegionDescriptor remote = peer.layers().get(layer);
      int l = layer;
      CompletableFuture<TransferStatus> done =
          CompletableFuture.supplyAsync(() -> setup.transport().read(local, remote, plan), io)
              .thenCompose(TransferStatus::completion);
      getContext()
          .pipeToSelf(
              done,
              (status, error) ->
                  new LayerRead(
                      r.transferId(),
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
    if (!m.status().succeeded()) {
      String from =
          job.request.remoteEngineId()
              + (m.prefillTpRank() == self.tpRank() ? "" : "/tp" + m.prefillTpRank());
      failRead(
          job,
          "reading layer " + m.layer() + " from " + from + " failed: "
              + m.status().failureMessage());
      return this;
    }
    job.bytes += m.status().bytesMoved();
    if (--job.remaining == 0) {
      reads.remove(m.transferId());
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(m.transferId(), job.bytes));
      for (int source : job.sources) {
        sendTo(job.request.remoteEngineId(), source, release(m.transferId()));
      }
    }
    return this;
  }

  private void failRead(ReadJob job, String reason) {
    ReqMeta r = job.request;
    reads.remove(r.transferId());
    tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(), reason));
    // P keeps the blocks for us until released: let them go now rather than at its deadline.
    for (int source : job.sources) {
      sendTo(r.remoteEngineId(), source, release(r.transferId()));
    }
  }

  // ---- membership ----

  private void sendTo(String engineId, int tpRank, Command message) {
    send(new Outgoing(engineId, tpRank, message, System.nanoTime()));
  }

  private void send(Outgoing o) {
    var entry = directory.find(o.engineId(), o.tpRank());
    if (entry.isPresent()) {
      entry.get().ref().tell(o.message());
      return;
    }
    // Not listed yet (it may have just joined). Held no longer than a transfer may take, and
    // never more than the terminal-id capacity: a peer naming engines that never come (bad
    // kv_transfer_params, a typo) must not grow this list without bound.
    if (System.nanoTime() - o.heldSinceNanos() > setup.settings().transferTimeout().toNanos()) {
      getContext().getLog().warn("{} never joined; dropping {}", o.engineId(), o.message());
      return;
    }
    if (awaitingPeer.size() >= setup.settings().terminalIdCapacity()) {
      Outgoing oldest = awaitingPeer.poll();
      getContext().getLog().warn("too many messages held for engines not listed; dropping {} for {}",
          oldest.message(), oldest.engineId());
    }
    getContext().getLog().debug("{} not listed yet; holding {}", o.engineId(), o.message());
    awaitingPeer.add(o);
  }

  private Behavior<Command> onListingChanged(ListingChanged m) {
    for (Role role : Role.values()) {
      if (m.listing().isForKey(serviceKey(role))) {
        listings.put(role, EngineDirectory.of(m.listing().getServiceInstances(serviceKey(role))));
      }
    }
    EngineDirectory merged = EngineDirectory.EMPTY;
    for (EngineDirectory d : listings.values()) {
      merged = merged.merge(d);
    }
    directory = merged;
    handshake.tell(new HandshakeActor.DirectoryChanged(merged));
    writer.tell(new WriterActor.DirectoryChanged(merged));
    tracker.tell(new RequestTrackerActor.DirectoryChanged(merged));
    List<AwaitingTpSize> needTp = new ArrayList<>(awaitingTpSize);
    awaitingTpSize.clear();
    needTp.forEach(a -> withTpSizeOf(a.engineId(), a.action()));
    List<Outgoing> held = new ArrayList<>(awaitingPeer);
    awaitingPeer.clear();
    held.forEach(this::send);
    return this;
  }
}
