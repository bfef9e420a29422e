package dev.kvferry.actors;

import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.PeerKey;
import dev.kvferry.actors.engine.TerminalIds;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
   * Lists the writes in progress (state "writing", with their {@link
   * WriteProgress}) and hands them to {@code tracker}, which answers {@code
   * replyTo} with them and its own transfers.
   */
  public record ListWrites(
      ActorRef<RequestTrackerActor.Command> tracker,
      ActorRef<TransferSnapshot> replyTo) implements Command {}

  private record LayerFired(String transferId, int layer) implements Command {}

  private record PeerReady(HandshakeActor.Result result) implements Command {}

  private record LayerWritten(String transferId, int decodeTpRank, int layer, TransferStatus status)
      implements Command {}

  private record DeferExpired(String transferId) implements Command {}

  private final EngineIdentity self;
  private final KvCacheGeometry geometry;
  private final LayerWriter layers;
  private final ConnectorSettings settings;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final TimerScheduler<Command> timers;
  private final WriteEndings endings;
  private final Map<String, WriteJob> jobs = new HashMap<>();
  private final TerminalIds terminal;
  private final WriteTargets targets;
  /** What goes to D's workers that may not be listed yet (failures). */
  private final PeerOutbox outbox;

  public static Behavior<Command> create(
      EngineActor.Setup setup,
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
      EngineActor.Setup setup,
      Executor io,
      ActorRef<HandshakeActor.Command> handshake,
      ActorRef<RequestTrackerActor.Command> tracker) {
    super(ctx);
    this.timers = timers;
    this.self = setup.identity();
    this.geometry = setup.geometry();
    this.layers = new LayerWriter(setup.layerRegions(), setup.transport(), io);
    this.settings = setup.settings();
    this.tracker = tracker;
    this.terminal = new TerminalIds(settings.terminalIdCapacity());
    this.outbox = new PeerOutbox(ctx.getLog(), settings);
    this.endings = new WriteEndings(self, mla(), outbox, tracker);
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
        .onMessage(ListWrites.class, this::onListWrites)
        .onMessage(PeerGone.class, this::onPeerGone)
        .onSignal(PostStop.class, this::onPostStop)
        .build();
  }

  private WriteJob job(String transferId, String requestId, String decodeEngineId) {
    WriteJob j = jobs.get(transferId);
    if (j == null) {
      j = new WriteJob(transferId, requestId, decodeEngineId);
      jobs.put(transferId, j);
      // The seed's defer timeout: a write whose remote blocks never come fails.
      timers.startSingleTimer(transferId, new DeferExpired(transferId), settings.deferTimeout());
    }
    return j;
  }

  private Behavior<Command> onSaveLayer(SaveLayer m) {
    ReqMeta r = m.request();
    if (terminal.contains(r.transferId())) {
      // Ended before this layer was saved (D left, D aborted): P must still free its blocks.
      endings.alreadyEnded(r.requestId(), r.transferId());
      return this;
    }
    WriteJob j = job(r.transferId(), r.requestId(), r.remoteEngineId());
    j.save(r);
    if (m.layer() < 0 || m.layer() >= layers.layers()) {
      // Saved (handed to us by the engine), so its blocks are freed when the job has ended.
      fail(j, "layer " + m.layer() + " is not registered (have " + layers.layers() + ")");
      return this;
    }
    if (j.failure != null) {
      return this; // ending: its blocks are freed (it is saved now) once its copies have landed
    }
    learnTargets(j);
    int layer = m.layer();
    if (m.event() instanceof CudaLayerEvent gpu && layers.ordersOnGpu()) {
      // The copy stream waits for the event (cudaStreamWaitEvent): ready now, as far as we care.
      j.gpuEvents.put(layer, gpu.event());
      j.firedLayers.addInt(layer);
      issueReady(j);
      return this;
    }
    ActorRef<Command> me = getContext().getSelf();
    String id = r.transferId();
    m.event().whenComplete(() -> me.tell(new LayerFired(id, layer)));
    return this;
  }

  private Behavior<Command> onLayerFired(LayerFired m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      j.firedLayers.addInt(m.layer());
      issueReady(j);
    }
    return this;
  }

  private Behavior<Command> onRemoteBlocks(RemoteBlocksArrived m) {
    PeerProtocol.RemoteBlocks b = m.blocks();
    if (terminal.contains(b.transferId())) {
      getContext().getLog().debug("late remote blocks for finished transfer {}", b.transferId());
      return this;
    }
    WriteJob j = job(b.transferId(), b.requestId(), b.decodeEngineId());
    if (!j.remoteBlocks(b, layers.ordersOnGpu())) {
      getContext().getLog().warn("duplicate remote blocks for transfer {} ignored", b.transferId());
      return this;
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
          fail(j, f.reason());
        }
      } else if (r instanceof HandshakeActor.Ready ready) {
        if (targets.ready(j, ready)) {
          completeIfDone(j); // MLA: a rank with nobody to write to is done once sealed
        }
        if (jobs.containsKey(j.transferId)) {
          issueReady(j);
        }
      }
    }
    return this;
  }

  /** Learns D's TP size if it can; a rank with nobody to write to (MLA) is done once sealed. */
  private void learnTargets(WriteJob j) {
    if (targets.learn(j)) {
      completeIfDone(j);
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
    if (ranks == null || j.firedLayers.isEmpty() || !jobs.containsKey(j.transferId)) {
      return;
    }
    for (int rank : ranks) {
      WriteJob.Target t = j.targets.get(rank);
      if (t == null || t.issued == j.firedLayers.size()) {
        continue;
      }
      WriteTargets.Check check = targets.check(j, t, local);
      if (check instanceof WriteTargets.Unwritable u) {
        fail(j, u.reason());
        return;
      }
      if (!(check instanceof WriteTargets.Writable w)) {
        continue; // its blocks or metadata have not come
      }
      AgentMetadata peer = w.peer();
      TransferBatch plan = w.plan();
      while (t.issued < j.firedLayers.size()) {
        int layer = j.firedLayers.getInt(t.issued++);
        j.inFlight++;
        getContext().pipeToSelf(layers.write(j, t, peer, plan, layer),
            (status, error) -> new LayerWritten(j.transferId, t.tpRank, layer,
                error != null ? TransferStatus.failed("write raised " + error) : status));
      }
      layers.storeDoneWordIfDue(j, t);
    }
  }

  private Behavior<Command> onListWrites(ListWrites m) {
    List<TransferView> writes = new ArrayList<>();
    long now = System.currentTimeMillis();
    for (WriteJob j : jobs.values()) {
      if (!j.saved()) {
        continue; // only D's block ids so far: nothing of ours exists yet
      }
      writes.add(j.view(now));
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
      String to = m.decodeTpRank() == self.tpRank() ? j.decodeEngineId
          : new PeerKey(j.decodeEngineId, m.decodeTpRank()).toString();
      fail(j, "writing layer " + m.layer() + " of transfer " + j.transferId + " to " + to
          + " failed: " + m.status().failureMessage());
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
        int[] ranks = j.targetRanks;
        if (ranks != null) {
          for (int rank : ranks) {
            WriteJob.Target t = j.targets.get(rank);
            if (t != null) {
              layers.storeDoneWordIfDue(j, t);
            }
          }
        }
        completeIfDone(j);
      }
    }
    return this;
  }

  private void completeIfDone(WriteJob j) {
    int[] ranks = j.targetRanks;
    if (ranks == null || !j.allWritten()) {
      return;
    }
    jobs.remove(j.transferId);
    timers.cancel(j.transferId);
    terminal.add(j.transferId);
    endings.written(j, ranks);
  }

  /**
   * Ends a job that will not complete. Nothing new is written from here on; copies already handed
   * to the transport may still land in D's blocks and read ours, so D is told and our blocks are
   * freed only once every one of them has finished (DESIGN.md section 3, block lifetime).
   */
  private void fail(WriteJob j, String reason) {
    if (j.failure != null) {
      return;
    }
    j.failure = reason;
    j.cancelled.set(true);
    timers.cancel(j.transferId);
    getContext().getLog().warn("write failed: {}", reason);
    endIfDrained(j);
  }

  private void endIfDrained(WriteJob j) {
    String failure = j.failure;
    if (j.inFlight > 0 || failure == null) {
      return;
    }
    jobs.remove(j.transferId);
    terminal.add(j.transferId);
    endings.failed(j, failure);
  }

  private Behavior<Command> onDeferExpired(DeferExpired m) {
    WriteJob j = jobs.get(m.transferId());
    if (j != null) {
      fail(j, "transfer " + j.transferId + " still waits for " + j.missing(self.tpRank())
          + " after " + settings.deferTimeout().toMillis() + " ms");
    }
    return this;
  }

  private Behavior<Command> onAbandon(Abandon m) {
    WriteJob j = jobs.get(m.transferId());
    String reason = "transfer " + m.transferId() + " abandoned: " + m.reason();
    if (j != null) {
      fail(j, reason);
      return this;
    }
    terminal.add(m.transferId()); // saves that come later are refused and reported
    String decodeEngineId = m.decodeEngineId();
    if (decodeEngineId != null && !decodeEngineId.isEmpty()) {
      // Nothing of ours is in flight: confirm at once, so D can free its blocks.
      endings.abandonedWithoutJob(m.transferId(), decodeEngineId, reason);
    }
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
    for (WriteJob j : new ArrayList<>(jobs.values())) {
      // Only an engine that was listed and is gone has left; one not listed yet may still join.
      if (before.contains(j.decodeEngineId) && !now.contains(j.decodeEngineId)) {
        fail(j, "decode engine " + j.decodeEngineId + " left the cluster during transfer "
            + j.transferId);
      } else if (j.targetRanks == null && j.saved()) {
        issueReady(j); // D may just have been listed: its TP size is known now
      }
    }
    outbox.flush();
    return this;
  }

  private Behavior<Command> onPostStop(PostStop signal) {
    // Submissions still queued on the io pool skip their copies: the transport may close.
    jobs.values().forEach(j -> j.cancelled.set(true));
    layers.close();
    return this;
  }

  private boolean mla() {
    return geometry.layout() == KvCacheGeometry.Layout.MLA;
  }
}
