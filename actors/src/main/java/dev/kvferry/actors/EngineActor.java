package dev.kvferry.actors;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.TerminalIds;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TensorParallelSplit;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.EventOrderedTransport;
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
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.IntConsumer;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.DispatcherSelector;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;
import org.jspecify.annotations.Nullable;

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
   * From this worker's writer: send {@code message} to worker {@code tpRank} of {@code engineId},
   * held while that engine is not listed (like every message of ours to a peer).
   */
  public record SendToPeer(String engineId, int tpRank, Command message)
      implements Command, LocalOnly {}

  /**
   * From this worker's handshake actor: a peer worker incarnation left (or restarted); its
   * transport state (idle connections, IPC mappings, copy streams) is released.
   */
  public record PeerGone(AgentMetadata metadata) implements Command, LocalOnly {}

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
     * {@code doneWords} (cuda transport, same host): the name of D's done-word file, opened by P
     * only if it is a kvferry done-word file under /dev/shm (SharedDoneWords.openPeerWords); P's
     * copy stream
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

  /**
   * Either way: the sender, worker {@code senderTpRank} of engine {@code engineId} (-1: the
   * receiver's own rank), ended a transfer with the reason. From P it also says that no copy of
   * its will touch D's blocks any more (P sends it only once its writes in flight have landed);
   * from D it asks P to abandon, and P answers with its own TransferFailed.
   */
  public record TransferFailed(String transferId, String engineId, String reason, int senderTpRank)
      implements Command, CborSerializable {
    public TransferFailed(String transferId, String engineId, String reason) {
      this(transferId, engineId, reason, -1);
    }
  }

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

  private record ReadPeerReady(@Nullable ReqMeta request, HandshakeActor.Result result) implements Command, LocalOnly {}

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
    /** By layer: reads (one per source) not yet landed. */
    final int[] layerRemaining;
    long bytes;
    /** Layer reads handed to the transport and not finished. */
    int inFlight;
    /** Why it is ending; non-null: no read starts, the ending waits for inFlight == 0. */
    @Nullable String failure;
    /** Seen by reads still queued on the io pool: they skip their copies. */
    final AtomicBoolean cancelled =
        new AtomicBoolean();

    ReadJob(ReqMeta request, int[] sources, int layers) {
      this.request = request;
      this.sources = sources;
      this.remaining = layers * sources.length;
      this.layerRemaining = new int[layers];
      java.util.Arrays.fill(layerRemaining, sources.length);
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
  private @Nullable DoneWordWatcher doneWords;
  private boolean doneWordsUnavailable;
  /** Whether P's transport can store a done word behind its copies (resolved once). */
  private final boolean peersCanStoreDoneWords;
  private final ActorRef<HandshakeActor.Result> readHandshakeAdapter;
  private final Map<String, ReadJob> reads = new HashMap<>();
  private final Map<String, List<ReqMeta>> readsAwaitingPeer = new HashMap<>();
  /** Messages to peers not listed yet, flushed when they appear (or dropped after the transfer timeout). */
  private final ArrayDeque<Outgoing> awaitingPeer = new ArrayDeque<>();
  private final Map<Role, EngineDirectory> listings = new HashMap<>();
  private EngineDirectory directory = EngineDirectory.EMPTY;
  private final TransferPlanner planner = new TransferPlanner(); // not thread-safe: one per actor

  private record Outgoing(String engineId, int tpRank, Command message, long heldSinceNanos) {}

  /**
   * Work that needs a peer engine's TP size, held until one of its workers is listed; dropped
   * when its transfer ends, and never more than the terminal-id capacity.
   */
  private record AwaitingTpSize(String engineId, String transferId, IntConsumer action) {}

  private final ArrayDeque<AwaitingTpSize> awaitingTpSize = new ArrayDeque<>();

  /**
   * D, WRITE: a receive this worker began and has not ended. Its blocks go back to the engine only
   * once no P worker can still write into them: each has said WriteDone or TransferFailed, or its
   * engine left the cluster (DESIGN.md section 3, block lifetime).
   */
  private static final class Incoming {
    final ReqMeta request;
    /** P workers told our blocks that have not finished; null until P's TP size is known. */
    @Nullable Set<Integer> mayWrite;
    /** Why it is ending; non-null: P was asked to abandon and we wait for mayWrite to empty. */
    @Nullable String failure;

    Incoming(ReqMeta request) {
      this.request = request;
    }
  }

  private final Map<String, Incoming> incoming = new HashMap<>();
  /** D: transfers a P worker ended before this worker began them; they never begin. */
  private final TerminalIds endedEarly;
  /** P, READ, D with another TP size: the D workers that released so far, by transfer id. */
  private final Map<String, Set<Integer>> releasesSeen;

  public static Behavior<Command> create(Setup setup) {
    return Behaviors.setup(ctx -> new EngineActor(ctx, setup));
  }

  private EngineActor(ActorContext<Command> ctx, Setup setup) {
    super(ctx);
    this.setup = setup;
    // The same transport kind on both sides: ours tells what P's can do.
    this.peersCanStoreDoneWords = setup.transport() instanceof EventOrderedTransport;
    this.self = setup.identity();
    this.endedEarly =
        new TerminalIds(setup.settings().terminalIdCapacity());
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
    this.handshake =
        ctx.spawn(HandshakeActor.create(local, setup.settings(), ctx.getSelf()), "handshake");
    this.tracker =
        ctx.spawn(
            RequestTrackerActor.create(self.label(), setup.settings(), setup.sink(), ctx.getSelf()),
            "tracker");
    this.writer =
        ctx.spawn(
            WriterActor.create(
                self, setup.geometry(), setup.layerRegions(), setup.transport(), io,
                setup.settings(), handshake, tracker, ctx.getSelf()),
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
        .onMessage(TransferFailed.class, this::onTransferFailed)
        .onMessage(ReceiveOverdue.class, m -> {
          endTransfer(m.transferId(), m.reason());
          return this;
        })
        .onMessage(ReleaseOverdue.class, this::onReleaseOverdue)
        .onMessage(AbortReceive.class, this::onAbortReceive)
        .onMessage(PeerGone.class, m -> {
          // The writer owns what is mapped for a decode peer (its done words): it releases both.
          writer.tell(new WriterActor.PeerGone(m.metadata()));
          return this;
        })
        .onMessage(SendToPeer.class, m -> {
          sendTo(m.engineId(), m.tpRank(), m.message());
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
              // The writer tells D once none of its writes can still land in D's blocks.
              writer.tell(new WriterActor.Abandon(m.transferId(), m.reason(), m.decodeEngineId()));
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
          reads.values().forEach(j -> j.cancelled.set(true)); // queued reads skip their copies
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
        new RequestTrackerActor.ExpectReceive(
            r.requestId(), r.transferId(), r.remoteEngineId(), r.localBlockIds()));
    if (endedEarly.contains(r.transferId()) || incoming.containsKey(r.transferId())) {
      // P gave up already (the tracker fails it at once), or the id is a duplicate (refused):
      // nobody is told these blocks.
      return this;
    }
    Incoming in = new Incoming(r);
    incoming.put(r.transferId(), in);
    withTpSizeOf(
        r.remoteEngineId(),
        r.transferId(),
        prefillTp -> {
          if (incoming.get(r.transferId()) != in || in.failure != null) {
            return;
          }
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
                      self.dpRank(), self.tpRank(), ticket.name(), ticket.slots(), ticket.slot(),
                      ticket.value());
          Optional<String> tooBig =
              messageLimit.whyNotSendable(blocks, r.localBlockIds().length,
                  "the list of " + r.localBlockIds().length + " block ids of request "
                      + r.requestId());
          if (tooBig.isPresent()) {
            forgetDoneWord(r.transferId());
            // Artery would drop it and P would wait for its defer timeout: fail both sides now
            // (P never had our blocks, so nothing can land in them).
            incoming.remove(r.transferId());
            tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(), tooBig.get()));
            for (int source : sources) {
              sendTo(r.remoteEngineId(), source,
                  new TransferFailed(r.transferId(), self.engineId(), tooBig.get(),
                      self.tpRank()));
            }
            return;
          }
          in.mayWrite = due;
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
  private DoneWordWatcher.@Nullable Ticket doneWordTicket(String transferId) {
    if (!peersCanStoreDoneWords) {
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
    Incoming in = incoming.get(m.transferId());
    if (in != null && in.mayWrite != null && in.mayWrite.size() == 1) {
      onWriteDone(new WriteDone(m.transferId(), "", in.mayWrite.iterator().next()));
    }
    return this;
  }

  private Behavior<Command> onWriteDone(WriteDone m) {
    forgetDoneWord(m.transferId());
    Incoming in = incoming.get(m.transferId());
    if (in == null) {
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(m.transferId(), 0)); // ignored if ended
      return this;
    }
    if (in.mayWrite != null) {
      in.mayWrite.remove(m.producerTpRank() < 0 ? self.tpRank() : m.producerTpRank());
      if (!in.mayWrite.isEmpty()) {
        return this; // other P workers still write their heads
      }
    }
    incoming.remove(m.transferId());
    dropHeldWork(m.transferId(), null);
    if (in.failure != null) {
      // Ending already (we asked P to abandon): the engine was promised a failure.
      tracker.tell(new RequestTrackerActor.TransferFailed(m.transferId(), in.failure));
    } else {
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(m.transferId(), 0));
    }
    return this;
  }

  private Behavior<Command> onTransferFailed(TransferFailed m) {
    String reason = "engine " + m.engineId() + ": " + m.reason();
    int senderRank = m.senderTpRank() < 0 ? self.tpRank() : m.senderTpRank();
    if (self.role() == Role.PREFILL) {
      // P, WRITE: D gave up (maybe before P finished prefill): no write may start; once those in
      // flight landed the writer confirms to D, and the request's blocks are freed then or as
      // soon as its layers are saved.
      tracker.tell(new RequestTrackerActor.TransferFailed(m.transferId(), reason));
      writer.tell(new WriterActor.Abandon(m.transferId(), reason, m.engineId()));
      return this;
    }
    forgetDoneWord(m.transferId());
    Incoming in = incoming.get(m.transferId());
    if (in != null) {
      if (in.mayWrite != null) {
        in.mayWrite.remove(senderRank); // that P worker writes no more
      }
      endTransfer(m.transferId(), reason);
    } else if (reads.containsKey(m.transferId()) || isHeld(m.transferId())) {
      endTransfer(m.transferId(), reason); // P wants its blocks back: stop reading, then release
    } else {
      // Not begun here (or over): it never begins, and P, if it waits for a release, gets one.
      endedEarly.add(m.transferId());
      tracker.tell(new RequestTrackerActor.TransferFailed(m.transferId(), reason));
      if (self.mode() == dev.kvferry.actors.connector.TransferMode.READ) {
        sendTo(m.engineId(), senderRank, release(m.transferId()));
      }
    }
    return this;
  }

  private Behavior<Command> onAbortReceive(AbortReceive m) {
    if (incoming.containsKey(m.transferId()) || reads.containsKey(m.transferId())
        || isHeld(m.transferId())) {
      endTransfer(m.transferId(), m.reason());
    } else {
      tracker.tell(
          new RequestTrackerActor.ReportAborted(m.requestId(), m.transferId(), m.reason()));
    }
    return this;
  }

  /**
   * D: ends a receive that will not complete (timeout, abort, P's failure, P gone). Work held for
   * it is dropped; P is asked to abandon; the failure (with the blocks as load errors) is reported
   * once no copy can land in the blocks: every P worker told them confirmed or left (WRITE), every
   * read of ours finished (READ).
   */
  private void endTransfer(String transferId, String reason) {
    Incoming in = incoming.get(transferId);
    ReadJob job = reads.get(transferId);
    if (in != null) {
      if (in.failure == null) {
        in.failure = reason;
        forgetDoneWord(transferId);
        dropHeldWork(transferId, in);
        if (in.mayWrite != null) {
          for (int source : in.mayWrite) {
            sendTo(in.request.remoteEngineId(), source,
                new TransferFailed(transferId, self.engineId(), reason, self.tpRank()));
          }
        }
      }
      if (in.mayWrite == null || in.mayWrite.isEmpty()) {
        incoming.remove(transferId);
        tracker.tell(new RequestTrackerActor.TransferFailed(transferId, in.failure));
      }
    } else if (job != null) {
      endRead(job, reason);
    } else {
      dropHeldWork(transferId, null);
      tracker.tell(new RequestTrackerActor.TransferFailed(transferId, reason));
    }
  }

  private boolean isHeld(String transferId) {
    for (AwaitingTpSize a : awaitingTpSize) {
      if (transferId.equals(a.transferId())) {
        return true;
      }
    }
    return false;
  }

  /**
   * Drops work held for a transfer that ended: actions waiting for a peer's TP size, and our
   * blocks announced to P workers not listed yet (those P workers can then never write).
   */
  private void dropHeldWork(String transferId, @Nullable Incoming in) {
    awaitingTpSize.removeIf(a -> transferId.equals(a.transferId()));
    awaitingPeer.removeIf(o -> {
      if (o.message() instanceof RemoteBlocks b && b.transferId().equals(transferId)) {
        if (in != null && in.mayWrite != null) {
          in.mayWrite.remove(o.tpRank());
        }
        return true;
      }
      return false;
    });
  }

  /** P, READ: D did not release in time; ask the D workers that read from us to let go. */
  private Behavior<Command> onReleaseOverdue(ReleaseOverdue m) {
    OptionalInt decodeTp = PeerPlanning.tpSizeOf(directory, m.decodeEngineId());
    int[] readers =
        decodeTp.isEmpty() || decodeTp.getAsInt() == self.tpSize()
            ? new int[] {self.tpRank()}
            : TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), decodeTp.getAsInt(),
                mla());
    String reason =
        "prefill engine " + self.engineId() + " waited "
            + setup.settings().readAbortTimeout().toMillis() + " ms for transfer "
            + m.transferId() + " to be read; release its blocks";
    for (int reader : readers) {
      sendTo(m.decodeEngineId(), reader,
          new TransferFailed(m.transferId(), self.engineId(), reason, self.tpRank()));
    }
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
    // P's bookkeeping of releases seen; entries of finished transfers go, so eviction only
    // bounds what a misbehaving peer can make us hold.
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

  /**
   * Runs {@code action} with the TP size of {@code engineId} now if it is listed, else later
   * (dropped when transfer {@code transferId} ends).
   */
  private void withTpSizeOf(String engineId, String transferId, IntConsumer action) {
    OptionalInt tp = PeerPlanning.tpSizeOf(directory, engineId);
    if (tp.isPresent()) {
      action.accept(tp.getAsInt());
    } else {
      // Not listed yet (it may have just joined); the transfer's deadline ends the wait, and the
      // list is bounded so engines that never come cannot grow it.
      getContext().getLog().debug("{} not listed yet; holding work that needs its TP size", engineId);
      if (awaitingTpSize.size() >= setup.settings().terminalIdCapacity()) {
        AwaitingTpSize oldest = awaitingTpSize.poll();
        getContext().getLog().warn(
            "too much work held for engines not listed; dropping work of transfer {} for {}",
            oldest.transferId(), oldest.engineId());
      }
      awaitingTpSize.add(new AwaitingTpSize(engineId, transferId, action));
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
            s.transferId(),
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
            r.transferId(),
            prefillTp -> {
              for (int source : sourcesFor(prefillTp)) {
                sendTo(r.remoteEngineId(), source, release(r.transferId()));
              }
            });
        continue;
      }
      tracker.tell(
          new RequestTrackerActor.ExpectReceive(
              r.requestId(), r.transferId(), r.remoteEngineId(), r.localBlockIds()));
      if (endedEarly.contains(r.transferId()) || reads.containsKey(r.transferId())
          || isHeld(r.transferId())) {
        continue; // P gave up already, or a duplicate id: the tracker reports it; nothing is read
      }
      withTpSizeOf(
          r.remoteEngineId(),
          r.transferId(),
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
        endRead(job, f.reason());
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
    TransferBatch plan;
    try {
      // A prefix-cache hit on D leaves fewer local blocks: read the tail of P's list.
      plan =
          PeerPlanning.plan(
              planner, setup.geometry(), self.tpRank(), self.tpSize(), peer, r.localBlockIds(),
              r.remoteBlockIds(), true);
    } catch (InvalidBlockIdsException e) {
      endRead(job, "request " + r.requestId() + ": " + e.getMessage());
      return;
    }
    List<MemoryRegion> regions = setup.layerRegions();
    int source = peer.tpRank();
    for (int layer = 0; layer < regions.size(); layer++) {
      MemoryRegion local = regions.get(layer);
      RegionDescriptor remote = peer.layers().get(layer);
      int l = layer;
      AtomicBoolean cancelled = job.cancelled;
      job.inFlight++;
      CompletableFuture<TransferStatus> done =
          CompletableFuture.supplyAsync(
                  () ->
                      cancelled.get()
                          ? TransferStatus.failed("transfer ended before this layer was read")
                          : setup.transport().read(local, remote, plan),
                  io)
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
    job.inFlight--;
    if (job.failure != null) {
      endRead(job, job.failure);
      return this;
    }
    if (!m.status().succeeded()) {
      String from =
          job.request.remoteEngineId()
              + (m.prefillTpRank() == self.tpRank() ? "" : "/tp" + m.prefillTpRank());
      endRead(
          job,
          "reading layer " + m.layer() + " from " + from + " failed: "
              + m.status().failureMessage());
      return this;
    }
    job.bytes += m.status().bytesMoved();
    if (--job.layerRemaining[m.layer()] == 0) {
      setup.sink().layerLoads().layerLanded(m.transferId(), m.layer()); // waitForLayerLoad
    }
    if (--job.remaining == 0) {
      reads.remove(m.transferId());
      tracker.tell(new RequestTrackerActor.ReceiveSucceeded(m.transferId(), job.bytes));
      for (int source : job.sources) {
        sendTo(job.request.remoteEngineId(), source, release(m.transferId()));
      }
    }
    return this;
  }

  /**
   * Ends a read that will not complete. Reads already handed to the transport may still land in
   * our blocks (and read P's), so the failure is reported and P released only once every one of
   * them has finished.
   */
  private void endRead(ReadJob job, String reason) {
    if (job.failure == null) {
      job.failure = reason;
      job.cancelled.set(true);
    }
    if (job.inFlight > 0) {
      return;
    }
    ReqMeta r = job.request;
    reads.remove(r.transferId());
    tracker.tell(new RequestTrackerActor.TransferFailed(r.transferId(), job.failure));
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

  /**
   * D: receives from a P engine that was listed and is gone (downed) end: it writes no more. Reads
   * of ours from it still wait for the copies in flight before the blocks go back.
   */
  private void endTransfersWithPeersGone(EngineDirectory before, EngineDirectory now) {
    List<String> ending = new ArrayList<>();
    for (Incoming in : incoming.values()) {
      String p = in.request.remoteEngineId();
      if (before.contains(p) && !now.contains(p)) {
        if (in.mayWrite != null) {
          in.mayWrite.clear();
        }
        ending.add(in.request.transferId());
      }
    }
    for (ReadJob job : reads.values()) {
      String p = job.request.remoteEngineId();
      if (before.contains(p) && !now.contains(p)) {
        ending.add(job.request.transferId());
      }
    }
    for (String transferId : ending) {
      Incoming in = incoming.get(transferId);
      ReadJob read = reads.get(transferId);
      String peer =
          in != null ? in.request.remoteEngineId()
              : read != null ? read.request.remoteEngineId() : "?";
      endTransfer(transferId,
          "prefill engine " + peer + " left the cluster during transfer " + transferId);
    }
  }

  /**
   * Another worker is listed under our engine id and TP rank: say so, naming both. Every node
   * routes to the same one of the two (see {@link EngineDirectory#of}); the other gets no
   * transfer while both are listed (a restarted engine whose old incarnation is not yet removed
   * takes over once it is).
   */
  private void refuseIfDuplicate(EngineDirectory merged) {
    for (EngineDirectory.Duplicate d : merged.duplicates()) {
      if (d.engineId().equals(self.engineId()) && reportedDuplicates.add(d.message())) {
        getContext().getLog().error(d.message());
      }
    }
    if (reportedDuplicates.size() > 64) {
      reportedDuplicates.clear(); // bounded; a duplicate still listed is reported again
    }
  }

  private final Set<String> reportedDuplicates = new HashSet<>();
  /** The reachable worker with our engine id and TP rank that every node routes to instead. */
  private @Nullable ActorRef<Command> displacedBy;

  /**
   * Refuses this worker while another reachable worker holds its engine id and TP rank and every
   * node routes to that one (see {@link EngineDirectory#of}): it leaves the listing, so no
   * transfer reaches it, and says so naming both. It takes over once that worker is gone (a
   * restarted engine whose old incarnation had not been removed yet).
   */
  private void refuseOrResume(
      Set<ActorRef<Command>> reachable, @Nullable EngineDirectory ownRole) {
    ActorRef<Receptionist.Command> receptionist = getContext().getSystem().receptionist();
    if (displacedBy != null) {
      if (!reachable.contains(displacedBy)) {
        getContext().getLog().info("{}: the worker {} that displaced it is gone; serving again",
            self.label(), displacedBy.path());
        displacedBy = null;
        receptionist.tell(Receptionist.register(serviceKey(self.role()), getContext().getSelf()));
      }
      return;
    }
    if (ownRole == null) {
      return;
    }
    for (EngineDirectory.Duplicate d : ownRole.duplicates()) {
      if (d.refused().equals(getContext().getSelf()) && reachable.contains(d.kept())) {
        getContext().getLog().error("{}: refused: {}", self.label(), d.message());
        displacedBy = d.kept();
        receptionist.tell(Receptionist.deregister(serviceKey(self.role()), getContext().getSelf()));
        return;
      }
    }
  }

  private Behavior<Command> onListingChanged(ListingChanged m) {
    EngineDirectory before = directory;
    for (Role role : Role.values()) {
      if (m.listing().isForKey(serviceKey(role))) {
        // Unreachable workers too: one that is unreachable may still copy (a partition heals), so
        // only a worker the cluster downed and removed counts as gone (block lifetime rule).
        listings.put(role,
            EngineDirectory.of(m.listing().getAllServiceInstances(serviceKey(role))));
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
    refuseIfDuplicate(merged);
    if (m.listing().isForKey(serviceKey(self.role()))) {
      refuseOrResume(m.listing().getServiceInstances(serviceKey(self.role())),
          listings.get(self.role()));
    }
    endTransfersWithPeersGone(before, merged);
    List<AwaitingTpSize> needTp = new ArrayList<>(awaitingTpSize);
    awaitingTpSize.clear();
    needTp.forEach(a -> withTpSizeOf(a.engineId(), a.transferId(), a.action()));
    List<Outgoing> held = new ArrayList<>(awaitingPeer);
    awaitingPeer.clear();
    held.forEach(this::send);
    return this;
  }
}
