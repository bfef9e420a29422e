package dev.kvferry.actors;

import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
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
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.javadsl.TimerScheduler;

/**
 * P's per-layer write queue (WRITE mode). A layer's write waits until three things are there: D's
 * remote blocks, D's metadata (handshake) and the layer's compute event (with the cuda transport
 * and a {@link CudaLayerEvent}, the GPU waits for that one: the copies are queued behind it on the
 * copy stream and no thread waits); then the request's plan
 * (computed once, shared by all layers) is written on the I/O executor. Completed writes are
 * counted; once the expected count is sealed after the forward pass and reached, P tells D "write
 * done" and reports the request done sending. Replaces the seed's MoRIIOWriter thread, its
 * deferred list and event.synchronize().
 */
public final class WriterActor extends AbstractBehavior<WriterActor.Command> {

  public sealed interface Command extends LocalOnly {}

  /** One layer of one request is to be written once its event fires. */
  public record SaveLayer(ReqMeta request, int layer, LayerEvent event) implements Command {}

  /** After the forward pass: {@code layers} writes were scheduled for each of these requests. */
  public record Seal(List<ReqMeta> requests, int layers) implements Command {}

  /** D's blocks for a transfer (may arrive before or after the layers are saved). */
  public record RemoteBlocksArrived(EngineActor.RemoteBlocks blocks) implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  /**
   * A peer worker incarnation left (from the handshake, through the worker): its transport state
   * is released and, when it was a decode engine whose done words we mapped, those are unmapped
   * after its copy streams have drained (a store into them may still be queued).
   */
  public record PeerGone(dev.kvferry.actors.engine.AgentMetadata metadata) implements Command {}

  /**
   * The transfer will not happen (aborted on either side, or D gave up): no write starts any
   * more; once the writes in flight have landed, D is told (the confirmation it waits for before
   * freeing its blocks) and the request's blocks are freed if it was saved.
   *
   * @param decodeEngineId the decode engine to tell even if this worker never had the transfer
   *     (it may be waiting for our confirmation); empty: tell it only about a job we have
   */
  public record Abandon(String transferId, String reason, String decodeEngineId)
      implements Command {
    public Abandon(String transferId, String reason) {
      this(transferId, reason, "");
    }
  }

  /**
   * Lists the writes in progress (state "writing", with their {@link
   * RequestTrackerActor.WriteProgress}) and hands them to {@code tracker}, which answers {@code
   * replyTo} with them and its own transfers.
   */
  public record ListWrites(
      ActorRef<RequestTrackerActor.Command> tracker,
      ActorRef<RequestTrackerActor.Snapshot> replyTo) implements Command {}

  private record LayerFired(String transferId, int layer) implements Command {}

  private record PeerReady(String transferId, HandshakeActor.Result result) implements Command {}

  private record LayerWritten(String transferId, int decodeTpRank, int layer, TransferStatus status)
      implements Command {}

  private record DeferExpired(String transferId) implements Command {}

  /** One D worker this P worker writes a request's KV into. */
  private static final class Target {
    final int tpRank;
    int @Nullable [] remoteBlockIds;
    @Nullable AgentMetadata peer;
    @Nullable ActorRef<EngineActor.Command> decodeRef;
    @Nullable TransferBatch plan;
    /** How many of the job's fired layers have been issued to this target. */
    int issued;
    boolean handshakeRequested;
    /** D's done word for this target (cuda transport), from its RemoteBlocks; null: none. */
    EngineActor.@Nullable RemoteBlocks doneWord;
    /** With a done word: each issued layer's submission (copies queued, not yet done). */
    final List<CompletableFuture<?>> submitted = new ArrayList<>();
    boolean doneWordQueued;

    Target(int tpRank) {
      this.tpRank = tpRank;
    }
  }

  /** Everything known about one request's writes. */
  private static final class WriteJob {
    final String transferId;
    final long startedMs = System.currentTimeMillis();
    @Nullable String requestId;
    @Nullable String decodeEngineId;
    int @Nullable [] localBlockIds;
    /**
     * D's workers to write into, once D's TP size is known: with equal TP sizes the worker of our
     * rank; otherwise those whose heads overlap ours (MLA: maybe none).
     */
    int @Nullable [] targetRanks;
    /** By D TP rank; remote blocks may come before the targets are known. */
    final Map<Integer, Target> targets = new HashMap<>();
    /** Layers whose compute event fired, in firing order; each target issues them in turn. */
    final List<Integer> firedLayers = new ArrayList<>();
    /** Layers whose copies wait for their compute event on the GPU, not here. */
    final Map<Integer, CudaEvent> gpuEvents = new HashMap<>();
    int inFlight;
    int completed;
    int expected = -1;
    long bytes;
    boolean probeRequested;
    /** Why the job is ending; non-null: no write starts, the ending waits for inFlight == 0. */
    @Nullable String failure;
    /** Seen by submissions still queued on the io pool: they skip their copies. */
    final AtomicBoolean cancelled =
        new AtomicBoolean();

    WriteJob(String transferId) {
      this.transferId = transferId;
    }

    boolean saved() {
      return localBlockIds != null;
    }

    Target target(int tpRank) {
      return targets.computeIfAbsent(tpRank, Target::new);
    }

    boolean isTarget(int tpRank) {
      if (targetRanks == null) {
        return false;
      }
      for (int r : targetRanks) {
        if (r == tpRank) {
          return true;
        }
      }
      return false;
    }
  }

  private static final org.slf4j.Logger log = org.slf4j.LoggerFactory.getLogger(WriterActor.class);

  private final EngineIdentity self;
  private final KvCacheGeometry geometry;
  private final List<MemoryRegion> layerRegions;
  private final Transport transport;
  /** The transport's GPU ordering (copies behind CUDA events, done words), resolved once. */
  private final @Nullable EventOrderedTransport eventOrdered;
  private final Executor io;
  private final ConnectorSettings settings;
  private final ActorRef<HandshakeActor.Command> handshake;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  /** The worker: it holds messages for engines not listed yet instead of dropping them. */
  private final ActorRef<EngineActor.Command> owner;
  private final TimerScheduler<Command> timers;
  private final Map<String, WriteJob> jobs = new HashMap<>();
  private final TerminalIds terminal;
  private final ActorRef<HandshakeActor.Result> handshakeAdapter;
  private EngineDirectory directory = EngineDirectory.EMPTY;
  private final TransferPlanner planner = new TransferPlanner(); // not thread-safe: one per actor
  /** D's done-word files, mapped for our GPUs, by path (cuda transport only). */
  private final Map<String, SharedDoneWords> doneWords = new HashMap<>();
  /** Which decode engine each mapped done-word file belongs to, to unmap it when it leaves. */
  private final Map<String, String> doneWordsOwner = new HashMap<>();
  private final Set<String> unusableDoneWords = new HashSet<>();

  public static Behavior<Command> create(
      EngineIdentity self,
      KvCacheGeometry geometry,
      List<MemoryRegion> layerRegions,
      Transport transport,
      Executor io,
      ConnectorSettings settings,
      ActorRef<HandshakeActor.Command> handshake,
      ActorRef<RequestTrackerActor.Command> tracker,
      ActorRef<EngineActor.Command> owner) {
    return Behaviors.setup(
        ctx ->
            Behaviors.withTimers(
                timers ->
                    new WriterActor(
                        ctx, timers, self, geometry, layerRegions, transport, io, settings,
                        handshake, tracker, owner)));
  }

  private WriterActor(
      ActorContext<Command> ctx,
      TimerScheduler<Command> timers,
      EngineIdentity self,
      KvCacheGeometry geometry,
      List<MemoryRegion> layerRegions,
      Transport transport,
      Executor io,
      ConnectorSettings settings,
      ActorRef<HandshakeActor.Command> handshake,
      ActorRef<RequestTrackerActor.Command> tracker,
      ActorRef<EngineActor.Command> owner) {
    super(ctx);
    this.owner = owner;
    this.timers = timers;
    this.self = self;
    this.geometry = geometry;
    this.layerRegions = List.copyOf(layerRegions);
    this.transport = transport;
    this.eventOrdered = transport instanceof EventOrderedTransport e ? e : null;
    this.io = io;
    this.settings = settings;
    this.handshake = handshake;
    this.tracker = tracker;
    this.terminal = new TerminalIds(settings.terminalIdCapacity());
    // The handshake result names the engine, not the transfer: fan it out to waiting jobs.
    this.handshakeAdapter =
        ctx.messageAdapter(HandshakeActor.Result.class, r -> new PeerReady("", r));
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(SaveLayer.class, this::onSaveLayer)
        .onMessage(Seal.class, this::onSeal)
        .onMessage(RemoteBlocksArrived.class, this::onRemoteBlocks)
        .onMessage(LayerFired.class, this::onLayerFired)
        .onMessage(PeerReady.class, this::onPeerReady)
        .onMessage(LayerWritten.class, this::onLayerWritten)
        .onMessage(DeferExpired.class, this::onDeferExpired)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .onMessage(Abandon.class, this::onAbandon)
        .onMessage(ListWrites.class, this::onListWrites)
        .onMessage(PeerGone.class, this::onPeerGone)
        .onSignal(PostStop.class, sig -> {
          // Submissions still queued on the io pool skip their copies: the transport may close.
          jobs.values().forEach(j -> j.cancelled.set(true));
          doneWords.values().forEach(SharedDoneWords::close);
          return this;
        })
        .build();
  }

  private WriteJob job(String transferId) {
    return jobs.computeIfAbsent(
        transferId,
        id -> {
          WriteJob j = new WriteJob(id);
          // The seed's defer timeout: a write whose remote blocks never come fails.
          timers.startSingleTimer(id, new DeferExpired(id), settings.deferTimeout());
          return j;
        });
  }

  private Behavior<Command> onSaveLayer(SaveLayer m) {
    ReqMeta r = m.request();
    if (terminal.contains(r.transferId())) {
      // Ended before this layer was saved (D left, D aborted): make sure P still frees the
      // request's blocks. The tracker ignores repeats for the same transfer.
      tracker.tell(
          new RequestTrackerActor.SendFinished(
              r.requestId(), r.transferId(), "transfer " + r.transferId() + " already ended", 0));
      return this;
    }
    WriteJob j = job(r.transferId());
    if (!j.saved()) {
      j.requestId = r.requestId();
      j.decodeEngineId = r.remoteEngineId();
      j.localBlockIds = r.localBlockIds();
    }
    if (m.layer() < 0 || m.layer() >= layerRegions.size()) {
      // Saved (handed to us by the engine), so its blocks are freed when the job has ended.
      fail(j, "layer " + m.layer() + " is not registered (have " + layerRegions.size() + ")",
          r.requestId());
      return this;
    }
    if (j.failure != null) {
      return this; // ending: its blocks are freed (it is saved now) once its copies have landed
    }
    learnTargets(j);
    String id = r.transferId();
    int layer = m.layer();
    if (m.event() instanceof CudaLayerEvent gpu && eventOrdered != null) {
      // The copy stream waits for the event (cudaStreamWaitEvent): ready now, as far as we care.
      j.gpuEvents.put(layer, gpu.event());
      j.firedLayers.add(layer);
      issueReady(j);
      return this;
    }
    ActorRef<Command> me = getContext().getSelf();
    m.event().whenComplete(() -> me.tell(new LayerFired(id, layer)));
    return this;
  }

  private Behavior<Command> onLayerFired(LayerFired m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      j.firedLayers.add(m.layer());
      issueReady(j);
    }
    return this;
  }

  private Behavior<Command> onRemoteBlocks(RemoteBlocksArrived m) {
    EngineActor.RemoteBlocks b = m.blocks();
    if (terminal.contains(b.transferId())) {
      getContext().getLog().debug("late remote blocks for finished transfer {}", b.transferId());
      return this;
    }
    WriteJob j = job(b.transferId());
    int decodeRank = b.decodeTpRank() < 0 ? self.tpRank() : b.decodeTpRank();
    Target t = j.target(decodeRank);
    if (t.remoteBlockIds != null) {
      getContext().getLog().warn("duplicate remote blocks for transfer {} ignored", b.transferId());
      return this;
    }
    t.remoteBlockIds = b.blockIds();
    if (b.hasDoneWord() && eventOrdered != null) {
      t.doneWord = b;
    }
    if (j.decodeEngineId == null) {
      j.decodeEngineId = b.decodeEngineId();
    }
    if (j.requestId == null) {
      j.requestId = b.requestId();
    }
    issueReady(j);
    return this;
  }

  private Behavior<Command> onPeerReady(PeerReady m) {
    HandshakeActor.Result r = m.result();
    for (WriteJob j : new ArrayList<>(jobs.values())) {
      if (!r.engineId().equals(j.decodeEngineId)) {
        continue;
      }
      if (r instanceof HandshakeActor.Failed f) {
        if (j.targetRanks == null || j.isTarget(r.tpRank())) {
          fail(j, f.reason(), j.requestId);
        }
      } else if (r instanceof HandshakeActor.Ready ready) {
        if (j.targetRanks == null) {
          setTargets(j, ready.metadata().tpSize());
        }
        Target t = j.targets.get(r.tpRank());
        if (t != null && t.peer == null && j.isTarget(r.tpRank())) {
          t.peer = ready.metadata();
        }
        if (jobs.containsKey(j.transferId)) {
          issueReady(j);
        }
      }
    }
    return this;
  }

  /**
   * Finds D's TP size: from the directory when D is listed, else from the handshake with D's
   * worker 0 (which every engine has, and which waits for D to be listed or fails clearly).
   */
  private void learnTargets(WriteJob j) {
    if (j.targetRanks != null || j.decodeEngineId == null) {
      return;
    }
    OptionalInt tp = PeerPlanning.tpSizeOf(directory, j.decodeEngineId);
    if (tp.isPresent()) {
      setTargets(j, tp.getAsInt());
    } else if (!j.probeRequested) {
      j.probeRequested = true;
      handshake.tell(new HandshakeActor.Fetch(j.decodeEngineId, 0, handshakeAdapter));
    }
  }

  private void setTargets(WriteJob j, int decodeTpSize) {
    boolean mla = geometry.layout() == KvCacheGeometry.Layout.MLA;
    j.targetRanks =
        decodeTpSize == self.tpSize()
            ? new int[] {self.tpRank()}
            : TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), decodeTpSize, mla);
    for (int rank : j.targetRanks) {
      Target t = j.target(rank);
      if (!t.handshakeRequested) {
        t.handshakeRequested = true;
        handshake.tell(new HandshakeActor.Fetch(j.decodeEngineId, rank, handshakeAdapter));
      }
    }
    for (Integer rank : new ArrayList<>(j.targets.keySet())) {
      if (!j.isTarget(rank)) {
        getContext().getLog().warn(
            "transfer {}: remote blocks from {}/tp{} ignored: its heads do not overlap ours",
            j.transferId, j.decodeEngineId, rank);
        j.targets.remove(rank);
      }
    }
    completeIfDone(j); // MLA: a rank with nobody to write to is done once sealed
  }

  /**
   * Issues every fired layer of a job to each target whose blocks, metadata, plan and address are
   * known.
   */
  private void issueReady(WriteJob j) {
    if (!j.saved() || j.failure != null) {
      return;
    }
    learnTargets(j);
    if (j.targetRanks == null || j.firedLayers.isEmpty() || !jobs.containsKey(j.transferId)) {
      return;
    }
    for (int rank : j.targetRanks) {
      Target t = j.targets.get(rank);
      if (t == null || t.remoteBlockIds == null || t.peer == null
          || t.issued == j.firedLayers.size()) {
        continue;
      }
      if (t.decodeRef == null) {
        Optional<EngineDirectory.Entry> d = directory.find(j.decodeEngineId, rank);
        if (d.isEmpty()) {
          fail(j, "decode engine " + j.decodeEngineId + " is not a member of the cluster",
              j.requestId);
          return;
        }
        t.decodeRef = d.get().ref();
      }
      if (t.plan == null) {
        try {
          t.plan =
              PeerPlanning.plan(
                  planner, geometry, self.tpRank(), self.tpSize(), t.peer, j.localBlockIds,
                  t.remoteBlockIds, false);
        } catch (InvalidBlockIdsException e) {
          fail(j, "transfer " + j.transferId + " (request " + j.requestId + "): " + e.getMessage(),
              j.requestId);
          return;
        }
      }
      while (t.issued < j.firedLayers.size()) {
        int layer = j.firedLayers.get(t.issued++);
        issue(j, t, layer);
      }
      queueDoneWord(j, t);
    }
  }

  /**
   * Once every layer of a target is queued: the store of D's done word, on the same copy stream,
   * behind them all (queued only after every submission returned, since they run on the io pool
   * in any order). D then learns as soon as the last byte landed; WriteDone still follows.
   */
  private void queueDoneWord(WriteJob j, Target t) {
    if (t.doneWord == null || t.doneWordQueued || j.expected < 0 || t.issued < j.expected
        || t.peer == null || t.peer.layers().isEmpty() || layerRegions.isEmpty()) {
      return;
    }
    t.doneWordQueued = true;
    EngineActor.RemoteBlocks w = t.doneWord;
    SharedDoneWords words = doneWordsOf(w);
    if (words == null) {
      return;
    }
    MemoryRegion local = layerRegions.get(0);
    var remote = t.peer.layers().get(0);
    EventOrderedTransport ordered = eventOrdered;
    if (ordered == null) {
      return;
    }
    String id = j.transferId;
    CompletableFuture.allOf(t.submitted.toArray(CompletableFuture[]::new))
        .thenRunAsync(() -> ordered.signalWhenCopied(local, remote, words.deviceAddress(w.doneSlot()),
            w.doneValue()), io)
        .whenComplete((ok, error) -> {
          if (error != null) {
            log.debug("done word of transfer {} not stored ({}); D learns from WriteDone", id,
                error.toString());
          }
        });
  }

  /** D's done words, mapped for this process's GPUs once per file; null if they cannot be. */
  private @Nullable SharedDoneWords doneWordsOf(EngineActor.RemoteBlocks w) {
    if (unusableDoneWords.contains(w.doneWords())) {
      return null;
    }
    SharedDoneWords words = doneWords.get(w.doneWords());
    if (words == null) {
      try {
        words = SharedDoneWords.openPeerWords(w.doneWords(), w.doneSlots());
        doneWords.put(w.doneWords(), words);
        doneWordsOwner.put(w.doneWords(), w.decodeEngineId());
      } catch (RuntimeException e) {
        unusableDoneWords.add(w.doneWords());
        getContext().getLog().info("done words {} unusable here ({}); D learns from WriteDone",
            w.doneWords(), e.getMessage());
        return null;
      }
    }
    return words;
  }

  private void issue(WriteJob j, Target t, int layer) {
    j.inFlight++;
    MemoryRegion local = layerRegions.get(layer);
    var remote = t.peer.layers().get(layer);
    TransferBatch plan = t.plan;
    CudaEvent after = j.gpuEvents.get(layer);
    EventOrderedTransport ordered = eventOrdered;
    AtomicBoolean cancelled = j.cancelled;
    CompletableFuture<TransferStatus> submission =
        CompletableFuture.supplyAsync(
            () -> {
              if (cancelled.get()) {
                return TransferStatus.failed("transfer abandoned before this layer was written");
              }
              return after != null && ordered != null
                  ? ordered.writeAfter(after, local, remote, plan)
                  : transport.write(local, remote, plan);
            },
            io);
    if (t.doneWord != null) {
      t.submitted.add(submission); // the done word is stored behind every layer's copies
    }
    CompletableFuture<TransferStatus> done = submission.thenCompose(TransferStatus::completion);
    String id = j.transferId;
    int rank = t.tpRank;
    getContext()
        .pipeToSelf(
            done,
            (status, error) ->
                new LayerWritten(
                    id,
                    rank,
                    layer,
                    error != null ? TransferStatus.failed("write raised " + error) : status));
  }

  private Behavior<Command> onListWrites(ListWrites m) {
    List<RequestTrackerActor.TransferView> writes = new ArrayList<>();
    long now = System.currentTimeMillis();
    for (WriteJob j : jobs.values()) {
      if (!j.saved()) {
        continue; // only D's block ids so far: nothing of ours exists yet
      }
      writes.add(new RequestTrackerActor.TransferView(
          j.requestId, j.transferId, "writing", j.decodeEngineId, now - j.startedMs,
          new RequestTrackerActor.WriteProgress(j.firedLayers.size(), j.completed, j.inFlight)));
    }
    m.tracker().tell(new RequestTrackerActor.GetSnapshot(m.replyTo(), writes));
    return this;
  }

  private Behavior<Command> onLayerWritten(LayerWritten m) {
    WriteJob j = jobs.get(m.transferId());
    if (j == null) {
      return this; // the job failed already
    }
    j.inFlight--;
    if (j.failure != null) {
      endIfDrained(j);
      return this;
    }
    if (!m.status().succeeded()) {
      fail(j, "writing layer " + m.layer() + " of transfer " + j.transferId + " to "
          + j.decodeEngineId + (m.decodeTpRank() == self.tpRank() ? "" : "/tp" + m.decodeTpRank())
          + " failed: " + m.status().failureMessage(), j.requestId);
      return this;
    }
    j.completed++;
    j.bytes += m.status().bytesMoved();
    completeIfDone(j);
    return this;
  }

  private Behavior<Command> onSeal(Seal m) {
    for (ReqMeta r : m.requests()) {
      WriteJob j = jobs.get(r.transferId());
      if (j != null && j.failure == null) {
        // Sealed after the forward pass: hybrid models fire fewer save hooks than layers.
        j.expected = m.layers();
        if (j.targetRanks != null) {
          for (int rank : j.targetRanks) {
            Target t = j.targets.get(rank);
            if (t != null) {
              queueDoneWord(j, t);
            }
          }
        }
        completeIfDone(j);
      }
    }
    return this;
  }

  private void completeIfDone(WriteJob j) {
    if (j.failure != null
        || j.expected < 0
        || j.targetRanks == null
        || j.completed < (long) j.expected * j.targetRanks.length
        || j.inFlight > 0) {
      return;
    }
    jobs.remove(j.transferId);
    timers.cancel(j.transferId);
    terminal.add(j.transferId);
    for (int rank : j.targetRanks) {
      EngineActor.WriteDone done =
          new EngineActor.WriteDone(j.transferId, self.engineId(), self.tpRank());
      ActorRef<EngineActor.Command> ref = j.targets.get(rank).decodeRef;
      if (ref != null) {
        ref.tell(done);
      } else {
        directory.find(j.decodeEngineId, rank).ifPresent(d -> d.ref().tell(done));
      }
    }
    tracker.tell(new RequestTrackerActor.SendFinished(j.requestId, j.transferId, null, j.bytes));
  }

  /**
   * Ends a job that will not complete. Nothing new is written from here on; copies already handed
   * to the transport may still land in D's blocks and read ours, so D is told and our blocks are
   * freed only once every one of them has finished (DESIGN.md section 3, block lifetime).
   */
  private void fail(WriteJob j, String reason, String requestId) {
    if (j.failure != null) {
      return;
    }
    j.failure = reason;
    if (j.requestId == null) {
      j.requestId = requestId;
    }
    j.cancelled.set(true);
    timers.cancel(j.transferId);
    getContext().getLog().warn("write failed: {}", reason);
    endIfDrained(j);
  }

  private void endIfDrained(WriteJob j) {
    if (j.inFlight > 0) {
      return;
    }
    jobs.remove(j.transferId);
    terminal.add(j.transferId);
    if (j.decodeEngineId != null) {
      tellDecode(j.decodeEngineId, j.targetRanks,
          new EngineActor.TransferFailed(j.transferId, self.engineId(), j.failure, self.tpRank()));
    }
    if (j.saved()) {
      // Only a saved request's free was delayed for this transfer; one the engine never handed
      // us for saving was freed by the engine already, and must not be reported done sending.
      tracker.tell(new RequestTrackerActor.SendFinished(j.requestId, j.transferId, j.failure, 0));
    }
  }

  /** Tells D's workers this worker writes into (all we can know of them) {@code message}. */
  private void tellDecode(String decodeEngineId, int[] knownRanks, EngineActor.Command message) {
    int[] ranks = knownRanks;
    if (ranks == null) {
      OptionalInt tp = PeerPlanning.tpSizeOf(directory, decodeEngineId);
      boolean mla = geometry.layout() == KvCacheGeometry.Layout.MLA;
      ranks =
          tp.isEmpty() || tp.getAsInt() == self.tpSize()
              ? new int[] {self.tpRank()}
              : TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), tp.getAsInt(), mla);
    }
    for (int rank : ranks) {
      owner.tell(new EngineActor.SendToPeer(decodeEngineId, rank, message));
    }
  }

  private Behavior<Command> onDeferExpired(DeferExpired m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      String missing = missingFor(j);
      fail(j, "transfer " + j.transferId + " still waits for " + missing + " after "
          + settings.deferTimeout().toMillis() + " ms", j.requestId);
    }
    return this;
  }

  private String missingFor(WriteJob j) {
    if (j.targetRanks == null) {
      return j.targets.values().stream().allMatch(t -> t.remoteBlockIds == null)
          ? "remote blocks from " + j.decodeEngineId
          : "the TP size of " + j.decodeEngineId;
    }
    for (int rank : j.targetRanks) {
      Target t = j.targets.get(rank);
      String who = j.decodeEngineId + (rank == self.tpRank() ? "" : "/tp" + rank);
      if (t.remoteBlockIds == null) {
        return "remote blocks from " + who;
      }
      if (t.peer == null) {
        return "metadata of " + who;
      }
    }
    return "layer events or seal";
  }

  private Behavior<Command> onAbandon(Abandon m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      if (j.decodeEngineId == null && !m.decodeEngineId().isEmpty()) {
        j.decodeEngineId = m.decodeEngineId();
      }
      fail(j, "transfer " + m.transferId() + " abandoned: " + m.reason(), j.requestId);
    } else {
      terminal.add(m.transferId()); // saves that come later are refused and reported
      if (!m.decodeEngineId().isEmpty()) {
        // Nothing of ours is in flight: confirm at once, so D can free its blocks.
        tellDecode(m.decodeEngineId(), null,
            new EngineActor.TransferFailed(m.transferId(), self.engineId(),
                "transfer " + m.transferId() + " abandoned: " + m.reason(), self.tpRank()));
      }
    }
    return this;
  }

  private Behavior<Command> onPeerGone(PeerGone m) {
    if (m.metadata().layers().isEmpty()) {
      return this;
    }
    var any = m.metadata().layers().get(0);
    List<SharedDoneWords> unmap = new ArrayList<>();
    if (!directory.contains(m.metadata().engineId())) {
      // The engine itself is gone (not just one incarnation replaced): its words go too.
      doneWordsOwner.entrySet().removeIf(e -> {
        if (e.getValue().equals(m.metadata().engineId())) {
          SharedDoneWords w = doneWords.remove(e.getKey());
          if (w != null) {
            unmap.add(w);
          }
          return true;
        }
        return false;
      });
    }
    String engine = m.metadata().engineId();
    // Blocking native calls (a copy stream waits for its queued copies): off the actor thread,
    // and in this order: streams drained, then the words their stores target unmapped.
    io.execute(() -> {
      try {
        transport.peerGone(any);
      } catch (RuntimeException e) {
        log.warn("releasing transport state of {}: {}", engine, e.toString());
      }
      unmap.forEach(SharedDoneWords::close);
    });
    return this;
  }

  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    EngineDirectory before = directory;
    directory = m.directory();
    for (WriteJob j : new ArrayList<>(jobs.values())) {
      // Only an engine that was listed and is gone has left; one not listed yet may still join.
      if (j.decodeEngineId != null
          && before.contains(j.decodeEngineId)
          && !directory.contains(j.decodeEngineId)) {
        fail(j, "decode engine " + j.decodeEngineId + " left the cluster during transfer "
            + j.transferId, j.requestId);
      } else if (j.targetRanks == null && j.saved()) {
        issueReady(j); // D may just have been listed: its TP size is known now
      }
    }
    return this;
  }
}
