package dev.kvferry.actors;

import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.TransferStatus;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.javadsl.TimerScheduler;
import org.jspecify.annotations.Nullable;

/**
 * P's per-layer write queue (WRITE mode). A layer's write waits until three things are there: D's
 * remote blocks, D's metadata (handshake) and the layer's compute event (with the cuda transport
 * and a {@link CudaLayerEvent}, the GPU waits for that one: the copies are queued behind it on the
 * copy stream and no thread waits); then the request's plan (computed once, shared by all layers)
 * is written through its {@link LayerWriter}. Completed writes are counted; once the expected
 * count is sealed after the forward pass and reached, P tells D "write done" and reports the
 * request done sending. Each transfer's state is a {@link WriteJob}. Replaces the seed's
 * MoRIIOWriter thread, its deferred list and event.synchronize().
 */
public final class WriterActor extends AbstractBehavior<WriterActor.Command> {

  public sealed interface Command extends LocalOnly {}

  /** One layer of one request is to be written once its event fires. */
  public record SaveLayer(ReqMeta request, int layer, LayerEvent event) implements Command {}

  /** After the forward pass: {@code layers} writes were scheduled for each of these requests. */
  public record Seal(List<ReqMeta> requests, int layers) implements Command {}

  /** D's blocks for a transfer (may arrive before or after the layers are saved). */
  public record RemoteBlocksArrived(PeerProtocol.RemoteBlocks blocks) implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  /**
   * A peer worker incarnation left (from the handshake, through the worker): its transport state
   * is released and, when it was a decode engine whose done words we mapped, those are unmapped
   * after its copy streams have drained (a store into them may still be queued).
   */
  public record PeerGone(AgentMetadata metadata) implements Command {}

  /**
   * The transfer will not happen (aborted on either side, or D gave up): no write starts any
   * more; once the writes in flight have landed, D is told (the confirmation it waits for before
   * freeing its blocks) and the request's blocks are freed if it was saved.
   *
   * @param decodeEngineId the decode engine to tell even if this worker never had the transfer
   *     (it may be waiting for our confirmation); null: tell it only about a job we have
   */
  public record Abandon(String transferId, String reason, @Nullable String decodeEngineId)
      implements Command {}

  /**
   * Lists the writes in progress (state "writing", with their {@link WriteProgress}) and hands them
   * to {@code tracker}, which answers {@code replyTo} with them and its own transfers.
   */
  public record ListWrites(
      ActorRef<RequestTrackerActor.Command> tracker, ActorRef<TransferSnapshot> replyTo)
      implements Command {}

  private record LayerFired(String transferId, int layer) implements Command {}

  private record PeerReady(HandshakeActor.Result result) implements Command {}

  private record LayerWritten(String transferId, int decodeTpRank, int layer, TransferStatus status)
      implements Command {}

  /** The seed's defer timeout (started and cancelled by {@link WriteJobs}). */
  record DeferExpired(String transferId) implements Command {}

  /**
   * The engine preempted these requests and will reuse their blocks once {@code done} completes:
   * a saved transfer of one of them fails (D recomputes; what it would read may be overwritten),
   * and {@code done} completes when none of its copies is in flight any more. A transfer with no
   * layer saved yet reads nothing of ours and goes on (the request saves again when resumed).
   */
  public record FenceSaves(Set<String> requestIds, CompletableFuture<Void> done)
      implements Command {}

  private final EngineIdentity self;
  private final LayerWriter layers;
  private final ConnectorSettings settings;
  private final WriteEndings endings;
  private final WriteJobs jobs;
  private final WriteTargets targets;
  /** What goes to D's workers that may not be listed yet (failures). */
  private final PeerOutbox outbox;
  private final SaveFences fences = new SaveFences();

  public static Behavior<Command> create(
      WorkerSetup setup,
      Executor io,
      ActorRef<HandshakeActor.Command> handshake,
      ActorRef<RequestTrackerActor.Command> tracker) {
    return Behaviors.setup(
        ctx -> Behaviors.withTimers(
            timers -> new WriterActor(ctx, timers, setup, io, handshake, tracker)));
  }

  private WriterActor(
      ActorContext<Command> ctx,
      TimerScheduler<Command> timers,
      WorkerSetup setup,
      Executor io,
      ActorRef<HandshakeActor.Command> handshake,
      ActorRef<RequestTrackerActor.Command> tracker) {
    super(ctx);
    this.self = setup.identity();
    this.layers = new LayerWriter(setup.layerRegions(), setup.transport(), io);
    this.settings = setup.settings();
    this.outbox = new PeerOutbox(ctx.getLog(), settings);
    KvCacheGeometry geometry = setup.geometry();
    boolean mla = geometry.layout() == KvCacheGeometry.Layout.MLA;
    this.endings = new WriteEndings(self, mla, outbox, tracker);
    this.jobs = new WriteJobs(settings, endings, timers, ctx.getLog(), fences::ended);
    // The handshake result names the engine, not the transfer: fan it out to waiting jobs.
    this.targets = new WriteTargets(self, geometry, outbox, handshake,
        ctx.messageAdapter(HandshakeActor.Result.class, PeerReady::new), ctx.getLog());
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
        .onMessage(FenceSaves.class, this::onFenceSaves)
        .onMessage(ListWrites.class, this::onListWrites)
        .onMessage(PeerGone.class, this::onPeerGone)
        .onSignal(PostStop.class, this::onPostStop)
        .build();
  }

  private Behavior<Command> onSaveLayer(SaveLayer m) {
    WriteStamps.mark(WriteStamps.Stage.SAVE_SEEN);
    ReqMeta r = m.request();
    if (jobs.ended(r.transferId())) {
      // Ended before this layer was saved (D left, D aborted): P must still free its blocks.
      endings.alreadyEnded(r.requestId(), r.transferId());
      return this;
    }
    WriteJob j = jobs.getOrStart(r.transferId(), r.requestId(), r.remoteEngineId());
    j.save(r);
    if (m.layer() < 0 || m.layer() >= layers.layers()) {
      // Saved (handed to us by the engine), so its blocks are freed when the job has ended.
      jobs.fail(j, "layer " + m.layer() + " is not registered (have " + layers.layers() + ")");
      return this;
    }
    if (j.failure != null) {
      return this; // ending: its blocks are freed (it is saved now) once its copies have landed
    }
    learnTargets(j);
    int layer = m.layer();
    if (m.event() instanceof CudaLayerEvent gpu && layers.ordersOnGpu()) {
      if (layers.savesTogether()) {
        if (j.expected < 0 && layer < layers.layers() - 1) {
          j.holdOnGpu(layer, gpu.event()); // queued behind the step's last layer, or at its seal
          return this;
        }
        j.releaseHeldBehind(gpu.event());
      }
      // The copy stream waits for the event (cudaStreamWaitEvent): ready now, as far as we care.
      j.firedOnGpu(layer, gpu.event());
      issueReady(j);
      return this;
    }
    ActorRef<Command> me = getContext().getSelf();
    m.event().whenComplete(() -> me.tell(new LayerFired(r.transferId(), layer)));
    return this;
  }

  private Behavior<Command> onLayerFired(LayerFired m) {
    WriteStamps.mark(WriteStamps.Stage.FIRED_SEEN);
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      j.firedLayers.addInt(m.layer());
      issueReady(j);
    }
    return this;
  }

  private Behavior<Command> onRemoteBlocks(RemoteBlocksArrived m) {
    WriteStamps.mark(WriteStamps.Stage.BLOCKS_SEEN);
    PeerProtocol.RemoteBlocks b = m.blocks();
    if (jobs.ended(b.transferId())) {
      getContext().getLog().debug("late remote blocks for finished transfer {}", b.transferId());
      return this;
    }
    WriteJob j = jobs.getOrStart(b.transferId(), b.requestId(), b.decodeEngineId());
    if (!j.remoteBlocks(b, layers.storesDoneWords())) {
      getContext().getLog().warn("duplicate remote blocks for transfer {} ignored", b.transferId());
      return this;
    }
    targets.blocksArrived(j, b.decodeTpRank());
    issueReady(j);
    return this;
  }

  private Behavior<Command> onPeerReady(PeerReady m) {
    HandshakeActor.Result r = m.result();
    for (WriteJob j : jobs.writingTo(r.engineId())) {
      if (r instanceof HandshakeActor.Failed f) {
        if (j.awaitsHandshake(r.tpRank())) {
          jobs.fail(j, f.reason());
        }
      } else if (r instanceof HandshakeActor.Ready ready) {
        if (targets.ready(j, ready)) {
          jobs.completeIfDone(j); // MLA: a rank with nobody to write to is done once sealed
        }
        if (jobs.live(j)) {
          issueReady(j);
        }
      }
    }
    return this;
  }

  /** Learns D's TP size if it can; a rank with nobody to write to (MLA) is done once sealed. */
  private void learnTargets(WriteJob j) {
    if (targets.learn(j)) {
      jobs.completeIfDone(j);
    }
  }

  /**
   * Issues every fired layer of a job to each target whose blocks, metadata, plan and address are
   * known.
   */
  private void issueReady(WriteJob j) {
    int[] local = j.localBlockIds;
    if (local == null || j.failure != null) {
      return;
    }
    learnTargets(j);
    int[] ranks = j.targetRanks;
    if (ranks == null || j.firedLayers.isEmpty() || !jobs.live(j)) {
      return;
    }
    for (int rank : ranks) {
      WriteJob.Target t = j.targets.get(rank);
      if (t == null || t.issued == j.firedLayers.size()) {
        continue;
      }
      WriteTargets.Check check = targets.check(j, t, local);
      if (check instanceof WriteTargets.Unwritable u) {
        jobs.fail(j, u.reason());
        return;
      }
      if (!(check instanceof WriteTargets.Writable w)) {
        continue; // its blocks or metadata have not come
      }
      layers.writeFired(j, t, w.peer(), w.plan(), (written, layer) -> getContext().pipeToSelf(
          written, (status, error) -> new LayerWritten(j.transferId, t.tpRank, layer,
              error != null ? TransferStatus.failed("write raised " + error) : status)));
    }
  }

  private Behavior<Command> onListWrites(ListWrites m) {
    List<TransferView> writes = jobs.views(System.currentTimeMillis());
    m.tracker().tell(new RequestTrackerActor.GetSnapshot(m.replyTo(), writes));
    return this;
  }

  private Behavior<Command> onLayerWritten(LayerWritten m) {
    WriteStamps.mark(WriteStamps.Stage.WRITTEN_SEEN);
    WriteJob j = jobs.get(m.transferId());
    if (j == null) {
      return this; // the job failed already
    }
    j.inFlight--;
    if (j.failure != null) {
      jobs.endIfDrained(j);
      return this;
    }
    if (!m.status().succeeded()) {
      jobs.fail(j, j.writeFailed(self.tpRank(), m.decodeTpRank(), m.layer(),
          m.status().failureMessage()));
      return this;
    }
    j.written(m.status().bytesMoved());
    jobs.completeIfDone(j);
    return this;
  }

  private Behavior<Command> onSeal(Seal m) {
    for (ReqMeta r : m.requests()) {
      WriteJob j = jobs.get(r.transferId());
      if (j != null && j.failure == null) {
        // Sealed after the forward pass: hybrid models fire fewer save hooks than layers.
        j.expected = m.layers();
        if (j.releaseHeld()) {
          issueReady(j); // the step saved no last layer: its held ones go now
        }
        layers.storeDoneWordsIfDue(j);
        jobs.completeIfDone(j);
      }
    }
    return this;
  }

  private Behavior<Command> onDeferExpired(DeferExpired m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      jobs.fail(j, j.deferExpired(self.tpRank(), settings.deferTimeout()));
    }
    return this;
  }

  private Behavior<Command> onAbandon(Abandon m) {
    WriteJob j = jobs.get(m.transferId());
    String reason = "transfer " + m.transferId() + " abandoned: " + m.reason();
    if (j != null) {
      jobs.fail(j, reason);
      return this;
    }
    jobs.endWithoutJob(m.transferId()); // saves that come later are refused and reported
    String decodeEngineId = m.decodeEngineId();
    if (decodeEngineId != null && !decodeEngineId.isEmpty()) {
      // Nothing of ours is in flight: confirm at once, so D can free its blocks.
      endings.abandonedWithoutJob(m.transferId(), decodeEngineId, reason);
    }
    return this;
  }

  private Behavior<Command> onFenceSaves(FenceSaves m) {
    Set<String> draining = new HashSet<>();
    for (WriteJob j : jobs.all()) {
      if (m.requestIds().contains(j.requestId) && j.saved()) {
        jobs.fail(j, "request " + j.requestId + " was preempted on prefill engine "
            + self.engineId() + ", which reuses its blocks");
        if (jobs.live(j)) {
          draining.add(j.transferId); // copies in flight: done once they have finished
        }
      }
    }
    fences.await(draining, m.done());
    return this;
  }

  private Behavior<Command> onPeerGone(PeerGone m) {
    // The engine itself gone (not just one incarnation replaced): its done words go too.
    layers.peerGone(m.metadata(), !outbox.directory().contains(m.metadata().engineId()));
    return this;
  }

  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    EngineDirectory now = m.directory();
    EngineDirectory before = outbox.replaceDirectory(now);
    for (WriteJob j : jobs.all()) {
      if (j.decodeEngineLeft(before, now)) {
        jobs.fail(j, "decode engine " + j.decodeEngineId + " left the cluster during transfer "
            + j.transferId);
      } else if (j.targetRanks == null && j.saved()) {
        issueReady(j); // D may just have been listed: its TP size is known now
      }
    }
    outbox.flush();
    return this;
  }

  private Behavior<Command> onPostStop(PostStop signal) {
    jobs.cancelAll(); // the transport may close
    fences.failAll("the worker stopped");
    // Blocks this thread, once, as the worker stops: D must not see us gone before our copies land.
    layers.close(settings.transferTimeout());
    return this;
  }
}
