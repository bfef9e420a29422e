package dev.kvferry.actors.connector;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.WorkerSetup;
import dev.kvferry.actors.FinishedSink;
import dev.kvferry.actors.LayerLoads;
import dev.kvferry.actors.ReadStamps;
import dev.kvferry.actors.TransferObserver;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.EventOrderedTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.cuda.CudaEvent;
import java.time.Duration;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.pekko.actor.InvalidActorNameException;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.Terminated;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.jspecify.annotations.Nullable;

/**
 * Worker side of the connector, one per TP rank of one DP engine: what the engine's model runner
 * calls. Every call returns at once; the work goes to the worker's {@link EngineActor}. Not
 * thread-safe: called from the engine's worker loop, like the seed's MoRIIOConnectorWorker.
 */
public final class ConnectorWorker implements AutoCloseable {

  /** How long a new worker waits for a stopped worker of its engine to free the actor name. */
  private static final Duration NAME_RELEASE_WAIT = Duration.ofSeconds(2);

  private final ActorSystem<?> system;
  private final EngineIdentity identity;
  private final Transport transport;
  /** The transport when it orders copies on the GPU (loads can then end in an event). */
  private final @Nullable EventOrderedTransport eventOrdered;
  private final ConnectorSettings settings;
  private final FinishedSink sink;
  private volatile @Nullable ActorRef<EngineActor.Command> engine;
  private @Nullable ConnectorMetadata lastSaved;
  /** D, READ: the transfers this step loads, which {@link #waitForLayerLoad} waits for. */
  private Set<String> loadsThisStep = Set.of();
  private int layersSavedThisStep;

  public ConnectorWorker(
      ActorSystem<?> system, EngineIdentity identity, Transport transport, ConnectorSettings settings) {
    this(system, identity, transport, settings, TransferObserver.NONE);
  }

  /** @param observer told of every transfer that ends on this worker (metrics) */
  public ConnectorWorker(
      ActorSystem<?> system,
      EngineIdentity identity,
      Transport transport,
      ConnectorSettings settings,
      TransferObserver observer) {
    this.sink = new FinishedSink(observer);
    this.system = system;
    this.identity = identity;
    this.transport = transport;
    this.eventOrdered = transport instanceof EventOrderedTransport e ? e : null;
    this.settings = settings;
  }

  /**
   * Registers this worker's KV cache, one region per layer, and starts serving it: the worker
   * joins the Receptionist listing of its role from here on.
   */
  public void registerKvCaches(KvCacheGeometry geometry, List<MemoryRegion> layerRegions) {
    if (engine != null) {
      throw new IllegalStateException("KV caches of " + identity.label() + " already registered");
    }
    WorkerSetup setup =
        new WorkerSetup(identity, geometry, layerRegions, transport, settings, sink);
    engine = spawnEngine(setup);
  }

  /**
   * Spawns the worker's actor under its engine's name. A worker of the same engine whose stop
   * completed just before (an engine attaching again at once) can still hold the name for a
   * moment: its parent frees it when it handles the termination, after our watch saw it. That
   * moment is waited out, up to {@link #NAME_RELEASE_WAIT}; a name held longer (two live workers
   * of one engine in one node) fails as before.
   */
  private ActorRef<EngineActor.Command> spawnEngine(WorkerSetup setup) {
    long deadline = System.nanoTime() + NAME_RELEASE_WAIT.toNanos();
    while (true) {
      try {
        return system.systemActorOf(EngineActor.create(setup), identity.toActorName(),
            Props.empty());
      } catch (InvalidActorNameException e) {
        if (System.nanoTime() > deadline || !String.valueOf(e.getMessage()).contains("not unique")) {
          throw e;
        }
        try {
          Thread.sleep(5);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw e;
        }
      }
    }
  }

  /** Starts this step's loads (D, READ) and records the blocks P keeps for D (P, READ). */
  public void startLoadKv(ConnectorMetadata metadata) {
    ActorRef<EngineActor.Command> engine = requireRegistered();
    Set<String> loads = new HashSet<>();
    for (ReqMeta r : metadata.reqsToRecv()) {
      if (r.localBlockIds().length > 0) {
        ReadStamps.mark(r.transferId(), ReadStamps.Stage.START_LOAD);
        loads.add(r.transferId());
        sink.layerLoads().begin(r.transferId());
      }
    }
    sink.layerLoads().forget(loadsThisStep);
    loadsThisStep = Set.copyOf(loads);
    if (!metadata.reqsToRecv().isEmpty() || !metadata.reqsToSend().isEmpty()) {
      engine.tell(new EngineActor.StartLoad(metadata));
    }
  }

  /**
   * D: blocks until layer {@code layer} of every load this step started has landed (or its
   * transfer ended; failures come with {@link #getFinished}), so the engine never runs a layer
   * over KV still being copied: vLLM's {@code wait_for_layer_load}. Returns at once when nothing
   * is loaded this step.
   *
   * @return false if the layer did not land within the transfer timeout
   */
  public boolean waitForLayerLoad(int layer) throws InterruptedException {
    if (loadsThisStep.isEmpty()) {
      return true;
    }
    return sink.layerLoads().await(loadsThisStep, layer, settings.transferTimeout().toNanos());
  }

  /**
   * Whether {@link #waitForLayerQueued} can be used: the transport queues reads on GPU streams
   * that an event can be recorded behind.
   */
  public boolean ordersLoadsOnGpu() {
    return eventOrdered != null;
  }

  /**
   * D, GPU: like {@link #waitForLayerLoad}, but blocks only until the reads of layer {@code
   * layer} of every load this step started are queued on the copy streams (or landed, or their
   * transfer ended), then records {@code event} behind those still in flight. The engine's stream
   * waits for the event instead of the engine's CPU waiting for the copies. {@code event} must be
   * of this worker's GPU; recording it again is the caller's care once no stream may still wait.
   *
   * @throws IllegalStateException if the transport does not order copies on the GPU
   */
  public LayerLoadOrder waitForLayerQueued(int layer, CudaEvent event)
      throws InterruptedException {
    EventOrderedTransport ordered = eventOrdered;
    if (ordered == null) {
      throw new IllegalStateException("the " + transport.name() + " transport of "
          + identity.label() + " does not order copies on the GPU; use waitForLayerLoad");
    }
    if (loadsThisStep.isEmpty()) {
      return LayerLoadOrder.NOTHING_IN_FLIGHT;
    }
    Optional<List<LayerLoads.QueuedRead>> queued =
        sink.layerLoads().awaitQueued(loadsThisStep, layer, settings.transferTimeout().toNanos());
    if (queued.isEmpty()) {
      return LayerLoadOrder.TIMED_OUT;
    }
    List<LayerLoads.QueuedRead> reads = queued.get();
    if (reads.isEmpty()) {
      return LayerLoadOrder.NOTHING_IN_FLIGHT;
    }
    // Every read of a layer lands in this worker's one region of that layer.
    ordered.recordAfterCopies(event, reads.get(0).local(),
        reads.stream().map(LayerLoads.QueuedRead::remote).toList());
    return LayerLoadOrder.EVENT_RECORDED;
  }

  /** P: layer {@code layer} is being computed; its KV is complete when {@code event} fires. */
  public void saveKvLayer(ConnectorMetadata metadata, int layer, LayerEvent event) {
    ActorRef<EngineActor.Command> engine = requireRegistered();
    if (identity.role() != Role.PREFILL
        || identity.mode() != TransferMode.WRITE
        || metadata.reqsToSave().isEmpty()) {
      return;
    }
    if (lastSaved != metadata) {
      lastSaved = metadata;
      layersSavedThisStep = 0;
    }
    layersSavedThisStep++;
    engine.tell(new EngineActor.SaveLayer(metadata, layer, event));
  }

  /** End of the forward pass: seals the expected write count of the requests saved this step. */
  public void waitForSave() {
    ConnectorMetadata saved = lastSaved;
    ActorRef<EngineActor.Command> e = engine;
    if (saved != null && e != null && layersSavedThisStep > 0) {
      e.tell(new EngineActor.SealWrites(saved.reqsToSave(), layersSavedThisStep));
    }
    lastSaved = null;
    layersSavedThisStep = 0;
  }

  /**
   * P: the engine preempted {@code requestIds} and reuses their blocks once the returned future
   * completes (vLLM's {@code handle_preemptions}, before the next forward pass). A transfer that
   * saved any layer of one of them fails (D recomputes), and the future completes once none of
   * its copies reads the blocks any more. Completed at once where nothing is saved (D, READ).
   */
  public CompletableFuture<Void> fenceSaves(Collection<String> requestIds) {
    ActorRef<EngineActor.Command> e = requireRegistered();
    if (identity.role() != Role.PREFILL || identity.mode() != TransferMode.WRITE
        || requestIds.isEmpty()) {
      return CompletableFuture.completedFuture(null);
    }
    CompletableFuture<Void> done = new CompletableFuture<>();
    e.tell(new EngineActor.FenceSaves(Set.copyOf(requestIds), done));
    return done;
  }

  /**
   * {@link #fenceSaves}, waiting for it up to the transfer timeout.
   *
   * @return false if copies still read the blocks then (the engine must not reuse them)
   * @throws IllegalStateException if the worker stopped meanwhile
   */
  public boolean fenceSavesAndWait(Collection<String> requestIds) throws InterruptedException {
    try {
      fenceSaves(requestIds).get(settings.transferTimeout().toNanos(), TimeUnit.NANOSECONDS);
      return true;
    } catch (TimeoutException e) {
      return false;
    } catch (ExecutionException e) {
      Throwable why = e.getCause() != null ? e.getCause() : e;
      throw new IllegalStateException(String.valueOf(why.getMessage()), why);
    }
  }

  /** Requests whose transfers ended since the last call. */
  public Finished getFinished() {
    return sink.drain();
  }

  public EngineIdentity identity() {
    return identity;
  }

  /** The worker's actor, for the scheduler side and for management endpoints. */
  public ActorRef<EngineActor.Command> engineRef() {
    return requireRegistered();
  }

  public FinishedSink sink() {
    return sink;
  }

  public Transport transport() {
    return transport;
  }

  public boolean isRegistered() {
    return engine != null;
  }

  public void shutdown() {
    stop();
  }

  /**
   * Stops the worker and its children; completes once its actor has terminated, so a shared
   * transport can be closed after it (copies queued but not started are skipped as it stops).
   */
  public CompletableFuture<Void> stop() {
    CompletableFuture<Void> stopped =
        new CompletableFuture<>();
    ActorRef<EngineActor.Command> ref = engine;
    if (ref == null) {
      stopped.complete(null);
      return stopped;
    }
    engine = null;
    try {
      system.systemActorOf(
          Behaviors.<Void>setup(
              ctx -> {
                ctx.watch(ref);
                return Behaviors.<Void>receive(Void.class)
                    .onSignal(
                        Terminated.class,
                        sig -> {
                          stopped.complete(null);
                          return Behaviors.stopped();
                        })
                    .build();
              }),
          "stop-watch-" + identity.toActorName() + "-" + java.util.UUID.randomUUID(),
          Props.empty());
    } catch (RuntimeException e) {
      stopped.complete(null); // the system is shutting down: nothing left to wait for
    }
    ref.tell(new EngineActor.Stop());
    return stopped;
  }

  @Override
  public void close() {
    shutdown();
  }

  /** The worker's actor; read once per call, since a stop may clear it concurrently. */
  private ActorRef<EngineActor.Command> requireRegistered() {
    ActorRef<EngineActor.Command> e = engine;
    if (e == null) {
      throw new IllegalStateException(
          "registerKvCaches must be called before using worker " + identity.label());
    }
    return e;
  }
}
